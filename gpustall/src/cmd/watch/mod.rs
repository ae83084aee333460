//! `gpustall watch`: the always-on daemon. It finds jobs by itself (`--match` rules, NVML's
//! compute processes), follows them as they come and go, keeps the last minutes in a bounded
//! flight recorder, writes an incident bundle when something goes wrong (an OOM kill or
//! SIGKILL in a watched tree, a GPU stall, a reclaim storm) and serves Prometheus metrics.

pub mod bundle;
pub mod jobs;
pub mod metrics;
pub mod otlp;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    cmd::{
        event_loop::{self, Beat, GpuTicks, Rings, Stop},
        gpu::{GpuOptions, GpuWatch},
    },
    kernel::{
        loader::{self, KernelMaps, Probes},
        preflight,
    },
    model::incident::{Incident, IncidentKind},
    model::{proctree::Role, samples::Sample, stats::IoSlot, Model},
    pipeline::session::{Moment, Session},
    recording::{
        flight::{FlightRecorder, FlightSink},
        header::{Header, IncidentHeader},
        record::Record,
    },
    sources::{agent, clock::monotonic_ns, context::ContextReader, host, procfs},
};
use jobs::{Candidate, MatchRule};
use metrics::{GpuLabel, JobRole, Metrics, ProcDelta};

/// `gpustall watch`'s flags.
#[derive(clap::Args)]
pub struct WatchArgs {
    /// Also watch processes matching RULE: `comm:REGEX` (process name) or `cgroup:SUBSTRING`
    /// (cgroup path). Repeatable. GPU users are always watched.
    #[arg(long = "match", value_name = "RULE")]
    rules: Vec<MatchRule>,
    /// Where incident bundles go.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/gpustall/incidents")]
    bundle_dir: PathBuf,
    /// Address of the Prometheus endpoint (`/metrics`, and `/healthz` for liveness probes):
    /// HOST:PORT (`127.0.0.1:9464`, `localhost:9464`, `[::1]:9464`) or `:PORT` for every
    /// interface.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464", value_parser = crate::cmd::units::parse_listen)]
    listen: std::net::SocketAddr,
    /// How long the flight recorder keeps events and samples.
    #[arg(long, value_name = "D", default_value = "5m", value_parser = crate::cmd::units::parse_duration)]
    window: Duration,
    /// How much of the time before an incident goes into its bundle.
    #[arg(long, value_name = "D", default_value = "2m", value_parser = crate::cmd::units::parse_duration)]
    before: Duration,
    /// How long after an incident its bundle waits (later incidents join it).
    #[arg(long, value_name = "D", default_value = "10s", value_parser = crate::cmd::units::parse_duration)]
    after: Duration,
    /// Keep at most this many bundles (oldest removed first).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_bundles: u64,
    /// Keep bundles within this size in all (oldest removed first); e.g. 512MiB, 2G.
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = crate::cmd::units::parse_size)]
    max_bundle_bytes: u64,
    /// Memory for the flight recorder; e.g. 64MiB, 128M. Older lines are dropped (and counted)
    /// to stay within it.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = crate::cmd::units::parse_size)]
    memory_budget: u64,
    /// How often /proc is scanned for new jobs.
    #[arg(long, value_name = "D", default_value = "2s", value_parser = crate::cmd::units::parse_duration)]
    scan_every: Duration,
    #[command(flatten)]
    gpu: crate::cmd::gpu::GpuArgs,
    #[command(flatten)]
    kernel_log: crate::cmd::KernelLogArgs,
    #[command(flatten)]
    stacks: crate::cmd::StacksArgs,
    #[command(flatten)]
    otlp: otlp::OtlpArgs,
}

impl WatchArgs {
    pub fn into_options(self) -> anyhow::Result<WatchOptions> {
        Ok(WatchOptions {
            otlp: self.otlp.options().map_err(anyhow::Error::msg)?,
            rules: self.rules,
            bundle_dir: self.bundle_dir,
            listen: self.listen,
            window: self.window,
            before: self.before,
            after: self.after,
            max_bundles: self.max_bundles as usize,
            max_bundle_bytes: self.max_bundle_bytes,
            memory_budget: usize::try_from(self.memory_budget).unwrap_or(usize::MAX),
            scan_every: self.scan_every,
            trust_user_kernel_log: self.kernel_log.trust_user_kernel_log,
            py_stacks: self.stacks.py_stacks,
            // A daemon samples less often and calls only long idle periods stalls (evaluation,
            // checkpointing and epoch ends idle a GPU for seconds).
            gpu: self.gpu.options(Duration::from_secs(1), Duration::from_secs(30)),
        })
    }
}

pub struct WatchOptions {
    pub rules: Vec<MatchRule>,
    pub bundle_dir: PathBuf,
    pub listen: SocketAddr,
    /// How long the flight recorder keeps, and how long exited processes stay in the model.
    pub window: Duration,
    /// The bundle covers this much before the incident ...
    pub before: Duration,
    /// ... and this much after it (later incidents in that time join the same bundle).
    pub after: Duration,
    pub max_bundles: usize,
    pub max_bundle_bytes: u64,
    pub memory_budget: usize,
    pub gpu: Option<GpuOptions>,
    pub scan_every: Duration,
    /// `--trust-user-kernel-log`.
    pub trust_user_kernel_log: bool,
    /// OTLP export, where asked.
    pub otlp: Option<otlp::OtlpOptions>,
    /// `--py-stacks`.
    pub py_stacks: crate::sources::pyspy::Rate,
}

struct Job {
    name: String,
}

/// A process's cumulative figures, to turn into metric increments.
#[derive(Clone, Copy, Default, PartialEq)]
struct ProcTotals {
    stall_ns: u64,
    stalls: u64,
    swapout: u64,
    read: u64,
    write: u64,
    reclaim_io: u64,
    /// A trainer's or rank's wait for data (logical waits that ended).
    data_wait_ns: u64,
    /// Its time in the CUDA driver's synchronising calls that returned.
    gpu_wait_ns: u64,
}

impl ProcTotals {
    fn of(p: &crate::model::stats::ProcStats, data_wait_ns: u64, gpu_wait_ns: u64) -> Self {
        let c = &p.counters;
        Self {
            data_wait_ns,
            gpu_wait_ns,
            stall_ns: c.reclaim_ns(),
            stalls: c.reclaim_count(),
            swapout: c.swapout_anon_pages,
            read: p.io_bytes(gpustall_common::counters::IoOp::Read, None),
            write: p.io_bytes(gpustall_common::counters::IoOp::Write, None),
            reclaim_io: p.io.iter().filter(|(k, _)| k.in_reclaim).map(|(_, v)| v.bytes).sum(),
        }
    }
}

struct Daemon {
    opts: WatchOptions,
    session: Session,
    flight: Arc<Mutex<FlightRecorder>>,
    header: Header,
    jobs: BTreeMap<u32, Job>,
    metrics: Arc<Metrics>,
    /// Each process's figures at the last metrics update, keyed by pid and start (a reused pid
    /// is another process). Increments are taken per process, so a process leaving the model
    /// (pruned, folded) never makes a counter step back, and one counted once is never again.
    last_totals: HashMap<(u32, u64), ProcTotals>,
    storms: crate::pipeline::rate_incidents::Storms,
    pending: Option<(Incident, Instant)>,
    /// Incidents folded into the pending bundle and not said one by one (8,000 SIGKILLs of
    /// one job are one bundle and two lines in the log).
    pending_unsaid: u64,
    ctx: ContextReader,
    last_scan: Instant,
    otlp: Option<otlp::Exporter>,
}

impl Daemon {
    fn job_of(&self, pid: u32) -> Option<&Job> {
        self.jobs.get(&self.root_of(pid)?)
    }

    /// The root process of the job `pid` belongs to.
    fn root_of(&self, pid: u32) -> Option<u32> {
        let mut cur = pid;
        for _ in 0..64 {
            if self.jobs.contains_key(&cur) {
                return Some(cur);
            }
            cur = self.session.model.tree.get(cur)?.ppid;
        }
        None
    }

    fn labels(&self, pid: u32) -> Option<JobRole> {
        let (training_job, role) = self.job_and_role(pid)?;
        Some(JobRole::new(training_job, role))
    }

    fn job_and_role(&self, pid: u32) -> Option<(String, Role)> {
        Some((self.job_of(pid)?.name.clone(), self.session.model.tree.role(pid)))
    }

    /// New jobs: roots matched by the rules or by the GPU, with their existing descendants.
    fn discover(&mut self, maps: &mut loader::KernelMaps, now: u64) {
        let need_cgroup = self.opts.rules.iter().any(MatchRule::needs_cgroup);
        let me = std::process::id();
        let all = procfs::all_processes();
        let candidates: Vec<Candidate> = all
            .iter()
            .filter(|p| p.pid != me)
            .map(|p| Candidate {
                pid: p.pid,
                ppid: p.ppid,
                comm: p.comm.clone(),
                cgroup: need_cgroup.then(|| {
                    std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).unwrap_or_default()
                }),
            })
            .collect();
        let gpu_pids: BTreeSet<u32> = self
            .session
            .model
            .gpu
            .latest
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
        let tracked: BTreeSet<u32> = self.session.model.tree.alive_pids().into_iter().collect();
        for root in jobs::new_roots(&candidates, &self.opts.rules, &gpu_pids, &tracked) {
            let members = procfs::descendants_of(root, &all);
            let Some(top) = members.first() else { continue };
            let name = format!("{}-{root}", printable(&top.comm));
            for p in &members {
                if let Err(e) = maps.track(p.pid) {
                    log::warn!("cannot track pid {}: {e}", p.pid);
                    continue;
                }
                self.session.observe(Sample::Seed {
                    t_ns: now,
                    pid: p.pid,
                    ppid: p.ppid,
                    comm: p.comm.clone(),
                    is_target: p.pid == root,
                });
                if let Some(c) = host::cmdline(p.pid) {
                    self.session.observe(Sample::Cmdline {
                        t_ns: now,
                        pid: p.pid,
                        cmdline: c.join(" "),
                    });
                }
                self.session.note_identity(p.pid, now);
            }
            let n = members.len();
            say!("gpustall: watching job {name} ({n} process{})", if n == 1 { "" } else { "es" });
            // Each job is read in its own cgroup and mount namespace.
            self.ctx.add_job(root);
            self.jobs.insert(root, Job { name });
        }
    }

    fn update_metrics(&mut self) {
        let m = &self.session.model;
        let mut deltas: BTreeMap<(String, Role), ProcDelta> = BTreeMap::new();
        let mut memory: BTreeMap<(String, Role), (u64, u64)> = BTreeMap::new();
        // The longest wait for data in progress per (job, role).
        let mut open_waits: BTreeMap<(String, Role), u64> = BTreeMap::new();
        let mut seen = HashMap::new();
        for n in m.tree.iter() {
            let Some(key) = self.job_and_role(n.pid) else { continue };
            let Some(p) = m.procs.get(&n.pid) else { continue };
            let now =
                ProcTotals::of(p, m.offcpu.data_wait(n.pid).ns, m.gpu_waits.returned_ns(n.pid));
            let id = (n.pid, n.started_ns);
            let prev = self.last_totals.get(&id).copied().unwrap_or_default();
            seen.insert(id, now);
            let d = deltas.entry(key.clone()).or_default();
            d.reclaim_stall_seconds += now.stall_ns.saturating_sub(prev.stall_ns) as f64 / 1e9;
            d.reclaim_stalls += now.stalls.saturating_sub(prev.stalls);
            d.swapout_pages += now.swapout.saturating_sub(prev.swapout);
            d.swapout_bytes += now.swapout.saturating_sub(prev.swapout) * page_size();
            d.block_read_bytes += now.read.saturating_sub(prev.read);
            d.block_write_bytes += now.write.saturating_sub(prev.write);
            d.reclaim_io_bytes += now.reclaim_io.saturating_sub(prev.reclaim_io);
            d.data_wait_seconds += now.data_wait_ns.saturating_sub(prev.data_wait_ns) as f64 / 1e9;
            d.gpu_wait_seconds += now.gpu_wait_ns.saturating_sub(prev.gpu_wait_ns) as f64 / 1e9;
            if n.alive() {
                let open = m.offcpu.open_wait(n.pid).map_or(0, |w| w.without_batch_ns);
                let o = open_waits.entry(key.clone()).or_insert(0);
                *o = (*o).max(open);
                let mem = memory.entry(key).or_default();
                mem.0 += p.mem.rss_kb * 1024;
                mem.1 += p.mem.swap_kb * 1024;
            }
        }
        // Processes gone from the model take their baselines with them.
        self.last_totals = seen;
        for ((job, role), d) in deltas {
            if d != ProcDelta::default() {
                self.metrics.add(&JobRole::new(job, role), d);
            }
        }
        for ((job, role), ns) in open_waits {
            if ns > 0 || role.is_main() {
                self.metrics.set_open_data_wait(&JobRole::new(job, role), ns);
            }
        }
        for ((job, role), (res, swap)) in &memory {
            self.metrics.set_memory(&JobRole::new(job.clone(), *role), *res, *swap);
        }
        for g in &m.gpu.latest {
            if let Some(u) = g.util_gpu_pct {
                self.metrics.set_gpu(
                    &GpuLabel { gpu: g.index.to_string() },
                    u as f64 / 100.0,
                    g.temperature_c.map(f64::from),
                );
            }
        }
        let (dropped, held) = self.flight.lock().map_or((0, 0), |f| (f.evicted_early, f.bytes()));
        self.metrics.set_flight_recorder(held as u64, self.opts.memory_budget as u64, dropped);
        self.export_losses(dropped);
        // Jobs with a process alive: an ended job stays in the model for the window, not here.
        let alive = m.tree.alive_pids();
        let live_jobs: BTreeSet<&str> =
            alive.iter().filter_map(|&p| self.job_of(p)).map(|j| j.name.as_str()).collect();
        self.metrics.set_watched(live_jobs.len() as u64, alive.len() as u64);
        self.metrics.beat();
        for (root, ctx) in &m.ctx.jobs_last {
            if let (Some(job), Some(cg)) = (self.jobs.get(root), &ctx.cgroup) {
                let forecast = m.ctx.job_clocks.get(root).and_then(|c| c.forecast());
                self.metrics.set_job_cgroup(&job.name, cg, forecast);
            }
        }
        self.export_identities();
        let (cpu, rss_kb) = agent::agent_usage();
        self.metrics.set_agent(cpu, rss_kb * 1024);
        let maps = crate::kernel::mapmem::held_maps();
        self.metrics.set_bpf_maps(maps.iter().map(|m| m.bytes).sum());
    }

    /// Reclaim storms (`pipeline::rate_incidents::Storms`).
    fn storm(&mut self, now: u64) {
        if let Some(inc) = self.storms.tick(&self.session.model, now) {
            self.session.incidents.push(inc);
        }
    }

    /// What could not be recorded, by reason (`dropped`: the flight recorder's lines).
    fn export_losses(&self, dropped: u64) {
        use gpustall_common::counters::LostCounter;
        let host = &self.session.model.host;
        let lost = |c: LostCounter| host.lost.get(c as usize).copied().unwrap_or(0);
        for (reason, total) in [
            ("critical_ring", lost(LostCounter::CriticalRing)),
            ("bulk_ring", lost(LostCounter::BulkRing)),
            ("map_full", lost(LostCounter::MapFull)),
            ("undecodable", self.session.undecodable),
            ("flight_recorder", dropped),
        ] {
            self.metrics.set_lost_events(reason, total);
        }
    }

    /// Each watched job's identity (its processes' together) as its info series; a job with
    /// none found has one too, its identity labels empty (absent, to Prometheus): the
    /// dashboard lists jobs by this series.
    fn export_identities(&self) {
        for (root, job) in &self.jobs {
            self.metrics.set_job_identity(&job.name, &self.identity_of_job(*root));
        }
    }

    /// The identity of the job rooted at `root`: its processes' together.
    fn identity_of_job(&self, root: u32) -> crate::model::identity::Identity {
        let ids = self.session.model.identities.iter();
        let ids = ids.filter(|(pid, _)| self.root_of(**pid) == Some(root)).map(|(_, id)| id);
        crate::model::identity::Identity::of_job(ids)
    }

    fn take_incidents(&mut self) {
        // The kernel log's faults, folded: each line counts every line it stands for.
        for l in std::mem::take(&mut self.session.logged_faults) {
            if let Some(xid) = l.xid {
                let bus = l.device.clone().unwrap_or_default();
                self.metrics.gpu_xid(&bus, u64::from(xid), l.count.max(1));
            }
        }
        for inc in std::mem::take(&mut self.session.incidents) {
            let job = self.job_of(inc.pid).map(|j| j.name.clone()).unwrap_or_default();
            self.metrics.incident(inc.kind.as_str(), &job);
            match inc.kind {
                IncidentKind::OomKill => {
                    if let Some(l) = self.labels(inc.pid) {
                        self.metrics.oom_kill(&l);
                    }
                }
                IncidentKind::GpuStall => {
                    for s in self.session.model.gpu.stalls.iter().filter(|s| s.start_ns == inc.t_ns)
                    {
                        self.metrics.gpu_stall(&GpuLabel { gpu: s.gpu_index.to_string() });
                    }
                }
                IncidentKind::GpuFault => {
                    let lines = &self.session.model.kernel_log.lines;
                    // NVML's events, where the kernel log has no line for them.
                    let xids = &self.session.model.gpu.xids;
                    for x in xids.iter().filter(|x| x.t_ns == inc.t_ns) {
                        let logged = lines.iter().any(|l| {
                            l.origin.is_trusted()
                                && l.xid.map(u64::from) == Some(x.xid)
                                && l.device == x.pci_bus_id
                        });
                        if !logged {
                            let bus = x.pci_bus_id.clone().unwrap_or_default();
                            self.metrics.gpu_xid(&bus, x.xid, 1);
                        }
                    }
                }
                _ => {}
            }
            match &mut self.pending {
                None => {
                    say!("gpustall: incident: {} (pid {})", inc.kind, inc.pid);
                    self.pending = Some((inc, Instant::now() + self.opts.after));
                }
                // One bundle for incidents close together, named after the gravest (the OOM
                // killer's SIGKILL comes just before its mark_victim).
                Some((first, _)) if inc.kind > first.kind => {
                    say!("gpustall: incident: {} (pid {})", inc.kind, inc.pid);
                    first.kind = inc.kind;
                    first.pid = inc.pid;
                }
                Some(_) => self.pending_unsaid += 1,
            }
        }
    }

    /// The bundle of the pending incident, once its after-window has passed (or now, at exit).
    fn write_bundle(&mut self, force: bool) {
        let Some((inc, due)) = self.pending.clone() else { return };
        if !force && Instant::now() < due {
            return;
        }
        self.pending = None;
        let unsaid = std::mem::take(&mut self.pending_unsaid);
        if unsaid > 0 {
            say!("gpustall: {unsaid} more incidents in the same bundle");
        }
        let from = inc
            .t_ns
            .saturating_sub(self.opts.before.as_nanos() as u64)
            .max(self.session.model.start_ns);
        let (lines, dropped) =
            self.flight.lock().map(|f| (f.since(from), f.evicted_since(from))).unwrap_or_default();
        let header = Header {
            start_ns: from,
            // The wall clock at the window's start, not at the daemon's: `merge` maps the
            // bundle's times to dates through this pair.
            wall_clock_at_start_ns: self.header.wall_clock_at_start_ns
                + from.saturating_sub(self.header.start_ns),
            incident: Some(IncidentHeader { kind: inc.kind, t_ns: inc.t_ns, pid: inc.pid }),
            ..self.header.clone()
        };
        // The bundle is the incident's job's: its processes only (every process of the node
        // when the incident names no watched job), so another job's kill earlier in the window
        // is never this bundle's verdict.
        let root = self.root_of(inc.pid);
        let in_job = |pid: u32| root.is_none() || self.root_of(pid) == root;
        // The tree as it stood: every process alive at the window's start or seen in it.
        let jobs = &self.jobs;
        let tree = self
            .session
            .model
            .tree
            .iter()
            .filter(|n| n.exit_ns.is_none_or(|e| e >= from) && in_job(n.pid));
        let seeds = tree.flat_map(|n| {
            let seed = Sample::Seed {
                t_ns: from,
                pid: n.pid,
                ppid: n.ppid,
                comm: n.comm.clone(),
                is_target: jobs.contains_key(&n.pid),
            };
            let cmdline = n.cmdline.as_ref().map(|c| Sample::Cmdline {
                t_ns: from,
                pid: n.pid,
                cmdline: c.clone(),
            });
            let identity = self.session.model.identities.get(&n.pid).map(|i| Sample::Identity {
                t_ns: from,
                pid: n.pid,
                identity: i.clone(),
            });
            std::iter::once(seed).chain(cmdline).chain(identity).map(Record::Sample)
        });
        // The bundle's verdict is the incident's job's: its cgroup, its filesystems. Each
        // line is parsed, adjusted and written in turn (see bundle::write).
        let mut rebase = crate::cmd::watch::bundle::Rebase::default();
        let window = lines
            .iter()
            .filter_map(|l| Record::parse(l.as_bytes()).ok())
            .filter(|r| crate::cmd::watch::bundle::is_of_job(r, in_job))
            .map(move |r| rebase.record(crate::cmd::watch::bundle::context_of_job(r, root)));
        // An incomplete window says so in the bundle, where its summary will count it.
        let gap = (dropped > 0)
            .then_some(Record::Sample(Sample::RecordingGap { t_ns: inc.t_ns, lines: dropped }));
        let header = Record::Header(Box::new(header));
        let out = std::iter::once(header).chain(seeds).chain(window).chain(gap);
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // The job's identity in the name where known: bundles are found by pod, job or rank.
        let who = root.and_then(|r| self.identity_of_job(r).file_tag());
        let who = who.map(|w| format!("-{w}")).unwrap_or_default();
        let name = format!("incident-{secs:012}-{}-{}{who}", inc.kind, inc.pid);
        let written = crate::cmd::watch::bundle::write(&self.opts.bundle_dir, &name, inc.t_ns, out);
        drop(lines);
        self.export_incident(&inc, unsaid, root, &written);
        self.announce_bundle(&written);
    }

    /// Says where the bundle went and what it found, and keeps the bundle directory within
    /// its limits.
    fn announce_bundle(
        &self,
        written: &anyhow::Result<(PathBuf, crate::output::summary::Summary)>,
    ) {
        match written {
            Ok((dir, summary)) => {
                say!(
                    "gpustall: wrote incident bundle {} ({}: {})",
                    dir.display(),
                    summary.verdict.cause,
                    summary.verdict.text
                );
                for old in crate::cmd::watch::bundle::rotate(
                    &self.opts.bundle_dir,
                    self.opts.max_bundles,
                    self.opts.max_bundle_bytes,
                ) {
                    say!("gpustall: removed old bundle {}", old.display());
                }
            }
            Err(e) => say!("gpustall: cannot write the incident bundle: {e:#}"),
        }
    }

    /// The bundle just written (or not) as an OTLP log record, where asked.
    fn export_incident(
        &mut self,
        inc: &Incident,
        more: u64,
        root: Option<u32>,
        written: &anyhow::Result<(PathBuf, crate::output::summary::Summary)>,
    ) {
        if self.otlp.is_none() {
            return;
        }
        let h = &self.header;
        let log = otlp::IncidentLog {
            at_unix_ns: h.wall_clock_at_start_ns + inc.t_ns.saturating_sub(h.start_ns),
            kind: inc.kind.to_string(),
            pid: inc.pid,
            more,
            job: root.and_then(|r| self.jobs.get(&r)).map(|j| j.name.clone()),
            identity: root.map(|r| self.identity_of_job(r)).unwrap_or_default(),
            verdict: written.as_ref().ok().map(|(_, s)| {
                let v = &s.verdict;
                otlp::VerdictLine {
                    cause: v.cause.to_string(),
                    title: v.cause.title().to_string(),
                    severity: v.cause.severity(),
                    text: v.text.clone(),
                    advice: v.advice.clone(),
                }
            }),
            bundle: match written {
                Ok((dir, _)) => Ok(dir.display().to_string()),
                Err(e) => Err(format!("{e:#}")),
            },
        };
        if let Some(o) = &mut self.otlp {
            o.incident(log);
        }
    }

    /// Processes gone longer than the window leave the model and the kernel maps; jobs with no
    /// process left leave the metrics. This is what keeps the daemon's memory bounded.
    fn prune(&mut self, maps: &mut loader::KernelMaps, now: u64) {
        let mut defer_trim = false;
        let horizon = now.saturating_sub(self.opts.window.as_nanos() as u64);
        // The kernel log's lines last seen before the window, as the flight recorder's.
        self.session.model.kernel_log.forget_before(horizon);
        let gone: Vec<u32> = self
            .session
            .model
            .tree
            .iter()
            .filter(|n| n.exit_ns.is_some_and(|e| e < horizon))
            .map(|n| n.pid)
            .collect();
        // A job with no process alive is no longer read (its cgroup may be gone or reused).
        let alive = self.session.model.tree.alive_pids();
        let live_roots: BTreeSet<u32> = alive.iter().filter_map(|&p| self.root_of(p)).collect();
        for root in self.jobs.keys().filter(|r| !live_roots.contains(r)) {
            self.ctx.remove_job(*root);
        }
        let ended_jobs: Vec<u32> =
            self.jobs.keys().copied().filter(|root| gone.contains(root)).collect();
        for root in ended_jobs {
            // Only once no process of the job is alive.
            let alive = self.session.model.tree.alive_pids().iter().any(|&p| {
                self.job_of(p)
                    .is_some_and(|j| self.jobs.get(&root).is_some_and(|r| r.name == j.name))
            });
            if !alive {
                if let Some(job) = self.jobs.remove(&root) {
                    self.metrics.forget_job(&job.name);
                    say!("gpustall: job {} ended", job.name);
                }
            }
        }
        if gone.len() >= 1000 {
            // After this loop: the freed model memory goes back to the system.
            defer_trim = true;
        }
        for pid in gone {
            if self.jobs.contains_key(&pid) {
                continue; // a root stays while its job lives (it names the job)
            }
            self.session.model.tree.remove(pid);
            let slots: Vec<IoSlot> = self
                .session
                .model
                .procs
                .remove(&pid)
                .map(|p| p.io.keys().copied().collect())
                .unwrap_or_default();
            maps.forget(pid, slots);
        }
        if defer_trim {
            agent::give_back_memory();
        }
    }
}

pub async fn run(opts: WatchOptions) -> anyhow::Result<()> {
    let (mut d, mut probes, mut rings, gpu) = setup(opts).await?;
    let every = d.opts.gpu.as_ref().map_or(Duration::MAX, |g| g.interval);
    let stop =
        event_loop::run(&mut d, &mut rings, &mut probes, GpuTicks { watch: gpu, every }, None)
            .await?;
    log::debug!("watch ended: {stop:?}");
    if let Some(k) = &probes.klog {
        k.drain();
    }
    d.take_incidents();
    d.write_bundle(true);
    if let Some(o) = d.otlp.take() {
        d.update_metrics();
        o.finish(&d.metrics, Duration::from_secs(5));
    }
    say!("gpustall: watch stopped");
    Ok(())
}

/// This host's page size in bytes: the unit of the kernel's swap-out counts.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// A process name as it may be written in a log line, a label or a file name: the kernel lets
/// a process name itself anything (`prctl(PR_SET_NAME)`), newlines included, which would
/// inject lines into the daemon's log.
fn printable(comm: &str) -> String {
    comm.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// Checks, the metrics endpoint, loading and attaching, the flight recorder, the first scan.
async fn setup(opts: WatchOptions) -> anyhow::Result<(Daemon, Probes, Rings, Option<GpuWatch>)> {
    preflight::raise_open_files()?;
    preflight::check_privileges()?;
    preflight::protect_self_from_oom_killer();
    preflight::raise_memlock();
    std::fs::create_dir_all(&opts.bundle_dir)
        .with_context(|| format!("creating the bundle directory {}", opts.bundle_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(opts.listen).await.with_context(|| {
        format!("cannot listen on {} for metrics (choose another with --listen)", opts.listen)
    })?;
    let listen_addr = listener.local_addr()?;
    if !listen_addr.ip().is_loopback() {
        say!(
            "gpustall: note: metrics on {listen_addr} are open to the network: they name the jobs' processes; put it behind a firewall or a NetworkPolicy, or listen on 127.0.0.1"
        );
    }
    let metrics = Arc::new(Metrics::new());
    tokio::spawn(metrics::serve(listener, metrics.clone()));

    let mut probes = loader::load_and_warn()?;
    let start = monotonic_ns();
    let flight = Arc::new(Mutex::new(FlightRecorder::new(
        opts.window.as_nanos() as u64,
        opts.memory_budget,
    )));
    let mut session = Session::new(Model { start_ns: start, last_ns: start, ..Default::default() });
    session.follow_kernel_log(opts.trust_user_kernel_log);
    session.sample_stacks(opts.py_stacks);
    session.recorder = Some(Box::new(FlightSink::new(flight.clone())));
    session.full_counters = true;
    let (gpu, gpu_header) = crate::cmd::gpu::open(opts.gpu.as_ref(), &mut session.model.gpu);
    let header = Header {
        mode: Some("watch".into()),
        ..Header::new(start, &probes.attached, &probes.skipped, gpu_header)
    };
    let mut d = Daemon {
        ctx: ContextReader::host_only(),
        opts,
        session,
        flight,
        header,
        jobs: BTreeMap::new(),
        metrics,
        last_totals: HashMap::new(),
        storms: Default::default(),
        pending: None,
        pending_unsaid: 0,
        last_scan: Instant::now(),
        otlp: None,
    };
    if let Some(o) = d.opts.otlp.clone() {
        let from = otlp::Sender {
            node: host::node_name(),
            started_unix_ns: d.header.wall_clock_at_start_ns,
            k8s_node: std::env::var_os("NODE_NAME").is_some(),
            resource: o.resource.clone(),
        };
        let exporter = otlp::Exporter::start(o, from, d.metrics.clone())
            .context("starting the OTLP exporter's thread")?;
        say!("gpustall: OpenTelemetry export: {}", exporter.describe());
        d.otlp = Some(exporter);
    }
    d.discover(&mut probes.maps, start);
    say!(
        "gpustall: watching ({} jobs now, {} tracepoints); metrics on http://{listen_addr}/metrics; bundles in {}",
        d.jobs.len(),
        probes.attached.len(),
        d.opts.bundle_dir.display()
    );
    let (critical, bulk) = probes.take_rings()?;
    let rings = Rings::register(critical, bulk)?;
    Ok((d, probes, rings, gpu))
}

impl Beat for Daemon {
    fn session(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Only at a fatal signal or an OOM kill: a node's jobs exit and exec all the time, and
    /// each catch-up reads every watched job.
    fn catch_up(&mut self, why: Moment) {
        if why == Moment::Fatal {
            self.ctx.catch_up(&[]);
        }
    }

    /// Discovery, counters and context, storms, incidents, metrics, bundles, pruning.
    fn beat(&mut self, maps: &mut KernelMaps, now: u64) -> Option<Stop> {
        if self.last_scan.elapsed() >= self.opts.scan_every {
            self.discover(maps, now);
            self.last_scan = Instant::now();
        }
        self.session.tick(maps, &mut self.ctx, None, now);
        // Metrics before settling: an exited process's last counts reach its counters before
        // it can be folded away.
        self.update_metrics();
        if let Some(o) = &mut self.otlp {
            o.tick(&self.metrics);
        }
        self.session.settle_exited(maps, now);
        self.storm(now);
        self.take_incidents();
        self.write_bundle(false);
        self.prune(maps, now);
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_name_cannot_inject_log_lines() {
        assert_eq!(super::printable("py\nthon\x1b[2J"), "py?thon?[2J");
        assert_eq!(super::printable("pt_data_worker"), "pt_data_worker");
    }
}
