//! `cargo xtask install [--root DIR]`: the user's install from a clone. Setup (the pinned nightly
//! and bpf-linker the eBPF build needs, once), then `cargo install --locked --path gpustall`:
//! `~/.cargo/bin/gpustall`, or `DIR/bin/gpustall`.

use std::path::PathBuf;

use crate::util::{cargo, run_cmd};

#[derive(clap::Args)]
pub struct Args {
    /// Install into DIR/bin (e.g. /usr/local) instead of cargo's (~/.cargo/bin).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    crate::setup::run_setup(true)?;
    let mut install = cargo();
    install.args(["install", "--locked", "--path", "gpustall"]);
    if let Some(root) = &args.root {
        install.arg("--root").arg(root);
    }
    run_cmd(&mut install)
}
