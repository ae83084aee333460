//! The deploy files that name what the build makes, checked against the workspace. No container
//! runtime here builds deploy/container/Containerfile, so these checks are what keep it, the
//! DaemonSet and the Debian package's unit in step with the build: the image's tag, the binary's
//! name and path.

use std::path::Path;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value after `key` on the first line that has it, unquoted.
fn value_after<'a>(text: &'a str, key: &str) -> &'a str {
    let line = text.lines().find_map(|l| l.trim().strip_prefix(key));
    line.unwrap_or_else(|| panic!("no line with {key:?}")).trim().trim_matches('"')
}

#[test]
fn the_daemonsets_image_is_the_one_the_containerfile_builds() {
    let daemonset = read("deploy/kubernetes/daemonset.yaml");
    let containerfile = read("deploy/container/Containerfile");
    // Tagged with the workspace's version, as the Containerfile's build command says.
    let image = value_after(&daemonset, "image:");
    let tagged = format!("gpustall:{}", env!("CARGO_PKG_VERSION"));
    assert!(image.ends_with(&tagged), "the DaemonSet runs {image}, not ...{tagged}");
    assert!(containerfile.contains(&format!("-t {image} .")), "build it as {image}");
    // It runs the binary where the Containerfile puts the dist binary, which sits at the top of
    // the release archive's directory (the build context; xtask/src/dist.rs).
    let command = value_after(&daemonset, "command:").trim_matches(['[', ']', '"']);
    let copy = value_after(&containerfile, "COPY ");
    assert_eq!(copy, format!("gpustall {command}"));
    assert!(containerfile.contains("cargo xtask dist"));
    assert_eq!(value_after(&containerfile, "ENTRYPOINT"), format!("[\"{command}\"]"));
}

#[test]
fn the_unit_runs_gpustall_from_systemds_search_path() {
    // No directory: the Debian package's /usr/bin and a hand install's /usr/local/bin alike
    // (tests/tests/deb.rs has systemd resolve it against the installed package).
    let unit = read("deploy/gpustall-watch.service");
    assert!(value_after(&unit, "ExecStart=").starts_with("gpustall watch "));
}

#[test]
fn the_slurm_scripts_parse_and_are_installed_where_their_readme_says() {
    let readme = read("deploy/slurm/README.md");
    let package = read("gpustall/Cargo.toml");
    for name in ["gpustall-prolog.sh", "gpustall-epilog.sh"] {
        let rel = format!("deploy/slurm/{name}");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(&rel);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect("script").permissions(),
        );
        assert_eq!(mode & 0o755, 0o755, "{rel}: slurmd runs it as is");
        let sh = std::process::Command::new("sh").arg("-n").arg(&path).status();
        assert!(sh.is_ok_and(|s| s.success()), "sh -n {rel}");
        assert!(
            package.contains(&format!("[\"../{rel}\", \"usr/share/gpustall/slurm/\", \"755\"]"))
        );
        assert!(readme.contains(&format!("/usr/share/gpustall/slurm/{name}")), "{rel}");
    }
}
