//! /proc: the descendants that exist when tracing starts (the kernel only sees later forks),
//! and per-process memory samples (RSS split, swap, the kernel's own peak VmHWM, major faults).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use crate::model::stats::MemSample;
use crate::sources::host::read_text;

/// A process as /proc shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
}

/// `root` and all its descendants among `all`, parents before children.
pub fn descendants_of(root: u32, all: &[ProcEntry]) -> Vec<ProcEntry> {
    let mut children: BTreeMap<u32, Vec<&ProcEntry>> = BTreeMap::new();
    for p in all {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out: Vec<ProcEntry> = all.iter().filter(|p| p.pid == root).cloned().collect();
    let mut seen: BTreeSet<u32> = out.iter().map(|p| p.pid).collect();
    let mut i = 0;
    while i < out.len() {
        let pid = out[i].pid;
        for c in children.get(&pid).into_iter().flatten() {
            if seen.insert(c.pid) {
                out.push((*c).clone());
            }
        }
        i += 1;
    }
    out
}

/// Every process in /proc (ones that vanish while reading are skipped).
pub fn all_processes() -> Vec<ProcEntry> {
    let Ok(iter) = procfs::process::all_processes() else {
        return Vec::new();
    };
    // Zombies have exited already: there is nothing to trace and no exit event to wait for.
    iter.filter_map(|p| p.ok())
        .filter_map(|p| p.stat().ok())
        .filter(|s| s.state != 'Z' && s.state != 'X')
        .map(|s| ProcEntry { pid: s.pid as u32, ppid: s.ppid as u32, comm: s.comm })
        .collect()
}

pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Exited but not yet reaped by its parent: no exit event will ever come for it.
pub fn is_zombie(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state == 'Z' || s.state == 'X')
}

/// Gone, a zombie, or on its way out (PF_EXITING, set at the start of the kernel's `do_exit`).
/// An exiting task is moved to the root cgroup before it becomes a zombie (`cgroup_exit`
/// comes first): its /proc/PID/cgroup then says "/" while it still looks alive.
pub fn is_ending(pid: u32) -> bool {
    const PF_EXITING: u32 = 0x4;
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .map_or(true, |s| s.state == 'Z' || s.state == 'X' || s.flags & PF_EXITING != 0)
}

/// Memory of one process, or `None` once it is gone (or a zombie without an mm). Read from
/// /proc/PID/status and stat directly: the procfs crate opens the process directory and
/// parses every line of both files into maps, several times the cost of the read itself.
pub fn sample_mem(pid: u32) -> Option<MemSample> {
    let status = read_text(Path::new(&format!("/proc/{pid}/status")))?;
    let mut mem = parse_status_mem(&status)?;
    let stat = read_text(Path::new(&format!("/proc/{pid}/stat")));
    mem.majflt = stat.as_deref().and_then(crate::sources::host::stat_majflt).unwrap_or(0);
    Some(mem)
}

/// The memory lines of a /proc/PID/status text (kB); `None` without VmRSS (a kernel thread,
/// or a zombie whose mm is gone). Major faults come from stat.
pub fn parse_status_mem(text: &str) -> Option<MemSample> {
    let mut m = MemSample::default();
    let mut rss = None;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else { continue };
        let slot = match key {
            "VmRSS" => {
                rss = kb(rest);
                continue;
            }
            "RssAnon" => &mut m.anon_kb,
            "RssFile" => &mut m.file_kb,
            "RssShmem" => &mut m.shmem_kb,
            "VmSwap" => &mut m.swap_kb,
            "VmHWM" => &mut m.hwm_kb,
            _ => continue,
        };
        *slot = kb(rest).unwrap_or(0);
    }
    m.rss_kb = rss?;
    Some(m)
}

/// "   2044 kB" as 2044.
fn kb(value: &str) -> Option<u64> {
    value.split_whitespace().next()?.parse().ok()
}

/// Proportional memory of a process in kB (`MemSample::pss_kb`): Pss_Anon + Pss_Shmem +
/// SwapPss from smaps_rollup (Linux 5.9+; `None` before, or when it cannot be read). It walks
/// the process's page tables, milliseconds for a large process: read it for the job's own
/// processes only.
pub fn sample_pss_kb(pid: u32) -> Option<u64> {
    let p = procfs::process::Process::new(pid as i32).ok()?;
    let rollup = p.smaps_rollup().ok()?;
    let m = &rollup.memory_map_rollup.0.first()?.extension.map;
    let anon = *m.get("Pss_Anon")?;
    let bytes =
        anon + m.get("Pss_Shmem").copied().unwrap_or(0) + m.get("SwapPss").copied().unwrap_or(0);
    Some(bytes / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(pid: u32, ppid: u32) -> ProcEntry {
        ProcEntry { pid, ppid, comm: format!("p{pid}") }
    }

    #[test]
    fn finds_children_and_grandchildren_only() {
        let all = vec![e(1, 0), e(10, 1), e(11, 10), e(12, 11), e(13, 10), e(20, 1), e(21, 20)];
        let pids: Vec<u32> = descendants_of(10, &all).iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![10, 11, 13, 12]);
    }

    #[test]
    fn status_gives_the_memory_split() {
        let text = "Name:\tpython\nVmPeak:\t  9000 kB\nVmHWM:\t    2108 kB\nVmRSS:\t    2044 kB\n\
                    RssAnon:\t     128 kB\nRssFile:\t    1916 kB\nRssShmem:\t       0 kB\n\
                    VmSwap:\t      12 kB\nThreads:\t1\n";
        let m = parse_status_mem(text).expect("parses");
        assert_eq!(
            (m.rss_kb, m.anon_kb, m.file_kb, m.shmem_kb, m.swap_kb, m.hwm_kb),
            (2044, 128, 1916, 0, 12, 2108)
        );
        // A zombie or kernel thread has no VmRSS line.
        assert!(parse_status_mem("Name:\tkworker\nThreads:\t1\n").is_none());
        let me = sample_mem(std::process::id()).expect("this process");
        assert!(me.rss_kb > 0 && me.hwm_kb >= me.rss_kb);
    }

    #[test]
    fn missing_root_gives_nothing() {
        assert!(descendants_of(99, &[e(1, 0)]).is_empty());
    }
}
