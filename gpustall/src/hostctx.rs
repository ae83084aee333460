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

use serde::Serialize;

/// v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX * page size);
/// anything this large is no real limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// /proc/diskstats counts sectors of 512 bytes whatever the device's sector size.
const SECTOR_BYTES: u64 = 512;

/// The memory cgroup of a process: the limit that makes reclaim and the OOM killer act on the
/// job long before the host runs out.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct CgroupMem {
    /// The cgroup path as /proc/PID/cgroup shows it, e.g. "/gpustall-test-x".
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// `None` = unlimited ("max" in v2, or >= 2^60 in v1).
    pub limit_bytes: Option<u64>,
    pub usage_bytes: u64,
    /// v1 memory.max_usage_in_bytes; v2 memory.peak (kernel 5.19+).
    pub peak_bytes: Option<u64>,
    /// v1 memsw.usage - usage; v2 memory.swap.current.
    pub swap_usage_bytes: Option<u64>,
    /// v1 memory.oom_control `oom_kill`; v2 memory.events `oom_kill`.
    pub oom_kills: Option<u64>,
    /// How often usage hit the limit: v1 memory.failcnt; v2 memory.events `max`.
    pub failcnt: Option<u64>,
}

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

/// Host-wide memory: a job without a cgroup limit is squeezed by the host's MemAvailable.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct HostMem {
    pub mem_total_kb: u64,
    pub mem_available_kb: u64,
    pub swap_total_kb: u64,
    pub swap_free_kb: u64,
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

/// Host-wide reclaim, swap and OOM activity between two /proc/vmstat readings: the evidence
/// of memory pressure even for the events the eBPF side could not attribute.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct VmDelta {
    pub pswpin: u64,
    pub pswpout: u64,
    pub pgmajfault: u64,
    pub oom_kill: u64,
    pub pgscan_direct: u64,
    pub pgsteal_direct: u64,
    pub pgscan_kswapd: u64,
    /// The sum of allocstall_* (one counter per zone: dma, dma32, normal, movable, device).
    pub allocstall: u64,
}

pub fn vm_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> VmDelta {
    let d = |key: &str| {
        let a = after.get(key).copied().unwrap_or(0);
        a.saturating_sub(before.get(key).copied().unwrap_or(0))
    };
    // Zones differ between machines, so sum whichever allocstall_* this kernel has.
    let allocstall =
        after.keys().filter(|k| k.starts_with("allocstall")).map(|k| d(k)).sum::<u64>();
    VmDelta {
        pswpin: d("pswpin"),
        pswpout: d("pswpout"),
        pgmajfault: d("pgmajfault"),
        oom_kill: d("oom_kill"),
        pgscan_direct: d("pgscan_direct"),
        pgsteal_direct: d("pgsteal_direct"),
        pgscan_kswapd: d("pgscan_kswapd"),
        allocstall,
    }
}

/// One line of /proc/diskstats, cumulative since boot.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct DiskStat {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Milliseconds the device had I/O in flight (field 10 of the documented layout).
    pub io_ticks_ms: u64,
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

/// A disk's activity over an interval: 100% busy with reclaim I/O is the "disk is the problem"
/// symptom that memory pressure often causes.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct DiskBusy {
    pub name: String,
    /// "maj:min", to match the device numbers of block tracepoints.
    pub dev: String,
    pub busy_pct: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// Busy share and bytes per disk between two readings `elapsed_ms` apart. Disks that appear
/// only in `after` (hot-plugged) have no baseline and are left out.
pub fn disk_busy(before: &[DiskStat], after: &[DiskStat], elapsed_ms: u64) -> Vec<DiskBusy> {
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.major == a.major && b.minor == a.minor)?;
            let ticks = a.io_ticks_ms.saturating_sub(b.io_ticks_ms);
            // io_ticks advance in jiffies and are sampled at slightly different moments than
            // our clock, so the raw ratio can exceed 100%.
            let busy_pct = if elapsed_ms == 0 {
                0.0
            } else {
                (ticks as f64 * 100.0 / elapsed_ms as f64).min(100.0)
            };
            Some(DiskBusy {
                name: a.name.clone(),
                dev: format!("{}:{}", a.major, a.minor),
                busy_pct,
                read_bytes: a.read_bytes.saturating_sub(b.read_bytes),
                write_bytes: a.write_bytes.saturating_sub(b.write_bytes),
            })
        })
        .collect()
}

/// Space on the filesystem holding a path (the dataset, the checkpoint directory): a full disk
/// stalls a job in a way that looks like slow I/O.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct FsUsage {
    pub path: String,
    pub total_bytes: u64,
    /// Available to unprivileged users (root's reserved blocks excluded), as df shows.
    pub avail_bytes: u64,
    /// As df's Use%: used / (used + available), so it reaches 100 when users can write no more.
    pub used_pct: f64,
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

/// What a task is doing: a job whose processes sit in D state with a wchan in the block layer
/// is hung on I/O; at 0 CPU in S state it is waiting or deadlocked.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct TaskState {
    pub pid: u32,
    /// R S D T t Z I X, as in /proc/PID/stat.
    pub state: char,
    /// The kernel function the task sleeps in; "" when running or hidden.
    pub wchan: String,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    pub majflt: u64,
    /// /proc/PID/io, readable only by the owner or with CAP_SYS_PTRACE.
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A temp dir removed on drop, to fake /proc and /sys/fs/cgroup.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("gpustall-hostctx-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeRoot(dir)
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }

        fn mkdir(&self, rel: &str) {
            std::fs::create_dir_all(self.0.join(rel)).unwrap();
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const HYBRID: &str = "12:cpu,cpuacct:/job\n5:memory,hugetlb:/job/rank0\n0::/user.slice/x\n";

    #[test]
    fn v1_combined_controllers_line() {
        let r = FakeRoot::new("cg-v1");
        r.write("proc/42/cgroup", HYBRID);
        r.mkdir("cg/memory/job/rank0");
        let (dir, path, v) = memory_cgroup_dir_at(&r.0.join("proc"), &r.0.join("cg"), 42).unwrap();
        assert_eq!((dir, path.as_str(), v), (r.0.join("cg/memory/job/rank0"), "/job/rank0", 1));
    }

    #[test]
    fn v2_line_plain_and_unified() {
        let r = FakeRoot::new("cg-v2");
        r.write("proc/7/cgroup", "0::/gpustall-test-x\n");
        r.write("cg/gpustall-test-x/memory.max", "max\n");
        let got = memory_cgroup_dir_at(&r.0.join("proc"), &r.0.join("cg"), 7).unwrap();
        assert_eq!(got, (r.0.join("cg/gpustall-test-x"), "/gpustall-test-x".to_string(), 2));

        // Hybrid mount: the unified tree lives under cgroup_root/unified.
        r.write("proc/8/cgroup", "0::/svc\n");
        r.write("cg/unified/svc/memory.current", "0\n");
        let got = memory_cgroup_dir_at(&r.0.join("proc"), &r.0.join("cg"), 8).unwrap();
        assert_eq!(got.0, r.0.join("cg/unified/svc"));
        // A v2 directory without memory files is no memory cgroup.
        r.write("proc/9/cgroup", "0::/nomem\n");
        r.mkdir("cg/nomem");
        assert_eq!(memory_cgroup_dir_at(&r.0.join("proc"), &r.0.join("cg"), 9), None);
    }

    #[test]
    fn both_present_prefers_v1_when_its_dir_exists() {
        let r = FakeRoot::new("cg-both");
        r.write("proc/42/cgroup", HYBRID);
        r.write("cg/user.slice/x/memory.current", "1\n");
        let (proc_root, cg_root) = (r.0.join("proc"), r.0.join("cg"));
        // No v1 memory dir: fall back to v2.
        assert_eq!(memory_cgroup_dir_at(&proc_root, &cg_root, 42).unwrap().2, 2);
        r.mkdir("cg/memory/job/rank0");
        assert_eq!(memory_cgroup_dir_at(&proc_root, &cg_root, 42).unwrap().2, 1);
        assert_eq!(memory_cgroup_dir_at(&proc_root, &cg_root, 43), None);
    }

    #[test]
    fn root_cgroup_path_is_the_mount_itself() {
        let r = FakeRoot::new("cg-ns");
        // Inside a cgroup namespace the job's cgroup shows as "/".
        r.write("proc/1/cgroup", "0::/\n");
        r.write("cg/memory.max", "1048576\n");
        let got = memory_cgroup_dir_at(&r.0.join("proc"), &r.0.join("cg"), 1).unwrap();
        assert_eq!(got.0, r.0.join("cg"));
    }

    #[test]
    fn read_v1_memsw_and_oom_control() {
        let r = FakeRoot::new("mem-v1");
        r.write("m/memory.limit_in_bytes", "9223372036854771712\n");
        r.write("m/memory.usage_in_bytes", "1000\n");
        r.write("m/memory.max_usage_in_bytes", "4000\n");
        r.write("m/memory.memsw.usage_in_bytes", "1500\n");
        r.write("m/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
        r.write("m/memory.failcnt", "17\n");
        let m = read_cgroup_mem(&r.0.join("m"), "/job", 1).unwrap();
        let want = CgroupMem {
            path: "/job".into(),
            version: 1,
            limit_bytes: None,
            usage_bytes: 1000,
            peak_bytes: Some(4000),
            swap_usage_bytes: Some(500),
            oom_kills: Some(3),
            failcnt: Some(17),
        };
        assert_eq!(m, want);
        r.write("m/memory.limit_in_bytes", "2147483648\n");
        let m = read_cgroup_mem(&r.0.join("m"), "/job", 1).unwrap();
        assert_eq!(m.limit_bytes, Some(2 << 30));
    }

    #[test]
    fn read_v2_max_and_events() {
        let r = FakeRoot::new("mem-v2");
        r.write("m/memory.max", "max\n");
        r.write("m/memory.current", "123456\n");
        r.write("m/memory.events", "low 0\nhigh 0\nmax 42\noom 2\noom_kill 1\noom_group_kill 0\n");
        let m = read_cgroup_mem(&r.0.join("m"), "/x", 2).unwrap();
        let want = CgroupMem {
            path: "/x".into(),
            version: 2,
            limit_bytes: None,
            usage_bytes: 123456,
            peak_bytes: None,
            swap_usage_bytes: None,
            oom_kills: Some(1),
            failcnt: Some(42),
        };
        assert_eq!(m, want);
        r.write("m/memory.max", "536870912\n");
        r.write("m/memory.peak", "600000000\n");
        r.write("m/memory.swap.current", "4096\n");
        let m = read_cgroup_mem(&r.0.join("m"), "/x", 2).unwrap();
        assert_eq!(
            (m.limit_bytes, m.peak_bytes, m.swap_usage_bytes),
            (Some(512 << 20), Some(600_000_000), Some(4096))
        );
        // A removed cgroup reads as None.
        assert_eq!(read_cgroup_mem(&r.0.join("gone"), "/gone", 2), None);
    }

    #[test]
    fn vm_delta_sums_allocstall_and_saturates() {
        let before = parse_vmstat(
            "pswpin 10\npswpout 100\npgmajfault 5\noom_kill 0\npgscan_direct 1000\n\
             pgsteal_direct 900\npgscan_kswapd 50\nallocstall_normal 2\nallocstall_movable 1\n",
        );
        let after = parse_vmstat(
            "pswpin 15\npswpout 400\npgmajfault 4\noom_kill 1\npgscan_direct 3000\n\
             pgsteal_direct 2500\npgscan_kswapd 80\nallocstall_normal 7\nallocstall_movable 3\n\
             allocstall_dma32 1\n",
        );
        let d = vm_delta(&before, &after);
        let want = VmDelta {
            pswpin: 5,
            pswpout: 300,
            pgmajfault: 0, // went backwards: saturates, never wraps
            oom_kill: 1,
            pgscan_direct: 2000,
            pgsteal_direct: 1600,
            pgscan_kswapd: 30,
            allocstall: 5 + 2 + 1,
        };
        assert_eq!(d, want);
        assert!(!read_vmstat().is_empty(), "/proc/vmstat is readable on Linux");
    }

    const DISKSTATS_1: &str = "\
 259       0 nvme0n1 1000 0 2048 10 500 0 4096 20 0 1000 30 0 0 0 0 0 0
 259       1 nvme0n1p1 900 0 2000 9 400 0 4000 19 0 900 28 0 0 0 0 0 0
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 10 0 8 1 1 0 8 1 0 100 2
garbage line
";

    const DISKSTATS_2: &str = "\
 259       0 nvme0n1 1100 0 4096 12 900 0 8192 40 3 1900 50 0 0 0 0 0 0
 259       1 nvme0n1p1 1000 0 4000 11 800 0 8000 38 3 1800 48 0 0 0 0 0 0
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 10 0 8 1 1 0 8 1 0 3000 2
   8      16 sdb 1 0 8 1 1 0 8 1 0 100 2
";

    #[test]
    fn diskstats_parse_and_busy() {
        let before = parse_diskstats(DISKSTATS_1);
        assert_eq!(before.len(), 4);
        assert_eq!(
            before[0],
            DiskStat {
                name: "nvme0n1".into(),
                major: 259,
                minor: 0,
                read_bytes: 2048 * 512,
                write_bytes: 4096 * 512,
                io_ticks_ms: 1000,
            }
        );
        let after = parse_diskstats(DISKSTATS_2);
        let busy = disk_busy(&before, &after, 1000);
        // sdb has no baseline.
        let names: Vec<&str> = busy.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["nvme0n1", "nvme0n1p1", "loop0", "sda"]);
        assert_eq!(busy[0].dev, "259:0");
        assert!((busy[0].busy_pct - 90.0).abs() < 1e-9);
        assert_eq!((busy[0].read_bytes, busy[0].write_bytes), (2048 * 512, 4096 * 512));
        assert_eq!(busy[3].busy_pct, 100.0, "clamped");
        assert_eq!(disk_busy(&before, &after, 0)[0].busy_pct, 0.0);
    }

    #[test]
    fn whole_disks_drop_partitions_and_idle_loops() {
        let r = FakeRoot::new("sysblock");
        for d in ["nvme0n1", "loop0", "sda"] {
            r.mkdir(&format!("block/{d}"));
        }
        let kept = whole_disks(parse_diskstats(DISKSTATS_2), &r.0.join("block"));
        let names: Vec<&str> = kept.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["nvme0n1", "sda"]);
    }

    #[test]
    fn fs_usage_of_root_is_sane() {
        let u = fs_usage(Path::new("/")).unwrap();
        assert_eq!(u.path, "/");
        assert!(u.total_bytes > 0);
        assert!(u.avail_bytes <= u.total_bytes);
        assert!((0.0..=100.0).contains(&u.used_pct), "{u:?}");
        assert_eq!(fs_usage(Path::new("/no/such/dir/gpustall")), None);
    }

    #[test]
    fn task_state_of_this_process() {
        let me = std::process::id();
        // Burn a little CPU so utime is not 0 at tick granularity.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let t = task_state(me).unwrap();
        assert_eq!(t.pid, me);
        assert!(matches!(t.state, 'R' | 'S'), "{t:?}");
        assert!(t.cpu_ticks > 0, "{t:?}");
        assert!(t.read_bytes.is_some(), "own /proc/self/io is readable");
        assert!(cmdline(me).is_some_and(|c| !c.is_empty()));
        assert!(cwd(me).is_some());
    }

    #[test]
    fn task_state_from_fake_proc() {
        let r = FakeRoot::new("task");
        // A comm with a space and a ')' must not shift the fields.
        r.write(
            "9/stat",
            "9 (pt_data (w) 0) D 1 9 9 0 -1 4194560 100 0 7 0 250 50 0 0 20 0 1 0 5 0 0\n",
        );
        r.write("9/wchan", "folio_wait_bit_common");
        r.write(
            "9/io",
            "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 8192\nwrite_bytes: 0\n",
        );
        let t = task_state_at(&r.0, 9).unwrap();
        let want = TaskState {
            pid: 9,
            state: 'D',
            wchan: "folio_wait_bit_common".into(),
            cpu_ticks: 300,
            majflt: 7,
            read_bytes: Some(8192),
            write_bytes: Some(0),
        };
        assert_eq!(t, want);
        r.write("9/wchan", "0");
        std::fs::remove_file(r.0.join("9/io")).unwrap();
        let t = task_state_at(&r.0, 9).unwrap();
        assert_eq!((t.wchan.as_str(), t.read_bytes), ("", None));
        assert_eq!(task_state_at(&r.0, 10), None);
    }

    #[test]
    fn cmdline_split() {
        assert_eq!(
            split_cmdline(b"python\0train.py\0--log\0x.log\0"),
            ["python", "train.py", "--log", "x.log"]
        );
        assert!(split_cmdline(b"").is_empty());
    }
}
