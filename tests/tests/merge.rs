//! `gpustall merge`: two process trees traced on this machine stand for two nodes. On node-a a
//! worker is OOM-killed; only then is node-b's trainer released, and it fails a second later
//! (a rank giving up on a dead peer). Their recordings are merged as they are, and with node-b's
//! wall clock moved forward and back (as another machine's clock would be): the merge must follow
//! the wall clocks, name the first node and its cause, and warn where the recordings disagree.

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    procs::{TraceResult, Tracer, Workload},
    TempDir,
};

const S: i64 = 1_000_000_000;

fn workload_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gpustall-workload"))
}

/// node-a: a worker grows past its 256 MiB cgroup and is OOM-killed.
fn trace_oom_tree() -> TraceResult {
    let cg = MemCgroup::new("merge", 256, false);
    let mut w = Workload::start(workload_bin(), &["hog", "600,40,40", "8", "3000"], Some(&cg));
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, _) = w.wait(Duration::from_secs(120));
    assert_eq!(code, Some(1), "the trainer saw its worker killed");
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(t.summary["verdict"]["cause"], "host_memory_oom", "{}", t.stderr);
    t
}

/// node-b: a trainer whose child fails after a second, started after node-a's kill.
fn trace_failing_tree() -> TraceResult {
    let mut w = Workload::start(workload_bin(), &["spawn", "sh", "-c", "sleep 1; exit 1"], None);
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, _) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1));
    tracer.wait(Duration::from_secs(30))
}

/// A copy of a recording with its header's host renamed and its wall clock moved by `shift_ns`.
fn as_node(rec: &Path, out: &Path, host: &str, shift_ns: i64) {
    let text = std::fs::read_to_string(rec).expect("recording");
    let (first, rest) = text.split_once('\n').expect("a header line");
    let mut h: Value = serde_json::from_str(first).expect("header json");
    h["host"] = host.into();
    let wall = h["wall_clock_at_start_ns"].as_i64().expect("wall_clock_at_start_ns");
    h["wall_clock_at_start_ns"] = (wall + shift_ns).into();
    std::fs::write(out, format!("{h}\n{rest}")).expect("writing the copy");
}

struct Merged {
    summary: Value,
    stdout: String,
    html: String,
    perfetto: Value,
}

fn merge(dir: &TempDir, tag: &str, files: &[&Path]) -> Merged {
    let (s, h, p) = (
        dir.path(&format!("{tag}.json")),
        dir.path(&format!("{tag}.html")),
        dir.path(&format!("{tag}.trace.json")),
    );
    let o = Command::new(tests::gpustall_bin())
        .arg("merge")
        .args(files)
        .arg("--summary-json")
        .arg(&s)
        .arg("--html")
        .arg(&h)
        .arg("--perfetto")
        .arg(&p)
        .output()
        .expect("gpustall merge");
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let read = |p: &Path| std::fs::read_to_string(p).expect("a merge output");
    Merged {
        summary: serde_json::from_str(&read(&s)).expect("summary json"),
        stdout,
        html: read(&h),
        perfetto: serde_json::from_str(&read(&p)).expect("perfetto json"),
    }
}

fn lead_s(m: &Merged) -> f64 {
    m.summary["verdict"]["lead_s"].as_f64().unwrap_or_else(|| panic!("a lead: {:#}", m.summary))
}

fn warnings(m: &Merged) -> String {
    m.summary["warnings"].to_string()
}

#[test]
fn two_nodes_merge_on_their_wall_clocks() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let a = trace_oom_tree();
    let b = trace_failing_tree();
    let victim = a.summary["oom_kills"][0]["victim_pid"].as_u64().expect("the victim");
    let dir = TempDir::new("merge");
    let (na, nb) = (dir.path("node-a.jsonl"), dir.path("node-b.jsonl"));
    as_node(&a.record_path(), &na, "node-a", 0);
    as_node(&b.record_path(), &nb, "node-b", 0);

    // As recorded: node-b was released only after node-a's kill, so node-a is first.
    let m = merge(&dir, "plain", &[&nb, &na]);
    let v = &m.summary["verdict"];
    assert_eq!(v["first"], "node-a", "{:#}", m.summary);
    assert_eq!(v["cause"], "host_memory_oom");
    let lead = lead_s(&m);
    assert!(lead > 0.0, "{lead}");
    assert!(v["text"].as_str().is_some_and(|t| t.contains(&format!("pid {victim}"))), "{v:#}");
    assert!(m.stdout.contains("JOB VERDICT: node-a"), "{}", m.stdout);
    assert_eq!(warnings(&m), "[]");
    eprintln!("merged: {}", v["text"]);
    // A lane per node in the page, a process group per node in the trace.
    for node in ["node-a", "node-b"] {
        assert!(m.html.contains(&format!("<h1>{node}: ")), "{node} has no lane");
    }
    let groups: std::collections::BTreeSet<u64> = m.perfetto["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["pid"].as_u64())
        .collect();
    assert_eq!(groups.len(), 2, "{groups:?}");

    // node-b's clock 90 s ahead: the same events, 90 s further apart.
    let ahead = dir.path("node-b-ahead.jsonl");
    as_node(&b.record_path(), &ahead, "node-b", 90 * S);
    let m = merge(&dir, "ahead", &[&na, &ahead]);
    assert_eq!(m.summary["verdict"]["first"], "node-a");
    assert!((lead_s(&m) - (lead + 90.0)).abs() < 1e-3, "{} vs {lead} + 90", lead_s(&m));

    // An hour behind: node-b now seems first, too far apart to be one incident, which is said.
    let behind = dir.path("node-b-behind.jsonl");
    as_node(&b.record_path(), &behind, "node-b", -3600 * S);
    let m = merge(&dir, "behind", &[&na, &behind]);
    assert_eq!(m.summary["verdict"]["first"], "node-b");
    assert!((lead_s(&m) - (3600.0 - lead)).abs() < 1e-3, "{} vs 3600 - {lead}", lead_s(&m));
    assert!(warnings(&m).contains("more than any collective timeout"), "{}", warnings(&m));

    // Left on one host, a moved clock contradicts the host's own monotonic clock.
    let same = dir.path("same-host-ahead.jsonl");
    as_node(&b.record_path(), &same, "node-a", 90 * S);
    let m = merge(&dir, "same", &[&na, &same]);
    // The two recordings' own (wall - monotonic) offsets differ by how long each agent took
    // between its two clock reads at start (milliseconds on a loaded machine): 90 s give or take.
    let w = warnings(&m);
    let by = w
        .split("clocks disagree by ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no clock disagreement said: {w}"));
    assert!((by - 90.0).abs() < 0.5, "{w}");
    let labels: Vec<&str> = m.summary["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["label"].as_str())
        .collect();
    assert_eq!(labels.len(), 2);
    assert!(labels.iter().all(|l| l.starts_with("node-a [pid ")), "{labels:?}");
}

/// Inputs that cannot be merged (a FIFO nobody writes to, a recording of a newer format) are
/// each skipped with a warning, never a hang: the others are merged, and the exit status says
/// some were left out.
#[test]
fn bad_inputs_are_skipped_and_the_rest_merged() {
    let dir = tests::TempDir::new("merge-bad");
    let fifo = dir.path("fifo");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let newer = dir.path("v99.jsonl");
    std::fs::write(
        &newer,
        "{\"type\":\"header\",\"version\":99,\"start_ns\":1,\"gpu\":{\"enabled\":false}}\n",
    )
    .expect("v99");
    let good = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gpustall/src/recording/testdata/merge-node-a.jsonl"
    );
    let out = dir.path("job.json");
    let o = std::process::Command::new("timeout")
        .arg("30")
        .arg(tests::gpustall_bin())
        .arg("merge")
        .arg(good)
        .arg(&fifo)
        .arg(&newer)
        .arg("--summary-json")
        .arg(&out)
        .output()
        .expect("gpustall merge");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("fifo is not a gpustall recording: it is empty: skipped"), "{err}");
    assert!(err.contains("version 99 is newer"), "{err}");
    assert!(err.contains("2 of 3 inputs could not be merged"), "{err}");
    let job: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("summary")).expect("json");
    assert_eq!(job["nodes"].as_array().map(Vec::len), Some(1), "{job}");
}
