//! What `cargo xtask dist` ships, as users get it: one binary that needs glibc 2.17 at most (read
//! from its symbol versions), which traces an OOM kill with NVML loaded inside a Debian 11 root;
//! the wheel installed by pip into a fresh venv and by `uv tool install`; the tarball and the .deb
//! holding that same binary.
//!
//! `cargo xtask test` builds them (minutes: a cargo test cannot) and passes them in
//! `$GPUSTALL_TEST_DIST` (the unpacked archive), `$GPUSTALL_TEST_WHEEL`, `$GPUSTALL_TEST_DEB`,
//! with the Debian 11 root (`$GPUSTALL_TEST_OLD_ROOT`, debootstrap, cached), a stand-in NVML built
//! for glibc 2.17 (`$GPUSTALL_TEST_OLD_NVML`) and uv (`$GPUSTALL_TEST_UV`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use object::{read::elf::ElfFile64, Endianness};
use serde_json::json;
use tests::{cgroup::MemCgroup, run_ok, stdout_ok, TempDir};

/// The glibc floor: the manylinux2014 policy's, which the wheel is tagged with.
const GLIBC_FLOOR: (u32, u32) = (2, 17);

fn given(var: &str) -> PathBuf {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: run this test through `cargo xtask test`, which builds the release files (cargo xtask dist)")
    });
    assert!(p.exists(), "{var}={} does not exist: run `cargo xtask test`", p.display());
    p
}

fn dist_binary() -> PathBuf {
    given("GPUSTALL_TEST_DIST").join("gpustall")
}

/// Every `(library, version)` the binary's dynamic symbols need (ELF .gnu.version_r).
fn version_needs(binary: &Path) -> Vec<(String, String)> {
    let data = std::fs::read(binary).expect("reading the binary");
    let elf = ElfFile64::<Endianness>::parse(&*data).expect("an ELF64 binary");
    let (endian, sections) = (elf.endian(), elf.elf_section_table());
    let (mut needs, link) =
        sections.gnu_verneed(endian, &*data).expect(".gnu.version_r").expect("versioned needs");
    let strings = sections.strings(endian, &*data, link).expect("its string table");
    let mut out = Vec::new();
    while let Some((need, mut auxes)) = needs.next().expect("a version need") {
        let file = String::from_utf8_lossy(need.file(endian, strings).expect("file")).into_owned();
        while let Some(aux) = auxes.next().expect("a version") {
            let name = aux.name(endian, strings).expect("name");
            out.push((file.clone(), String::from_utf8_lossy(name).into_owned()));
        }
    }
    out
}

/// `GLIBC_2.17` as (2, 17); None for other version names (GCC_3.0, GLIBC_PRIVATE).
fn glibc_version(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.strip_prefix("GLIBC_")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

#[test]
fn the_dist_binary_needs_glibc_2_17_at_most_and_only_glibcs_libraries() {
    let needs = version_needs(&dist_binary());
    let highest = needs.iter().filter_map(|(_, v)| glibc_version(v)).max().expect("glibc needs");
    eprintln!("the dist binary's highest glibc symbol version: {}.{}", highest.0, highest.1);
    assert!(highest <= GLIBC_FLOOR, "it needs GLIBC_{}.{}: {needs:?}", highest.0, highest.1);
    let glibc = ["libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "ld-linux-x86-64.so.2"];
    for (file, version) in &needs {
        assert!(glibc.contains(&file.as_str()), "{file} ({version}) is not glibc's");
        assert!(!version.contains("PRIVATE"), "{file} {version}: not a public interface");
    }
}

#[test]
fn the_tarball_and_the_deb_carry_the_dist_binary_and_the_deb_asks_for_glibc_2_17() {
    let binary = std::fs::read(dist_binary()).expect("the dist binary");
    let unpacked = given("GPUSTALL_TEST_DIST");
    let name = unpacked.file_name().and_then(|n| n.to_str()).expect("the archive's name");
    let tarball = unpacked.with_file_name(format!("{name}.tar.gz"));
    let member = format!("{name}/gpustall");
    let in_tar = run_ok(Command::new("tar").arg("-xzOf").arg(&tarball).arg(&member)).stdout;
    assert!(in_tar == binary, "{member} in {} is another binary", tarball.display());
    let deb = given("GPUSTALL_TEST_DEB");
    let script = "dpkg-deb --fsys-tarfile \"$1\" | tar -xO ./usr/bin/gpustall";
    let in_deb = run_ok(Command::new("sh").args(["-c", script, "sh"]).arg(&deb)).stdout;
    assert!(in_deb == binary, "the .deb's /usr/bin/gpustall is another binary");
    let depends = stdout_ok(Command::new("dpkg-deb").args(["-f"]).arg(&deb).arg("Depends"));
    assert_eq!(depends.trim(), "libc6 (>= 2.17)");
    // What SHA256SUMS lists is what is there.
    run_ok(
        Command::new("sha256sum")
            .args(["-c", "SHA256SUMS"])
            .current_dir(unpacked.parent().expect("target/dist")),
    );
}

/// The root's own glibc, from its loader's banner.
fn root_glibc(root: &Path) -> String {
    let banner = stdout_ok(Command::new("chroot").arg(root).args(["/usr/bin/ldd", "--version"]));
    banner.lines().next().and_then(|l| l.split_whitespace().last()).expect("a version").to_owned()
}

/// One NVML device that is busy for the whole trace.
fn nvml_scenario() -> serde_json::Value {
    let busy = json!({"at_s": 0.0, "util_gpu": 90, "util_mem": 30, "memory_used_mib": 1000,
        "temperature_c": 60, "sm_clock_mhz": 1980, "power_w": 600, "throttle": [], "pids": []});
    json!({"driver_version": "550.54.15", "gpus": [{"name": "Stand-in H100", "uuid": "GPU-old-0",
        "pci_bus_id": "0000:3b:00.0", "memory_total_mib": 81559, "timeline": [busy]}]})
}

#[test]
fn in_a_debian_11_root_the_dist_binary_traces_an_oom_kill_and_loads_nvml() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let root = given("GPUSTALL_TEST_OLD_ROOT");
    let glibc = root_glibc(&root);
    eprintln!("the Debian 11 root's glibc: {glibc}");
    assert_eq!(glibc, "2.31", "the root is Debian 11's");
    // Everything the run needs lies inside the root, where the chrooted binary sees it.
    let dir = TempDir::new_in(root.join("tmp"), "dist");
    let inside = Path::new("/tmp").join(dir.0.file_name().expect("a name"));
    std::fs::copy(dist_binary(), dir.path("gpustall")).expect("copying the binary");
    std::fs::copy(given("GPUSTALL_TEST_OLD_NVML"), dir.path("libnvidia-ml.so.1"))
        .expect("copying the stand-in NVML");
    std::fs::write(dir.path("scenario.json"), nvml_scenario().to_string()).expect("scenario");
    let cg = MemCgroup::new("old-distro", 64, false);
    // A job that grows without bound in a 64 MiB cgroup: tail keeps the line it never ends.
    let job = format!("echo $$ > {}/cgroup.procs && exec tail /dev/zero", cg.path.display());
    // A private mount namespace: the bind mounts go with it, also when the test fails.
    let script = r#"mount --rbind /proc "$1/proc" && mount --rbind /sys "$1/sys" &&
        mount --rbind /dev "$1/dev" && exec chroot "$1" "$2/gpustall" trace --quiet \
        --nvml-lib "$2/libnvidia-ml.so.1" --gpu-interval 200ms --summary-json "$2/summary.json" \
        -- sh -c "$3""#;
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"])
        .arg(&root)
        .arg(&inside)
        .arg(&job)
        .env("GPUSTALL_NVML_STUB_SCENARIO", inside.join("scenario.json"))
        .output()
        .expect("running unshare");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let text = std::fs::read_to_string(dir.path("summary.json"))
        .unwrap_or_else(|e| panic!("no summary ({e}), exit {:?}:\n{stderr}", o.status));
    let summary: serde_json::Value = serde_json::from_str(&text).expect("the summary parses");
    assert_eq!(
        summary["verdict"]["cause"], "host_memory_oom",
        "{stderr}\n{:#}",
        summary["verdict"]
    );
    let kills = summary["oom_kills"].as_array().expect("oom_kills");
    assert_eq!(kills.len(), 1, "{kills:?}");
    assert_eq!(cg.oom_kills(), 1, "the cgroup's own OOM count");
    let evidence = summary["verdict"]["evidence"].to_string();
    assert!(evidence.contains("64 MiB limit"), "the cgroup's limit was read: {evidence}");
    assert_eq!(summary["gpu"][0]["uuid"], "GPU-old-0", "NVML loaded: {}", summary["gpu_status"]);
    assert!(summary["gpu_status"].as_str().is_some_and(|s| s.contains("550.54.15")));
}

/// `gpustall --version` of an installed copy.
fn version_of(gpustall: &Path) -> String {
    stdout_ok(Command::new(gpustall).arg("--version"))
}

#[test]
fn the_wheel_installs_with_pip_and_uv_and_its_gpustall_traces_a_job() {
    tests::require_privileged_env();
    let wheel = given("GPUSTALL_TEST_WHEEL");
    let dir = TempDir::new("wheel");
    let venv = dir.path("venv");
    run_ok(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    let pip = venv.join("bin/pip");
    run_ok(Command::new(&pip).args(["install", "-q", "--no-index", "--no-deps"]).arg(&wheel));
    let gpustall = venv.join("bin/gpustall");
    let expected = format!("gpustall {}", env!("CARGO_PKG_VERSION"));
    assert!(version_of(&gpustall).contains(&expected));
    // The man page where man finds it from PATH (bin/ -> ../share/man), completions beside it.
    let path =
        format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let page = stdout_ok(Command::new("man").args(["-w", "gpustall"]).env("PATH", &path));
    assert_eq!(PathBuf::from(page.trim()), venv.join("share/man/man1/gpustall.1"));
    assert!(venv.join("share/bash-completion/completions/gpustall").is_file());
    // A job traced through the venv's path, as `sudo "$(command -v gpustall)" trace` runs it.
    let summary = dir.path("summary.json");
    let o = run_ok(
        Command::new(&gpustall)
            .args(["trace", "--quiet", "--no-gpu", "--summary-json"])
            .arg(&summary)
            .args(["--", "sh", "-c", "sleep 0.5"]),
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let comms: Vec<&str> = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["comm"].as_str())
        .collect();
    assert!(comms.contains(&"sleep"), "{comms:?}\n{}", String::from_utf8_lossy(&o.stderr));
    // uv's tool install: its own venv, the command in a bin directory of its own.
    let uv = given("GPUSTALL_TEST_UV");
    run_ok(
        Command::new(uv)
            .args(["tool", "install", "--offline", "--no-python-downloads"])
            .arg(&wheel)
            .env("UV_TOOL_DIR", dir.path("uv-tools"))
            .env("UV_TOOL_BIN_DIR", dir.path("uv-bin"))
            .env("UV_CACHE_DIR", dir.path("uv-cache")),
    );
    assert!(version_of(&dir.path("uv-bin/gpustall")).contains(&expected));
}
