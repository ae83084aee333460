//! A pid that comes back inside one trace is a new process: it starts from zero, and the one
//! that had the pid before keeps its figures (folded into its role's totals). Before, the new
//! process inherited the old one's kernel counters and the old one's row was lost.

use std::{path::Path, time::Duration};

use tests::procs::{Tracer, Workload};

#[test]
fn a_reused_pid_starts_from_zero_and_the_earlier_process_keeps_its_figures() {
    tests::require_privileged_env();
    const FIRST: u64 = 4;
    const SECOND: u64 = 8;
    let scratch = tests::TempDir::new_in("/var/tmp", "pid-reuse");
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let dir = scratch.0.to_str().expect("utf-8").to_string();
    let mut w =
        Workload::start(bin, &["reuse", &dir, &FIRST.to_string(), &SECOND.to_string()], None);
    let t = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0), "the second child got the first one's pid: {lines:?}");
    let pid = |role: &str| lines.iter().find(|l| l["role"] == role).expect(role)["pid"].clone();
    assert_eq!(pid("first"), pid("second"), "one pid, two processes");
    let t = t.wait(Duration::from_secs(30));
    let reused = pid("second").as_u64().expect("pid") as u32;
    let row = t.process(reused);
    assert_eq!(
        row["block_write_bytes"].as_u64(),
        Some(SECOND * 4096),
        "the new process's own writes only: {row}"
    );
    let folded: u64 = t.summary["folded"]
        .as_array()
        .map_or(0, |f| f.iter().filter_map(|r| r["block_write_bytes"].as_u64()).sum());
    assert_eq!(folded, FIRST * 4096, "the earlier process's writes, kept: {}", t.summary);
}
