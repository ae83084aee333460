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
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::model::host::{DiskStat, FsUsage, HostMem, TaskState, SECTOR_BYTES};

fn read_text(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

pub fn read_host_mem() -> Option<HostMem> {
    use procfs::Current;
    let m = procfs::Meminfo::current().ok()?;
    // procfs 0.18 reports bytes; MemAvailable is missing before Linux 3.14, where free is the
    // closest figure.
    Some(HostMem {
        mem_total_kb: m.mem_total / 1024,
        mem_available_kb: m.mem_available.unwrap_or(m.mem_free) / 1024,
        swap_total_kb: m.swap_total / 1024,
        swap_free_kb: m.swap_free / 1024,
        page_size: page_size(),
    })
}

/// The kernel's page size (sysconf PAGESIZE), `None` if it cannot say.
pub fn page_size() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the running system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}

/// /proc/vmstat as name -> value; lines that do not parse are skipped.
pub fn parse_vmstat(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (k, v) = line.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// /proc/vmstat now; empty when unreadable.
pub fn read_vmstat() -> BTreeMap<String, u64> {
    read_text(Path::new("/proc/vmstat")).map(|t| parse_vmstat(&t)).unwrap_or_default()
}

/// Every device of a /proc/diskstats text, partitions included (see [`read_disks`]).
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

/// Whole disks now: partitions would count the same I/O twice, and idle loop/ram devices are
/// noise. Empty when /proc/diskstats is unreadable.
pub fn read_disks() -> Vec<DiskStat> {
    let all = read_text(Path::new("/proc/diskstats")).map(|t| parse_diskstats(&t));
    whole_disks(all.unwrap_or_default(), Path::new("/sys/block"))
}

/// Keeps the devices that have an entry in `sys_block` (whole disks; partitions have none),
/// dropping loop* and ram* devices that never did I/O, with the devices each is stacked on.
pub fn whole_disks(all: Vec<DiskStat>, sys_block: &Path) -> Vec<DiskStat> {
    all.into_iter()
        .filter(|d| {
            // sysfs spells '/' in a device name (cciss/c0d0) as '!'.
            sys_block.join(d.name.replace('/', "!")).exists()
        })
        .filter(|d| {
            let virtual_dev = d.name.starts_with("loop") || d.name.starts_with("ram");
            !(virtual_dev && d.read_bytes == 0 && d.write_bytes == 0)
        })
        .map(|d| DiskStat { lower: lower_devices(sys_block, &d.name), ..d })
        .collect()
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

pub fn fs_usage(path: &Path) -> Option<FsUsage> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call, and `st` is a valid,
    // writable statvfs that the kernel fills.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    let blocks = st.f_blocks as u64;
    let avail = st.f_bavail as u64;
    let used = blocks.saturating_sub(st.f_bfree as u64);
    // Pseudo filesystems (proc, sysfs) report zero blocks: nothing is used.
    let used_pct =
        if used + avail == 0 { 0.0 } else { used as f64 * 100.0 / (used + avail) as f64 };
    Some(FsUsage {
        path: path.display().to_string(),
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
    })
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

/// The running kernel's release, for the recording header.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests;
