//! Running commands and finding places.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _};

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where cargo builds: `$CARGO_TARGET_DIR` when set (a relative one is taken from the workspace,
/// where xtask runs cargo), else the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => workspace_root().join(d),
        _ => workspace_root().join("target"),
    }
}

/// Runs a command, inheriting stdio; fails with the command line when it fails.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout, or None if it cannot run or fails.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Builds what the end-to-end tests run: gpustall, the test binaries and the stand-in NVML
/// and CUDA libraries.
pub fn build_test_programs() -> anyhow::Result<()> {
    let packages = ["gpustall", "tests", "nvml-stub", "cuda-stub"];
    run_cmd(cargo().arg("build").args(packages.iter().flat_map(|p| ["-p", p])))
}

/// `apt-get install` of `packages`, without recommends, after a quiet `apt-get update`.
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    let _ = run_cmd(Command::new("apt-get").args(["update", "-qq"]));
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}
