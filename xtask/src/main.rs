//! Developer commands: `cargo xtask setup | install | dist | test | lint | demo | bench |
//! screenshot | vm-test`.
//!
//! `setup` installs what building and running gpustall needs on a fresh machine (the pinned
//! nightly, bpf-linker, tracefs); the others call it first, so each is one command on a fresh
//! clone. The commands that run the tests or the demo also install their tools.

mod bench;
mod deb;
mod demo;
#[cfg(test)]
mod deploy_files;
mod dist;
mod install;
mod lint;
mod old_root;
mod screenshot;
mod setup;
mod test;
mod torch;
mod util;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "gpustall's developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the pinned nightly with rust-src, bpf-linker built against its LLVM, mount tracefs.
    Setup,
    /// Set up, then `cargo install --locked --path gpustall` (~/.cargo/bin/gpustall).
    Install(install::Args),
    /// Set up, then build what a release ships into target/dist/ from one binary that runs on
    /// glibc 2.17 and later: the wheel, a tarball (binary, man page, completions, deploy files),
    /// the .deb and SHA256SUMS (maturin, zig and cargo-deb are installed into the tools directory).
    Dist,
    /// Set up, build (the Debian package too), and run every test (unit and privileged
    /// end-to-end; needs root).
    Test {
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Set up, build, and trace a bundled memory-hungry workload in a memory-limited cgroup.
    Demo,
    /// Measure the tracer's overhead side by side with an untraced run; writes
    /// docs/BENCHMARKS.md's sections and target/bench/overhead.json.
    Bench {
        /// Run one case only (and rewrite only its section): `swap-heavy` (a swapping workload
        /// untraced and traced), `watch` (the daemon on an idle and a busy job), `fork-burst`
        /// (gpustall watch through 18,000 short children), `peer` (gpustall against a bpftrace
        /// script answering the same questions, per program; then `outside`), `outside` (the
        /// cost to processes gpustall does not trace), `ctxswitch` (a pipe ping-pong untraced,
        /// outside and inside the traced job).
        #[arg(long)]
        only: Option<String>,
    },
    /// The gates CI runs first: cargo fmt --check, clippy -D warnings on every crate.
    Lint,
    /// Render a recording's HTML report in headless Chromium and save a PNG to look at.
    Screenshot { recording: std::path::PathBuf, png: std::path::PathBuf },
    /// Boot other kernels (5.10, 6.1, 6.12, 7.2) in qemu and run the end-to-end tests in each;
    /// print a table of test x kernel.
    VmTest(vm::Args),
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Setup => setup::run(),
        Cmd::Install(args) => install::run(&args),
        Cmd::Dist => dist::run(),
        Cmd::Test { args } => test::run(&args),
        Cmd::Demo => demo::run(),
        Cmd::Bench { only } => bench::run(only.as_deref()),
        Cmd::Lint => lint::run(),
        Cmd::Screenshot { recording, png } => screenshot::run(&recording, &png),
        Cmd::VmTest(args) => vm::run(&args),
    };
    if let Err(e) = r {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}
