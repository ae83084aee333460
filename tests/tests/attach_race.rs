//! Starting gpustall while the job is already in reclaim (the usual moment: someone notices the
//! stall and starts the tracer). A tracer started mid-reclaim must pair every later episode
//! exactly as a tracer that was running before: the same stalls, thread by thread, to within
//! what separates two programs on one tracepoint hit. Before the fix, a begin seen before the
//! end program was attached left the thread "in reclaim" for the rest of its life (no stall
//! counted, all its I/O reclaim I/O).

use std::{collections::BTreeSet, time::Duration};

use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

/// (tid, start_ns, duration_ns) of every reclaim stall in a recording.
fn stalls(record: &[Value]) -> BTreeSet<(u64, u64, u64)> {
    record
        .iter()
        .filter(|l| l["type"] == "event" && l["kind"] == "reclaim" && l["reclaim"] != "kswapd")
        .map(|l| {
            let n = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
            (n("tid"), n("start_ns"), n("duration_ns"))
        })
        .collect()
}

/// The same stall in another tracer's set: same thread, start and length close (each tracer's
/// program reads the clock itself, usually a few hundred ns apart on the same tracepoint hit).
fn has(set: &BTreeSet<(u64, u64, u64)>, &(tid, start, dur): &(u64, u64, u64)) -> bool {
    // Tracepoint programs may be preempted between one tracer's program and the other's on a
    // loaded machine: a few milliseconds apart is still the same stall.
    const SLACK: u64 = 5_000_000;
    set.range((tid, start.saturating_sub(SLACK), 0)..=(tid, start + SLACK, u64::MAX))
        .any(|&(_, _, d)| d.abs_diff(dur) <= SLACK.max(dur / 10))
}

/// The recording's start and its last line's time (monotonic ns, the kernel's clock).
fn span(record: &[Value]) -> (u64, u64) {
    let start = record[0]["start_ns"].as_u64().expect("header start_ns");
    let end = record.iter().filter_map(|l| l["t_ns"].as_u64()).max().expect("lines");
    (start, end)
}

#[test]
fn a_tracer_started_mid_reclaim_pairs_every_later_stall() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    let cg = MemCgroup::new("attach-race", 96, true);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // Two workers of 100 MiB touched every 50 ms for 30 s against 96 MiB: reclaim throughout.
    let mut w = Workload::start(bin, &["hog", "100,100", "8", "30000"], Some(&cg));
    let before = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    std::thread::sleep(Duration::from_millis(1500));
    let mut late = Vec::new();
    for _ in 0..3 {
        if w.child.try_wait().expect("try_wait").is_some() {
            break; // a slow machine: the tracers started so far are the test
        }
        let t = Tracer::start(w.pid(), &["--quiet", "--no-gpu", "--duration", "2"]);
        late.push(t.wait(Duration::from_secs(30)));
    }
    let (code, _) = w.wait(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the workers swap and exit normally");
    let reference = stalls(&before.wait(Duration::from_secs(30)).record);
    assert!(!late.is_empty(), "the job outlived no late tracer");
    assert!(reference.len() > 50, "the job really was in reclaim: {} stalls", reference.len());
    for (i, t) in late.iter().enumerate() {
        let got = stalls(&t.record);
        let (start, end) = span(&t.record);
        // Every stall the late tracer saw whole is one the earlier tracer saw, and every stall
        // the earlier one saw inside the late one's span (a margin for attaching and draining).
        let inside: BTreeSet<_> = reference
            .iter()
            .filter(|&&(_, s, d)| s > start + 300_000_000 && s + d + 300_000_000 < end)
            .copied()
            .collect();
        eprintln!(
            "late tracer {i}: {} stalls, {} of the reference's inside its span",
            got.len(),
            inside.len()
        );
        assert!(!inside.is_empty(), "tracer {i} ran while the job was in reclaim");
        let unknown: Vec<_> = got.iter().filter(|s| !has(&reference, s)).collect();
        assert!(unknown.is_empty(), "tracer {i} saw stalls the reference did not: {unknown:?}");
        let missed: Vec<_> = inside.iter().filter(|s| !has(&got, s)).collect();
        assert!(missed.is_empty(), "tracer {i} missed stalls the reference saw: {missed:?}");
    }
}
