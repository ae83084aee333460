//! The tools that build the eBPF programs, in one place for the three that need them: this
//! crate's build.rs (which fails early, in one line, when they are missing), gpustall's build.rs
//! (which runs the build) and `cargo xtask setup` (which installs them). Included with `#[path]`.

use std::{path::PathBuf, process::Command};

/// The nightly verified with the pinned aya crates (docs/TOOLCHAIN.md).
pub const NIGHTLY: &str = "nightly-2026-05-20";

/// Where `cargo xtask setup` puts bpf-linker and its LLVM prefix: `$GPUSTALL_TOOLS` or
/// ~/.cache/gpustall/tools.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("GPUSTALL_TOOLS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/gpustall/tools")
    })
}

/// The directory of the bpf-linker that setup builds against the nightly's own LLVM.
pub fn bpf_linker_dir() -> PathBuf {
    tools_dir().join("bpf-linker/bin")
}

/// Whether the nightly with rust-src is installed and setup's bpf-linker starts (a bpf-linker
/// built against another nightly's LLVM does not).
pub fn tools_present() -> bool {
    // Never let rustup download a toolchain from a build script.
    let sysroot = Command::new("rustup")
        .args(["run", NIGHTLY, "rustc", "--print", "sysroot"])
        .env("RUSTUP_AUTO_INSTALL", "0")
        .output();
    let rust_src = sysroot.ok().filter(|o| o.status.success()).is_some_and(|o| {
        let root = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        root.join("lib/rustlib/src/rust/library/core").is_dir()
    });
    let linker = Command::new(bpf_linker_dir().join("bpf-linker")).arg("--version").output();
    rust_src && linker.is_ok_and(|o| o.status.success())
}
