//! Trainers' and ranks' waits for the GPU: the kernel's per-process totals of time inside the
//! CUDA driver's synchronising calls (`gpustall_common::gpu`, read with the other counters),
//! and which library each waiter's probes were put on (`Sample::CudaProbes`).

use std::collections::BTreeMap;

use gpustall_common::gpu::GpuWaits;
use serde::{Deserialize, Serialize};

/// One process's totals, as read (cumulative; a read replaces the one before).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuWaitRec {
    pub pid: u32,
    #[serde(flatten)]
    pub waits: GpuWaits,
    /// The oldest call of its threads still inside one at the read (monotonic ns; 0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub open_since_ns: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a waiter's GPU waits are measured from (`Sample::CudaProbes`): the CUDA driver it
/// mapped, and the synchronising calls found in it; or why they are not measured.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaProbesRec {
    pub t_ns: u64,
    pub pid: u32,
    /// The library's path as the process maps it ("" when none is mapped).
    pub library: String,
    /// The calls probed, and those the library does not export.
    pub symbols: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// Why its waits are not measured, where they are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the model keeps: per process, its last totals and its probes.
#[derive(Default, Clone, Debug)]
pub struct GpuWaitModel {
    totals: BTreeMap<u32, GpuWaitRec>,
    /// The last read's time, for the calls still open then.
    read_ns: u64,
    probes: BTreeMap<u32, CudaProbesRec>,
}

/// A process's waits for the GPU over the trace.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct GpuWaitSummary {
    /// Synchronising calls that returned, and the time inside them.
    pub calls: u64,
    pub wait_ns: u64,
    /// Of it, the time its threads were on a CPU (spinning or yielding) and not (blocked, or
    /// runnable and waiting for a CPU); absent where the kernel's task layout is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_cpu_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_cpu_ns: Option<u64>,
    pub longest_ns: u64,
    /// A call still in progress at the end, and for how long then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_ns: Option<u64>,
    /// The CUDA driver probed and its calls.
    pub library: String,
    pub symbols: Vec<String>,
}

impl GpuWaitModel {
    pub fn apply(&mut self, t_ns: u64, recs: &[GpuWaitRec], settled: impl Fn(u32) -> bool) {
        for r in recs.iter().filter(|r| !settled(r.pid)) {
            self.totals.insert(r.pid, *r);
        }
        self.read_ns = self.read_ns.max(t_ns);
    }

    pub fn apply_probes(&mut self, r: &CudaProbesRec) {
        self.probes.insert(r.pid, r.clone());
    }

    /// `pid`'s time in the calls that returned (a counter's source: never the open call's).
    pub fn returned_ns(&self, pid: u32) -> u64 {
        self.totals.get(&pid).map_or(0, |t| t.waits.ns)
    }

    /// How `pid`'s GPU waits were probed, if they were looked for.
    pub fn probes(&self, pid: u32) -> Option<&CudaProbesRec> {
        self.probes.get(&pid)
    }

    /// `pid`'s waits, where its calls were probed.
    pub fn summary(&self, pid: u32) -> Option<GpuWaitSummary> {
        let probes = self.probes.get(&pid).filter(|p| p.error.is_none())?;
        let t = self.totals.get(&pid).copied().unwrap_or_default();
        let w = t.waits;
        let open = (t.open_since_ns != 0).then(|| self.read_ns.saturating_sub(t.open_since_ns));
        let on_cpu = (w.cpu_known != 0).then_some(w.cpu_ns);
        Some(GpuWaitSummary {
            calls: w.calls,
            wait_ns: w.ns + open.unwrap_or(0),
            on_cpu_ns: on_cpu,
            off_cpu_ns: on_cpu.map(|c| w.ns.saturating_sub(c)),
            longest_ns: w.max_ns.max(open.unwrap_or(0)),
            open_ns: open,
            library: probes.library.clone(),
            symbols: probes.symbols.clone(),
        })
    }
}

/// `recs` counted from `base` (an incident bundle's window).
pub fn rebase(recs: &[GpuWaitRec], base: &[GpuWaitRec]) -> Vec<GpuWaitRec> {
    recs.iter()
        .map(|r| {
            let b = base.iter().find(|b| b.pid == r.pid).map(|b| b.waits).unwrap_or_default();
            GpuWaitRec { waits: r.waits.since(&b), ..*r }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pid: u32, calls: u64, ns: u64, cpu_ns: u64, open_since_ns: u64) -> GpuWaitRec {
        GpuWaitRec {
            pid,
            waits: GpuWaits { calls, ns, cpu_ns, max_ns: ns / calls.max(1), cpu_known: 1 },
            open_since_ns,
        }
    }

    fn probed(pid: u32) -> CudaProbesRec {
        CudaProbesRec {
            t_ns: 1,
            pid,
            library: "/usr/lib/libcuda.so.1".into(),
            symbols: vec!["cuStreamSynchronize".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_waiters_time_in_the_driver_is_split_on_and_off_cpu_with_its_open_call() {
        let mut m = GpuWaitModel::default();
        m.apply_probes(&probed(7));
        m.apply(10_000, &[rec(7, 4, 4_000, 3_000, 0)], |_| false);
        m.apply(20_000, &[rec(7, 5, 5_000, 3_500, 19_000)], |_| false);
        let s = m.summary(7).expect("probed");
        assert_eq!((s.calls, s.wait_ns, s.open_ns), (5, 6_000, Some(1_000)));
        assert_eq!((s.on_cpu_ns, s.off_cpu_ns), (Some(3_500), Some(1_500)));
    }

    #[test]
    fn no_summary_where_nothing_was_probed_and_zero_where_probed_but_never_called() {
        let mut m = GpuWaitModel::default();
        assert_eq!(m.summary(7), None);
        m.apply_probes(&CudaProbesRec { error: Some("no libcuda".into()), ..probed(7) });
        assert_eq!(m.summary(7), None);
        m.apply_probes(&probed(8));
        assert_eq!(m.summary(8).map(|s| (s.calls, s.wait_ns)), Some((0, 0)));
    }

    #[test]
    fn a_settled_process_keeps_its_final_totals() {
        let mut m = GpuWaitModel::default();
        m.apply_probes(&probed(7));
        m.apply(1, &[rec(7, 2, 2_000, 0, 0)], |_| false);
        m.apply(2, &[rec(7, 0, 0, 0, 0)], |_| true);
        assert_eq!(m.summary(7).map(|s| s.calls), Some(2));
    }

    #[test]
    fn a_window_counts_from_its_base() {
        let w = rebase(&[rec(7, 5, 5_000, 1_000, 0)], &[rec(7, 2, 2_000, 400, 0)]);
        assert_eq!((w[0].waits.calls, w[0].waits.ns, w[0].waits.cpu_ns), (3, 3_000, 600));
    }
}
