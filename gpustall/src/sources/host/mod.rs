//! Host context that the eBPF events alone cannot give: the memory cgroup's limit and usage,
//! host MemAvailable and swap, /proc/vmstat counters, disk busy time, free space, and the state
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

use crate::model::host::{CgroupMem, DiskStat, FsUsage, HostMem, TaskState, SECTOR_BYTES};

/// v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX * page size);
/// anything this large is no real limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// The memory cgroup directory of `pid` on this host: (directory, cgroup path, version).
pub fn memory_cgroup_dir(pid: u32) -> Option<(PathBuf, String, u8)> {
    memory_cgroup_dir_at(Path::new("/proc"), Path::new("/sys/fs/cgroup"), pid)
}

/// As [`memory_cgroup_dir`], with /proc at `proc_root` and the cgroup mount at `cgroup_root`.
///
/// v1 memory is preferred when its directory exists: on a hybrid host (v1 memory controller,
/// v2 unified tree for systemd) the v2 directory holds no memory files, the v1 one does.
pub fn memory_cgroup_dir_at(
    proc_root: &Path,
    cgroup_root: &Path,
    pid: u32,
) -> Option<(PathBuf, String, u8)> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let (v1, v2) = parse_proc_cgroup(&text);
    if let Some(path) = v1 {
        let dir = under(&cgroup_root.join("memory"), &path);
        if dir.is_dir() {
            return Some((dir, path, 1));
        }
    }
    let path = v2?;
    [cgroup_root.to_path_buf(), cgroup_root.join("unified")]
        .iter()
        .map(|root| under(root, &path))
        .find(|dir| dir.join("memory.max").exists() || dir.join("memory.current").exists())
        .map(|dir| (dir, path, 2))
}

/// The v1 memory path and the v2 path from a /proc/PID/cgroup text
/// ("hierarchy-id:controllers:path" per line).
fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        // The path may itself contain ':', so split at the first two only.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v1, v2)
}

/// `root` joined with an absolute cgroup path ("/" is the root itself).
fn under(root: &Path, cgroup_path: &str) -> PathBuf {
    let rel = cgroup_path.trim_start_matches('/');
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// Reads the memory files of the cgroup directory `dir`; `None` when its usage is unreadable
/// (the cgroup was removed, or `dir` is not a memory cgroup).
pub fn read_cgroup_mem(dir: &Path, path: &str, version: u8) -> Option<CgroupMem> {
    if version == 1 {
        read_v1(dir, path)
    } else {
        read_v2(dir, path)
    }
}

fn read_v1(dir: &Path, path: &str) -> Option<CgroupMem> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    // memsw counts memory + swap; it exists only with swap accounting on.
    let swap = read_u64(&dir.join("memory.memsw.usage_in_bytes")).map(|m| m.saturating_sub(usage));
    let oom_control = read_text(&dir.join("memory.oom_control"));
    Some(CgroupMem {
        path: path.to_string(),
        version: 1,
        limit_bytes: read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < V1_UNLIMITED),
        usage_bytes: usage,
        peak_bytes: read_u64(&dir.join("memory.max_usage_in_bytes")),
        swap_usage_bytes: swap,
        oom_kills: oom_control.as_deref().and_then(|t| keyed_value(t, "oom_kill")),
        failcnt: read_u64(&dir.join("memory.failcnt")),
    })
}

fn read_v2(dir: &Path, path: &str) -> Option<CgroupMem> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let events = read_text(&dir.join("memory.events"));
    let event = |key| events.as_deref().and_then(|t| keyed_value(t, key));
    Some(CgroupMem {
        path: path.to_string(),
        version: 2,
        // "max" does not parse as a number: unlimited.
        limit_bytes: read_u64(&dir.join("memory.max")),
        usage_bytes: usage,
        peak_bytes: read_u64(&dir.join("memory.peak")),
        swap_usage_bytes: read_u64(&dir.join("memory.swap.current")),
        oom_kills: event("oom_kill"),
        failcnt: event("max"),
    })
}

fn read_text(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn read_u64(path: &Path) -> Option<u64> {
    read_text(path)?.trim().parse().ok()
}

/// The value of `key` in "key value" lines (memory.events, memory.oom_control).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(char::is_whitespace)?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
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
    })
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
    })
}

/// Whole disks now: partitions would count the same I/O twice, and idle loop/ram devices are
/// noise. Empty when /proc/diskstats is unreadable.
pub fn read_disks() -> Vec<DiskStat> {
    let all = read_text(Path::new("/proc/diskstats")).map(|t| parse_diskstats(&t));
    whole_disks(all.unwrap_or_default(), Path::new("/sys/block"))
}

/// Keeps the devices that have an entry in `sys_block` (whole disks; partitions have none),
/// dropping loop* and ram* devices that never did I/O.
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
        .collect()
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
mod tests;
