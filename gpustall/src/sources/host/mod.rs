//! Host context that the eBPF events alone cannot give (the memory cgroup's are in
//! `sources::cgroup`): host MemAvailable and swap, /proc/vmstat counters, disk busy time, free space, and the state
//! of a task (R/S/D, wchan).
//!
//! Why: a verdict such as "the workers hit the cgroup limit and the disk was busy with swap"
//! needs the limit, the swap counters and the disk's busy share as measured figures; and the
//! stalls that are *not* memory (a full disk, a task stuck in D state, a deadlock at 0% CPU)
//! are told apart by these same readings.
//!
//! Every reader returns `None` (or an empty collection) when the file is missing or unreadable:
//! these run in the agent's loop, against processes that may exit at any moment, so they never
//! panic. Parsing is split from reading and takes text or a root directory, so the unit tests run
//! on hand-built inputs (a temp dir that fakes /proc or /sys/fs/cgroup).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::host::{DiskStat, FsUsage, HostMem, TaskState, SECTOR_BYTES};

/// A /proc, /sys or cgroup file's text. Not `std::fs::read_to_string`: it sizes its buffer
/// from the file's length (a statx and an lseek), which these files report as 0 or 4096; the
/// agent reads some forty of them a second.
pub fn read_text(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::with_capacity(4096);
    // Through `Take`, whose read_to_end asks no size.
    file.by_ref().take(u64::MAX).read_to_end(&mut bytes).ok()?;
    Some(lossy(bytes))
}

/// Text that may hold a process's name: /proc/PID/status and stat carry the name as the
/// kernel has it, any bytes (prctl(PR_SET_NAME) takes anything). Read strictly, one such name
/// made the process unreadable, then "vanished", and its job lost every metric.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

pub fn read_host_mem() -> Option<HostMem> {
    parse_meminfo(&read_text(Path::new("/proc/meminfo"))?)
}

/// The host memory figures of a /proc/meminfo text (kB); MemAvailable is missing before Linux
/// 3.14, where MemFree is the closest figure. Only the five lines it needs are parsed.
pub fn parse_meminfo(text: &str) -> Option<HostMem> {
    let (mut total, mut avail, mut free, mut swap_total, mut swap_free) =
        (None, None, None, None, None);
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else { continue };
        let slot = match key {
            "MemTotal" => &mut total,
            "MemAvailable" => &mut avail,
            "MemFree" => &mut free,
            "SwapTotal" => &mut swap_total,
            "SwapFree" => &mut swap_free,
            _ => continue,
        };
        *slot = rest.split_whitespace().next().and_then(|v| v.parse::<u64>().ok());
    }
    Some(HostMem {
        mem_total_kb: total?,
        mem_available_kb: avail.or(free)?,
        swap_total_kb: swap_total.unwrap_or(0),
        swap_free_kb: swap_free.unwrap_or(0),
        page_size: page_size(),
    })
}

/// The kernel's page size (sysconf PAGESIZE), `None` if it cannot say.
pub fn page_size() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the running system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}

/// /proc/vmstat as name -> value, the counters `wanted` keeps (the others, ~180 of them, are
/// never copied); lines that do not parse are skipped.
pub fn parse_vmstat_keys(text: &str, wanted: impl Fn(&str) -> bool) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (k, v) = line.split_once(' ')?;
            if !wanted(k) {
                return None;
            }
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The counters of /proc/vmstat that `wanted` keeps; empty when unreadable.
pub fn read_vmstat_keys(wanted: impl Fn(&str) -> bool) -> BTreeMap<String, u64> {
    read_text(Path::new("/proc/vmstat")).map(|t| parse_vmstat_keys(&t, wanted)).unwrap_or_default()
}

/// Every device of a /proc/diskstats text, partitions included (see
/// [`DiskTopology::read_disks`]).
pub fn parse_diskstats(text: &str) -> Vec<DiskStat> {
    text.lines().filter_map(parse_diskstats_line).collect()
}

/// Layout (Documentation/admin-guide/iostats.rst): major minor name, then reads completed,
/// reads merged, sectors read, ms reading, writes completed, writes merged, sectors written,
/// ms writing, I/Os in progress, ms doing I/O, ...
fn parse_diskstats_line(line: &str) -> Option<DiskStat> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 13 {
        return None;
    }
    let num = |i: usize| f[i].parse::<u64>().ok();
    Some(DiskStat {
        name: f[2].to_string(),
        major: f[0].parse().ok()?,
        minor: f[1].parse().ok()?,
        read_bytes: num(5)?.saturating_mul(SECTOR_BYTES),
        write_bytes: num(9)?.saturating_mul(SECTOR_BYTES),
        io_ticks_ms: num(12)?,
        lower: Vec::new(),
    })
}

/// Re-read /sys/block at least this often even when the device names stay the same.
const TOPOLOGY_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// Which devices are whole disks and what each sits on, as /sys/block says: looked up once
/// per device name and kept, not looked up every second (a dozen stats and directory reads a
/// beat on a small VM). Looked up again when the names in /proc/diskstats change (a device
/// added or removed) and every [`TOPOLOGY_REFRESH`].
pub struct DiskTopology {
    sys_block: PathBuf,
    /// Per device name: `None` for a partition, else the devices it is stacked on.
    known: BTreeMap<String, Option<Vec<String>>>,
    looked_up: Option<std::time::Instant>,
}

impl DiskTopology {
    pub fn new(sys_block: &Path) -> Self {
        Self { sys_block: sys_block.to_path_buf(), known: BTreeMap::new(), looked_up: None }
    }

    /// Whole disks now: partitions would count the same I/O twice, and idle loop/ram devices
    /// are noise. Empty when /proc/diskstats is unreadable.
    pub fn read_disks(&mut self) -> Vec<DiskStat> {
        let all = read_text(Path::new("/proc/diskstats")).map(|t| parse_diskstats(&t));
        self.whole_disks(all.unwrap_or_default())
    }

    /// Keeps the devices of `all` that have an entry in /sys/block (whole disks; partitions
    /// have none), dropping loop* and ram* devices that never did I/O, with the devices each
    /// is stacked on.
    pub fn whole_disks(&mut self, all: Vec<DiskStat>) -> Vec<DiskStat> {
        let same_names =
            all.len() == self.known.len() && all.iter().all(|d| self.known.contains_key(&d.name));
        let fresh = self.looked_up.is_some_and(|t| t.elapsed() < TOPOLOGY_REFRESH);
        if !(same_names && fresh) {
            self.known.clear();
            self.looked_up = Some(std::time::Instant::now());
        }
        all.into_iter()
            .filter_map(|d| {
                let sys_block = &self.sys_block;
                let lower = self
                    .known
                    .entry(d.name.clone())
                    .or_insert_with(|| look_up(sys_block, &d.name))
                    .clone()?;
                let virtual_dev = d.name.starts_with("loop") || d.name.starts_with("ram");
                let idle = d.read_bytes == 0 && d.write_bytes == 0;
                (!(virtual_dev && idle)).then_some(DiskStat { lower, ..d })
            })
            .collect()
    }
}

/// A device as /sys/block has it: `None` for a partition (no entry), else what it sits on.
fn look_up(sys_block: &Path, name: &str) -> Option<Vec<String>> {
    // sysfs spells '/' in a device name (cciss/c0d0) as '!'.
    sys_block.join(name.replace('/', "!")).exists().then(|| lower_devices(sys_block, name))
}

/// What a stacked device (dm, md) sits on: the names in `sys_block/NAME/slaves`, sorted.
fn lower_devices(sys_block: &Path, name: &str) -> Vec<String> {
    let dir = sys_block.join(name.replace('/', "!")).join("slaves");
    let mut lower: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    lower.sort();
    lower
}

/// A directory opened only to name it (O_PATH): no read permission needed, nothing read, and
/// never a FIFO or device a job put at the path (O_DIRECTORY).
pub fn open_dir(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(path)
        .ok()
}

/// Space on the filesystem of an open directory, as df shows it, and which filesystem it is.
pub fn fs_usage_of(dir: &std::fs::File) -> Option<FsUsage> {
    use std::os::{fd::AsRawFd, unix::fs::MetadataExt};
    // SAFETY: statvfs is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open for the call (borrowed from `dir`), and `st` is a valid,
    // writable statvfs that the kernel fills.
    let rc = unsafe { libc::fstatvfs(dir.as_raw_fd(), &mut st) };
    if rc != 0 {
        return None;
    }
    let dev = dir.metadata().ok().map(|m| {
        let d = m.dev();
        format!("{}:{}", libc::major(d), libc::minor(d))
    });
    let frsize = st.f_frsize as u64;
    let blocks = st.f_blocks as u64;
    let avail = st.f_bavail as u64;
    let used = blocks.saturating_sub(st.f_bfree as u64);
    // Pseudo filesystems (proc, sysfs) report zero blocks: nothing is used.
    let used_pct =
        if used + avail == 0 { 0.0 } else { used as f64 * 100.0 / (used + avail) as f64 };
    Some(FsUsage {
        path: String::new(),
        dev,
        total_bytes: blocks.saturating_mul(frsize),
        avail_bytes: avail.saturating_mul(frsize),
        used_pct,
    })
}

pub fn task_state(pid: u32) -> Option<TaskState> {
    task_state_at(Path::new("/proc"), pid)
}

/// As [`task_state`], with /proc at `proc_root`; `None` once the process is gone.
pub fn task_state_at(proc_root: &Path, pid: u32) -> Option<TaskState> {
    let dir = proc_root.join(pid.to_string());
    let stat = parse_stat(&read_text(&dir.join("stat"))?)?;
    // The kernel prints "0" for a running task; hardened kernels hide the symbol the same way.
    let wchan = read_text(&dir.join("wchan")).map(|w| w.trim().to_string()).unwrap_or_default();
    let io = read_text(&dir.join("io"));
    let io_field = |key| io.as_deref().and_then(|t| keyed_value_colon(t, key));
    Some(TaskState {
        pid,
        state: stat.state,
        wchan: if wchan == "0" { String::new() } else { wchan },
        cpu_ticks: stat.utime.saturating_add(stat.stime),
        majflt: stat.majflt,
        read_bytes: io_field("read_bytes"),
        write_bytes: io_field("write_bytes"),
        runs: read_text(&dir.join("schedstat")).and_then(|t| schedstat_runs(&t)),
    })
}

/// The third field of /proc/PID/schedstat: how many times the task was scheduled to run.
fn schedstat_runs(text: &str) -> Option<u64> {
    text.split_whitespace().nth(2)?.parse().ok()
}

/// Major faults from a /proc/PID/stat text.
pub fn stat_majflt(text: &str) -> Option<u64> {
    parse_stat(text).map(|s| s.majflt)
}

struct StatFields {
    state: char,
    majflt: u64,
    utime: u64,
    stime: u64,
}

/// The fields of /proc/PID/stat that [`TaskState`] needs. comm may hold spaces and ')', so the
/// fields are counted from the last ')'.
fn parse_stat(text: &str) -> Option<StatFields> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After comm: state(0) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt(9)
    // cmajflt utime(11) stime(12), per proc(5).
    let num = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(StatFields {
        state: f.first()?.chars().next()?,
        majflt: num(9)?,
        utime: num(11)?,
        stime: num(12)?,
    })
}

/// The value of `key` in "key: value" lines (/proc/PID/io).
fn keyed_value_colon(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if k.trim() == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

/// The arguments of `pid`; empty for kernel threads and zombies, `None` once it is gone.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(split_cmdline(&raw))
}

/// Splits NUL-separated arguments; the kernel ends the last one with a NUL too.
fn split_cmdline(raw: &[u8]) -> Vec<String> {
    let trimmed = raw.strip_suffix(b"\0").unwrap_or(raw);
    if trimmed.is_empty() {
        return Vec::new();
    }
    trimmed.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// The working directory of `pid`, to resolve relative paths in its command line (a log file,
/// a dataset root).
pub fn cwd(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

/// This machine's name, for the recording header.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The name the node goes by: NODE_NAME where the deployment sets it (a DaemonSet's pod has
/// the pod's name as its hostname, not the node's), else the hostname.
pub fn node_name() -> String {
    std::env::var("NODE_NAME").ok().filter(|n| !n.trim().is_empty()).unwrap_or_else(hostname)
}

/// The running kernel's release, for the recording header.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests;
