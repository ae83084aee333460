//! The kernel log as a source: /dev/kmsg, the structured interface (one record per read, each
//! with its sequence number and CLOCK_MONOTONIC time), followed from the start of the trace.
//! Only the lines a verdict can use are kept ([`classify`]: a table of patterns over real
//! kernel lines); everything else is dropped here and never recorded, since the log can hold
//! other users' data. Records the reader missed (overwritten in the kernel's buffer before it
//! read them: a gap in the sequence) are counted. A record's facility says who wrote it: the
//! kernel (0), or user space (any other: /dev/kmsg forces one on what it is given), whose lines
//! are kept as such and never taken for the kernel's ([`LogOrigin`]). A read's lines are
//! folded as they come (`model::kernlog::KernelLog`): a flood of them is a few lines and
//! counts.

use std::fs::File;
use std::io::{ErrorKind, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::OpenOptionsExt as _;
use std::sync::LazyLock;

use regex::Regex;

use crate::model::kernlog::{KernelLog, KernelLogLine, LogOrigin, LogWhat};

/// Records read at most at open, to find the last one's sequence number.
const OPEN_DRAIN_MAX: usize = 1_000_000;

/// The longest text kept of a line.
const TEXT_MAX: usize = 240;

/// A record's header and message: "PRI,SEQ,TS_USEC,FLAGS[,..];MESSAGE\n[ KEY=VALUE\n...]".
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The syslog facility (PRI >> 3): 0 is the kernel's own, any other user space's.
    pub facility: u32,
    pub seq: u64,
    pub ts_usec: u64,
    pub message: &'a str,
}

/// Splits one /dev/kmsg record; `None` for anything else.
pub fn parse_record(text: &str) -> Option<Record<'_>> {
    let (head, rest) = text.split_once(';')?;
    let mut f = head.split(',');
    // PRI = facility * 8 + level.
    let prio: u32 = f.next()?.parse().ok()?;
    let seq = f.next()?.parse().ok()?;
    let ts_usec = f.next()?.parse().ok()?;
    let message = rest.split('\n').next().unwrap_or("");
    Some(Record { facility: prio >> 3, seq, ts_usec, message })
}

/// /dev/kmsg writes bytes outside printable ASCII as `\xNN`; the text is kept as it came.
struct Pattern {
    what: LogWhat,
    re: Regex,
}

/// The patterns, each with the named groups it can fill: `pid`, `comm`, `dev`, `xid`.
static PATTERNS: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    let p = |what, re: &str| Pattern { what, re: Regex::new(re).expect("a valid pattern") };
    vec![
        // NVIDIA's driver: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has
        // fallen off the bus." (older drivers: no pid and name; unknown ones: '<unknown>').
        p(
            LogWhat::GpuXid,
            r"NVRM: Xid \(PCI:(?P<dev>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),(?: pid=(?:(?P<pid>\d+)|'?<unknown>'?), name=(?P<comm>[^,]*),)?",
        ),
        p(
            LogWhat::HungTask,
            r"INFO: task (?P<comm>.+):(?P<pid>\d+) blocked for more than \d+ seconds",
        ),
        p(
            LogWhat::SoftLockup,
            r"BUG: soft lockup - CPU#\d+ stuck for \d+s! \[(?P<comm>.+):(?P<pid>\d+)\]",
        ),
        p(LogWhat::IoError, r"(?:^|: )I/O error, dev (?P<dev>[^,\s]+), sector"),
        p(LogWhat::IoError, r"Buffer I/O error on dev(?:ice)? (?P<dev>[^,\s]+),"),
        p(LogWhat::FsError, r"EXT[234]-fs (?:error|warning) \(device (?P<dev>[^)]+)\)"),
        p(
            LogWhat::FsError,
            r"XFS \((?P<dev>[^)]+)\): .*(?:[Cc]orruption|I/O [Ee]rror|shut(?:ting)? down)",
        ),
        p(LogWhat::FsError, r"BTRFS (?:error|critical) \(device (?P<dev>[^)]+)"),
        p(LogWhat::RemoteFsDown, r"nfs: server (?P<dev>\S+) not responding"),
        p(LogWhat::RemoteFsDown, r"CIFS: VFS: \\*(?P<dev>\S+?) has not responded in \d+ seconds"),
        p(LogWhat::RemoteFsUp, r"nfs: server (?P<dev>\S+) OK"),
        p(LogWhat::MachineCheck, r"mce: \[Hardware Error\]|Machine check events logged"),
        p(
            LogWhat::PcieAer,
            r"^(?:\S+ )?(?P<dev>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]): AER: (?:Uncorrected|Multiple Uncorrected|Corrected|Multiple Corrected)",
        ),
        p(
            LogWhat::OomKill,
            r"(?:Out of memory|Memory cgroup out of memory): Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)",
        ),
        p(
            LogWhat::OomCgroup,
            r"^oom-kill:constraint=CONSTRAINT_MEMCG,.*?,oom_memcg=(?P<dev>[^,]+),.*?,task=(?P<comm>[^,]*),pid=(?P<pid>\d+),",
        ),
    ]
});

/// The kept line a message is, or `None` (dropped). `t_ns` and `seq` are the record's; the
/// line is the kernel's (see [`KmsgReader::read`] for the origin).
pub fn classify(message: &str, t_ns: u64, seq: u64) -> Option<KernelLogLine> {
    PATTERNS.iter().find_map(|p| {
        let c = p.re.captures(message)?;
        let text = |name: &str| c.name(name).map(|m| m.as_str().trim().to_string());
        let mut end = message.len().min(TEXT_MAX);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        Some(KernelLogLine {
            t_ns,
            seq,
            what: p.what,
            pid: text("pid").and_then(|s| s.parse().ok()),
            comm: text("comm").filter(|s| !s.is_empty() && s != "<unknown>"),
            device: text("dev"),
            xid: text("xid").and_then(|s| s.parse().ok()),
            text: message[..end].to_string(),
            origin: LogOrigin::Kernel,
            count: 1,
            last_t_ns: None,
        })
    })
}

/// Follows /dev/kmsg from the moment it is opened.
pub struct KmsgReader {
    file: File,
    /// `--trust-user-kernel-log`: user space's lines count as the kernel's.
    trust_user_space: bool,
    /// The last sequence number read.
    last_seq: Option<u64>,
    /// Records missed so far.
    pub missed: u64,
}

impl KmsgReader {
    /// Opens /dev/kmsg at its end (only what the kernel logs from now on), knowing the last
    /// record's sequence number, so that records overwritten before the first read are
    /// counted too. An error says why the kernel log cannot be read (no /dev/kmsg in a
    /// container, CAP_SYSLOG, dmesg_restrict).
    pub fn open(trust_user_space: bool) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")?;
        let mut r = Self { file, trust_user_space, last_seq: None, missed: 0 };
        // Read through what the buffer holds (from its oldest record, where a reader starts):
        // a few thousand records once, for the last one's number, never classified.
        let mut buf = vec![0u8; 8192];
        let mut at_end = false;
        for _ in 0..OPEN_DRAIN_MAX {
            match r.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if let Some(rec) = parse_record(&String::from_utf8_lossy(&buf[..n])) {
                        r.last_seq = Some(r.last_seq.map_or(rec.seq, |l| l.max(rec.seq)));
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    at_end = e.kind() == ErrorKind::WouldBlock;
                    break;
                }
            }
        }
        if !at_end {
            // Not at the end (a log flooding faster than it is read, an error): from the end,
            // the first gap uncounted.
            r.file.seek(SeekFrom::End(0))?;
            r.last_seq = None;
        }
        Ok(r)
    }

    /// Every record logged since the last call, the kept ones classified, those `keep` takes
    /// folded (first seen first): the batch's lines, and how many were dropped (past the cap
    /// of distinct lines, `model::kernlog::DISTINCT_PER_KIND`).
    pub fn read(
        &mut self,
        mut keep: impl FnMut(&KernelLogLine) -> bool,
    ) -> (Vec<KernelLogLine>, u64) {
        let mut out = KernelLog::default();
        let mut buf = vec![0u8; 8192];
        // Bounded: a log flooding faster than this is read again next beat.
        for _ in 0..10_000 {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    if let Some(r) = parse_record(&text) {
                        self.note_seq(r.seq);
                        let t_ns = r.ts_usec.saturating_mul(1000);
                        if let Some(mut line) = classify(r.message, t_ns, r.seq) {
                            line.origin = LogOrigin::of_facility(r.facility, self.trust_user_space);
                            if keep(&line) {
                                out.apply(&line);
                            }
                        }
                    }
                }
                // Overwritten before we read it: the reader moved to the oldest record kept;
                // the gap in the sequence counts what was lost.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::debug!("reading /dev/kmsg: {e}");
                    break;
                }
            }
        }
        (out.take_lines(), out.dropped)
    }

    fn note_seq(&mut self, seq: u64) {
        if let Some(last) = self.last_seq {
            self.missed += seq.saturating_sub(last).saturating_sub(1);
        }
        self.last_seq = Some(self.last_seq.map_or(seq, |l| l.max(seq)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a line is kept as: (what, pid, comm, device).
    type Kept = (LogWhat, Option<u32>, Option<String>, Option<String>);

    fn what(line: &str) -> Option<Kept> {
        classify(line, 1, 2).map(|l| (l.what, l.pid, l.comm, l.device))
    }

    #[test]
    fn records_split_into_sequence_time_and_message() {
        let r = parse_record(
            "3,1234,5678901,-;nfs: server nas1 not responding, still trying\n SUBSYSTEM=x\n",
        );
        assert_eq!(
            r,
            Some(Record {
                facility: 0,
                seq: 1234,
                ts_usec: 5678901,
                message: "nfs: server nas1 not responding, still trying"
            })
        );
        assert_eq!(parse_record("garbage"), None);
        // `<3>line` written to /dev/kmsg from user space: PRI 11, facility 1 (LOG_USER).
        assert_eq!(parse_record("11,9,1,-;NVRM: Xid").map(|r| r.facility), Some(1));
        assert_eq!(parse_record("30,9,1,-;x").map(|r| r.facility), Some(3));
    }

    /// Real lines, as the kernel and NVIDIA's driver print them.
    #[test]
    fn the_patterns_keep_the_lines_that_matter_and_nothing_else() {
        let x = classify(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            5,
            9,
        )
        .unwrap();
        assert_eq!(
            (x.what, x.xid, x.pid, x.comm.as_deref(), x.device.as_deref()),
            (LogWhat::GpuXid, Some(79), Some(1234), Some("python3"), Some("0000:3b:00"))
        );
        let old = classify(
            "NVRM: Xid (PCI:0000:03:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)",
            5,
            9,
        )
        .unwrap();
        assert_eq!((old.xid, old.pid), (Some(13), None));
        let unknown = classify("NVRM: Xid (PCI:0000:ca:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC response from GPU1 GSP!", 5, 9).unwrap();
        assert_eq!((unknown.xid, unknown.pid, unknown.comm), (Some(119), None, None));
        assert_eq!(
            what("INFO: task pt_data_worker:4321 blocked for more than 120 seconds."),
            Some((LogWhat::HungTask, Some(4321), Some("pt_data_worker".into()), None))
        );
        assert_eq!(
            what("watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python3:777]"),
            Some((LogWhat::SoftLockup, Some(777), Some("python3".into()), None))
        );
        assert_eq!(
            what("I/O error, dev sdb, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2"),
            Some((LogWhat::IoError, None, None, Some("sdb".into())))
        );
        assert_eq!(what("blk_update_request: I/O error, dev nvme0n1, sector 1953525168 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 0").map(|w| w.3), Some(Some("nvme0n1".into())));
        assert_eq!(
            what("Buffer I/O error on dev dm-3, logical block 0, async page read").map(|w| w.3),
            Some(Some("dm-3".into()))
        );
        assert_eq!(what("EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0").map(|w| (w.0, w.3)), Some((LogWhat::FsError, Some("sda1".into()))));
        assert_eq!(what("XFS (nvme1n1): Corruption of in-memory data (0x8) detected at xfs_trans_cancel+0x13f/0x170 (fs/xfs/xfs_trans.c:1097).  Shutting down filesystem.").map(|w| w.0), Some(LogWhat::FsError));
        assert_eq!(
            what("nfs: server 10.0.0.5 not responding, still trying").map(|w| (w.0, w.3)),
            Some((LogWhat::RemoteFsDown, Some("10.0.0.5".into())))
        );
        assert_eq!(
            what("nfs: server 10.0.0.5 OK").map(|w| (w.0, w.3)),
            Some((LogWhat::RemoteFsUp, Some("10.0.0.5".into())))
        );
        assert_eq!(
            what("CIFS: VFS: \\\\fileserver has not responded in 180 seconds. Reconnecting...")
                .map(|w| (w.0, w.3)),
            Some((LogWhat::RemoteFsDown, Some("fileserver".into())))
        );
        assert_eq!(
            what("mce: [Hardware Error]: Machine check events logged").map(|w| w.0),
            Some(LogWhat::MachineCheck)
        );
        assert_eq!(
            what("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0")
                .map(|w| (w.0, w.3)),
            Some((LogWhat::PcieAer, Some("0000:00:01.0".into())))
        );
        assert_eq!(what("Out of memory: Killed process 28585 (pt_data_worker) total-vm:4194304kB, anon-rss:179204kB").map(|w| (w.0, w.1)), Some((LogWhat::OomKill, Some(28585))));
        assert_eq!(
            what("Memory cgroup out of memory: Killed process 9 (python3) total-vm:1kB")
                .map(|w| w.1),
            Some(Some(9))
        );
        // Dropped: everything else (users' data may be in the log).
        for other in [
            "audit: type=1400 audit(1): apparmor=\"DENIED\"",
            "usb 1-1: new high-speed USB device",
            "EXT4-fs (sda1): mounted filesystem",
            "nfs: server foo mounted",
            "",
        ] {
            assert_eq!(what(other), None, "{other}");
        }
    }

    /// A memory cgroup's OOM report names the cgroup; a global one is not kept.
    #[test]
    fn the_oom_report_names_the_memory_cgroup() {
        let memcg = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/gpustall-test-oom-28890-0,task_memcg=/gpustall-test-oom-28890-0,task=pt_data_worker,pid=28897,uid=0";
        let l = classify(memcg, 5, 6).expect("kept");
        assert_eq!(
            (l.what, l.pid, l.device.as_deref()),
            (LogWhat::OomCgroup, Some(28897), Some("/gpustall-test-oom-28890-0"))
        );
        // A global OOM names no memory cgroup: not this line's news.
        assert!(classify("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=x,pid=5,uid=0", 5, 6).is_none());
    }

    #[test]
    fn a_long_line_is_cut_at_a_character_boundary() {
        let long = format!("INFO: task é{}:1 blocked for more than 1 seconds.", "é".repeat(200));
        let l = classify(&long, 0, 0).unwrap();
        assert!(l.text.len() <= TEXT_MAX && l.text.starts_with("INFO: task"));
    }
}
