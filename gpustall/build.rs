//! Builds the eBPF programs (crate `gpustall-ebpf`) with the pinned nightly and bpf-linker,
//! leaving the object in `$OUT_DIR/gpustall` for `include_bytes_aligned!`.
//! `cargo xtask setup` installs both (gpustall-ebpf's own build.rs stops the build early, in one
//! line, when they are missing); this script puts bpf-linker on PATH for cargo.
//!
//! Quiet unless something fails: `cargo install` shows a build script's warnings, and aya-build
//! forwards every line the nested cargo prints as one.

#[path = "../gpustall-ebpf/toolchain.rs"]
#[expect(dead_code, reason = "the early check (tools_present) is gpustall-ebpf's build.rs's")]
mod toolchain;

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let meta = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&meta).parent().ok_or_else(|| anyhow!("no workspace root"))?;
    let root = root.join("gpustall-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    // aya-build spawns `rustup run <nightly> cargo` with this process's PATH: bpf-linker first,
    // without asking the user to change theirs.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let parts = std::iter::once(toolchain::bpf_linker_dir()).chain(std::env::split_paths(&path));
    std::env::set_var("PATH", std::env::join_paths(parts.collect::<Vec<_>>())?);
    println!("cargo:rerun-if-env-changed=GPUSTALL_TOOLS");
    // The nested cargo's "Compiling ..." lines would each become a `warning:` line; its
    // diagnostics (a compile error, a real warning) still come through.
    std::env::set_var("CARGO_TERM_QUIET", "true");
    aya_build::build_ebpf(
        [aya_build::Package { name: "gpustall-ebpf", root_dir: root, ..Default::default() }],
        aya_build::Toolchain::Custom(toolchain::NIGHTLY),
    )
    .context("building the eBPF programs failed (`cargo xtask setup` installs the pinned nightly and bpf-linker)")
}
