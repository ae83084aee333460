//! `gpustall report --html`, looked at in a real headless browser (Debian's Chromium, installed
//! if missing): the page renders (the screenshot is not blank), and the rendered document has
//! the verdict's heading, where and when it was recorded, the charts and the process table.

use std::{path::Path, process::Command};

fn chromium() -> &'static Path {
    let bin = Path::new("/usr/bin/chromium");
    tests::apt::ensure("chromium", || bin.exists());
    bin
}

/// Chromium, headless, on a file: no sandbox (root), no network, a profile of its own.
fn headless(page: &Path, profile: &Path, what: &[String]) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,1800",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(what)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium")
}

/// The share of pixels that are not the page's white background.
fn ink(png_file: &Path) -> f64 {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_file).expect("the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let px = info.color_type.samples();
    let pixels = buf[..info.buffer_size()].chunks(px);
    let total = pixels.len().max(1);
    let inked = pixels.filter(|p| p.iter().take(3).any(|&c| c < 240)).count();
    inked as f64 / total as f64
}

/// The committed recording of a DataLoader worker OOM-killed in a memory cgroup, as a page a
/// browser draws.
#[test]
fn the_html_report_renders_in_a_real_browser() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("html");
    let rec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gpustall/src/recording/testdata/merge-node-a.jsonl");
    let page = dir.path("report.html");
    let o = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(&rec)
        .arg("--html")
        .arg(&page)
        .output()
        .expect("gpustall report");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::canonicalize(&page).expect("the page");
    let png = dir.path("report.png");
    let shot = headless(&page, &dir.path("profile"), &[format!("--screenshot={}", png.display())]);
    assert!(png.exists(), "no screenshot: {}", String::from_utf8_lossy(&shot.stderr));
    let ink = ink(&png);
    eprintln!("screenshot 1280 x 1800: {:.1} % of the pixels drawn", 100.0 * ink);
    assert!(ink > 0.01, "a blank page ({:.3} % drawn)", 100.0 * ink);
    let dom = headless(&page, &dir.path("profile"), &["--dump-dom".to_string()]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    for want in [
        "Out of memory: a process was OOM-killed",
        "(host_memory_oom)",
        "On node-a (kernel",
        "Memory held per process",
        "DataLoader worker 0 (pid 28585)",
        "<h2>Processes</h2>",
    ] {
        assert!(dom.contains(want), "{want:?} in the rendered page:\n{dom}");
    }
}
