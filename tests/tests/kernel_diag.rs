//! The kernel side's own lines (aya-log; `RUST_LOG=gpustall::ebpf=debug`) on a rare path taken
//! for real: the critical ring full. The agent is stopped (SIGSTOP, as a host too busy to run
//! it would leave it) while the traced job forks 20,000 short children, whose fork and exit
//! records (120 bytes a child) overflow the 1 MiB ring; continued, it reads what fit and counts
//! the rest. Asked for, the programs' warning reaches gpustall's stderr; not asked for, the
//! programs do not even format it, and no line is printed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::procs::{TraceResult, Tracer, Workload};

/// Children forked while the agent is stopped: about 2.3 times what the ring holds.
const CHILDREN: u32 = 20_000;

/// Traces a job of [`CHILDREN`] subshells with the agent stopped throughout, gpustall run with
/// `RUST_LOG` as given (`None`: unset, whatever the test's own environment says).
fn overflow_the_critical_ring(rust_log: Option<&str>) -> TraceResult {
    let script = format!("i=0; while [ $i -lt {CHILDREN} ]; do ( : ); i=$((i+1)); done");
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["spawn", "sh", "-c", &script], None);
    let mut cmd = Command::new(tests::gpustall_bin());
    match rust_log {
        Some(v) => cmd.env("RUST_LOG", v),
        None => cmd.env_remove("RUST_LOG"),
    };
    let t = Tracer::launch(cmd, w.pid(), &["--quiet", "--no-gpu"], &[]);
    let agent = t.pid() as i32;
    // SAFETY: plain kill of our child; SIGCONT follows below, also on the workload's failure.
    unsafe { libc::kill(agent, libc::SIGSTOP) };
    w.go();
    let done =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wait(Duration::from_secs(120))));
    // SAFETY: as above.
    unsafe { libc::kill(agent, libc::SIGCONT) };
    let (code, _) = done.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert_eq!(code, Some(0), "the job ran");
    t.wait(Duration::from_secs(60))
}

fn critical_ring_lost(t: &TraceResult) -> u64 {
    t.summary["lost"]["critical_ring"].as_u64().expect("lost.critical_ring")
}

#[test]
fn the_kernel_sides_warning_is_printed_only_when_rust_log_asks() {
    tests::require_privileged_env();

    let asked = overflow_the_critical_ring(Some("warn,gpustall::ebpf=debug"));
    let lost = critical_ring_lost(&asked);
    eprintln!("asked: {lost} records lost in the critical ring");
    assert!(lost > 0, "the ring filled up: {}", asked.summary["lost"]);
    let lines: Vec<_> = asked.stderr.lines().filter(|l| l.contains("[gpustall::ebpf]")).collect();
    eprintln!("{} kernel lines, the first: {:?}", lines.len(), lines.first());
    assert!(
        lines.iter().any(|l| l
            == &"gpustall: warning [gpustall::ebpf]: the critical ring is full: a process record is lost"),
        "the kernel's warning reached stderr:\n{}",
        asked.stderr
    );

    let not_asked = overflow_the_critical_ring(None);
    let lost = critical_ring_lost(&not_asked);
    eprintln!("not asked: {lost} records lost in the critical ring");
    assert!(lost > 0, "the ring filled up: {}", not_asked.summary["lost"]);
    assert!(
        !not_asked.stderr.contains("gpustall::ebpf"),
        "no kernel line without RUST_LOG:\n{}",
        not_asked.stderr
    );
}
