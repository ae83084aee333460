//! The CUDA driver's synchronising calls, probed: which `libcuda.so` each trainer and rank
//! mapped (its `/proc/PID/maps`, read through its root so that a container's library is the
//! file it really runs), a uprobe and a uretprobe on each call there, once per library file
//! (every process mapping it runs them; the programs time only trainers and ranks), and the
//! kernel's per-process totals read into the counter sample.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use aya::{
    maps::{HashMap, IterableMap as _, MapData},
    programs::{uprobe::UProbeScope, UProbe},
    Ebpf,
};
use gpustall_common::gpu::{GpuCall, GpuWaits};
use gpustall_common::names::{maps, programs};

use crate::kernel::batch;
use crate::kernel::maps::{iterate, take};
use crate::model::gpuwait::{CudaProbesRec, GpuWaitRec};
use crate::model::samples::CountersSample;

/// The driver's calls a thread waits for the GPU in: the stream, event and context
/// synchronisations, and the copies to the host that block until the GPU's work before them is
/// done (`loss.item()`, `.cpu()`: an async copy then a stream synchronisation, or a plain
/// copy). `_ptsz`: the same calls on the per-thread default stream.
pub const SYNC_CALLS: &[&str] = &[
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuEventSynchronize",
    "cuCtxSynchronize",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoH_v2_ptds",
    "cuMemcpy",
    "cuMemcpy_ptds",
];

/// The kernel's maps of GPU waits.
pub struct GpuMaps {
    waits: HashMap<MapData, u32, GpuWaits>,
    /// Behind a lock: the counter read (`&self`) deletes the calls of threads that are gone.
    calls: std::sync::Mutex<HashMap<MapData, u32, GpuCall>>,
}

impl GpuMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, super::loader::LoadError> {
        let calls = std::sync::Mutex::new(take(ebpf, maps::GPU_CALLS)?);
        Ok(Self { waits: take(ebpf, maps::GPU_WAITS)?, calls })
    }

    /// Adds each waiter's totals, with its oldest call still in progress, to `out`.
    pub fn read(&self, out: &mut CountersSample) {
        let waits = batch::entries(self.waits.map())
            .unwrap_or_else(|| iterate(&self.waits, maps::GPU_WAITS));
        let mut open: BTreeMap<u32, u64> = BTreeMap::new();
        // Only threads inside a call are in it: a handful, read whole. A thread that is gone
        // (killed inside a call) never returns: its entry is deleted.
        let mut gone = Vec::new();
        let mut calls = self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (tid, c) in calls.iter().filter_map(Result::ok) {
            if !Path::new(&format!("/proc/{}/task/{tid}", c.pid)).exists() {
                gone.push(tid);
                continue;
            }
            let e = open.entry(c.pid).or_insert(c.since_ns);
            *e = (*e).min(c.since_ns);
        }
        let mut recs: BTreeMap<u32, GpuWaitRec> = waits
            .into_iter()
            .map(|(pid, waits)| (pid, GpuWaitRec { pid, waits, open_since_ns: 0 }))
            .collect();
        for (pid, since) in open {
            recs.entry(pid).or_insert(GpuWaitRec { pid, ..Default::default() }).open_since_ns =
                since;
        }
        out.gpu_waits = recs.into_values().collect();
        for tid in gone {
            let _ = calls.remove(&tid);
        }
    }

    pub fn forget(&mut self, pid: u32) {
        let _ = self.waits.remove(&pid);
    }
}

/// The probes put on CUDA drivers so far, and the waiters looked at.
#[derive(Default)]
pub struct CudaProbes {
    /// Library files probed, by (device, inode): the calls found, or why none were.
    libraries: BTreeMap<(u64, u64), Result<Vec<String>, String>>,
    /// Waiters looked at: the size of their address space then (CUDA is loaded when the job
    /// first touches a GPU, often well after it started: the maps are read again only once the
    /// size changed), or `None` once their library was found (never looked at again).
    looked: BTreeMap<u32, Option<u64>>,
    /// The programs were loaded (once, at the first library), or why they could not be.
    loaded: Option<Result<(), String>>,
}

impl CudaProbes {
    /// Looks at `waiters` (live trainers and ranks) not yet seen with a CUDA driver, probes the
    /// drivers they mapped, and says what was found for each, once.
    pub fn follow(&mut self, ebpf: &mut Ebpf, waiters: &[u32], now_ns: u64) -> Vec<CudaProbesRec> {
        let alive: BTreeSet<u32> = waiters.iter().copied().collect();
        self.looked.retain(|pid, _| alive.contains(pid));
        let mut out = Vec::new();
        for &pid in waiters {
            let size = match self.looked.get(&pid) {
                Some(None) => continue,
                Some(Some(seen)) => match vm_pages(pid) {
                    Some(size) if size != *seen => size,
                    _ => continue,
                },
                None => vm_pages(pid).unwrap_or(0),
            };
            let Some((range, library)) = mapped_driver(pid) else {
                self.looked.insert(pid, Some(size));
                continue;
            };
            self.looked.insert(pid, None);
            out.push(self.probe(ebpf, pid, &range, &library, now_ns));
        }
        out
    }

    fn probe(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        range: &str,
        library: &str,
        now_ns: u64,
    ) -> CudaProbesRec {
        let mut rec =
            CudaProbesRec { t_ns: now_ns, pid, library: library.into(), ..Default::default() };
        // The very file the process maps (its mapping's own link, in a container too), never
        // what its path names now: a job could put a FIFO or a link there, which reading the
        // library's symbols would block on or follow.
        let path = Path::new("/proc").join(pid.to_string()).join("map_files").join(range);
        let key = match std::fs::metadata(&path) {
            Ok(m) => (m.dev(), m.ino()),
            Err(e) => {
                rec.error = Some(format!("{library} could not be opened: {e}"));
                return rec;
            }
        };
        if !self.libraries.contains_key(&key) {
            let attached = self.load(ebpf).and_then(|()| attach(ebpf, &path));
            self.libraries.insert(key, attached);
        }
        match &self.libraries[&key] {
            Ok(found) => {
                rec.symbols.clone_from(found);
                rec.missing = SYNC_CALLS
                    .iter()
                    .filter(|s| !found.iter().any(|f| f == *s))
                    .map(|s| s.to_string())
                    .collect();
            }
            Err(e) => rec.error = Some(e.clone()),
        }
        rec
    }

    /// The programs are loaded (a library was found and they passed the verifier).
    pub fn loaded(&self) -> bool {
        matches!(self.loaded, Some(Ok(())))
    }

    fn load(&mut self, ebpf: &mut Ebpf) -> Result<(), String> {
        self.loaded
            .get_or_insert_with(|| {
                [programs::CUDA_SYNC_ENTER, programs::CUDA_SYNC_EXIT].into_iter().try_for_each(
                    |name| uprobe(ebpf, name)?.load().map_err(|e| format!("loading {name}: {e}")),
                )
            })
            .clone()
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, String> {
    let p = ebpf.program_mut(name).ok_or_else(|| format!("{name} is missing from the object"))?;
    p.try_into().map_err(|e| format!("{name}: {e}"))
}

/// Both programs on each synchronising call `path` exports: the calls probed, or why none.
fn attach(ebpf: &mut Ebpf, path: &Path) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    let mut last_error = None;
    for &call in SYNC_CALLS {
        // The return probe first: a uretprobe takes hold of a call's return at the call's entry,
        // so every call the entry probe then sees also returns through it. (The other way round
        // a call entered between the two would stay open, and its thread's later calls nest in
        // it uncounted.) Calls in progress at the attach are not seen at all.
        let exit =
            uprobe(ebpf, programs::CUDA_SYNC_EXIT)?.attach(call, path, UProbeScope::AllProcesses);
        let exit = match exit {
            Ok(link) => link,
            Err(e) => {
                log::debug!("{call} in {}: {e}", path.display());
                last_error = Some(e.to_string());
                continue;
            }
        };
        if let Err(e) =
            uprobe(ebpf, programs::CUDA_SYNC_ENTER)?.attach(call, path, UProbeScope::AllProcesses)
        {
            let _ = uprobe(ebpf, programs::CUDA_SYNC_EXIT)?.detach(exit);
            return Err(format!("the entry probe on {call}: {e}"));
        }
        found.push(call.to_string());
    }
    if found.is_empty() {
        return Err(format!(
            "it exports none of the synchronising calls (stripped, or not NVIDIA's driver): {}",
            last_error.unwrap_or_default()
        ));
    }
    Ok(found)
}

/// The size of `pid`'s address space in pages (/proc/PID/statm's first field).
fn vm_pages(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    statm.split_whitespace().next()?.parse().ok()
}

/// The CUDA driver `pid` maps (`libcuda.so`, `libcuda.so.1`, `libcuda.so.550.54.15`): one of
/// its mappings' address range and its path as the process sees it.
fn mapped_driver(pid: u32) -> Option<(String, String)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    driver_in(&maps).map(|(range, path)| (range.to_string(), path.to_string()))
}

/// The first mapped file whose name is `libcuda.so` or a versioned `libcuda.so.N`, with its
/// mapping's address range (`/proc/PID/map_files/` names each mapping so).
pub fn driver_in(maps: &str) -> Option<(&str, &str)> {
    // A file's path is the rest of its line from its first '/' (it may hold spaces).
    maps.lines().filter_map(|l| Some((l.split(' ').next()?, &l[l.find('/')?..]))).find(|(_, p)| {
        let name = p.rsplit('/').next().unwrap_or(p);
        name == "libcuda.so" || name.strip_prefix("libcuda.so.").is_some_and(|v| !v.is_empty())
    })
}

/// The live trainers and ranks of `tree`: the processes whose GPU waits are timed.
pub fn waiters(tree: &crate::model::proctree::ProcessTree) -> Vec<u32> {
    use gpustall_common::sched::ACCOUNT_WAITS;
    crate::kernel::offcpu_maps::wanted(tree)
        .into_iter()
        .filter(|&(_, level)| level == ACCOUNT_WAITS)
        .map(|(pid, _)| pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::driver_in;

    #[test]
    fn the_driver_is_found_by_its_name_not_a_lookalike() {
        let maps = "\
7f00-7f10 r-xp 00000000 08:01 11 /opt/libcudart.so.12
7f10-7f20 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f20-7f30 r-xp 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libcuda.so.1
";
        assert_eq!(
            driver_in(maps),
            Some(("7f10-7f20", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"))
        );
        assert_eq!(driver_in("7f00-7f10 r-xp 00000000 08:01 11 /x/libcuda.so.\n"), None);
        assert_eq!(driver_in("7f00-7f10 r-xp 00000000 08:01 11 [heap]\n"), None);
        assert_eq!(
            driver_in("7f00-7f10 r-xp 00000000 08:01 11 /x/libcuda.so\n").map(|d| d.1),
            Some("/x/libcuda.so")
        );
    }
}
