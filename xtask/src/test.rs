//! `cargo xtask test`: the README's test command. Sets up (the tests' tools too), builds
//! everything the tests run (gpustall, the workloads, the stand-in NVML library, the Debian
//! package, a venv with torch), then runs every test.

use crate::util::{cargo, is_root, run_cmd, target_dir};

/// How tests/tests/deb.rs finds the package it installs.
const DEB_ENV: &str = "GPUSTALL_TEST_DEB";

pub fn run(extra: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        anyhow::bail!("the end-to-end tests load eBPF programs and make cgroups and swap: run as root (sudo -E cargo xtask test)");
    }
    crate::setup::run_setup(true)?;
    crate::setup::ensure_test_tools()?;
    crate::util::build_test_programs()?;
    let bin = target_dir().join("debug/gpustall");
    // The package as users install it: built here (a release build, cargo-deb), installed by the
    // test, which a cargo test could not build in reasonable time.
    let deb = crate::deb::build()?;
    // A real PyTorch for the DataLoader test, cached after the first run.
    let torch = crate::torch::ensure_venv()?;
    // The whole workspace: `tests` is not a default member, so that a plain `cargo test` (no
    // root) runs the unit tests only.
    run_cmd(
        cargo()
            .args(["test", "--workspace", "--exclude", "gpustall-ebpf", "--no-fail-fast"])
            .env("GPUSTALL_BIN", bin)
            .env(crate::torch::PYTHON_ENV, torch)
            .env(DEB_ENV, deb)
            .arg("--")
            .args(extra),
    )
}
