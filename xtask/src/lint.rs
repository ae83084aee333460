//! `cargo xtask lint`: the gates CI runs before the tests. Formatting (`cargo fmt --check`) and
//! clippy with `-D warnings` on every crate: the host crates with the stable toolchain, the eBPF
//! crate with its pinned nightly for its own target.

use crate::{
    setup::NIGHTLY,
    util::{cargo, run_cmd, workspace_root},
};

pub fn run() -> anyhow::Result<()> {
    crate::setup::run_setup(true)?;
    eprintln!("xtask: cargo fmt --check");
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    eprintln!("xtask: clippy (host crates)");
    run_cmd(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "gpustall-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    eprintln!("xtask: clippy (eBPF crate, {NIGHTLY})");
    // The nightly is installed with the minimal profile (setup): clippy only where lint runs.
    run_cmd(std::process::Command::new("rustup").args([
        "component",
        "add",
        "--toolchain",
        NIGHTLY,
        "clippy",
    ]))?;
    run_cmd(
        std::process::Command::new("cargo")
            .arg(format!("+{NIGHTLY}"))
            .args(["clippy", "--target", "bpfel-unknown-none", "-Z", "build-std=core", "--release"])
            .args(["--", "-D", "warnings"])
            .current_dir(workspace_root().join("gpustall-ebpf"))
            // The nightly's own cargo and rustc, not the stable ones `cargo xtask` runs under.
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env_remove("RUSTUP_TOOLCHAIN"),
    )
}
