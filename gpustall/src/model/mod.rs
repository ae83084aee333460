//! Stage 3, the model: everything the agent knows about a trace (the process tree,
//! per-process and host measurements, OOM kills and fatal signals, GPU state, training steps).
//! Fed by [`event::Event`]s and [`samples::Sample`]s only, the same way live and on replay; it
//! reads nothing from the machine and knows no aya or tokio, so it is tested on hand-built input.

pub mod cpu;
pub mod event;
pub mod folded;
pub mod gpu;
pub mod gpuwait;
pub mod host;
pub mod identity;
pub mod incident;
pub mod kernlog;
pub mod limit_clock;
pub mod longwait;
pub mod offcpu;
pub mod origin;
pub mod overhead;
pub mod proctree;
pub mod pystacks;
pub mod samples;
pub mod stats;
pub mod steps;
pub mod untrusted;

use std::collections::{BTreeMap, HashSet};

use gpustall_common::reclaim::ReclaimKind;

use crate::model::event::Event;
use crate::model::event::OomRss;
use crate::model::proctree::Killer;
use crate::model::proctree::ProcessTree;
use crate::model::samples::CountersSample;
use crate::model::samples::Sample;
use crate::model::stats::HostStats;
use crate::model::stats::IoSlot;
use crate::model::stats::ProcStats;

/// An OOM kill as the summary lists it (the victim's RSS as four nullable numbers, as recorded).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OomKill {
    pub t_ns: u64,
    pub victim_pid: u32,
    pub victim_comm: String,
    #[serde(flatten, with = "crate::model::event::oom_rss")]
    pub rss: Option<OomRss>,
    pub oom_score_adj: i32,
    /// The task whose allocation invoked the OOM killer.
    pub trigger_pid: u32,
    pub trigger_comm: String,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SignalRecord {
    pub t_ns: u64,
    pub sig: i32,
    pub si_code: i32,
    pub sender_pid: u32,
    pub sender_comm: String,
    pub target_pid: u32,
    pub target_comm: String,
}

#[derive(Default)]
pub struct Model {
    pub tree: ProcessTree,
    pub procs: BTreeMap<u32, ProcStats>,
    /// Exited processes that matter to no verdict, folded per role (see `folded`).
    pub folded: BTreeMap<crate::model::proctree::Role, crate::model::folded::FoldedTotals>,
    pub host: HostStats,
    pub oom_kills: Vec<OomKill>,
    pub signals: Vec<SignalRecord>,
    /// Records received from the kernel, by ring.
    pub events: u64,
    pub start_ns: u64,
    pub last_ns: u64,
    pub overhead: crate::model::overhead::Overhead,
    pub gpu: crate::model::gpu::GpuState,
    pub ctx: crate::model::host::HostContext,
    /// Per-step times from the training log (`--log`), with the time the line was read.
    pub steps: Vec<(u64, crate::model::steps::StepTimes)>,
    /// Off-CPU time per process and who ended whose waits (sched_switch / sched_waking).
    pub offcpu: crate::model::offcpu::OffCpu,
    /// The kernel log's lines that matter to a verdict (`sources::kmsg`).
    pub kernel_log: crate::model::kernlog::KernelLog,
    /// The job's Python stacks, per process (`--py-stacks`).
    pub py_stacks: crate::model::pystacks::PyStacks,
    /// Trainers' and ranks' waits for the GPU (only trainers and ranks: never folded).
    pub gpu_waits: crate::model::gpuwait::GpuWaitModel,
    /// Each process's identity in its cluster, where one was found.
    pub identities: BTreeMap<u32, crate::model::identity::Identity>,
    /// Where and when the trace ran (from the recording's header).
    pub origin: Option<crate::model::origin::Origin>,
}

impl Model {
    /// The job's identity: what its processes' identities say together (`Identity::of_job`),
    /// `None` when none was found.
    pub fn job_identity(&self) -> Option<crate::model::identity::Identity> {
        let job = crate::model::identity::Identity::of_job(self.identities.values());
        (!job.is_empty()).then_some(job)
    }

    /// Folds in one observation (see `observe`): the same path live and on replay.
    /// Returns GPU stall episodes that ended with it.
    pub fn observe(&mut self, s: &Sample) -> Vec<crate::model::gpu::StallEpisode> {
        self.last_ns = self.last_ns.max(s.t_ns());
        // The samples that carry names, paths and kernel-log text from the job's world enter
        // the model shown safely (`untrusted`), live and on replay of any recording alike.
        let cleaned = match s {
            Sample::Seed { .. }
            | Sample::Cmdline { .. }
            | Sample::Identity { .. }
            | Sample::Context(_)
            | Sample::Gpu { .. }
            | Sample::KernelLog(_)
            | Sample::PyStacks(_)
            | Sample::CudaProbes(_) => untrusted::cleaned(s),
            _ => None,
        };
        let s = cleaned.as_ref().unwrap_or(s);
        match s {
            Sample::Seed { t_ns, pid, ppid, comm, is_target } => {
                self.tree.seed(*pid, *ppid, comm, *is_target, *t_ns)
            }
            Sample::ProcMem { t_ns, pid, mem } => self.proc_mut(*pid).record_mem(*mem, *t_ns),
            Sample::Vanished { t_ns, pid } => self.tree.mark_vanished(*pid, *t_ns),
            Sample::Cmdline { pid, cmdline, .. } => self.tree.set_cmdline(*pid, cmdline.clone()),
            Sample::Identity { pid, identity, .. } => {
                self.identities.insert(*pid, identity.clone());
            }
            Sample::Counters(c) => self.apply_counters(c),
            Sample::Context(c) => {
                self.ctx.apply(c);
                // A trainer's CPU from its first DataLoader worker on is its per-batch work,
                // without its imports and model building before (`CpuTrack::mark`).
                for pid in self.tree.alive_pids() {
                    if let Some(owner) = self.tree.dataloader_of(pid) {
                        self.ctx.cpu.mark(owner);
                    }
                }
            }
            Sample::Gpu { gpus, .. } => {
                let pids: HashSet<u32> = self.tree.iter().map(|n| n.pid).collect();
                let alive = !self.tree.alive_pids().is_empty();
                return self.gpu.apply(gpus, &pids, alive);
            }
            Sample::TrainStep { t_ns, data_time_s, iter_time_s, iter, .. } => self.steps.push((
                *t_ns,
                crate::model::steps::StepTimes {
                    data_time_s: *data_time_s,
                    iter_time_s: *iter_time_s,
                    iter: *iter,
                },
            )),
            Sample::Overhead { overhead, .. } => self.overhead = overhead.clone(),
            Sample::RecordingGap { lines, .. } => self.host.recording_gap_lines += lines,
            Sample::Fold { pids, .. } => self.fold(pids),
            Sample::KernelLog(line) => self.kernel_log.apply(line),
            Sample::PyStacks(r) => self.py_stacks.apply(r),
            Sample::CudaProbes(r) => self.gpu_waits.apply_probes(r),
            Sample::KernelLogMissed { records, dropped, .. } => {
                self.kernel_log.missed = self.kernel_log.missed.saturating_add(*records);
                self.kernel_log.dropped = self.kernel_log.dropped.saturating_add(*dropped);
            }
            Sample::Final { pids, .. } => {
                for pid in pids {
                    if let Some(p) = self.procs.get_mut(pid) {
                        p.final_counters = true;
                    }
                }
            }
        }
        Vec::new()
    }

    fn apply_counters(&mut self, c: &CountersSample) {
        let settled = |m: &Self, pid| m.procs.get(&pid).is_some_and(|p| p.final_counters);
        for p in &c.procs {
            if !settled(self, p.pid) {
                self.proc_mut(p.pid).counters = p.counters;
            }
        }
        for r in &c.io {
            if settled(self, r.pid) {
                continue;
            }
            let slot = IoSlot { dev: r.dev, op: r.op, in_reclaim: r.in_reclaim };
            self.proc_mut(r.pid).io.insert(slot, r.counters);
        }
        if !c.host.is_empty() {
            for (dst, src) in self.host.counters.iter_mut().zip(&c.host) {
                *dst = *src;
            }
        }
        if !c.lost.is_empty() {
            for (dst, src) in self.host.lost.iter_mut().zip(&c.lost) {
                *dst = *src;
            }
        }
        if let Some(u) = c.undecodable {
            self.host.undecodable = u;
        }
        let procs = &self.procs;
        let settled_pid = |pid| procs.get(&pid).is_some_and(|p| p.final_counters);
        self.offcpu.apply(&c.offcpu, &c.wakes, &c.syscall_waits, settled_pid);
        if let Some(open) = &c.open_waits {
            self.offcpu.apply_open(c.t_ns, open);
        }
        self.gpu_waits.apply(c.t_ns, &c.gpu_waits, settled_pid);
        for (dst, src) in self.host.io_latency.iter_mut().zip(&c.io_latency) {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
    }

    /// The end of the trace (live or replayed): GPU stalls still open are closed.
    pub fn finish(&mut self, now_ns: u64) -> Vec<crate::model::gpu::StallEpisode> {
        self.gpu.finish(now_ns)
    }

    pub fn proc_mut(&mut self, pid: u32) -> &mut ProcStats {
        self.procs.entry(pid).or_default()
    }

    pub fn apply(&mut self, e: &Event) {
        self.events += 1;
        let h = e.header();
        self.last_ns = self.last_ns.max(h.t_ns);
        match e {
            Event::Fork { h, child_pid, .. } => {
                if self.tree.get(*child_pid).is_some_and(|n| !n.alive()) {
                    // A reused pid: the earlier process's figures go to its role's totals
                    // (its OOM kill, if any, stays in `oom_kills`); the new one starts at zero.
                    // Only then: a new child's first counters may be read before its fork
                    // record is drained, and must not be dropped.
                    self.fold(&[*child_pid]);
                    self.procs.remove(child_pid);
                }
                self.tree.on_fork(h.pid, *child_pid, &h.comm, h.t_ns)
            }
            Event::Exit { h, exit_code } => self.tree.on_exit(h.pid, *exit_code, h.t_ns),
            Event::Rename { h, renamed_tid, new_comm } => {
                self.tree.on_rename(h.pid, *renamed_tid, new_comm)
            }
            Event::Exec { h, filename, .. } => self.tree.on_exec(h.pid, &h.comm, filename),
            Event::OomVictim { .. } => self.on_oom_kill(e),
            Event::Signal { .. } => self.on_signal(e),
            Event::Reclaim { h, kind: ReclaimKind::Kswapd, duration_ns, .. } => {
                let _ = h;
                self.host.kswapd_episodes += 1;
                self.host.kswapd_ns += duration_ns;
            }
            Event::Reclaim { h, duration_ns, start_ns, .. } => {
                self.offcpu.long.note_reclaim(h.pid, *start_ns, *duration_ns);
                let p = self.proc_mut(h.pid);
                p.record_stall(*duration_ns);
                p.first_reclaim_ns =
                    Some(p.first_reclaim_ns.map_or(*start_ns, |f| f.min(*start_ns)));
            }
            Event::Throttled { .. } => {}
            Event::DataWait { .. } => self.on_data_wait(e),
        }
    }

    fn on_oom_kill(&mut self, e: &Event) {
        let Event::OomVictim { h, victim_pid, victim_comm, rss, oom_score_adj, .. } = e else {
            return;
        };
        self.tree.on_oom_victim(*victim_pid);
        if let Some(r) = rss {
            let rss_kb = r.anon_rss_kb + r.file_rss_kb + r.shmem_rss_kb;
            self.proc_mut(*victim_pid).note_kill_rss(rss_kb, h.t_ns);
        }
        self.oom_kills.push(OomKill {
            t_ns: h.t_ns,
            victim_pid: *victim_pid,
            victim_comm: untrusted::name(victim_comm),
            rss: *rss,
            oom_score_adj: *oom_score_adj,
            trigger_pid: h.pid,
            trigger_comm: untrusted::name(&h.comm),
        });
    }

    fn on_signal(&mut self, e: &Event) {
        let Event::Signal { h, sig, code, target_pid, target_comm, .. } = e else { return };
        let killer = Killer {
            sig: *sig,
            sender_pid: h.pid,
            sender_comm: untrusted::name(&h.comm),
            si_code: *code,
            t_ns: h.t_ns,
        };
        self.tree.on_signal(*target_pid, killer);
        self.signals.push(SignalRecord {
            t_ns: h.t_ns,
            sig: *sig,
            si_code: *code,
            sender_pid: h.pid,
            sender_comm: untrusted::name(&h.comm),
            target_pid: *target_pid,
            target_comm: untrusted::name(target_comm),
        });
    }

    fn on_data_wait(&mut self, e: &Event) {
        let Event::DataWait {
            h,
            wakee_pid,
            wakee_tid,
            start_ns,
            duration_ns,
            wait_class,
            slices,
            job_wakes,
            co_waker,
            ..
        } = e
        else {
            return;
        };
        self.offcpu.long.note_wait(crate::model::longwait::LongWait {
            t_ns: h.t_ns,
            start_ns: *start_ns,
            duration_ns: *duration_ns,
            waker: h.pid,
            wakee: *wakee_pid,
            wakee_tid: *wakee_tid,
            waker_reclaim_ns: 0,
            wait_class: *wait_class,
            timeouts: slices.zip(*job_wakes).map(|(s, j)| s.saturating_sub(j)),
            co_waker: *co_waker,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::Header;

    fn h(pid: u32, comm: &str, t_ns: u64) -> Header {
        Header { t_ns, pid, tid: pid, comm: comm.into() }
    }

    #[test]
    fn oom_kill_chain_marks_victim_and_killer() {
        let mut m = Model::default();
        m.tree.seed(10, 1, "trainer", true, 0);
        m.apply(&Event::Fork { h: h(10, "trainer", 1), child_pid: 11, clone_flags: 0x11 });
        m.apply(&Event::Rename {
            h: h(11, "trainer", 2),
            renamed_tid: 11,
            new_comm: "pt_data_worker".into(),
        });
        m.apply(&Event::Reclaim {
            h: h(11, "pt_data_worker", 3),
            kind: ReclaimKind::Memcg,
            start_ns: 2,
            duration_ns: 1_000_000,
            nr_reclaimed: 32,
        });
        m.apply(&Event::OomVictim {
            h: h(10, "trainer", 4),
            victim_pid: 11,
            victim_tid: None,
            victim_comm: "pt_data_worker".into(),
            rss: Some(OomRss {
                total_vm_kb: 1,
                anon_rss_kb: 900_000,
                file_rss_kb: 0,
                shmem_rss_kb: 0,
            }),
            oom_score_adj: 0,
            uid: 0,
        });
        m.apply(&Event::Signal {
            h: h(10, "trainer", 5),
            sig: 9,
            code: 0x80,
            target_pid: 11,
            target_tid: Some(11),
            result: 0,
            target_comm: "pt_data_worker".into(),
        });
        m.apply(&Event::Exit { h: h(11, "pt_data_worker", 6), exit_code: Some(9) });
        let n = m.tree.get(11).expect("worker");
        assert!(n.oom_killed);
        assert_eq!(n.exit_signal(), Some(9));
        assert_eq!(n.killed_by.as_ref().map(|k| k.sender_pid), Some(10));
        assert_eq!(m.oom_kills[0].trigger_pid, 10);
        assert_eq!(m.procs[&11].reclaim_stalls.as_ref().map(|h| h.len()), Some(1));
        assert_eq!(m.events, 6);
    }

    #[test]
    fn kswapd_episodes_are_host_level() {
        let mut m = Model::default();
        m.apply(&Event::Reclaim {
            h: h(77, "kswapd0", 1),
            kind: ReclaimKind::Kswapd,
            start_ns: 0,
            duration_ns: 500,
            nr_reclaimed: 0,
        });
        assert_eq!((m.host.kswapd_episodes, m.host.kswapd_ns), (1, 500));
        assert!(m.procs.is_empty());
    }
}
