//! `cargo xtask setup`: idempotent; a second run checks and returns in seconds.

use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

use crate::util::{is_root, output, run_cmd};

/// The nightly that builds the eBPF crate with the pinned aya set (docs/TOOLCHAIN.md).
/// Keep in step with gpustall/build.rs.
pub const NIGHTLY: &str = "nightly-2026-05-20";
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where bpf-linker and the LLVM prefix live: `$GPUSTALL_TOOLS` or ~/.cache/gpustall/tools.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("GPUSTALL_TOOLS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/gpustall/tools")
    })
}

pub fn bpf_linker_bin() -> PathBuf {
    tools_dir().join("bpf-linker/bin/bpf-linker")
}

fn nightly_ready() -> bool {
    let Some(sysroot) =
        output(Command::new("rustc").arg(format!("+{NIGHTLY}")).args(["--print", "sysroot"]))
    else {
        return false;
    };
    PathBuf::from(sysroot.trim()).join("lib/rustlib/src/rust/library/core").is_dir()
}

fn bpf_linker_ready() -> bool {
    output(Command::new(bpf_linker_bin()).arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION))
}

pub fn run_setup(quiet: bool) -> anyhow::Result<()> {
    if !nightly_ready() {
        eprintln!("xtask: installing {NIGHTLY} with rust-src (for the eBPF programs)");
        run_cmd(Command::new("rustup").args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    if !bpf_linker_ready() {
        eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against {NIGHTLY}'s LLVM (about a minute)");
        // bpf-linker links against the nightly's own libLLVM: a prefix whose lib/ has it.
        let sysroot =
            output(Command::new("rustc").arg(format!("+{NIGHTLY}")).args(["--print", "sysroot"]))
                .context("rustc of the nightly does not run")?;
        let lib = PathBuf::from(sysroot.trim()).join("lib");
        let so = std::fs::read_dir(&lib)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("libLLVM.so."))
            .context("the nightly has no libLLVM.so.*")?;
        let prefix = tools_dir().join(format!("llvm-{NIGHTLY}"));
        let plib = prefix.join("lib");
        std::fs::create_dir_all(&plib)?;
        for link in [plib.join("libLLVM.so"), plib.join(&so)] {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(lib.join(&so), &link)?;
        }
        run_cmd(
            Command::new("cargo")
                .arg(format!("+{NIGHTLY}"))
                .args([
                    "install",
                    "bpf-linker",
                    "--version",
                    BPF_LINKER_VERSION,
                    "--locked",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                    "--force",
                    "--root",
                ])
                .arg(tools_dir().join("bpf-linker"))
                // Without it, build.rs finds /usr/bin/llvm-config (LLVM 14).
                .env("LLVM_PREFIX", &prefix),
        )?;
    }
    if is_root() && !std::path::Path::new("/sys/kernel/tracing/events").is_dir() {
        let _ = std::fs::create_dir_all("/sys/kernel/tracing");
        run_cmd(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))?;
    }
    // What the tests and the demo run: util-linux/coreutils tools, python3 (the demo workload),
    // dmsetup and mdadm.
    for (tool, package) in [
        ("setpriv", "util-linux"),
        ("mkswap", "util-linux"),
        ("swapon", "util-linux"),
        ("fallocate", "util-linux"),
        ("dd", "coreutils"),
        ("python3", "python3"),
        // The stacked-device tests (dm-linear and md RAID1 over loop devices, in the matrix's
        // VMs, which run the host's tools).
        ("dmsetup", "dmsetup"),
        ("mdadm", "mdadm"),
    ] {
        if output(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_none() {
            eprintln!("xtask: {tool} is missing: installing {package}");
            let _ = run_cmd(Command::new("apt-get").arg("update"));
            run_cmd(
                Command::new("apt-get")
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .args(["install", "-y", package]),
            )?;
        }
    }
    if !quiet {
        eprintln!(
            "xtask: setup complete ({NIGHTLY}, bpf-linker {BPF_LINKER_VERSION} in {})",
            tools_dir().display()
        );
    }
    Ok(())
}

pub fn run() -> anyhow::Result<()> {
    run_setup(false)
}
