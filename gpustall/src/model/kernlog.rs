//! Lines of the kernel log that matter to a verdict (`sources::kmsg` keeps only these): a GPU
//! driver's Xid faults, hung-task and soft-lockup reports, block-layer I/O errors, filesystem
//! errors, network filesystems that stopped answering, machine-check and PCIe AER errors, the
//! OOM killer's report. Every other line is dropped where it is read and never recorded.

use serde::{Deserialize, Serialize};

/// What a kept line reports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LogWhat {
    /// `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., GPU has fallen off the bus.`
    GpuXid,
    /// `INFO: task python3:1234 blocked for more than 120 seconds.`
    HungTask,
    /// `watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python3:1234]`
    SoftLockup,
    /// `I/O error, dev sdb, sector 2048 op 0x0:(READ) ...`, `Buffer I/O error on dev ...`
    IoError,
    /// `EXT4-fs error (device sda1): ...`, `XFS (sdb1): ...shutdown...`, `BTRFS error ...`
    FsError,
    /// `nfs: server 10.0.0.5 not responding, still trying`, CIFS's "has not responded".
    RemoteFsDown,
    /// `nfs: server 10.0.0.5 OK`: the server answers again.
    RemoteFsUp,
    /// `mce: [Hardware Error]: ...`
    MachineCheck,
    /// `pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: ...`
    PcieAer,
    /// `Out of memory: Killed process 1234 (python3) ...`, `Memory cgroup out of memory: ...`
    OomKill,
    /// `oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/job,...,task=python3,pid=1234,...`:
    /// the memory cgroup whose limit the kill was for (`device`), by the kernel's own report.
    OomCgroup,
}

/// Who wrote a kept line into the kernel log, by the record's facility: the kernel's own
/// lines carry facility 0 (LOG_KERN), and /dev/kmsg gives anything user space writes a
/// non-zero one (LOG_USER unless the writer names another), so no process can pass a line off
/// as the kernel's.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum LogOrigin {
    /// The kernel or a driver (older recordings, which did not say, are read as this).
    #[default]
    Kernel,
    /// User space: kept and shown as such, never the ground of a verdict.
    UserSpace,
    /// User space, counted as the kernel's (`--trust-user-kernel-log`: tests, or a trusted
    /// daemon that relays driver messages).
    UserSpaceTrusted,
}

impl LogOrigin {
    /// The origin of a record of `facility` (its PRI shifted right by 3).
    pub fn of_facility(facility: u32, trust_user_space: bool) -> Self {
        match (facility, trust_user_space) {
            (0, _) => Self::Kernel,
            (_, true) => Self::UserSpaceTrusted,
            (_, false) => Self::UserSpace,
        }
    }

    /// Whether a verdict may rest on the line.
    pub fn is_trusted(self) -> bool {
        self != Self::UserSpace
    }

    fn is_kernel(&self) -> bool {
        *self == Self::Kernel
    }
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

/// One kept line of the kernel log, and the lines like it folded into it (same what, origin,
/// pid, device, Xid, and the same text but for its numbers: [`FoldKey`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KernelLogLine {
    /// The record's own time (CLOCK_MONOTONIC, the clock of every other record).
    pub t_ns: u64,
    /// Its sequence number in the kernel's log.
    pub seq: u64,
    pub what: LogWhat,
    /// The process it names (the Xid's `pid=`, the hung or locked-up task, the OOM victim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// The device, GPU bus id, server or mount it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// An Xid's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// The line as the kernel logged it (one line, at most 240 bytes): the first of its fold.
    pub text: String,
    /// Who wrote it (absent: the kernel).
    #[serde(default, skip_serializing_if = "LogOrigin::is_kernel")]
    pub origin: LogOrigin,
    /// How many lines it stands for, itself included (absent: 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u64,
    /// The time of the last of them (absent: only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_t_ns: Option<u64>,
}

/// What makes two lines the same line repeated: everything but the numbers in the text (a
/// sector, a timeout, a counter) and the time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FoldKey {
    what: LogWhat,
    origin: LogOrigin,
    pid: Option<u32>,
    device: Option<String>,
    xid: Option<u32>,
    /// The text with each run of digits as `#`.
    shape: String,
}

impl KernelLogLine {
    /// The time of the last line it stands for.
    pub fn last_ns(&self) -> u64 {
        self.last_t_ns.unwrap_or(self.t_ns).max(self.t_ns)
    }

    pub fn fold_key(&self) -> FoldKey {
        let mut shape = String::with_capacity(self.text.len());
        for c in self.text.chars() {
            if !c.is_ascii_digit() {
                shape.push(c);
            } else if !shape.ends_with('#') {
                shape.push('#');
            }
        }
        FoldKey {
            what: self.what,
            origin: self.origin,
            pid: self.pid,
            device: self.device.clone(),
            xid: self.xid,
            shape,
        }
    }

    /// Folds `later` (a line like this one, or lines folded already) into it.
    fn absorb(&mut self, later: &KernelLogLine) {
        self.count = self.count.saturating_add(later.count.max(1));
        self.last_t_ns = Some(self.last_ns().max(later.last_ns()));
    }
}

/// Distinct lines kept at most of one kind (what, and whether user space wrote it untrusted);
/// the lines like them are folded in and counted whatever their number. The kinds keep apart so
/// that a flood of one never crowds out another, nor user space's the kernel's.
pub const DISTINCT_PER_KIND: usize = 32;

/// The kept lines of the kernel log, folded as they arrive and bounded: at most
/// [`DISTINCT_PER_KIND`] distinct lines of each kind, the rest counted (`dropped`). The same
/// store folds a reader's batch (`sources::kmsg`) and the whole trace (the model).
#[derive(Default, Debug, Clone)]
pub struct KernelLog {
    /// Distinct lines, the first seen first, each with its count.
    pub lines: Vec<KernelLogLine>,
    /// Records the reader could not read (overwritten before it got to them).
    pub missed: u64,
    /// Lines not kept: unlike every kept line, of a kind that had its distinct lines already.
    pub dropped: u64,
    index: std::collections::HashMap<FoldKey, usize>,
    per_kind: std::collections::HashMap<(LogWhat, bool), usize>,
    last_seq: Option<u64>,
}

impl KernelLog {
    /// Folds in a line (or a folded batch's line); one at or before the last applied (the same
    /// record again) is ignored.
    pub fn apply(&mut self, line: &KernelLogLine) {
        if self.last_seq.is_some_and(|s| line.seq <= s) {
            return;
        }
        self.last_seq = Some(line.seq);
        let key = line.fold_key();
        if let Some(&i) = self.index.get(&key) {
            self.lines[i].absorb(line);
            return;
        }
        let kind = self.per_kind.entry((line.what, line.origin.is_trusted())).or_default();
        if *kind >= DISTINCT_PER_KIND {
            self.dropped = self.dropped.saturating_add(line.count.max(1));
            return;
        }
        *kind += 1;
        self.index.insert(key, self.lines.len());
        self.lines.push(line.clone());
    }

    /// Every line it stands for, kept or folded (not the dropped ones).
    pub fn total(&self) -> u64 {
        self.lines.iter().map(|l| l.count.max(1)).fold(0, u64::saturating_add)
    }

    /// Lines whose last time is before `horizon` leave (a daemon's window).
    pub fn forget_before(&mut self, horizon: u64) {
        if self.lines.iter().all(|l| l.last_ns() >= horizon) {
            return;
        }
        self.lines.retain(|l| l.last_ns() >= horizon);
        self.index = self.lines.iter().enumerate().map(|(i, l)| (l.fold_key(), i)).collect();
        self.per_kind.clear();
        for l in &self.lines {
            *self.per_kind.entry((l.what, l.origin.is_trusted())).or_default() += 1;
        }
    }

    /// The folded lines, leaving it empty (its sequence and counts go on).
    pub fn take_lines(&mut self) -> Vec<KernelLogLine> {
        self.index.clear();
        self.per_kind.clear();
        std::mem::take(&mut self.lines)
    }
}

/// What an Xid says about where the fault is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XidSide {
    /// The GPU's hardware (memory, bus, links): drain the node, reset or replace the GPU.
    Hardware,
    /// The driver or the GPU's firmware: reset the GPU, update the driver.
    Driver,
    /// The application's own GPU code (an illegal address, an exception).
    Application,
    /// A consequence of something else (the process was ended): evidence only.
    Consequence,
}

/// NVIDIA's Xid catalogue (the Xid errors document, docs.nvidia.com/deploy/xid-errors), in
/// one line each: the number, the side it points at, what it means.
const XIDS: &[(u32, XidSide, &str)] = &[
    (13, XidSide::Application, "Graphics Engine Exception: the application's kernel hit an illegal instruction or an out-of-range access"),
    (31, XidSide::Application, "GPU memory page fault: the application accessed memory it did not map (an illegal address)"),
    (32, XidSide::Driver, "invalid or corrupted push buffer stream (the driver's command stream; PCIe or driver)"),
    (38, XidSide::Driver, "driver firmware error"),
    (43, XidSide::Application, "GPU stopped processing: the application's work faulted and its channel was reset"),
    (45, XidSide::Consequence, "preemptive cleanup: a process's GPU work was cleaned up after it ended or faulted"),
    (48, XidSide::Hardware, "double-bit ECC error: an uncorrectable GPU memory error"),
    (61, XidSide::Driver, "internal micro-controller breakpoint/warning"),
    (62, XidSide::Driver, "internal micro-controller halt"),
    (63, XidSide::Hardware, "ECC page retirement or row remapping event"),
    (64, XidSide::Hardware, "ECC page retirement or row remapping failure"),
    (69, XidSide::Application, "graphics engine class error"),
    (74, XidSide::Hardware, "NVLink error"),
    (79, XidSide::Hardware, "GPU has fallen off the bus: the host cannot reach it any more"),
    (92, XidSide::Hardware, "high single-bit ECC error rate"),
    (94, XidSide::Hardware, "contained ECC error: the affected application must restart, the GPU keeps working"),
    (95, XidSide::Hardware, "uncontained ECC error: every application on the GPU is affected"),
    (109, XidSide::Driver, "context switch timeout"),
    (119, XidSide::Driver, "GSP RPC timeout: the GPU's system processor stopped answering the driver"),
    (120, XidSide::Driver, "GSP error: the GPU's system processor reported an error"),
    (121, XidSide::Hardware, "C2C link error"),
    (140, XidSide::Hardware, "unrecovered ECC error"),
    (154, XidSide::Driver, "GPU recovery action changed: nvidia-smi -q names the action the GPU needs"),
];

/// An Xid's side and meaning; an Xid outside the table is the driver's to explain.
pub fn xid_meaning(xid: u32) -> (XidSide, &'static str) {
    XIDS.iter().find(|(n, _, _)| *n == xid).map_or(
        (XidSide::Driver, "an Xid outside gpustall's table: see NVIDIA's Xid catalogue"),
        |&(_, s, m)| (s, m),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_point_at_the_hardware_the_driver_or_the_application() {
        assert_eq!(xid_meaning(79).0, XidSide::Hardware);
        assert_eq!(xid_meaning(119).0, XidSide::Driver);
        assert_eq!(xid_meaning(13).0, XidSide::Application);
        assert_eq!(xid_meaning(45).0, XidSide::Consequence);
        assert_eq!(xid_meaning(9999).0, XidSide::Driver);
    }

    fn xid(seq: u64, pid: u32, text: &str, origin: LogOrigin) -> KernelLogLine {
        KernelLogLine {
            t_ns: seq * 10,
            seq,
            what: LogWhat::GpuXid,
            pid: Some(pid),
            comm: None,
            device: Some("0000:3b:00".into()),
            xid: Some(79),
            text: text.into(),
            origin,
            count: 1,
            last_t_ns: None,
        }
    }

    #[test]
    fn repeated_lines_fold_into_one_with_their_count_and_last_time() {
        let mut log = KernelLog::default();
        for seq in 1..=1000 {
            // The same line but for its numbers: one line, counted.
            log.apply(&xid(seq, 7, &format!("NVRM: Xid 79, pid=7, try {seq}"), LogOrigin::Kernel));
        }
        assert_eq!(log.lines.len(), 1);
        let l = &log.lines[0];
        assert_eq!((l.count, l.t_ns, l.last_ns(), l.seq), (1000, 10, 10_000, 1));
        assert_eq!(l.text, "NVRM: Xid 79, pid=7, try 1", "the first line's own text");
        // Another pid, or user space's line, is another line.
        log.apply(&xid(1001, 8, "NVRM: Xid 79, pid=8, try 1", LogOrigin::Kernel));
        log.apply(&xid(1002, 7, "NVRM: Xid 79, pid=7, try 1", LogOrigin::UserSpace));
        assert_eq!(log.lines.len(), 3);
        assert_eq!(log.total(), 1002);
        // The same record again (a replay) is not counted twice.
        log.apply(&xid(1002, 7, "NVRM: Xid 79, pid=7, try 1", LogOrigin::UserSpace));
        assert_eq!(log.total(), 1002);
    }

    #[test]
    fn distinct_lines_are_capped_per_kind_and_the_rest_counted() {
        let mut log = KernelLog::default();
        // A flood of distinct lines (each naming another pid) from user space ...
        for seq in 0..10_000u64 {
            let pid = seq as u32;
            log.apply(&xid(seq, pid, "x", LogOrigin::UserSpace));
        }
        assert_eq!(log.lines.len(), DISTINCT_PER_KIND);
        assert_eq!(log.dropped, 10_000 - DISTINCT_PER_KIND as u64);
        // ... crowds out neither the kernel's own Xid lines nor another kind.
        log.apply(&xid(20_000, 1, "x", LogOrigin::Kernel));
        let mut hung = xid(20_001, 1, "INFO: task a:1 blocked", LogOrigin::UserSpace);
        hung.what = LogWhat::HungTask;
        log.apply(&hung);
        assert_eq!(log.lines.len(), DISTINCT_PER_KIND + 2);
        // A folded batch's line keeps its count.
        let mut batch = xid(20_002, 1, "x", LogOrigin::Kernel);
        batch.count = 500;
        batch.last_t_ns = Some(300_000);
        log.apply(&batch);
        let k = log.lines.iter().find(|l| l.origin == LogOrigin::Kernel).unwrap();
        assert_eq!((k.count, k.last_ns()), (501, 300_000));
        // A daemon's window: lines last seen before the horizon leave, and make room.
        log.forget_before(250_000);
        assert_eq!(log.lines.len(), 1);
        log.apply(&xid(30_000, 99_999, "x", LogOrigin::UserSpace));
        assert_eq!(log.lines.len(), 2);
    }

    #[test]
    fn the_facility_says_who_wrote_the_line() {
        assert_eq!(LogOrigin::of_facility(0, false), LogOrigin::Kernel);
        assert_eq!(LogOrigin::of_facility(0, true), LogOrigin::Kernel);
        assert_eq!(LogOrigin::of_facility(1, false), LogOrigin::UserSpace);
        assert_eq!(LogOrigin::of_facility(3, true), LogOrigin::UserSpaceTrusted);
        assert!(!LogOrigin::UserSpace.is_trusted() && LogOrigin::UserSpaceTrusted.is_trusted());
        // Older recordings say nothing of it: the kernel's, one line.
        let old: KernelLogLine = serde_json::from_str(
            r#"{"t_ns":1,"seq":2,"what":"gpu_xid","xid":79,"text":"NVRM: Xid"}"#,
        )
        .unwrap();
        assert_eq!((old.origin, old.count, old.last_ns()), (LogOrigin::Kernel, 1, 1));
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("origin") && !json.contains("count"), "{json}");
    }
}
