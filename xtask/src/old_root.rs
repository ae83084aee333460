//! A Debian 11 (bullseye, glibc 2.31) root made by debootstrap from Debian's archive, cached in
//! the tools directory: the older distribution the dist binary's test runs it in
//! (tests/tests/dist.rs). About 220 MB, a few minutes once.

use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

use crate::{setup::tools_dir, util::run_cmd};

const SUITE: &str = "bullseye";
const MIRROR: &str = "http://deb.debian.org/debian";
/// Written last: a root without it is half made.
const STAMP: &str = ".gpustall-root-complete";

pub fn ensure() -> anyhow::Result<PathBuf> {
    let root = tools_dir().join(format!("roots/debian-11-{SUITE}"));
    if root.join(STAMP).is_file() {
        return Ok(root);
    }
    if root.exists() {
        std::fs::remove_dir_all(&root)
            .with_context(|| format!("removing the half-made {}", root.display()))?;
    }
    eprintln!(
        "xtask: making a Debian 11 root with debootstrap at {} (once, a few minutes)",
        root.display()
    );
    std::fs::create_dir_all(&root)?;
    let made = run_cmd(
        Command::new("debootstrap").args(["--variant=minbase", SUITE]).arg(&root).arg(MIRROR),
    );
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&root);
    }
    made?;
    // The suite's own glibc, as the test checks it is older than the host's.
    std::fs::write(root.join(STAMP), SUITE).context("writing the root's stamp")?;
    Ok(root)
}
