//! `cargo xtask screenshot RECORDING OUT.png`: renders `gpustall report --html` of a recording
//! in headless Chromium (Debian's package, installed if missing) and saves a PNG to look at.

use std::{path::Path, process::Command};

use crate::util::{cargo, output, run_cmd, target_dir};

pub fn run(recording: &Path, png: &Path) -> anyhow::Result<()> {
    if output(Command::new("sh").args(["-c", "command -v chromium"])).is_none() {
        eprintln!("xtask: installing Debian's chromium for the screenshot");
        run_cmd(Command::new("apt-get").args([
            "install",
            "-y",
            "--no-install-recommends",
            "chromium",
        ]))?;
    }
    run_cmd(cargo().args(["build", "-p", "gpustall"]))?;
    let html = png.with_extension("html");
    run_cmd(
        Command::new(target_dir().join("debug/gpustall"))
            .arg("report")
            .arg(recording)
            .arg("--html")
            .arg(&html)
            .stdout(std::process::Stdio::null()),
    )?;
    let profile = std::env::temp_dir().join(format!("gpustall-chromium-{}", std::process::id()));
    let html = std::fs::canonicalize(&html)?;
    let status = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1100,1900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .stderr(std::process::Stdio::null())
        .status()?;
    let _ = std::fs::remove_dir_all(&profile);
    anyhow::ensure!(status.success() && png.exists(), "chromium did not write {}", png.display());
    eprintln!("xtask: wrote {} (from {})", png.display(), html.display());
    Ok(())
}
