//! A tracing session: the model and where its observations are written. Shared by `trace`
//! (a recording file) and `watch` (an in-memory flight recorder).

use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};

use crate::kernel::decode::decode;
use crate::kernel::loader;
use crate::model::event::Event;
use crate::model::gpu::StallEpisode;
use crate::model::incident::{Incident, IncidentKind};
use crate::model::proctree::Role;
use crate::model::samples::CountersSample;
use crate::model::samples::Sample;
use crate::model::stats::IoSlot;
use crate::model::stats::MemSample;
use crate::model::Model;
use crate::pipeline::pss::PssTurns;
use crate::recording::record::Line;
use crate::recording::writer::Sink;
use crate::sources::context::ContextReader;
use crate::sources::procfs;
use crate::sources::trainlog::LogSource;

/// At most this many processes are read from /proc per beat (memory, scheduler state).
const PROC_READS_PER_BEAT: usize = 256;

/// fsync the recording at least this often (and at once after an incident).
const SYNC_EVERY: Duration = Duration::from_secs(5);

/// The least time between two passes of [`Session::follow_roles`].
const ROLES_EVERY: Duration = Duration::from_millis(20);

pub struct Session {
    pub model: Model,
    pub recorder: Option<Box<dyn Sink>>,
    /// The last full read of the kernel counters: only changes are recorded, unless
    /// `full_counters` (the flight recorder needs a whole baseline in any window).
    last_counters: CountersSample,
    pub full_counters: bool,
    pub undecodable: u64,
    /// Incidents since the caller last took them.
    pub incidents: Vec<Incident>,
    /// The kernel log's GPU faults of the last read, folded (each with its count): the lines
    /// behind its `GpuFault` incidents (`watch` counts them in its metrics).
    pub logged_faults: Vec<crate::model::kernlog::KernelLogLine>,
    /// An incident arrived: sync the recording now.
    incident: bool,
    last_sync: Instant,
    /// Processes seen as zombies at their last read.
    zombies: std::collections::HashSet<u32>,
    /// The last pid read from /proc (see `proc_batch`).
    proc_cursor: u32,
    /// Processes whose exit was drained since the last beat (see `settle_exited`).
    exited: Vec<u32>,
    /// Whose PSS is read at the next beats.
    pss_turns: PssTurns,
    /// Training-log steps seen so far: each step's number in the recording.
    steps_seen: u64,
    /// A fork, exec or rename was drained since roles were last given to the kernel, and
    /// when they last were.
    roles_moved: bool,
    roles_given: Instant,
    /// The kernel log, where it can be read (`follow_kernel_log`).
    kmsg: Option<crate::sources::kmsg::KmsgReader>,
    /// The strongest reason drained since [`Session::take_moment`] to read the job's
    /// surroundings before the next beat.
    moment: Option<Moment>,
    /// The tree's last fork or exec drained (kernel time): a job may have made its own mount
    /// namespace then (see `sources::context`).
    pub tree_changed_ns: u64,
    /// The job's Python stacks, where sampled (`sample_stacks`).
    stacks: Option<crate::sources::pyspy::StackSampler>,
}

/// Why the job's surroundings (its /dev/shm, its cgroup) are read now, between beats: its
/// processes may be gone by the next one, and with them the only way into its mount namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Moment {
    /// A process of the tree forked, exec'd or exited (a job that mounted its own /dev/shm and
    /// exec'd its trainer, a last process on its way out).
    Change,
    /// A fatal signal or an OOM kill: what filled up is in the reading taken now.
    Fatal,
}

impl Session {
    pub fn new(model: Model) -> Self {
        Self {
            model,
            recorder: None,
            last_counters: CountersSample::default(),
            full_counters: false,
            undecodable: 0,
            incidents: Vec::new(),
            logged_faults: Vec::new(),
            incident: false,
            last_sync: Instant::now(),
            zombies: std::collections::HashSet::new(),
            exited: Vec::new(),
            proc_cursor: 0,
            pss_turns: PssTurns::default(),
            steps_seen: 0,
            roles_moved: false,
            roles_given: Instant::now(),
            kmsg: None,
            moment: None,
            tree_changed_ns: 0,
            stacks: None,
        }
    }

    /// Why the job's surroundings should be read now, if anything drained since the last
    /// call says so.
    pub fn take_moment(&mut self) -> Option<Moment> {
        self.moment.take()
    }

    fn note_moment(&mut self, m: Moment) {
        self.moment = self.moment.max(Some(m));
    }

    pub fn observe(&mut self, s: Sample) {
        if let Some(r) = self.recorder.as_mut() {
            r.write(Line::Sample(&s));
        }
        let ended = self.model.observe(&s);
        self.stalls_ended(&ended);
    }

    /// Records which job `pid` belongs to in its cluster, where anything says so.
    pub fn note_identity(&mut self, pid: u32, t_ns: u64) {
        let identity = crate::sources::identity_read::read(pid);
        let known = self.model.identities.get(&pid);
        if !identity.is_empty() && known != Some(&identity) {
            self.observe(Sample::Identity { t_ns, pid, identity });
        }
    }

    pub fn stalls_ended(&mut self, ended: &[StallEpisode]) {
        if ended.is_empty() {
            return;
        }
        self.incident = true;
        for e in ended {
            self.incidents.push(Incident {
                kind: IncidentKind::GpuStall,
                t_ns: e.start_ns,
                pid: e.pids.first().copied().unwrap_or(0),
            });
            if let Some(r) = self.recorder.as_mut() {
                r.write(Line::GpuStall(e));
            }
        }
    }

    /// Takes in what `ring` holds; returns how many records that was.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) -> usize {
        let mut records = 0;
        while let Some(item) = ring.next() {
            records += 1;
            let e = match decode(&item) {
                Ok(e) => e,
                Err(err) => {
                    self.undecodable += 1;
                    log::debug!("undecodable record: {err}");
                    continue;
                }
            };
            if let Some(r) = self.recorder.as_mut() {
                r.write(Line::Event(&e));
            }
            self.model.apply(&e);
            match &e {
                Event::Fork { h, .. } | Event::Exec { h, .. } => {
                    self.tree_changed_ns = self.tree_changed_ns.max(h.t_ns);
                    self.note_moment(Moment::Change);
                }
                Event::Exit { .. } => self.note_moment(Moment::Change),
                Event::OomVictim { .. } | Event::Signal { .. } => self.note_moment(Moment::Fatal),
                _ => {}
            }
            match &e {
                Event::Exit { h, .. } => self.exited.push(h.pid),
                Event::OomVictim { h, victim_pid, .. } => {
                    self.incident = true;
                    self.incidents.push(Incident {
                        kind: IncidentKind::OomKill,
                        t_ns: h.t_ns,
                        pid: *victim_pid,
                    });
                }
                Event::Signal { h, sig, target_pid, .. } if *sig == libc::SIGKILL => {
                    self.incident = true;
                    self.incidents.push(Incident {
                        kind: IncidentKind::Sigkill,
                        t_ns: h.t_ns,
                        pid: *target_pid,
                    });
                }
                Event::Signal { .. } => self.incident = true,
                Event::Fork { .. } | Event::Exec { .. } | Event::Rename { .. } => {
                    self.roles_moved = true;
                }
                _ => {}
            }
            // Roles need command lines (torchrun, forkserver, spawn): read them while the
            // process is young. Best effort: it may be gone already.
            let pid = match &e {
                Event::Fork { child_pid, .. } => Some(*child_pid),
                Event::Exec { h, .. } => Some(h.pid),
                _ => None,
            };
            if let Some(pid) = pid {
                let t_ns = e.header().t_ns;
                if let Some(c) = crate::sources::host::cmdline(pid) {
                    self.observe(Sample::Cmdline { t_ns, pid, cmdline: c.join(" ") });
                }
                // A rank's environment is its own from its exec (torchrun sets RANK there).
                if matches!(e, Event::Exec { .. }) {
                    self.note_identity(pid, t_ns);
                }
            }
        }
        records
    }

    fn counters(&mut self, maps: &loader::KernelMaps, now: u64) {
        let full = maps.read(now, self.undecodable);
        let changes =
            if self.full_counters { full.clone() } else { full.changes_since(&self.last_counters) };
        if !changes.is_empty() {
            self.observe(Sample::Counters(changes));
        }
        self.last_counters = full;
    }

    /// /proc memory of live processes; processes that vanished without an exit event (lost)
    /// are marked gone so the trace can end.
    fn sample_proc(&mut self, batch: &[u32], now: u64) {
        let alive = |p: u32| self.model.tree.get(p).is_some_and(|n| n.alive());
        self.zombies.retain(|p| alive(*p));
        self.pss_turns.retain(alive);
        let mems: Vec<(u32, Option<MemSample>)> =
            batch.iter().map(|&pid| (pid, procfs::sample_mem(pid))).collect();
        // PSS for the job's own processes only, where their memory moved, in turns when their
        // walks are costly.
        let roles: Vec<(u32, u64)> = mems
            .iter()
            .filter(|(pid, _)| self.model.tree.role(*pid) != Role::Other)
            .filter_map(|(pid, m)| m.as_ref().map(|m| (*pid, m.pss_base_kb())))
            .collect();
        let pss_due = self.pss_turns.due(&roles, now);
        for (pid, mem) in mems {
            match mem {
                Some(mut mem) => {
                    if pss_due.contains(&pid) {
                        let walk = Instant::now();
                        mem.pss_kb = procfs::sample_pss_kb(pid);
                        self.pss_turns.read(pid, now, walk.elapsed(), mem.pss_base_kb());
                    }
                    self.observe(Sample::ProcMem { t_ns: now, pid, mem })
                }
                None if !procfs::exists(pid) => self.observe(Sample::Vanished { t_ns: now, pid }),
                // A zombie: its exit event is on its way, unless it was lost; one still alive
                // in the model at its next read lost it.
                None if self.zombies.contains(&pid) => {
                    self.observe(Sample::Vanished { t_ns: now, pid })
                }
                None => {
                    self.zombies.insert(pid);
                }
            }
        }
    }

    /// The live processes to read from /proc this beat: all of them up to
    /// [`PROC_READS_PER_BEAT`], else the next ones in turn (by pid, wrapping around), so a
    /// tree of thousands of idle processes costs a bounded number of reads per second.
    fn proc_batch(&mut self) -> Vec<u32> {
        let alive = self.model.tree.alive_pids();
        if alive.len() <= PROC_READS_PER_BEAT {
            return alive;
        }
        let start = alive.partition_point(|&p| p <= self.proc_cursor);
        let batch: Vec<u32> = alive[start..]
            .iter()
            .chain(&alive[..start])
            .take(PROC_READS_PER_BEAT)
            .copied()
            .collect();
        self.proc_cursor = batch.last().copied().unwrap_or(0);
        batch
    }

    /// New training-log lines: per-step times onto the timeline (stamped when read: the log's
    /// own clock is not ours).
    fn read_log(&mut self, log: &mut LogSource, now: u64) {
        for line in log.poll() {
            if let Some(step) = log.patterns.parse(&line) {
                self.steps_seen += 1;
                self.observe(Sample::TrainStep {
                    t_ns: now,
                    data_time_s: step.data_time_s,
                    iter_time_s: step.iter_time_s,
                    iter: step.iter,
                    seq: Some(self.steps_seen),
                });
            }
        }
    }

    /// Samples the Python stacks of the job's trainers, ranks and workers from now on.
    pub fn sample_stacks(&mut self, rate: crate::sources::pyspy::Rate) {
        self.stacks = crate::sources::pyspy::StackSampler::start(rate);
    }

    /// Gives the stack sampler this beat's processes and takes in what it found.
    fn read_stacks(&mut self) {
        use crate::sources::pyspy::Target;
        let Some(sampler) = &self.stacks else { return };
        let tree = &self.model.tree;
        let targets = tree
            .alive_pids()
            .into_iter()
            .filter_map(|pid| match tree.role(pid) {
                Role::Trainer | Role::Rank => Some(Target { pid, every_round: true }),
                Role::DataloaderWorker => Some(Target { pid, every_round: false }),
                Role::Forkserver | Role::Other => None,
            })
            .collect();
        sampler.set_targets(targets);
        for s in sampler.take() {
            self.observe(s);
        }
    }

    /// Stops sampling stacks and takes in the last of them (at the end of a trace).
    pub fn finish_stacks(&mut self) {
        if let Some(sampler) = self.stacks.take() {
            for s in sampler.finish() {
                self.observe(s);
            }
        }
    }

    /// Everything a tick looks at.
    pub fn tick(
        &mut self,
        maps: &loader::KernelMaps,
        ctx: &mut ContextReader,
        log: Option<&mut LogSource>,
        now: u64,
    ) {
        self.counters(maps, now);
        let batch = self.proc_batch();
        self.sample_proc(&batch, now);
        ctx.job_changed(self.tree_changed_ns);
        // The kernel log first: a cgroup its OOM report names is read in this tick's context.
        for (path, victim) in self.read_kernel_log(now) {
            ctx.oom_reported(&path, victim, &self.model.tree);
        }
        self.observe(Sample::Context(Box::new(ctx.read(&batch, now))));
        if let Some(log) = log {
            self.read_log(log, now);
        }
        self.read_stacks();
    }

    /// Follows the kernel log from now on; where it cannot be read, says so once (its verdicts,
    /// a GPU's Xid faults, hung tasks, storage errors, are then not made). `trust_user_space`
    /// (`--trust-user-kernel-log`): lines user space writes into it count as the kernel's.
    pub fn follow_kernel_log(&mut self, trust_user_space: bool) {
        match crate::sources::kmsg::KmsgReader::open(trust_user_space) {
            Ok(r) => self.kmsg = Some(r),
            Err(e) => log::warn!(
                "the kernel log is not read (/dev/kmsg: {e}): GPU Xid faults, hung tasks and storage errors it reports are not looked for"
            ),
        }
    }

    /// The kernel log's new lines that matter, folded: a report naming a process (a hung task,
    /// a soft lockup, an OOM kill) only when it is one of the traced tree's; the node's GPU,
    /// storage and hardware errors always. Returns the memory cgroups the kernel's own OOM
    /// reports among them named for the tree's victims, each with its victim.
    fn read_kernel_log(&mut self, now: u64) -> Vec<(String, u32)> {
        use crate::model::kernlog::{xid_meaning, LogWhat, XidSide};
        self.logged_faults.clear();
        let mut oom_cgroups = Vec::new();
        let Some(r) = self.kmsg.as_mut() else { return oom_cgroups };
        let tree = &self.model.tree;
        let (lines, dropped) = r.read(|line| {
            let names_a_process = matches!(
                line.what,
                LogWhat::HungTask | LogWhat::SoftLockup | LogWhat::OomKill | LogWhat::OomCgroup
            );
            !names_a_process || line.pid.is_some_and(|p| tree.contains(p))
        });
        let missed = std::mem::take(&mut r.missed);
        for line in lines {
            // A GPU fault is an incident (a bundle in `watch`, a synced recording): an Xid
            // that only follows another fault (45, a cleanup) is not, nor a line user space
            // wrote.
            let fault = line.xid.map(xid_meaning);
            if line.origin.is_trusted()
                && fault.is_some_and(|(side, _)| side != XidSide::Consequence)
            {
                self.incident = true;
                self.incidents.push(Incident {
                    kind: IncidentKind::GpuFault,
                    t_ns: line.t_ns,
                    pid: line.pid.unwrap_or(0),
                });
                self.logged_faults.push(line.clone());
            }
            if line.what == LogWhat::OomCgroup && line.origin.is_trusted() {
                oom_cgroups.extend(line.device.clone().zip(line.pid));
            }
            self.observe(Sample::KernelLog(line));
        }
        if missed > 0 || dropped > 0 {
            self.observe(Sample::KernelLogMissed { t_ns: now, records: missed, dropped });
        }
        oom_cgroups
    }

    /// Gives the kernel the job's roles as soon as a drain moved them (a worker forked and
    /// renamed itself): its off-CPU accounting and its trainer's feeders start with its first
    /// batch, not at the next beat. At most every [`ROLES_EVERY`]: each pass reads the roles
    /// of the whole tree, and a fork burst drains many times a second.
    /// Probes the CUDA drivers the live trainers and ranks mapped (`kernel::cuda`); what was
    /// found is recorded.
    pub fn follow_cuda(&mut self, probes: &mut loader::Probes, now: u64) {
        let waiters = crate::kernel::cuda::waiters(&self.model.tree);
        for r in probes.follow_cuda(&waiters, now) {
            self.observe(Sample::CudaProbes(r));
        }
    }

    pub fn follow_roles(&mut self, maps: &mut loader::KernelMaps) {
        if self.roles_moved && self.roles_given.elapsed() >= ROLES_EVERY {
            self.roles_moved = false;
            self.roles_given = Instant::now();
            maps.account_offcpu(&self.model.tree);
        }
    }

    /// After the beat's counter read: processes that exited before it have their last counts
    /// in the model, so their kernel entries are deleted (the maps hold live processes only,
    /// and a reused pid starts from zero); then the exited processes that matter to no verdict
    /// are folded. Both are recorded, so a replay does the same.
    pub fn settle_exited(&mut self, maps: &mut loader::KernelMaps, now: u64) {
        self.finalize_exited(maps, now);
        self.fold_exited(maps, now);
        maps.account_offcpu(&self.model.tree);
    }

    fn finalize_exited(&mut self, maps: &mut loader::KernelMaps, now: u64) {
        let m = &self.model;
        let settled = |pid: &u32| m.procs.get(pid).is_some_and(|p| p.final_counters);
        // An entry re-created after its process was settled (a late I/O completion) goes too.
        let stray = self.last_counters.procs.iter().map(|p| p.pid);
        let stray = stray.chain(self.last_counters.io.iter().map(|r| r.pid)).filter(settled);
        let mut pids: Vec<u32> = std::mem::take(&mut self.exited);
        pids.extend(stray);
        pids.sort_unstable();
        pids.dedup();
        // A pid already reused by a live process of the tree is that process's now.
        pids.retain(|pid| m.tree.get(*pid).is_some_and(|n| !n.alive()));
        let newly: Vec<u32> = pids.iter().copied().filter(|p| !settled(p)).collect();
        for &pid in &pids {
            let keys = m.procs.get(&pid).map(|p| p.io.keys().copied().collect::<Vec<_>>());
            maps.forget(pid, keys.unwrap_or_default());
        }
        if !newly.is_empty() {
            self.observe(Sample::Final { t_ns: now, pids: newly });
        }
    }

    /// Folds exited processes that matter to no verdict and deletes what the kernel still
    /// holds for them: a fork storm leaves the model and the maps small.
    fn fold_exited(&mut self, maps: &mut loader::KernelMaps, now: u64) {
        let pids = self.model.foldable();
        if pids.is_empty() {
            return;
        }
        let slots: Vec<(u32, Vec<IoSlot>)> = pids
            .iter()
            .map(|&pid| {
                let keys = self.model.procs.get(&pid).map(|p| p.io.keys().copied().collect());
                (pid, keys.unwrap_or_default())
            })
            .collect();
        self.observe(Sample::Fold { t_ns: now, pids });
        let many = slots.len() >= 1000;
        for (pid, keys) in slots {
            maps.forget(pid, keys);
        }
        if many {
            crate::sources::agent::give_back_memory();
        }
    }

    /// fsync the recording after an incident, and at least every [`SYNC_EVERY`].
    pub fn sync_if_due(&mut self) {
        if self.incident || self.last_sync.elapsed() >= SYNC_EVERY {
            if let Some(r) = self.recorder.as_mut() {
                r.sync();
            }
            self.incident = false;
            self.last_sync = Instant::now();
        }
    }
}
