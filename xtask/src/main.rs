//! Developer commands: `cargo xtask setup | test | lint | demo | bench | screenshot | vm-test`.
//!
//! `setup` installs what a fresh machine lacks (the pinned nightly, bpf-linker, tracefs); the
//! others call it first, so each is one command on a fresh clone.

mod bench;
mod demo;
mod lint;
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
    /// Set up, build, and run every test (unit and privileged end-to-end; needs root).
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
