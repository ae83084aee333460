//! The kernel log's verdicts on hand-built facts: whose lines count, and how much of a flood
//! reaches the evidence.

use super::tests::{log_line, memory_facts, S};
use super::*;
use crate::model::kernlog::{KernelLog, LogOrigin};

const XID79: &str =
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=11, name=python3, GPU has fallen off the bus.";

#[test]
fn a_line_user_space_wrote_is_shown_as_such_and_makes_no_verdict() {
    let mut f = memory_facts();
    let first = decide(&f).cause;
    let mut fake = log_line(30 * S, XID79);
    fake.origin = LogOrigin::UserSpace;
    let mut hung =
        log_line(31 * S, "INFO: task pt_data_worker:11 blocked for more than 2 seconds.");
    hung.origin = LogOrigin::UserSpace;
    let mut nfs = log_line(32 * S, "nfs: server nas1 not responding, still trying");
    nfs.origin = LogOrigin::UserSpace;
    f.kernel_log = vec![fake, hung, nfs];
    let v = decide(&f);
    assert_eq!(v.cause, first, "no GPU fault, hung task or storage error: {v:#?}");
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("written into the kernel log by user space (not the kernel's")
                && e.contains("Xid (PCI:0000:3b:00): 79")),
        "{:#?}",
        v.evidence
    );
    // Counted as the kernel's where trusted (--trust-user-kernel-log).
    f.kernel_log[0].origin = LogOrigin::UserSpaceTrusted;
    let v = decide(&f);
    assert_eq!(v.cause, Cause::GpuFault, "{v:#?}");
    assert!(v.evidence.iter().any(|e| e.contains("--trust-user-kernel-log")), "{v:#?}");
}

#[test]
fn a_flood_of_kernel_log_lines_is_a_few_folded_lines_in_the_evidence() {
    let mut f = memory_facts();
    let mut log = KernelLog::default();
    // 20,000 Xid lines, each with its own counter, and 100 distinct I/O errors (other disks).
    for i in 0..20_000u64 {
        let mut l = log_line(10 * S + i * 1_000_000, XID79);
        l.seq = i + 1;
        l.text = format!("{XID79} (repeat {i})");
        log.apply(&l);
    }
    for d in 0..100u64 {
        let mut l = log_line(11 * S, "nfs: server nas1 not responding, still trying");
        l.seq = 100_000 + d;
        l.device = Some(format!("nas{d}"));
        l.text = format!("nfs: server nas-{} not responding, still trying", "x".repeat(d as usize));
        log.apply(&l);
    }
    assert_eq!(log.lines.len(), 1 + crate::model::kernlog::DISTINCT_PER_KIND);
    assert_eq!(log.dropped, 100 - crate::model::kernlog::DISTINCT_PER_KIND as u64);
    f.kernel_log = log.lines.clone();
    f.kernel_log_dropped = log.dropped;
    let v = decide(&f);
    assert_eq!(v.cause, Cause::GpuFault, "{v:#?}");
    assert!(v.text.contains("(20,000 Xid errors in all)"), "{}", v.text);
    let logged: Vec<&String> = v.evidence.iter().filter(|e| e.contains("kernel log")).collect();
    assert!(logged.len() <= kernel_faults::EVIDENCE_LINES + 3, "{logged:#?}");
    assert!(
        logged.iter().any(|e| e.contains("(20,000 lines like it, the last at +30.0s)")),
        "{logged:#?}"
    );
    let rest = 32 - (kernel_faults::EVIDENCE_LINES as u64 - 1);
    assert!(
        logged.iter().any(|e| e.starts_with(&format!(
            "and {rest} more lines of the kernel log like these ({rest} distinct)"
        ))),
        "{logged:#?}"
    );
    assert!(logged.iter().any(|e| e.starts_with("68 lines of the kernel log were not kept")));
    let bytes: usize = v.evidence.iter().map(String::len).sum();
    assert!(bytes < 8_000, "{bytes} bytes of evidence");
}

#[test]
fn the_verdicts_own_line_is_listed_whatever_its_place() {
    let mut f = memory_facts();
    f.kernel_log = (0..20u64)
        .map(|d| {
            let mut l = log_line(5 * S + d, "nfs: server nas1 OK");
            l.seq = d + 1;
            l.device = Some(format!("nas{d}"));
            l
        })
        .collect();
    f.kernel_log.push(log_line(40 * S, XID79));
    let v = decide(&f);
    assert_eq!(v.cause, Cause::GpuFault, "{v:#?}");
    assert!(v.evidence.iter().any(|e| e.contains("fallen off the bus")), "{:#?}", v.evidence);
    assert!(
        v.evidence.iter().any(|e| e.starts_with("and 12 more lines of the kernel log")),
        "{:#?}",
        v.evidence
    );
}
