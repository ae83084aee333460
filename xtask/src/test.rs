//! `cargo xtask test`: the README's test command. Sets up, builds everything the tests run
//! (gpustall, the workloads, the stand-in NVML library, a venv with torch), then runs every test.

use crate::util::{cargo, is_root, run_cmd, target_dir};

pub fn run(extra: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        anyhow::bail!("the end-to-end tests load eBPF programs and make cgroups and swap: run as root (sudo -E cargo xtask test)");
    }
    crate::setup::run_setup(true)?;
    run_cmd(cargo().args(["build", "-p", "gpustall", "-p", "tests", "-p", "nvml-stub"]))?;
    let bin = target_dir().join("debug/gpustall");
    // A real PyTorch for the DataLoader test, cached after the first run.
    let torch = crate::torch::ensure_venv()?;
    // The whole workspace: `tests` is not a default member, so that a plain `cargo test` (no
    // root) runs the unit tests only.
    run_cmd(
        cargo()
            .args(["test", "--workspace", "--exclude", "gpustall-ebpf", "--no-fail-fast"])
            .env("GPUSTALL_BIN", bin)
            .env(crate::torch::PYTHON_ENV, torch)
            .arg("--")
            .args(extra),
    )
}
