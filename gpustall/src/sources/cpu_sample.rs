//! The CPU side of the job's surroundings, read once a beat into a [`CpuSample`]: the job's CPU
//! cgroup (v1 `cpu` controller or v2) with its ancestors' quotas and cpu.stat throttling
//! counters, the CPUs online and those the job may run on, the host's busy time (/proc/stat),
//! the processes outside the traced tree that used the most CPU since the last beat (a scan of
//! /proc/*/stat), and the traced processes blocked reading a socket (/proc/PID/syscall, the fd's
//! socket inode, its peer from /proc/PID/net/tcp{,6}) or a file on a network or FUSE filesystem
//! (the fd's mount id in /proc/PID/fdinfo, its type and source in /proc/PID/mountinfo).
//!
//! Readers return `None` or nothing when a file is missing: processes and cgroups come and go.
//! Parsing is split from reading and unit-tested on text.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::model::cpu::{CpuCgroup, CpuLevel, CpuSample, OtherCpu, SocketWait};
use crate::sources::cgroup::mounts::{self, CgroupMount};
use crate::sources::host::read_text;

/// Processes outside the job kept per beat (the top CPU consumers of the interval).
const TOP_OTHERS: usize = 6;

/// CPU time the host spent outside the job and this agent since the last scan of /proc/*/stat
/// before the next is worth its cost (a read of every process's stat file: on an idle host
/// most of the agent's reads). A quarter of a CPU-second: a neighbour that uses half a CPU, the
/// least the verdicts weigh, is scanned at every beat; a quiet host about never. The scans'
/// deltas add up to the same totals whenever they run, less what processes that came and went
/// between two scans used.
const SCAN_AFTER_CPU_S: f64 = 0.25;

/// A CPU cgroup directory and the mount it lies under.
#[derive(Clone, Debug)]
struct CpuCgroupDir {
    dir: PathBuf,
    path: String,
    version: u8,
    mount_point: PathBuf,
}

/// Reads a [`CpuSample`] each beat for one traced job.
pub struct CpuReader {
    target: u32,
    cgroup: Option<CpuCgroupDir>,
    /// The ticks each process outside the job had at the previous scan.
    prev: HashMap<u32, u64>,
    /// The host's, the job's and the agent's ticks at the previous scan (`None`: none yet).
    scanned_at: Option<Ticks>,
    own_pid: u32,
}

/// Busy ticks at one reading: the host's (/proc/stat), the job's live processes' and the
/// agent's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticks {
    pub host: u64,
    pub job: u64,
    pub agent: u64,
}

/// Whether processes outside the job may have used `after` ticks or more since the scan at
/// `last`: the host's busy time the job and the agent do not explain. A process of the job
/// that exited takes its ticks out of the job's sum: its share counts as others', which only
/// brings the scan sooner.
pub fn others_may_have_used(last: Option<Ticks>, now: Ticks, after: u64) -> bool {
    let Some(last) = last else { return true };
    let host = now.host.saturating_sub(last.host);
    let ours = now.job.saturating_sub(last.job) + now.agent.saturating_sub(last.agent);
    host.saturating_sub(ours) >= after
}

impl CpuReader {
    pub fn new(target: u32) -> Self {
        Self {
            target,
            cgroup: find_cpu_cgroup(target),
            prev: HashMap::new(),
            scanned_at: None,
            own_pid: std::process::id(),
        }
    }

    /// One reading; `alive` are the traced processes (left out of the scan of the others),
    /// `job_ticks` the CPU ticks they used so far.
    pub fn read(&mut self, alive: &[u32], job_ticks: u64) -> CpuSample {
        if self.cgroup.is_none() {
            self.cgroup = find_cpu_cgroup(self.target);
        }
        let clk_tck = sysconf(libc::_SC_CLK_TCK).unwrap_or(100);
        let (busy, total) = read_text(Path::new("/proc/stat"))
            .and_then(|t| parse_proc_stat_cpu(&t))
            .unwrap_or((0, 0));
        let now =
            Ticks { host: busy, job: job_ticks, agent: crate::sources::agent::cpu_ticks(clk_tck) };
        let after = (SCAN_AFTER_CPU_S * clk_tck as f64) as u64;
        let (others, others_ticks) = if others_may_have_used(self.scanned_at, now, after) {
            log::debug!(
                "scanning /proc for CPU outside the job: {:?} then, {now:?} now",
                self.scanned_at
            );
            self.scanned_at = Some(now);
            self.scan_others(alive)
        } else {
            (Vec::new(), 0)
        };
        CpuSample {
            clk_tck,
            online_cpus: sysconf(libc::_SC_NPROCESSORS_ONLN).unwrap_or(1) as u32,
            allowed_cpus: read_text(Path::new(&format!("/proc/{}/status", self.target)))
                .and_then(|t| allowed_cpus(&t)),
            host_busy_ticks: busy,
            host_total_ticks: total,
            cgroup: self.cgroup.as_ref().and_then(read_cpu_cgroup),
            others,
            others_ticks,
            sockets: alive.iter().filter_map(|&p| socket_wait(p)).collect(),
        }
    }

    /// The top CPU consumers outside the job since the previous scan, and what all of them used.
    fn scan_others(&mut self, alive: &[u32]) -> (Vec<OtherCpu>, u64) {
        let job: HashSet<u32> = alive.iter().copied().collect();
        let mut now = HashMap::new();
        let mut used = Vec::new();
        let mut all = 0;
        let Ok(entries) = std::fs::read_dir("/proc") else { return (Vec::new(), 0) };
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if job.contains(&pid) || pid == self.own_pid {
                continue;
            }
            let Some((comm, ticks)) =
                read_text(&e.path().join("stat")).and_then(|t| parse_pid_stat(&t))
            else {
                continue;
            };
            now.insert(pid, ticks);
            // A process new since the last scan used all its ticks in the interval.
            let d = ticks.saturating_sub(self.prev.get(&pid).copied().unwrap_or(0));
            if d > 0 {
                all += d;
                used.push(OtherCpu { pid, comm, ticks: d });
            }
        }
        self.prev = now;
        used.sort_by_key(|o| (std::cmp::Reverse(o.ticks), o.pid));
        used.truncate(TOP_OTHERS);
        (used, all)
    }
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf reads a constant of the running system.
    let n = unsafe { libc::sysconf(name) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}

/// /proc/stat's "cpu" line: (busy, total) ticks, busy being all but idle and iowait (guest time
/// is already in user).
pub fn parse_proc_stat_cpu(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// comm and utime + stime from a /proc/PID/stat text.
pub fn parse_pid_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let f: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let num = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some((comm, num(11)?.saturating_add(num(12)?)))
}

/// The CPU count of /proc/PID/status's Cpus_allowed_list ("0-3,6").
pub fn allowed_cpus(status: &str) -> Option<u32> {
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?.trim();
    let mut n = 0;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<u32>().ok()?.checked_sub(a.parse::<u32>().ok()?)? + 1,
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// The cgroup mounts that hold the cpu controller: v1 hierarchies with "cpu" among their
/// options, and cgroup2 mounts.
pub fn cpu_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    controller_mounts(mountinfo, "cpu")
}

/// The cgroup mounts that hold `controller`: v1 hierarchies with it among their options, and
/// cgroup2 mounts.
pub fn controller_mounts(mountinfo: &str, controller: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let f: Vec<&str> = before.split(' ').collect();
            let mut a = after.split(' ');
            let version = match (a.next()?, a.nth(1).unwrap_or("")) {
                ("cgroup2", _) => 2,
                ("cgroup", opts) if opts.split(',').any(|o| o == controller) => 1,
                _ => return None,
            };
            Some(CgroupMount {
                mount_point: PathBuf::from(f.get(4)?),
                root: f.get(3)?.to_string(),
                version,
            })
        })
        .collect()
}

/// The v1 cpu path and the v2 path of a /proc/PID/cgroup text.
pub fn cpu_paths(text: &str) -> (Option<String>, Option<String>) {
    controller_paths(text, "cpu")
}

/// The v1 path of `controller` and the v2 path of a /proc/PID/cgroup text.
pub fn controller_paths(text: &str, controller: &str) -> (Option<String>, Option<String>) {
    let (mut v1, mut v2) = (None, None);
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == controller) {
            v1 = Some(path.to_string());
        }
    }
    (v1, v2)
}

fn find_cpu_cgroup(pid: u32) -> Option<CpuCgroupDir> {
    let mounts = cpu_mounts(&read_text(Path::new("/proc/self/mountinfo"))?);
    let (v1, v2) = cpu_paths(&read_text(Path::new(&format!("/proc/{pid}/cgroup")))?);
    for (version, seen) in [(1u8, v1), (2, v2)] {
        let Some(seen) = seen else { continue };
        for m in mounts.iter().filter(|m| m.version == version) {
            let Some((dir, path)) = mounts::resolve(m, None, &seen) else { continue };
            let has =
                if version == 1 { dir.join("cpu.cfs_quota_us") } else { dir.join("cpu.stat") };
            if has.exists() {
                return Some(CpuCgroupDir {
                    dir,
                    path,
                    version,
                    mount_point: m.mount_point.clone(),
                });
            }
        }
    }
    None
}

fn read_cpu_cgroup(cg: &CpuCgroupDir) -> Option<CpuCgroup> {
    let names = mounts::lexical(&cg.path).names;
    let dirs: Vec<PathBuf> = std::iter::once(cg.dir.clone())
        .chain(mounts::ancestors(&cg.dir, &cg.mount_point))
        .collect();
    let levels: Vec<CpuLevel> = dirs
        .iter()
        .enumerate()
        .filter_map(|(up, d)| {
            let path = format!("/{}", names[..names.len().saturating_sub(up)].join("/"));
            read_level(d, path, cg.version)
        })
        .collect();
    (!levels.is_empty()).then(|| CpuCgroup { path: cg.path.clone(), version: cg.version, levels })
}

fn read_level(dir: &Path, path: String, version: u8) -> Option<CpuLevel> {
    let stat = read_text(&dir.join("cpu.stat")).unwrap_or_default();
    if version == 1 {
        let quota: i64 = read_text(&dir.join("cpu.cfs_quota_us"))?.trim().parse().ok()?;
        let period = read_text(&dir.join("cpu.cfs_period_us"))?.trim().parse().ok()?;
        Some(parse_level(path, u64::try_from(quota).ok(), period, &stat, 1))
    } else {
        let (quota, period) =
            read_text(&dir.join("cpu.max")).map_or((None, 100_000), |t| parse_cpu_max(&t));
        Some(parse_level(path, quota, period, &stat, 2))
    }
}

/// v2 cpu.max: "max 100000" or "50000 100000".
pub fn parse_cpu_max(text: &str) -> (Option<u64>, u64) {
    let mut f = text.split_whitespace();
    let quota = f.next().and_then(|q| q.parse().ok());
    (quota, f.next().and_then(|p| p.parse().ok()).unwrap_or(100_000))
}

/// One level from its quota and its cpu.stat text (v1 throttled_time is ns, v2 throttled_usec).
pub fn parse_level(
    path: String,
    quota_us: Option<u64>,
    period_us: u64,
    stat: &str,
    version: u8,
) -> CpuLevel {
    let v = |k| crate::sources::cgroup::limits::keyed_value(stat, k).unwrap_or(0);
    CpuLevel {
        path,
        quota_us,
        period_us,
        nr_periods: v("nr_periods"),
        nr_throttled: v("nr_throttled"),
        throttled_us: if version == 1 { v("throttled_time") / 1000 } else { v("throttled_usec") },
    }
}

/// The syscalls that read a socket or a file, by number on this architecture.
fn read_syscall_name(nr: u64) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    let table: &[(u64, &str)] = &[
        (0, "read"),
        (17, "pread64"),
        (19, "readv"),
        (45, "recvfrom"),
        (47, "recvmsg"),
        (295, "preadv"),
        (327, "preadv2"),
    ];
    #[cfg(target_arch = "aarch64")]
    let table: &[(u64, &str)] = &[
        (63, "read"),
        (65, "readv"),
        (67, "pread64"),
        (69, "preadv"),
        (207, "recvfrom"),
        (212, "recvmsg"),
        (286, "preadv2"),
    ];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let table: &[(u64, &str)] = &[];
    table.iter().find(|(n, _)| *n == nr).map(|(_, s)| *s)
}

/// `pid` blocked in a read of a socket (the syscall and the peer) or of a file on a network
/// or FUSE filesystem (the mount's type, source and mount point).
fn socket_wait(pid: u32) -> Option<SocketWait> {
    let text = read_text(Path::new(&format!("/proc/{pid}/syscall")))?;
    let (nr, fd) = parse_syscall(&text)?;
    let syscall = read_syscall_name(nr)?.to_string();
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let Some(inode) = link.to_str().and_then(socket_inode) else {
        let fdinfo = read_text(Path::new(&format!("/proc/{pid}/fdinfo/{fd}")))?;
        let mountinfo = read_text(Path::new(&format!("/proc/{pid}/mountinfo")))?;
        let m = remote_mount(&mountinfo, fdinfo_mnt_id(&fdinfo)?)?;
        let peer = Some(format!("{} ({} at {})", m.source, m.fstype, m.mount_point));
        return Some(SocketWait { pid, syscall, peer, fs: Some(m.fstype) });
    };
    let peer = ["tcp", "tcp6"].iter().find_map(|f| {
        read_text(Path::new(&format!("/proc/{pid}/net/{f}"))).and_then(|t| tcp_peer(&t, inode))
    });
    Some(SocketWait { pid, syscall, peer, fs: None })
}

/// The inode of a "socket:[N]" fd link.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The mount id of an open file, from its /proc/PID/fdinfo/FD text ("mnt_id:\tN").
pub fn fdinfo_mnt_id(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("mnt_id:")).and_then(|v| v.trim().parse().ok())
}

/// A mount whose reads go over the network or to a user-space server.
#[derive(Debug, PartialEq, Eq)]
pub struct RemoteMount {
    pub fstype: String,
    pub source: String,
    pub mount_point: String,
}

/// Filesystem types whose reads wait on a server, not a local block device: network
/// filesystems, and FUSE (s3fs, gcsfuse, sshfs, blobfuse: object stores mounted as files).
fn remote_fstype(t: &str) -> bool {
    const REMOTE: &[&str] = &[
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "9p",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "afs",
        "fuse",
        "fuseblk",
    ];
    REMOTE.contains(&t) || t.starts_with("fuse.")
}

/// The mount `id` in a /proc/PID/mountinfo text when it is a remote one ([`remote_fstype`]).
/// A line: "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS".
pub fn remote_mount(mountinfo: &str, id: u64) -> Option<RemoteMount> {
    let line = mountinfo.lines().find(|l| l.split(' ').next() == Some(&id.to_string()))?;
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let mut r = right.split(' ');
    let (fstype, source) = (r.next()?, r.next()?);
    remote_fstype(fstype).then(|| RemoteMount {
        fstype: fstype.to_string(),
        source: crate::sources::cgroup::mounts::unescape(source),
        mount_point: crate::sources::cgroup::mounts::unescape(mount_point),
    })
}

/// /proc/PID/syscall of a blocked task: "NR ARG0 ARG1 ...": the number and its first argument.
/// "running" and "-1 ..." (not in a syscall) give `None`.
pub fn parse_syscall(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace();
    let nr = f.next()?.parse().ok()?;
    let arg0 = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
    Some((nr, arg0))
}

/// The remote address of the socket `inode` in a /proc/net/tcp{,6} text, as "a.b.c.d:port"
/// ("[v6]:port" for IPv6).
pub fn tcp_peer(text: &str, inode: u64) -> Option<String> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(9)?.parse::<u64>().ok()? != inode {
            return None;
        }
        let (addr, port) = f.get(2)?.split_once(':')?;
        let port = u16::from_str_radix(port, 16).ok()?;
        let bytes: Vec<u8> = (0..addr.len() / 8)
            .filter_map(|i| u32::from_str_radix(&addr[i * 8..i * 8 + 8], 16).ok())
            .flat_map(|w| w.to_le_bytes())
            .collect();
        match bytes.len() {
            4 => Some(format!("{}.{}.{}.{}:{port}", bytes[0], bytes[1], bytes[2], bytes[3])),
            16 => {
                let a: [u8; 16] = bytes.try_into().ok()?;
                let ip = std::net::Ipv6Addr::from(a);
                Some(match ip.to_ipv4_mapped() {
                    Some(v4) => format!("{v4}:{port}"),
                    None => format!("[{ip}]:{port}"),
                })
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_scanned_where_the_host_was_busier_than_the_job_and_the_agent() {
        let at = |host, job, agent| Ticks { host, job, agent };
        assert!(others_may_have_used(None, at(0, 0, 0), 25), "the first reading scans");
        let last = Some(at(1000, 400, 10));
        // The job used 180 ticks and the agent 5 of the host's 200: 15 left, under 25.
        assert!(!others_may_have_used(last, at(1200, 580, 15), 25));
        assert!(others_may_have_used(last, at(1230, 580, 15), 25));
        // A worker of 300 ticks exited: its ticks left the job's sum; the host's 60 count.
        assert!(others_may_have_used(last, at(1060, 100, 10), 25));
    }

    #[test]
    fn proc_texts_parse() {
        assert_eq!(
            parse_proc_stat_cpu("cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 1 2 3 4\n"),
            Some((160, 980))
        );
        assert_eq!(
            parse_pid_stat("42 (a (b) c) S 1 1 1 0 -1 0 0 0 0 0 70 30 0 0"),
            Some(("a (b) c".to_string(), 100))
        );
        assert_eq!(allowed_cpus("Name:\tx\nCpus_allowed_list:\t0-3,6\n"), Some(5));
        assert_eq!(allowed_cpus("Cpus_allowed_list:\t1\n"), Some(1));
        assert_eq!(parse_cpu_max("max 100000\n"), (None, 100000));
        assert_eq!(parse_cpu_max("50000 100000\n"), (Some(50000), 100000));
        let l = parse_level(
            "/j".into(),
            Some(50000),
            100000,
            "nr_periods 10\nnr_throttled 4\nthrottled_time 2000000\n",
            1,
        );
        assert_eq!((l.nr_periods, l.nr_throttled, l.throttled_us), (10, 4, 2000));
        assert_eq!(parse_syscall("45 0x7 0x7f 0x1000 0x0 0x0 0x0 0x7ffd 0x7f12\n"), Some((45, 7)));
        assert_eq!(parse_syscall("running\n"), None);
    }

    #[test]
    fn cgroup_paths_and_mounts_of_the_cpu_controller() {
        let (v1, v2) = cpu_paths("4:memory:/m\n2:cpu,cpuacct:/job\n0::/\n");
        assert_eq!((v1.as_deref(), v2.as_deref()), (Some("/job"), Some("/")));
        let m = cpu_mounts(
            "30 25 0:26 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu\n31 25 0:27 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].version, m[0].mount_point.to_str()), (1, Some("/sys/fs/cgroup/cpu")));
        assert_eq!(m[1].version, 2);
    }

    #[test]
    fn a_read_of_a_file_on_a_network_or_fuse_mount_names_the_mount() {
        let info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    46 22 0:40 / /mnt/my\\040data ro,nosuid - fuse slowfs:/export ro,user_id=0\n\
                    47 22 0:41 / /data rw - nfs4 10.0.0.5:/export rw,vers=4.2\n";
        assert_eq!(fdinfo_mnt_id("pos:\t0\nflags:\t0100000\nmnt_id:\t46\nino:\t2\n"), Some(46));
        let fuse = remote_mount(info, 46).expect("a FUSE mount");
        assert_eq!((fuse.fstype.as_str(), fuse.source.as_str()), ("fuse", "slowfs:/export"));
        assert_eq!(fuse.mount_point, "/mnt/my data");
        assert_eq!(remote_mount(info, 47).map(|m| m.fstype), Some("nfs4".into()));
        assert_eq!(remote_mount(info, 22), None, "a local disk");
        assert_eq!(remote_mount(info, 9), None, "no such mount");
        assert!(remote_fstype("fuse.sshfs") && !remote_fstype("tmpfs"));
        assert_eq!(socket_inode("socket:[4242]"), Some(4242));
        assert_eq!(socket_inode("/data/x"), None);
    }

    #[test]
    fn a_sockets_peer_is_found_by_its_inode() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(tcp_peer(tcp, 4242).as_deref(), Some("127.0.0.1:8080"));
        assert_eq!(tcp_peer(tcp, 1), None);
        let tcp6 = "header\n   0: 00000000000000000000000001000000:A1B2 0000000000000000FFFF00000100007F:1F90 01 0:0 0:0 0 0 0 77 1\n";
        assert_eq!(tcp_peer(tcp6, 77).as_deref(), Some("127.0.0.1:8080"));
    }
}
