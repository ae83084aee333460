//! The Debian package (`target/debian/gpustall_<version>-1_<arch>.deb`, copied into target/dist/),
//! made by cargo-deb from the dist binary (xtask/src/dist.rs: glibc 2.17, so the one package
//! installs on Debian 9 onwards and Ubuntu 18.04 onwards) and `[package.metadata.deb]` in
//! gpustall/Cargo.toml: the
//! binary, the systemd unit, the alert rules and the dashboard, and a man page and shell
//! completions generated from the binary itself, so they always match its CLI.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::Context as _;

use crate::{
    setup::tools_dir,
    util::{output, run_cmd, target_dir, workspace_root},
};

/// Pinned like the other tools: the package's layout is cargo-deb's (maintainer scripts, man
/// page compression), and a newer one may change it.
const CARGO_DEB_VERSION: &str = "3.8.0";

fn cargo_deb_bin() -> PathBuf {
    tools_dir().join("cargo-deb/bin/cargo-deb")
}

/// cargo-deb from crates.io, built once into the tools directory (about two minutes).
fn ensure_cargo_deb() -> anyhow::Result<PathBuf> {
    let bin = cargo_deb_bin();
    if output(Command::new(&bin).arg("--version")).is_some_and(|v| v.contains(CARGO_DEB_VERSION)) {
        return Ok(bin);
    }
    eprintln!("xtask: building cargo-deb {CARGO_DEB_VERSION} (once, about two minutes)");
    run_cmd(
        Command::new("cargo")
            .args(["install", "--quiet", "--locked", "cargo-deb", "--version", CARGO_DEB_VERSION])
            .arg("--root")
            .arg(tools_dir().join("cargo-deb")),
    )?;
    Ok(bin)
}

/// Runs the built gpustall and writes what it prints to `out`.
pub fn generate(bin: &Path, args: &[&str], out: &Path) -> anyhow::Result<()> {
    let text = output(Command::new(bin).args(args).stderr(Stdio::inherit()))
        .with_context(|| format!("{} {} failed", bin.display(), args.join(" ")))?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))
}

/// The man page and the completions, where the package's assets name them.
fn generate_assets(bin: &Path, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    generate(bin, &["man"], &dir.join("gpustall.1"))?;
    // cargo-deb compresses man pages it did not find under target/ only (Debian Policy 12.1).
    run_cmd(Command::new("gzip").args(["-9nf"]).arg(dir.join("gpustall.1")))?;
    generate(bin, &["completions", "bash"], &dir.join("gpustall.bash"))?;
    generate(bin, &["completions", "zsh"], &dir.join("_gpustall"))?;
    generate(bin, &["completions", "fish"], &dir.join("gpustall.fish"))
}

/// Packages the binary that dist built for `triple` (cargo-deb maps the assets' target/release/
/// to target/TRIPLE/release/) and returns the package's path.
pub fn package(triple: &str) -> anyhow::Result<PathBuf> {
    let cargo_deb = ensure_cargo_deb()?;
    let release = target_dir().join(triple).join("release");
    generate_assets(&release.join("gpustall"), &release.join("deb"))?;
    let out = target_dir().join("debian");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    let printed = output(
        Command::new(cargo_deb)
            .args(["--package", "gpustall", "--no-build", "--no-strip", "--locked", "--quiet"])
            .args(["--target", triple])
            .arg("--output")
            .arg(&out)
            .current_dir(workspace_root())
            .stderr(Stdio::inherit()),
    )
    .context("cargo-deb failed")?;
    // cargo-deb prints the package's path, last.
    let deb = printed.lines().last().map(PathBuf::from).context("cargo-deb printed no path")?;
    anyhow::ensure!(deb.is_file(), "cargo-deb said it wrote {}, which is not there", deb.display());
    Ok(deb)
}
