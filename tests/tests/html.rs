//! `gpustall report --html`, looked at in a real headless browser (Debian's Chromium, installed
//! if missing): the page renders (the screenshot is not blank), and the rendered document has
//! the verdict's heading, where and when it was recorded, the charts and the process table.
//! Where the browser laid things out is measured at 1280 px wide by a script added to a copy
//! of the page (tests/js/measure.js; the page itself has none): legend entries do not overlap,
//! marker labels stay inside their chart, the page does not scroll sideways, and a real torch
//! job's long waits are bars over the time they lasted, a lane per waiting thread.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

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

/// `gpustall report REC --html` into `dir`: the page's path.
fn report(rec: &Path, dir: &tests::TempDir) -> PathBuf {
    let page = dir.path("report.html");
    let o = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(rec)
        .arg("--html")
        .arg(&page)
        .output()
        .expect("gpustall report");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::canonicalize(&page).expect("the page")
}

/// Where the browser laid out the page's legends, markers and long waits (tests/js/measure.js,
/// run on a copy of the page).
fn measure(page: &Path, dir: &tests::TempDir) -> Value {
    let html = std::fs::read_to_string(page).expect("the page");
    let script = include_str!("../js/measure.js");
    let copy = dir.path("measured.html");
    let at = html.rfind("</body>").expect("</body>");
    std::fs::write(&copy, format!("{}<script>{script}</script>{}", &html[..at], &html[at..]))
        .expect("the copy");
    // Virtual time runs the page's timers (the measuring one last) before the DOM is dumped.
    let what = ["--virtual-time-budget=5000".to_string(), "--dump-dom".to_string()];
    let dom = headless(&copy, &dir.path("profile"), &what);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let at = dom.rfind(r#"<pre id="measure">"#);
    let json = at.and_then(|at| dom[at..].split(['>', '<']).nth(2));
    let json = json.unwrap_or_else(|| panic!("no measurements in the page:\n{dom}"));
    let json = json.replace("&lt;", "<").replace("&gt;", ">").replace("&nbsp;", "\u{a0}");
    serde_json::from_str(&json.replace("&amp;", "&"))
        .unwrap_or_else(|e| panic!("{e}: the measurements {json:?} in\n{dom}"))
}

/// Two boxes that share more than a pixel of area.
fn overlap(a: &Value, b: &Value) -> bool {
    let f = |v: &Value, k: &str| v[k].as_f64().expect(k);
    let w = f(a, "right").min(f(b, "right")) - f(a, "left").max(f(b, "left"));
    let h = f(a, "bottom").min(f(b, "bottom")) - f(a, "top").max(f(b, "top"));
    w > 1.0 && h > 1.0
}

/// No sideways scroll (with the window's scroll bar shown); every chart as wide as the others
/// and in the page's font (a flame graph's script and style once resized the first chart and
/// restyled every chart's text); no two entries of a legend overlapping; every marker label
/// inside its chart's plot and clear of the others there.
fn assert_laid_out(m: &Value) {
    let (scroll, client) = (m["scroll_width"].as_f64(), m["client_width"].as_f64());
    eprintln!("page width {scroll:?} in a {client:?} px window");
    assert!(scroll <= client, "the page scrolls sideways: {m}");
    let width = |c: &Value| c["right"].as_f64().expect("right") - c["left"].as_f64().expect("left");
    let charts = m["charts"].as_array().expect("charts");
    for c in charts.iter().chain(m["flame_graphs"].as_array().expect("flame graphs")) {
        eprintln!("chart {:.0} px wide: {}", width(c), c["title"]);
        assert!((width(c) - width(&charts[0])).abs() < 1.0 && width(c) > 1000.0, "{c}");
        assert!(!c["font"].as_str().expect("font").contains("monospace"), "{c}");
    }
    for legend in m["legends"].as_array().expect("legends") {
        let entries = legend.as_array().expect("entries");
        let mut rows: Vec<i64> =
            entries.iter().map(|e| e["top"].as_f64().unwrap_or(0.0) as i64).collect();
        rows.dedup();
        eprintln!("legend: {} entries in {} rows", entries.len(), rows.len());
        for (i, a) in entries.iter().enumerate() {
            for b in &entries[i + 1..] {
                assert!(!overlap(a, b), "legend entries overlap: {a} {b}");
            }
        }
    }
    let marks = m["marks"].as_array().expect("marks");
    for (i, a) in marks.iter().enumerate() {
        for b in marks[i + 1..].iter().filter(|b| b["plot"] == a["plot"]) {
            assert!(!overlap(a, b), "marker labels cover each other: {a} {b}");
        }
    }
    for mark in marks {
        let (p, f) = (&mark["plot"], |v: &Value, k: &str| v[k].as_f64().expect(k));
        eprintln!("marker {} at {:.1}..{:.1} px", mark["text"], f(mark, "left"), f(mark, "right"));
        assert!(f(mark, "left") >= f(p, "left") && f(mark, "right") <= f(p, "right"), "{mark}");
    }
}

/// The committed recording of a DataLoader worker OOM-killed in a memory cgroup, as a page a
/// browser draws.
#[test]
fn the_html_report_renders_in_a_real_browser() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("html");
    let rec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gpustall/src/recording/testdata/merge-node-a.jsonl");
    let page = report(&rec, &dir);
    let png = dir.path("report.png");
    let what = ["--hide-scrollbars".to_string(), format!("--screenshot={}", png.display())];
    let shot = headless(&page, &dir.path("profile"), &what);
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
    let m = measure(&page, &dir);
    assert!(!m["marks"].as_array().expect("marks").is_empty(), "the OOM kill is marked: {m}");
    assert_laid_out(&m);
}

/// A long wait as the recording has it (a `data_wait` event).
struct LongWait {
    waker: u32,
    wakee: (u32, u32),
    start_ns: u64,
    duration_ns: u64,
}

fn long_waits(record: &[Value]) -> Vec<LongWait> {
    let n = tests::procs::field_u64;
    let mut waits: Vec<LongWait> = record
        .iter()
        .filter(|r| r["kind"] == "data_wait")
        .map(|r| LongWait {
            waker: n(r, "pid") as u32,
            wakee: (n(r, "wakee_pid") as u32, n(r, "wakee_tid") as u32),
            start_ns: n(r, "start_ns"),
            duration_ns: n(r, "duration_ns"),
        })
        .collect();
    waits.sort_by_key(|w| (w.wakee, w.start_ns));
    waits
}

/// Seconds -> px on the chart, from its first and last tick labels.
fn time_scale(ticks: &[Value]) -> (f64, f64) {
    let f = |v: &Value, k: &str| v[k].as_f64().expect(k);
    let (first, last) = (ticks.first().expect("ticks"), ticks.last().expect("ticks"));
    let px_per_s = (f(last, "x") - f(first, "x")) / (f(last, "s") - f(first, "s"));
    (f(first, "x") - f(first, "s") * px_per_s, px_per_s)
}

/// A long wait's bar: its left edge and width on the chart's time scale (within 2 px, and at
/// least a pixel wide however short), filled with the colour of the legend entry of the worker
/// that ended it. Returns how far off it is drawn, in px.
fn assert_bar(
    span: &Value,
    w: &LongWait,
    start_ns: u64,
    scale: (f64, f64),
    legend: &[Value],
) -> f64 {
    let f = |v: &Value, k: &str| v[k].as_f64().expect(k);
    let (x0, px_per_s) = scale;
    let s = (w.start_ns - start_ns) as f64 / 1e9;
    let (left, width) = (x0 + s * px_per_s, w.duration_ns as f64 / 1e9 * px_per_s);
    let (l, r) = (f(span, "left"), f(span, "right"));
    if w.duration_ns > 1_000_000_000 {
        let secs = w.duration_ns as f64 / 1e9;
        let end = left + width;
        eprintln!(
            "{secs:.2} s wait at {s:.2} s: drawn {l:.1}..{r:.1} px, expected {left:.1}..{end:.1}"
        );
    }
    assert!((l - left).abs() <= 2.0, "starts at {left:.1} px: {span}");
    assert!((r - l - width.max(1.0)).abs() <= 2.0, "{width:.1} px wide: {span}");
    assert_eq!(span["waker"].as_u64(), Some(w.waker.into()), "{span}");
    let key = format!("(pid {})", w.waker);
    let entry = legend.iter().find(|e| e["text"].as_str().is_some_and(|t| t.contains(&key)));
    let entry = entry.unwrap_or_else(|| panic!("{key} in the legend: {legend:?}"));
    assert_eq!(span["fill"], entry["color"], "the colour of the worker that ended it");
    (l - left).abs().max((r - l - width.max(1.0)).abs())
}

/// Each long wait of the recording is a bar over the time it lasted ([`assert_bar`]), in a
/// lane of its own waiting thread, the lanes one under the other.
fn assert_waits_drawn(m: &Value, record: &[Value]) {
    let start_ns = record[0]["start_ns"].as_u64().expect("the header's start");
    let waits = long_waits(record);
    let chart = &m["waits"];
    let scale = time_scale(chart["ticks"].as_array().expect("ticks"));
    let legend = chart["legend"].as_array().expect("legend");
    let lanes = chart["lanes"].as_array().expect("the waits lane");
    let mut threads: Vec<(u32, u32)> = waits.iter().map(|w| w.wakee).collect();
    threads.dedup();
    eprintln!("{} long waits of {} threads; {:.2} px/s", waits.len(), threads.len(), scale.1);
    assert_eq!(lanes.len(), threads.len(), "a lane per waiting thread: {chart}");
    let mut off = 0.0f64;
    for (lane, thread) in lanes.iter().zip(&threads) {
        let (pid, tid) = (lane["pid"].as_u64(), lane["tid"].as_u64());
        assert_eq!((pid, tid), (Some(thread.0.into()), Some(thread.1.into())), "{lane}");
        let spans = lane["spans"].as_array().expect("spans");
        let of_thread: Vec<&LongWait> = waits.iter().filter(|w| w.wakee == *thread).collect();
        assert_eq!(spans.len(), of_thread.len(), "a bar per long wait: {lane}");
        for (span, w) in spans.iter().zip(of_thread) {
            off = off.max(assert_bar(span, w, start_ns, scale, legend));
        }
    }
    let f = |v: &Value, k: &str| v[k].as_f64().expect(k);
    for pair in lanes.windows(2) {
        let (a, b) = (&pair[0]["spans"][0], &pair[1]["spans"][0]);
        assert!(f(a, "bottom") <= f(b, "top"), "lanes overlap: {a} {b}");
    }
    eprintln!("{} bars checked, at most {off:.2} px off their time", waits.len());
}

/// A real torch DataLoader (tests/py/datawait.py torch: 2 fork workers, two items of 6.5 s)
/// traced into a recording, then its page: its long waits drawn over their time.
#[test]
fn the_long_waits_are_drawn_over_the_time_they_lasted() {
    let python = tests::torch_python();
    tests::require_privileged_env();
    // The trainer waits for its workers only while nothing else takes the CPUs.
    let _cpu = tests::cpu_lock();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/datawait.py");
    let argv = ["-u", script.to_str().expect("utf-8"), "torch", "--workers", "2", "--wait-go"];
    let (t, _) = tests::procs::trace_trainer_job(&python, &argv);
    let waits = long_waits(&t.record);
    assert!(waits.iter().any(|w| w.duration_ns > 5_000_000_000), "a wait of 6.5 s recorded");
    let dir = tests::TempDir::new("html-waits");
    let m = measure(&report(&t.record_path(), &dir), &dir);
    assert_laid_out(&m);
    assert_waits_drawn(&m, &t.record);
}

/// The incident that started gpustall, on a real torch job (tests/py/mmengine_job.py oom:
/// mmengine's Runner, 8 DataLoader workers caching every sample in a 3000 MiB memory cgroup
/// until one of the job is OOM-killed, late in the run), recorded, then its page: the OOM
/// kill's label inside each chart, the 8 workers' legends wrapped, the long waits drawn over
/// their time.
#[test]
fn a_real_torch_oom_fits_the_window() {
    let python = tests::torch_python();
    tests::require_privileged_env();
    let _memory = tests::pressure_lock();
    let _cpu = tests::cpu_lock();
    let dir = tests::TempDir::new("html-oom");
    let cg = tests::cgroup::MemCgroup::new("html-oom", 3000, false);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/mmengine_job.py");
    let job = format!(
        "echo $$ > {}/cgroup.procs && exec {} -u {} oom --workers 8 --grow-mib 8 --iters 100000 \
         --interval 2 --work-dir {} > {} 2>&1",
        cg.path.display(),
        python.display(),
        script.display(),
        dir.path("work").display(),
        dir.path("train.log").display()
    );
    let rec = dir.path("record.jsonl");
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--record"])
        .arg(&rec)
        .args(["--", "sh", "-c", &job])
        .output()
        .expect("gpustall trace -- mmengine job");
    // The DataLoader raises when a worker is killed (1); the trainer may be the victim (137).
    let log = std::fs::read_to_string(dir.path("train.log")).unwrap_or_default();
    assert!(matches!(o.status.code(), Some(1 | 137)), "{:?}: {log}", o.status);
    assert!(cg.oom_kills() >= 1, "the cgroup's own count");
    let m = measure(&report(&rec, &dir), &dir);
    assert!(!m["marks"].as_array().expect("marks").is_empty(), "the OOM kill is marked: {m}");
    assert_laid_out(&m);
    let text = std::fs::read_to_string(&rec).expect("the recording");
    let record: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_waits_drawn(&m, &record);
}
