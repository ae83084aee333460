//! `cargo xtask setup`: what building and running gpustall needs, nothing else: the pinned
//! nightly with rust-src, bpf-linker built against its LLVM, tracefs mounted. Idempotent; a
//! second run checks and returns in about a second.
//!
//! The tests' and the demo's own tools (python3, the disk tools of the stacked-device tests) come
//! from [`ensure_tools`], called by the commands that run them, so that a user who only builds
//! gpustall gets no mail server (mdadm recommends one) on the side.

use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

use crate::util::{is_root, output, run_cmd};

// The nightly and the tools directory, shared with the build scripts that use them.
#[path = "../../gpustall-ebpf/toolchain.rs"]
#[expect(dead_code, reason = "tools_present is the build scripts' check; setup checks each tool")]
mod toolchain;
pub use toolchain::{tools_dir, NIGHTLY};

const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn bpf_linker_bin() -> PathBuf {
    toolchain::bpf_linker_dir().join("bpf-linker")
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

fn install_nightly() -> anyhow::Result<()> {
    eprintln!("xtask: installing {NIGHTLY} with rust-src (for the eBPF programs)");
    run_cmd(Command::new("rustup").args([
        "toolchain",
        "install",
        NIGHTLY,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
}

/// A prefix whose lib/ has the nightly's own libLLVM, for bpf-linker to link against.
fn llvm_prefix() -> anyhow::Result<PathBuf> {
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
    Ok(prefix)
}

fn install_bpf_linker() -> anyhow::Result<()> {
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {NIGHTLY}'s LLVM (about a minute)"
    );
    let prefix = llvm_prefix()?;
    run_cmd(
        Command::new("cargo")
            .arg(format!("+{NIGHTLY}"))
            // --quiet: errors still show; not cargo's advice to put the tools dir on PATH
            // (gpustall's build.rs finds bpf-linker there itself).
            .args(["install", "--quiet", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--locked", "--no-default-features", "--features", "llvm-22", "--force"])
            .arg("--root")
            .arg(tools_dir().join("bpf-linker"))
            // Without it, build.rs finds /usr/bin/llvm-config (LLVM 14).
            .env("LLVM_PREFIX", &prefix),
    )
}

/// Mounts tracefs where the kernel has not. Not fatal: gpustall mounts it itself when it runs
/// as root, and a container build (`deploy/container/Containerfile`) may not mount anything.
fn mount_tracefs() {
    if !is_root() || std::path::Path::new("/sys/kernel/tracing/events").is_dir() {
        return;
    }
    let _ = std::fs::create_dir_all("/sys/kernel/tracing");
    if let Err(e) =
        run_cmd(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
    {
        eprintln!("xtask: note: tracefs not mounted ({e:#}); gpustall mounts it when it runs");
    }
}

pub fn run_setup(quiet: bool) -> anyhow::Result<()> {
    if !nightly_ready() {
        install_nightly()?;
    }
    if !bpf_linker_ready() {
        install_bpf_linker()?;
    }
    mount_tracefs();
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

/// A command the tests or the demo run, and the Debian package that has it.
type Tool = (&'static str, &'static str);

/// The demo's: its workload (python3) and its swap file.
const DEMO_TOOLS: &[Tool] = &[
    ("python3", "python3"),
    ("mkswap", "util-linux"),
    ("swapon", "util-linux"),
    ("fallocate", "util-linux"),
];

/// The tests' besides the demo's: what the workloads call, the stacked-device tests' disk tools
/// (dm-linear and md RAID1 over loop devices; vm-test's guests run the host's), and man (the
/// Debian package's test reads its man page), debootstrap (the dist binary's test runs it in a
/// Debian 11 root).
const TEST_TOOLS: &[Tool] = &[
    ("man", "man-db"),
    ("debootstrap", "debootstrap"),
    ("setpriv", "util-linux"),
    ("losetup", "mount"),
    ("dd", "coreutils"),
    ("dmsetup", "dmsetup"),
    ("mdadm", "mdadm"),
];

/// Test setup for `cargo xtask demo`.
pub fn ensure_demo_tools() -> anyhow::Result<()> {
    ensure_tools(DEMO_TOOLS)
}

/// Test setup for `cargo xtask test`, `vm-test` and `bench`.
pub fn ensure_test_tools() -> anyhow::Result<()> {
    ensure_tools(&[DEMO_TOOLS, TEST_TOOLS].concat())
}

/// Installs the packages of the tools that are missing, in one apt-get, without recommends
/// (mdadm's would bring a mail server).
fn ensure_tools(tools: &[Tool]) -> anyhow::Result<()> {
    let have = |tool: &str| {
        output(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_some()
    };
    let mut missing: Vec<&str> =
        tools.iter().filter(|(tool, _)| !have(tool)).map(|&(_, package)| package).collect();
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::ensure!(is_root(), "missing {}: install them as root", missing.join(" "));
    eprintln!("xtask: installing {} (apt-get, no recommends)", missing.join(" "));
    crate::util::apt_install(&missing)
}
