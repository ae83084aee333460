//! `cargo xtask dist`: what a release ships, all of it from one binary that starts on any x86_64
//! Linux with glibc 2.17 or later. `target/dist/` gets:
//! - the wheel (`pip install gpustall-*.whl` puts `gpustall` on PATH, with its man page and
//!   completions under the environment's `share/`);
//! - a tarball: the binary, man page, completions, systemd unit, DaemonSet, Containerfile, alert
//!   rules and dashboard, also left unpacked beside it (the Containerfile's build context);
//! - the .deb, made by cargo-deb from the same binary;
//! - SHA256SUMS.
//!
//! The route to glibc 2.17: zig as the linker, against zig's own glibc 2.17 symbol stubs, driven by
//! maturin (`--zig --compatibility manylinux2014`), which packs the wheel from the build in the
//! same step. The binary stays an ordinary dynamically linked glibc program, so nvml-wrapper can
//! dlopen the driver's libnvidia-ml.so.1 (a static musl binary cannot dlopen at all, and a
//! dynamic musl one needs musl's loader on the node). maturin and zig come from PyPI, pinned, in
//! a venv of the tools directory.
//!
//! The tests' stand-in NVML for the old-distribution test is built by cargo-zigbuild (the same
//! zig, its own target directory: the two tools' builds fingerprint differently, and sharing a
//! directory would rebuild the binary each time).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::{
    setup::tools_dir,
    util::{cargo, output, run_cmd, target_dir, workspace_root},
};

/// Pinned like the other tools. uv is for the wheel's test (`uv tool install`).
const PY_TOOLS: &[&str] = &["maturin==1.16.0", "ziglang==0.17.1", "uv==0.13.9"];
const CARGO_ZIGBUILD_VERSION: &str = "0.24.1";
/// The Rust target; the glibc floor is the manylinux2014 policy's (glibc 2.17).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";
const GLIBC_FLOOR: &str = "2.17";
/// Written last: a tools venv without it (or with another recipe) is half made.
const STAMP: &str = ".gpustall-dist-tools";

/// What `cargo xtask dist` made.
pub struct Dist {
    pub dir: PathBuf,
    /// The unpacked archive's directory: the binary and everything the tarball holds.
    pub unpacked: PathBuf,
    pub wheel: PathBuf,
    pub deb: PathBuf,
}

fn venv() -> PathBuf {
    tools_dir().join("dist-venv")
}

/// The tools venv's bin directory, made first unless its stamp says it is complete.
pub fn ensure_py_tools() -> anyhow::Result<PathBuf> {
    let venv = venv();
    let stamp = venv.join(STAMP);
    let recipe = PY_TOOLS.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == recipe) {
        return Ok(venv.join("bin"));
    }
    let _ = std::fs::remove_dir_all(&venv);
    eprintln!("xtask: installing {} into {} (once)", PY_TOOLS.join(" "), venv.display());
    run_cmd(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run_cmd(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(PY_TOOLS),
    )?;
    std::fs::write(&stamp, recipe).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(venv.join("bin"))
}

/// PATH with the tools venv first: maturin and cargo-zigbuild find zig as `python3 -m ziglang`.
fn tools_path(bin: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin.to_path_buf()];
    dirs.extend(std::env::split_paths(&rest));
    std::env::join_paths(dirs).expect("PATH entries without ':'")
}

fn release_dir() -> PathBuf {
    target_dir().join(TRIPLE).join("release")
}

/// The one binary (and the wheel holding it): maturin's release build through zig.
fn build_wheel(bin: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let maturin = || {
        let mut c = Command::new(bin.join("maturin"));
        c.args(["build", "--release", "--locked", "--zig", "--target", TRIPLE])
            .args(["--compatibility", "manylinux2014", "--manifest-path", "gpustall/Cargo.toml"])
            .env("PATH", tools_path(bin))
            .current_dir(workspace_root());
        c
    };
    // First the binary (with an empty data directory: maturin wants the one pyproject.toml
    // names), then its man page and completions for the wheel's data, then the wheel with them
    // (the second build finds everything fresh).
    let share = wheel_share();
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(&share).with_context(|| format!("creating {}", share.display()))?;
    let scratch = target_dir().join("dist-scratch");
    run_cmd(maturin().arg("--out").arg(&scratch))?;
    let _ = std::fs::remove_dir_all(&scratch);
    write_wheel_data(&release_dir().join("gpustall"))?;
    run_cmd(maturin().arg("--out").arg(out))?;
    let version = env!("CARGO_PKG_VERSION");
    let wheel = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("gpustall-{version}-")) && n.ends_with(".whl")
            })
        })
        .context("maturin wrote no wheel")?;
    Ok(wheel)
}

/// What the wheel installs as `<prefix>/share/...` of its environment: under the data directory
/// gpustall/pyproject.toml names (the workspace's own target/, whatever CARGO_TARGET_DIR).
fn wheel_share() -> PathBuf {
    workspace_root().join("target/wheel-data/data/share")
}

fn write_wheel_data(gpustall: &Path) -> anyhow::Result<()> {
    let share = wheel_share();
    let put = |rel: &str, args: &[&str]| -> anyhow::Result<()> {
        let path = share.join(rel);
        std::fs::create_dir_all(path.parent().expect("a file under share/"))?;
        crate::deb::generate(gpustall, args, &path)
    };
    put("man/man1/gpustall.1", &["man"])?;
    put("bash-completion/completions/gpustall", &["completions", "bash"])?;
    put("zsh/site-functions/_gpustall", &["completions", "zsh"])?;
    put("fish/vendor_completions.d/gpustall.fish", &["completions", "fish"])
}

/// The files of the tarball beside the binary: (from the workspace, to in the archive).
const ARCHIVE_FILES: &[(&str, &str)] = &[
    ("README.md", "README.md"),
    ("deploy/README.md", "deploy/README.md"),
    ("deploy/gpustall-watch.service", "deploy/gpustall-watch.service"),
    ("deploy/container/Containerfile", "deploy/container/Containerfile"),
    ("deploy/kubernetes/daemonset.yaml", "deploy/kubernetes/daemonset.yaml"),
    ("deploy/kubernetes/podmonitor.yaml", "deploy/kubernetes/podmonitor.yaml"),
    ("deploy/prometheus/gpustall-alerts.yml", "deploy/prometheus/gpustall-alerts.yml"),
    ("deploy/prometheus/gpustall-alerts.test.yml", "deploy/prometheus/gpustall-alerts.test.yml"),
    ("deploy/grafana/gpustall-dashboard.json", "deploy/grafana/gpustall-dashboard.json"),
    ("deploy/slurm/README.md", "deploy/slurm/README.md"),
    ("deploy/slurm/gpustall-prolog.sh", "deploy/slurm/gpustall-prolog.sh"),
    ("deploy/slurm/gpustall-epilog.sh", "deploy/slurm/gpustall-epilog.sh"),
];

/// The archive's directory (`gpustall-VERSION-x86_64-linux-gnu/`), then the tarball of it.
fn build_archive(out: &Path, gpustall: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let name = format!("gpustall-{}-x86_64-linux-gnu", env!("CARGO_PKG_VERSION"));
    let dir = out.join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let copy = |from: &Path, to: &str| -> anyhow::Result<()> {
        let dest = dir.join(to);
        std::fs::create_dir_all(dest.parent().expect("a file in the archive"))?;
        std::fs::copy(from, &dest)
            .with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
        Ok(())
    };
    copy(gpustall, "gpustall")?;
    for (from, to) in ARCHIVE_FILES {
        copy(&workspace_root().join(from), to)?;
    }
    let share = wheel_share();
    copy(&share.join("man/man1/gpustall.1"), "man/gpustall.1")?;
    copy(&share.join("bash-completion/completions/gpustall"), "completions/gpustall.bash")?;
    copy(&share.join("zsh/site-functions/_gpustall"), "completions/_gpustall")?;
    copy(&share.join("fish/vendor_completions.d/gpustall.fish"), "completions/gpustall.fish")?;
    let tarball = out.join(format!("{name}.tar.gz"));
    // Owned by root, in name order, one mtime: the same tree gives the same bytes.
    run_cmd(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--numeric-owner", "--sort=name"])
            .args(["--mtime=@0", "-czf"])
            .arg(&tarball)
            .arg("-C")
            .arg(out)
            .arg(&name),
    )?;
    Ok((dir, tarball))
}

/// SHA256SUMS of the wheel, tarball and .deb, in the format `sha256sum -c` reads.
fn write_sums(out: &Path, files: &[&Path]) -> anyhow::Result<()> {
    let names: Vec<&std::ffi::OsStr> = files.iter().filter_map(|f| f.file_name()).collect();
    let sums = output(Command::new("sha256sum").args(&names).current_dir(out))
        .context("sha256sum failed")?;
    std::fs::write(out.join("SHA256SUMS"), sums).context("writing SHA256SUMS")
}

/// Builds everything into target/dist/ and returns where.
pub fn build() -> anyhow::Result<Dist> {
    crate::setup::run_setup(true)?;
    let bin = ensure_py_tools()?;
    let dir = target_dir().join("dist");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let wheel = build_wheel(&bin, &dir)?;
    let gpustall = release_dir().join("gpustall");
    let (unpacked, tarball) = build_archive(&dir, &gpustall)?;
    let deb = crate::deb::package(TRIPLE)?;
    let deb = {
        let to = dir.join(deb.file_name().context("the .deb's name")?);
        std::fs::copy(&deb, &to).with_context(|| format!("copying {}", deb.display()))?;
        to
    };
    write_sums(&dir, &[&wheel, &tarball, &deb])?;
    Ok(Dist { dir, unpacked, wheel, deb })
}

/// The stand-in NVML built for glibc 2.17 (for the old-distribution test), in its own target
/// directory; cargo-zigbuild is built once into the tools directory.
pub fn build_old_glibc_nvml_stub() -> anyhow::Result<PathBuf> {
    let bin = ensure_py_tools()?;
    let root = tools_dir().join("cargo-zigbuild");
    let zigbuild = root.join("bin/cargo-zigbuild");
    if !output(Command::new(&zigbuild).arg("--version"))
        .is_some_and(|v| v.contains(CARGO_ZIGBUILD_VERSION))
    {
        eprintln!("xtask: building cargo-zigbuild {CARGO_ZIGBUILD_VERSION} (once, about a minute)");
        run_cmd(
            cargo()
                .args(["install", "--quiet", "--locked", "cargo-zigbuild", "--version"])
                .arg(CARGO_ZIGBUILD_VERSION)
                .arg("--root")
                .arg(&root),
        )?;
    }
    let target = target_dir().join("zig-stub");
    run_cmd(
        Command::new(&zigbuild)
            .current_dir(workspace_root())
            .env("PATH", tools_path(&bin))
            .arg("zigbuild")
            .args(["--release", "--locked", "-p", "nvml-stub", "--target"])
            .arg(format!("{TRIPLE}.{GLIBC_FLOOR}"))
            .arg("--target-dir")
            .arg(&target),
    )?;
    Ok(target.join(TRIPLE).join("release/libnvidia_ml_stub.so"))
}

pub fn run() -> anyhow::Result<()> {
    let dist = build()?;
    let sums = dist.dir.join("SHA256SUMS");
    for f in [&dist.wheel, &dist.deb] {
        let size = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        println!("{} ({:.1} MiB)", f.display(), size as f64 / f64::from(1u32 << 20));
    }
    println!("{}", dist.unpacked.display());
    println!("{}", sums.display());
    eprintln!("install with: pip install {}", dist.wheel.display());
    Ok(())
}
