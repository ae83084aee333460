//! `gpustall watch` at a big incident, under its own shipped limit: in a 256 MiB memory cgroup
//! (the DaemonSet's limit, the unit's MemoryMax=), a watched job tree of 8,000 processes is
//! SIGKILLed at once. The daemon must write the whole bundle (record, summary, report,
//! Perfetto trace) without being OOM-killed, its memory within --memory-budget plus a margin.

use std::path::Path;

use tests::incident::{BigIncident, BUDGET_MIB, PROCESSES};

#[test]
fn a_big_incident_is_bundled_within_the_shipped_memory_limit() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let bundles = tests::TempDir::new("bigincident");
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let BigIncident {
        before_kb,
        peak_kb,
        took,
        wrote,
        incident_lines,
        oom_kills: oom,
        mut watcher,
        cgroup: _cgroup,
    } = tests::incident::run(bin, &bundles.0);
    eprintln!(
        "{PROCESSES} processes killed: bundle in {took:?}, agent peak RSS {} MiB (before the \
         incident {} MiB), {incident_lines} incident lines, OOM kills in its cgroup {oom}: {wrote}",
        peak_kb / 1024,
        before_kb / 1024
    );
    let dir = wrote.split("bundle ").nth(1).and_then(|r| r.split(' ').next()).expect("dir");
    for f in ["record.jsonl", "summary.json", "report.txt", "trace.json"] {
        assert!(Path::new(dir).join(f).exists(), "{f} in {dir}");
    }
    let _ = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(Path::new(dir).join("trace.json")).expect("trace.json"),
    )
    .expect("trace.json parses");
    assert_eq!(oom, 0, "the daemon was not OOM-killed");
    assert!(watcher.child.try_wait().expect("try_wait").is_none(), "the daemon is still running");
    // The budget plus a fixed margin (the process model, the BPF side's buffers, the runtime).
    assert!(
        peak_kb < (BUDGET_MIB + 96) * 1024,
        "peak RSS {} MiB over the budget {BUDGET_MIB} MiB + 96 MiB",
        peak_kb / 1024
    );
    assert!(incident_lines <= 10, "{incident_lines} incident lines in the log");
}
