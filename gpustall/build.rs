//! Builds the eBPF programs (crate `gpustall-ebpf`) with the pinned nightly and bpf-linker,
//! leaving the object in `$OUT_DIR/gpustall` for `include_bytes_aligned!`.
//! `cargo xtask setup` installs both; it also puts bpf-linker on PATH for cargo.

use anyhow::{anyhow, Context as _};

/// The nightly verified with the pinned aya crates (docs/TOOLCHAIN.md). Keep in step with
/// xtask's `NIGHTLY`.
const NIGHTLY: &str = "nightly-2026-05-20";

fn main() -> anyhow::Result<()> {
    let meta = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&meta)
        .parent()
        .ok_or_else(|| anyhow!("no workspace root"))?
        .join("gpustall-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    // bpf-linker lives where `cargo xtask setup` put it; make it findable without a global PATH.
    if let Some(home) = std::env::var_os("HOME") {
        let tools = std::path::Path::new(&home).join(".cache/gpustall/tools/bpf-linker/bin");
        let tools = std::env::var_os("GPUSTALL_TOOLS")
            .map(|t| std::path::PathBuf::from(t).join("bpf-linker/bin"))
            .unwrap_or(tools);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut parts = vec![tools];
        parts.extend(std::env::split_paths(&path));
        // aya-build spawns `rustup run <nightly> cargo` with this process's PATH.
        std::env::set_var("PATH", std::env::join_paths(parts)?);
    }
    println!("cargo:rerun-if-env-changed=GPUSTALL_TOOLS");
    aya_build::build_ebpf(
        [aya_build::Package { name: "gpustall-ebpf", root_dir: root, ..Default::default() }],
        aya_build::Toolchain::Custom(NIGHTLY),
    )
    .context("building the eBPF programs failed: run `cargo xtask setup` first (pinned nightly + bpf-linker)")
}
