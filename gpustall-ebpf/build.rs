//! Stops a build of gpustall at once, with one line saying what to run, when the tools that build
//! these programs are missing: gpustall's build.rs would only find out after a minute or two of
//! compiling (this script has no dependencies, so cargo runs it among the first).

mod toolchain;

const SETUP_FIRST: &str = "gpustall's eBPF programs need the pinned nightly and bpf-linker: run `cargo xtask setup` first (or install with `cargo xtask install`)";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=toolchain.rs");
    println!("cargo:rerun-if-env-changed=GPUSTALL_TOOLS");
    // Built for the BPF target, the nested cargo of gpustall's build.rs is the nightly itself.
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.starts_with("bpf") && !toolchain::tools_present() {
        // cargo fails the build with this line once the script returns.
        println!("cargo::error={SETUP_FIRST}");
    }
}
