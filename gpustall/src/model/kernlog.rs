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
}
