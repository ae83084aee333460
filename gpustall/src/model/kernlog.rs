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
}

/// One kept line of the kernel log.
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
    /// The line as the kernel logged it (one line, at most 240 bytes).
    pub text: String,
}

/// What the model keeps of the kernel log: the kept lines in order, and how many records the
/// reader could not read (overwritten before it got to them, or a gap in the sequence).
#[derive(Default, Debug, Clone)]
pub struct KernelLog {
    pub lines: Vec<KernelLogLine>,
    pub missed: u64,
}

/// Lines kept at most (the count of missed records goes on).
const LINES_KEPT: usize = 10_000;

impl KernelLog {
    pub fn apply(&mut self, line: &KernelLogLine) {
        if self.lines.len() < LINES_KEPT && self.lines.last().is_none_or(|l| l.seq < line.seq) {
            self.lines.push(line.clone());
        }
    }
}
