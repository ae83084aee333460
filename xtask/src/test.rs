//! `cargo xtask test`: the README's test command. Sets up (the tests' tools too), builds
//! everything the tests run (gpustall, the workloads, the stand-in NVML library, the Debian
//! package, a venv with torch), then runs every test.

use crate::util::{cargo, is_root, run_cmd, target_dir};

/// How tests/tests/deb.rs finds the package it installs, and tests/tests/dist.rs what dist made
/// and what it runs it with.
const DEB_ENV: &str = "GPUSTALL_TEST_DEB";
const DIST_ENV: &str = "GPUSTALL_TEST_DIST";
const WHEEL_ENV: &str = "GPUSTALL_TEST_WHEEL";
const UV_ENV: &str = "GPUSTALL_TEST_UV";
const OLD_ROOT_ENV: &str = "GPUSTALL_TEST_OLD_ROOT";
const OLD_NVML_ENV: &str = "GPUSTALL_TEST_OLD_NVML";

pub fn run(extra: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        anyhow::bail!("the end-to-end tests load eBPF programs and make cgroups and swap: run as root (sudo -E cargo xtask test)");
    }
    // A swap file of an earlier run killed outright would be "the machine's swap" to this one.
    tests::kernel::sweep_stale_swap_files();
    crate::setup::run_setup(true)?;
    crate::setup::ensure_test_tools()?;
    crate::util::build_test_programs()?;
    let bin = target_dir().join("debug/gpustall");
    // What a release ships (the one glibc 2.17 binary, its wheel, tarball and .deb), built here
    // (minutes), which a cargo test could not do; with an older distribution to run it in.
    let dist = crate::dist::build()?;
    let old_nvml = crate::dist::build_old_glibc_nvml_stub()?;
    let old_root = crate::old_root::ensure()?;
    // A real PyTorch for the DataLoader test, cached after the first run.
    let torch = crate::torch::ensure_venv()?;
    // The whole workspace: `tests` is not a default member, so that a plain `cargo test` (no
    // root) runs the unit tests only.
    run_cmd(
        cargo()
            .args(["test", "--workspace", "--exclude", "gpustall-ebpf", "--no-fail-fast"])
            .env("GPUSTALL_BIN", bin)
            .env(crate::torch::PYTHON_ENV, torch)
            .env(DEB_ENV, &dist.deb)
            .env(DIST_ENV, &dist.unpacked)
            .env(WHEEL_ENV, &dist.wheel)
            .env(UV_ENV, crate::dist::ensure_py_tools()?.join("uv"))
            .env(OLD_ROOT_ENV, old_root)
            .env(OLD_NVML_ENV, old_nvml)
            .arg("--")
            .args(extra),
    )
}
