//! The job's memory cgroup: where it is (through the agent's cgroup namespace and the
//! machine's cgroup mounts), the limits that bind it (its own or an ancestor's), how often it
//! ran into them (v2 memory.events) and how long its tasks waited for memory (PSI).
//!
//! Readers return `None` when a file is missing: they run each second against cgroups that may
//! be removed at any moment. The pure parts are in [`mounts`] and [`limits`].

pub mod io;
pub mod limits;
pub mod mounts;

use std::path::{Path, PathBuf};

use crate::model::host::{CgroupMem, Psi};
use crate::sources::host::read_text;
use limits::{keyed_value, Level};
use mounts::CgroupMount;

/// v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX * page size);
/// anything this large is no real limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// How far the search for the agent's own cgroup goes (directories visited).
const OWN_SEARCH_DIRS: usize = 20_000;

/// A process's memory cgroup as found on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemCgroupDir {
    pub dir: PathBuf,
    /// Its path from the mount's root: the host's path when the host's tree is mounted.
    pub path: String,
    pub version: u8,
    /// The mount it was found under: its ancestors are read up to here.
    pub mount_point: PathBuf,
}

/// The memory cgroup of `pid`.
pub fn memory_cgroup_dir(pid: u32) -> Option<MemCgroupDir> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| mounts::parse_mountinfo(&t))
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| default_mounts(Path::new("/sys/fs/cgroup")));
    memory_cgroup_dir_in(Path::new("/proc"), &mounts, pid, std::process::id())
}

/// The usual places, for a machine whose mountinfo cannot be read: v1 memory at
/// `root`/memory, v2 at `root` or (hybrid) `root`/unified.
pub fn default_mounts(root: &Path) -> Vec<CgroupMount> {
    let m = |p: PathBuf, version| CgroupMount { mount_point: p, root: "/".into(), version };
    vec![m(root.join("memory"), 1), m(root.to_path_buf(), 2), m(root.join("unified"), 2)]
}

/// As [`memory_cgroup_dir`], with /proc at `proc_root` and the given mounts; `own_pid` is the
/// agent, whose own cgroup places its namespace root in a mount that reaches above it.
///
/// v1 memory is preferred when its directory exists: on a hybrid host (v1 memory controller,
/// v2 unified tree for systemd) the v2 directory holds no memory files, the v1 one does.
pub fn memory_cgroup_dir_in(
    proc_root: &Path,
    mounts: &[CgroupMount],
    pid: u32,
    own_pid: u32,
) -> Option<MemCgroupDir> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    memory_cgroup_dir_of(proc_root, mounts, &text, own_pid)
}

/// The memory cgroup the kernel names `path` (an OOM report's `oom_memcg=`, a path from the
/// hierarchy's root), where it still exists: v1's memory controller's, else v2's.
pub fn memory_cgroup_dir_named(path: &str) -> Option<MemCgroupDir> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| mounts::parse_mountinfo(&t))
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| default_mounts(Path::new("/sys/fs/cgroup")));
    let as_membership = format!("1:memory:{path}\n0::{path}\n");
    memory_cgroup_dir_of(Path::new("/proc"), &mounts, &as_membership, std::process::id())
}

/// As [`memory_cgroup_dir_in`], from a /proc/PID/cgroup text.
fn memory_cgroup_dir_of(
    proc_root: &Path,
    mounts: &[CgroupMount],
    text: &str,
    own_pid: u32,
) -> Option<MemCgroupDir> {
    let (v1, v2) = parse_proc_cgroup(text);
    for (version, seen) in [(1u8, v1), (2, v2)] {
        let Some(seen) = seen else { continue };
        for m in mounts.iter().filter(|m| m.version == version) {
            let base = if mounts::lexical(&m.root).ups > 0 {
                cached_ns_root(proc_root, m, own_pid)
            } else {
                None
            };
            let Some((dir, path)) = mounts::resolve(m, base.as_deref(), &seen) else {
                continue;
            };
            let is_memcg = if version == 1 {
                dir.is_dir()
            } else {
                dir.join("memory.max").exists() || dir.join("memory.current").exists()
            };
            if is_memcg {
                return Some(MemCgroupDir {
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

/// [`own_ns_root`], searched once per mount: the agent does not move, and the search reads
/// every cgroup.procs of a tree that may hold thousands of cgroups.
fn cached_ns_root(proc_root: &Path, mount: &CgroupMount, own_pid: u32) -> Option<String> {
    type Key = (PathBuf, PathBuf, u32);
    static FOUND: std::sync::Mutex<Vec<(Key, Option<String>)>> = std::sync::Mutex::new(Vec::new());
    let key = (proc_root.to_path_buf(), mount.mount_point.clone(), own_pid);
    let mut found = FOUND.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, root)) = found.iter().find(|(k, _)| *k == key) {
        return root.clone();
    }
    let root = own_ns_root(proc_root, mount, own_pid);
    // Not found (yet) is not remembered: the next job looks again.
    if root.is_some() {
        found.push((key, root.clone()));
    }
    root
}

/// Where the agent's cgroup namespace root lies under `mount`: its own cgroup is the directory
/// whose cgroup.procs lists it.
fn own_ns_root(proc_root: &Path, mount: &CgroupMount, own_pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(own_pid.to_string()).join("cgroup")).ok()?;
    let (v1, v2) = parse_proc_cgroup(&text);
    let own_seen = if mount.version == 1 { v1 } else { v2 }?;
    let own_dir = find_own_dir(&mount.mount_point, own_pid)?;
    let rel = own_dir.strip_prefix(&mount.mount_point).ok()?;
    mounts::ns_root_from_own(&format!("/{}", rel.display()), &own_seen)
}

/// The directory under `mount_point` whose cgroup.procs holds `pid` (breadth first, bounded).
fn find_own_dir(mount_point: &Path, pid: u32) -> Option<PathBuf> {
    let mut queue = std::collections::VecDeque::from([mount_point.to_path_buf()]);
    let mut visited = 0;
    while let Some(dir) = queue.pop_front() {
        visited += 1;
        if visited > OWN_SEARCH_DIRS {
            return None;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.lines().any(|l| l.trim().parse() == Ok(pid)) {
            return Some(dir);
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        queue.extend(
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    None
}

/// The v1 memory path and the v2 path from a /proc/PID/cgroup text
/// ("hierarchy-id:controllers:path" per line).
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
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

/// Reads the cgroup's memory files and its ancestors' limits; `None` when its usage is
/// unreadable (the cgroup was removed, or it is not a memory cgroup).
pub fn read_cgroup_mem(cg: &MemCgroupDir) -> Option<CgroupMem> {
    let mut m =
        if cg.version == 1 { read_v1(&cg.dir, &cg.path) } else { read_v2(&cg.dir, &cg.path) }?;
    let dirs: Vec<PathBuf> = std::iter::once(cg.dir.clone())
        .chain(mounts::ancestors(&cg.dir, &cg.mount_point))
        .collect();
    let names = mounts::lexical(&cg.path).names;
    let levels: Vec<Level> = dirs
        .iter()
        .enumerate()
        .map(|(up, d)| {
            let path = format!("/{}", names[..names.len().saturating_sub(up)].join("/"));
            read_level(d, path, cg.version)
        })
        .collect();
    let (mem, swap) = limits::effective(&levels, cg.version);
    let setter = |i: usize| (i > 0).then(|| levels[i].path.clone());
    m.limit_bytes = mem.map(|(b, _)| b);
    m.limit_set_by = mem.and_then(|(_, i)| setter(i));
    m.swap_limit_bytes = swap.map(|(b, _)| b);
    m.swap_limit_set_by = swap.and_then(|(_, i)| setter(i));
    if cg.version == 2 {
        // The cgroup whose limit binds counts the times it was hit.
        let events_dir = mem.map_or(&cg.dir, |(_, i)| &dirs[i]);
        m.events =
            read_text(&events_dir.join("memory.events")).and_then(|t| limits::parse_events(&t));
        m.pressure = read_psi(&cg.dir.join("memory.pressure"));
    }
    Some(m)
}

/// One cgroup's limits.
fn read_level(dir: &Path, path: String, version: u8) -> Level {
    if version == 1 {
        let limited = |f: &str| read_u64(&dir.join(f)).filter(|l| *l < V1_UNLIMITED);
        Level {
            path,
            limit: limited("memory.limit_in_bytes"),
            swap_limit: limited("memory.memsw.limit_in_bytes"),
            hierarchical: read_u64(&dir.join("memory.use_hierarchy")).is_none_or(|h| h == 1),
        }
    } else {
        // "max" does not parse as a number: unlimited.
        Level {
            path,
            limit: read_u64(&dir.join("memory.max")),
            swap_limit: read_u64(&dir.join("memory.swap.max")),
            hierarchical: true,
        }
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
        // The limits, this cgroup's and its ancestors', are read by `read_level`.
        limit_bytes: None,
        usage_bytes: usage,
        peak_bytes: read_u64(&dir.join("memory.max_usage_in_bytes")),
        swap_usage_bytes: swap,
        oom_kills: oom_control.as_deref().and_then(|t| keyed_value(t, "oom_kill")),
        failcnt: read_u64(&dir.join("memory.failcnt")),
        limit_set_by: None,
        swap_limit_bytes: None,
        swap_limit_set_by: None,
        events: None,
        pressure: None,
        file_bytes: file_cache(dir, "total_"),
    })
}

fn read_v2(dir: &Path, path: &str) -> Option<CgroupMem> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let events = read_text(&dir.join("memory.events"));
    let event = |key| events.as_deref().and_then(|t| keyed_value(t, key));
    Some(CgroupMem {
        path: path.to_string(),
        version: 2,
        // The limits, this cgroup's and its ancestors', are read by `read_level`.
        limit_bytes: None,
        usage_bytes: usage,
        peak_bytes: read_u64(&dir.join("memory.peak")),
        swap_usage_bytes: read_u64(&dir.join("memory.swap.current")),
        oom_kills: event("oom_kill"),
        failcnt: event("max"),
        limit_set_by: None,
        swap_limit_bytes: None,
        swap_limit_set_by: None,
        events: None,
        pressure: None,
        file_bytes: file_cache(dir, ""),
    })
}

/// The file cache charged to the cgroup, from memory.stat: `{prefix}active_file +
/// {prefix}inactive_file` (v1's hierarchical totals carry "total_"; v2's are hierarchical).
fn file_cache(dir: &Path, prefix: &str) -> Option<u64> {
    let stat = read_text(&dir.join("memory.stat"))?;
    let get = |k: &str| keyed_value(&stat, &format!("{prefix}{k}"));
    Some(get("active_file")? + get("inactive_file")?)
}

/// A PSI file; `None` when absent (no CONFIG_PSI, v1) or disabled (psi=0: reading fails with
/// EOPNOTSUPP).
pub fn read_psi(path: &Path) -> Option<Psi> {
    limits::parse_psi(&read_text(path)?)
}

/// The host's memory pressure (/proc/pressure/memory, Linux 4.20+ with PSI on).
pub fn read_host_psi() -> Option<Psi> {
    read_psi(Path::new("/proc/pressure/memory"))
}

fn read_u64(path: &Path) -> Option<u64> {
    read_text(path)?.trim().parse().ok()
}

#[cfg(test)]
mod tests;
