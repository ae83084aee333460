//! Prometheus metrics for `gpustall watch`, and the small HTTP server that exposes them.
//!
//! A daemon that watches every training job on a node is only useful if its findings reach the
//! dashboards and alerts people already have, so it exports counters to the Prometheus they
//! already run instead of keeping its own store or aggregation server. The exposition format is
//! left to `prometheus-client` (the Prometheus project's own Rust client: escaping, `# EOF`,
//! `_total` and unit suffixes are its job) and HTTP to hyper, so no hand-written parser faces the
//! network.
//!
//! Jobs come and go on a long-lived node: [`Metrics::forget_job`] drops a finished job's series so
//! the daemon's memory and the scrape size stay bounded.

use std::{
    collections::HashSet,
    convert::Infallible,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming,
    header::{HeaderValue, ALLOW, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    encoding::{
        prometheus_protobuf::prometheus_data_model::MetricFamily, text::encode, EncodeLabelSet,
    },
    metrics::{counter::Counter, family::Family, gauge::Gauge, info::Info},
    registry::{Registry, Unit},
};
use tokio::{net::TcpListener, sync::Semaphore};

use crate::model::untrusted;

mod cgroup;
mod families;

/// Labels of per-job, per-role series. The label is `training_job`, not `job`: Prometheus sets
/// `job` on every scrape target and would rename ours to `exported_job`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobRole {
    pub training_job: String,
    pub role: String,
}

impl JobRole {
    pub fn new(training_job: String, role: crate::model::proctree::Role) -> Self {
        Self { training_job, role: role.as_str().to_string() }
    }
}

/// Labels of a job's info series (value 1): which job it is in its cluster, to join its other
/// series on (`* on (training_job) group_left(namespace, pod) gpustall_job_info`). One series
/// per job; a label is empty where nothing said.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobInfo {
    pub training_job: String,
    pub namespace: String,
    pub pod: String,
    /// The container's name in its pod, where the kubelet's log files say it.
    pub container: String,
    pub slurm_job: String,
    pub run_id: String,
    /// The job's torch.distributed rank where it is one rank (a pod or an `srun` task per
    /// rank); empty for a launcher with several ranks on the node (their roles say `rank`).
    pub rank: String,
    pub world_size: String,
}

impl JobInfo {
    pub fn of(job: &str, id: &crate::model::identity::Identity) -> Self {
        // Read from the job's world (its environment, its root, the kubelet's log names):
        // shown safely, as every name is.
        let text = |v: &Option<String>| v.as_deref().map(untrusted::name).unwrap_or_default();
        JobInfo {
            training_job: untrusted::name(job),
            namespace: text(&id.namespace),
            pod: text(&id.pod.clone().or_else(|| id.pod_uid.clone())),
            container: text(&id.container),
            slurm_job: text(&id.slurm_job),
            run_id: text(&id.run_id),
            rank: id.rank.map(|r| r.to_string()).unwrap_or_default(),
            world_size: id.world_size.map(|w| w.to_string()).unwrap_or_default(),
        }
    }
}

/// Labels of `gpustall_build_info` (value 1), as exporters write theirs: which gpustall
/// answers, on which kernel, on which node. `hostname` (NODE_NAME where the DaemonSet sets it)
/// is what the dashboard lists nodes by: the target's own labels carry no node name unless the
/// scrape config relabels one in, and a `node` label here would clash with that one.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildInfo {
    version: String,
    kernel: String,
    hostname: String,
}

/// Label of per-GPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabel {
    pub gpu: String,
}

/// Labels of the GPU Xid counter: the GPU's PCI bus id as the driver logs it, and the Xid
/// (a few dozen numbers: bounded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabel {
    pci_bus_id: String,
    xid: String,
}

/// Labels of the incident counter: what happened, and to which job (empty when to none: a
/// GPU stall no process is named for).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IncidentLabels {
    kind: String,
    training_job: String,
}

/// Label of the OTLP failure counter: which signal did not get through.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabel {
    signal: String,
}

/// Label of the lost-events counter: where events were lost.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LostReason {
    reason: String,
}

/// Increments since the last update of one (job, role): the caller computes the deltas.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcDelta {
    pub reclaim_stall_seconds: f64,
    pub reclaim_stalls: u64,
    pub swapout_pages: u64,
    /// The same in bytes, at this host's page size (64 KiB on many arm64 GPU nodes).
    pub swapout_bytes: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub reclaim_io_bytes: u64,
    /// Trainers' and ranks' wait for data (logical waits that ended).
    pub data_wait_seconds: f64,
    /// Trainers' and ranks' time inside the CUDA driver's synchronising calls that returned.
    pub gpu_wait_seconds: f64,
}

/// A counter of seconds: prometheus-client stores the f64 in an `AtomicU64`.
type SecondsCounter = Counter<f64, std::sync::atomic::AtomicU64>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
type ByteGauge = Gauge<u64, std::sync::atomic::AtomicU64>;

families::families! {
    /// The families keyed by (job, role): every one of them is cleared by `forget_job`.
    JobFamilies<JobRole> {
        reclaim_stall_seconds: SecondsCounter, "reclaim_stall", Some(Unit::Seconds), true,
            "Time processes of the job spent stalled in direct or memcg reclaim";
        reclaim_stalls: Counter, "reclaim_stalls", None, true,
            "Direct or memcg reclaim episodes that stalled processes of the job";
        swapout_pages: Counter, "swapout_pages", None, true,
            "Anonymous pages of the job's processes written out to swap by reclaim";
        swapout_bytes: Counter, "swapout", Some(Unit::Bytes), true,
            "Anonymous memory of the job's processes written out to swap by reclaim, at the host's page size";
        block_read_bytes: Counter, "block_read", Some(Unit::Bytes), true,
            "Block I/O read bytes submitted by processes of the job";
        block_write_bytes: Counter, "block_write", Some(Unit::Bytes), true,
            "Block I/O write bytes submitted by processes of the job";
        reclaim_io_bytes: Counter, "reclaim_io", Some(Unit::Bytes), true,
            "Block I/O bytes the job's processes submitted inside reclaim (swap and writeback under memory pressure)";
        oom_kills: Counter, "oom_kills", None, true,
            "Processes of the job killed by the OOM killer";
        resident_bytes: ByteGauge, "process_resident", Some(Unit::Bytes), true,
            "Resident memory summed over the job's processes of this role";
        swap_bytes: ByteGauge, "process_swap", Some(Unit::Bytes), true,
            "Swapped-out memory summed over the job's processes of this role";
        data_wait_seconds: SecondsCounter, "data_wait", Some(Unit::Seconds), true,
            "Time the job's trainers or ranks waited for data (whole waits, across timeouts and the pin-memory thread, ended by a worker's batch)";
        // Not made at zero: a role that never waits (the workers) has no series of it.
        open_data_wait_seconds: FloatGauge, "data_wait_open", Some(Unit::Seconds), false,
            "How long a trainer or rank has been waiting for data with no batch coming (0: not waiting; a trainer hung on its input grows it)";
        gpu_wait_seconds: SecondsCounter, "gpu_wait", Some(Unit::Seconds), true,
            "Time the job's trainers or ranks waited for the GPU inside the CUDA driver's synchronising calls (uprobes; calls that returned)";
    }
}

/// The last cumulative totals passed in, to turn them into counter increments.
#[derive(Default)]
struct LastTotals {
    lost_events: std::collections::HashMap<String, u64>,
    agent_cpu_seconds: f64,
    flight_recorder_dropped: u64,
}

/// All metrics of the agent, behind `&self` so one `Arc<Metrics>` serves the daemon loop and the
/// HTTP server at once.
pub struct Metrics {
    registry: Registry,
    jobs: JobFamilies,
    /// Every (job, role) with a series: `Family` cannot be searched by one label, so
    /// `forget_job` needs this to find what to remove. Held while the job families are updated so
    /// a concurrent `forget_job` cannot leave a series behind that this set no longer knows.
    known: Mutex<HashSet<JobRole>>,
    gpu_utilization: Family<GpuLabel, FloatGauge>,
    gpu_temperature: Family<GpuLabel, FloatGauge>,
    gpu_stall_episodes: Family<GpuLabel, Counter>,
    gpu_xid_errors: Family<XidLabel, Counter>,
    lost_events: Family<LostReason, Counter>,
    watched_jobs: ByteGauge,
    watched_processes: ByteGauge,
    incidents: Family<IncidentLabels, Counter>,
    agent_cpu_seconds: SecondsCounter,
    agent_resident_bytes: ByteGauge,
    agent_bpf_map_bytes: ByteGauge,
    agent_memory_budget: ByteGauge,
    flight_recorder_bytes: ByteGauge,
    flight_recorder_dropped: Counter,
    otlp_failures: Family<SignalLabel, Counter>,
    totals: Mutex<LastTotals>,
    cgroups: cgroup::CgroupFamilies,
    job_info: Family<JobInfo, Gauge>,
    /// Each job's info labels now, to remove the old series when they change.
    job_info_now: Mutex<std::collections::HashMap<String, JobInfo>>,
    /// When the daemon's loop last completed a beat (monotonic seconds): `/healthz` fails
    /// when it stops beating (a loop stuck in a read is alive to a plain TCP probe).
    beat_at: std::sync::atomic::AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A poisoned lock only means another thread panicked mid-update of plain numbers; the daemon
/// must go on, so take the data anyway.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `v` if it can be added to a counter: finite and positive (zero adds nothing anyway).
fn nonneg(v: f64) -> Option<f64> {
    (v.is_finite() && v > 0.0).then_some(v)
}

impl Metrics {
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::default(),
            jobs: JobFamilies::default(),
            known: Mutex::new(HashSet::new()),
            gpu_utilization: Family::default(),
            gpu_temperature: Family::default(),
            gpu_stall_episodes: Family::default(),
            gpu_xid_errors: Family::default(),
            lost_events: Family::default(),
            watched_jobs: ByteGauge::default(),
            watched_processes: ByteGauge::default(),
            incidents: Family::default(),
            agent_cpu_seconds: SecondsCounter::default(),
            agent_resident_bytes: ByteGauge::default(),
            agent_bpf_map_bytes: ByteGauge::default(),
            agent_memory_budget: ByteGauge::default(),
            flight_recorder_bytes: ByteGauge::default(),
            flight_recorder_dropped: Counter::default(),
            otlp_failures: Family::default(),
            totals: Mutex::new(LastTotals::default()),
            cgroups: cgroup::CgroupFamilies::default(),
            job_info: Family::default(),
            job_info_now: Mutex::new(std::collections::HashMap::new()),
            beat_at: std::sync::atomic::AtomicU64::new(monotonic_s()),
        };

        // The registry adds the `gpustall_` prefix, the unit suffix and, for counters, `_total`;
        // the names registered are the stems. Families are `Arc`s inside, so the clones
        // registered and the fields kept in `Metrics` are the same series.
        let mut r = Registry::with_prefix("gpustall");
        m.jobs.register(&mut r);
        m.cgroups.register(&mut r);
        m.register_gpus(&mut r);
        m.register_node(&mut r);
        m.register_agent(&mut r);
        Self { registry: r, ..m }
    }

    fn register_gpus(&self, r: &mut Registry) {
        r.register_with_unit(
            "gpu_utilization",
            "GPU utilisation reported by NVML over its last sample period, 0 to 1",
            Unit::Other("ratio".to_string()),
            self.gpu_utilization.clone(),
        );
        r.register_with_unit(
            "gpu_temperature",
            "GPU core temperature reported by NVML",
            Unit::Celsius,
            self.gpu_temperature.clone(),
        );
        r.register(
            "gpu_stall_episodes",
            "Episodes of low GPU utilisation while a watched job was alive",
            self.gpu_stall_episodes.clone(),
        );
        r.register(
            "gpu_xid_errors",
            "GPU faults the NVIDIA driver reported in the kernel log (Xid lines), by GPU and Xid",
            self.gpu_xid_errors.clone(),
        );
    }

    /// What the agent watches and what it found.
    fn register_node(&self, r: &mut Registry) {
        r.register(
            "job_info",
            "A watched job's identity in its cluster (namespace, pod, Slurm job, torchrun run and rank), value 1",
            self.job_info.clone(),
        );
        r.register(
            "lost_events",
            "Events that could not be recorded, by reason: a full ring buffer (critical_ring, bulk_ring), a full kernel map (map_full), an undecodable record, the flight recorder's budget",
            self.lost_events.clone(),
        );
        r.register("watched_jobs", "Jobs the agent currently watches", self.watched_jobs.clone());
        r.register(
            "watched_processes",
            "Processes the agent currently follows across all watched jobs",
            self.watched_processes.clone(),
        );
        r.register("incidents", "Incidents detected, by kind", self.incidents.clone());
    }

    /// The agent's own cost and its flight recorder.
    fn register_agent(&self, r: &mut Registry) {
        // An OpenMetrics info metric: `gpustall_build_info{version,kernel,hostname} 1`.
        r.register(
            "build",
            "Which gpustall serves these metrics (version) on which kernel",
            Info::new(BuildInfo {
                version: env!("CARGO_PKG_VERSION").to_string(),
                kernel: crate::sources::host::kernel_release(),
                hostname: crate::sources::host::node_name(),
            }),
        );
        r.register_with_unit(
            "agent_cpu",
            "CPU time (user and system) used by the gpustall agent itself",
            Unit::Seconds,
            self.agent_cpu_seconds.clone(),
        );
        r.register_with_unit(
            "agent_resident_memory",
            "Resident memory of the gpustall agent itself",
            Unit::Bytes,
            self.agent_resident_bytes.clone(),
        );
        r.register_with_unit(
            "agent_bpf_map_memory",
            "Kernel memory of the gpustall agent's BPF maps and rings (not in its resident memory)",
            Unit::Bytes,
            self.agent_bpf_map_bytes.clone(),
        );
        // What the alert "agent over its memory budget" compares: the flight recorder against
        // --memory-budget, and the lines it had to drop to stay within it.
        r.register_with_unit(
            "agent_memory_budget",
            "The flight recorder's memory budget (--memory-budget)",
            Unit::Bytes,
            self.agent_memory_budget.clone(),
        );
        r.register_with_unit(
            "flight_recorder",
            "Memory held by the flight recorder's window of events and samples",
            Unit::Bytes,
            self.flight_recorder_bytes.clone(),
        );
        r.register(
            "flight_recorder_dropped_lines",
            "Lines the flight recorder dropped before they left its window, to stay within its budget",
            self.flight_recorder_dropped.clone(),
        );
        r.register(
            "otlp_export_failures",
            "OTLP exports (--otlp-endpoint) that did not reach the collector, by signal (metrics, logs), after their retries",
            self.otlp_failures.clone(),
        );
    }

    /// Remembers `labels` for `forget_job`; the returned guard must be held while the caller
    /// touches the job families (see `known`).
    fn track(&self, labels: &JobRole) -> MutexGuard<'_, HashSet<JobRole>> {
        let mut known = lock(&self.known);
        if !known.contains(labels) {
            // Every series of a new (job, role) starts at zero: `increase()` and `rate()` see no
            // increase in a series' first sample, so an OOM kill that created its counter at 1
            // would never fire an alert.
            self.jobs.create(labels);
            known.insert(labels.clone());
        }
        known
    }

    /// Adds one update's increments. Every series of the (job, role) is created, at zero if need
    /// be, so `rate()` has a first sample before the first stall.
    pub fn add(&self, labels: &JobRole, d: ProcDelta) {
        let _known = self.track(labels);
        let j = &self.jobs;
        let stall = j.reclaim_stall_seconds.get_or_create(labels);
        // A counter must never go down: a negative or NaN delta from a caller bug is dropped.
        if let Some(s) = nonneg(d.reclaim_stall_seconds) {
            stall.inc_by(s);
        }
        j.reclaim_stalls.get_or_create(labels).inc_by(d.reclaim_stalls);
        j.swapout_pages.get_or_create(labels).inc_by(d.swapout_pages);
        j.swapout_bytes.get_or_create(labels).inc_by(d.swapout_bytes);
        j.block_read_bytes.get_or_create(labels).inc_by(d.block_read_bytes);
        j.block_write_bytes.get_or_create(labels).inc_by(d.block_write_bytes);
        j.reclaim_io_bytes.get_or_create(labels).inc_by(d.reclaim_io_bytes);
        let wait = j.data_wait_seconds.get_or_create(labels);
        if let Some(s) = nonneg(d.data_wait_seconds) {
            wait.inc_by(s);
        }
        let gpu = j.gpu_wait_seconds.get_or_create(labels);
        if let Some(s) = nonneg(d.gpu_wait_seconds) {
            gpu.inc_by(s);
        }
    }

    /// Sets how long the longest wait for data in progress of one (job, role) has lasted.
    pub fn set_open_data_wait(&self, labels: &JobRole, ns: u64) {
        let _known = self.track(labels);
        self.jobs.open_data_wait_seconds.get_or_create(labels).set(ns as f64 / 1e9);
    }

    pub fn oom_kill(&self, labels: &JobRole) {
        let _known = self.track(labels);
        self.jobs.oom_kills.get_or_create(labels).inc();
    }

    /// Sets the memory gauges of one (job, role); the caller passes sums over its processes.
    pub fn set_memory(&self, labels: &JobRole, resident_bytes: u64, swapped_bytes: u64) {
        let _known = self.track(labels);
        self.jobs.resident_bytes.get_or_create(labels).set(resident_bytes);
        self.jobs.swap_bytes.get_or_create(labels).set(swapped_bytes);
    }

    /// Sets one GPU's gauges. Without a temperature reading the series is removed rather than
    /// left at a stale value.
    pub fn set_gpu(&self, gpu: &GpuLabel, util_ratio: f64, temperature_celsius: Option<f64>) {
        // The stall counter exists from the GPU's first sample on, at zero, so the first stall
        // is an increase (see `track`).
        let _ = self.gpu_stall_episodes.get_or_create(gpu);
        if util_ratio.is_finite() {
            self.gpu_utilization.get_or_create(gpu).set(util_ratio.clamp(0.0, 1.0));
        }
        match temperature_celsius.filter(|t| t.is_finite()) {
            Some(t) => {
                self.gpu_temperature.get_or_create(gpu).set(t);
            }
            None => {
                self.gpu_temperature.remove(gpu);
            }
        }
    }

    pub fn gpu_stall(&self, gpu: &GpuLabel) {
        self.gpu_stall_episodes.get_or_create(gpu).inc();
    }

    /// GPU faults: Xid `xid` on the GPU at PCI `bus`, `times` times.
    pub fn gpu_xid(&self, bus: &str, xid: u64, times: u64) {
        let labels = XidLabel { pci_bus_id: bus.to_string(), xid: xid.to_string() };
        self.gpu_xid_errors.get_or_create(&labels).inc_by(times);
    }

    /// Takes the cumulative count of lost events and adds what is new. A smaller total means the
    /// source was reset (programs reloaded): it becomes the new base, so later losses are still
    /// counted instead of hidden until the old high-water mark is passed again.
    /// Takes the cumulative count of events lost for `reason` (`critical_ring`, `bulk_ring`,
    /// `map_full`, `undecodable`, `flight_recorder`) and adds its increase.
    pub fn set_lost_events(&self, reason: &str, total: u64) {
        let mut t = lock(&self.totals);
        let last = t.lost_events.entry(reason.to_string()).or_default();
        let labels = LostReason { reason: reason.to_string() };
        self.lost_events.get_or_create(&labels).inc_by(total.saturating_sub(*last));
        *last = total;
    }

    pub fn set_watched(&self, jobs: u64, processes: u64) {
        self.watched_jobs.set(jobs);
        self.watched_processes.set(processes);
    }

    pub fn incident(&self, kind: &str, job: &str) {
        let labels = IncidentLabels { kind: kind.to_string(), training_job: job.to_string() };
        self.incidents.get_or_create(&labels).inc();
    }

    /// Takes the agent's cumulative CPU time (as in /proc/self/stat) and its resident memory. The
    /// CPU total is turned into increments like `set_lost_events`.
    pub fn set_agent(&self, cpu_seconds_total: f64, resident_bytes: u64) {
        // CPU time is never negative: such a value is a caller bug, not a reset to rebase on.
        if cpu_seconds_total.is_finite() && cpu_seconds_total >= 0.0 {
            let mut t = lock(&self.totals);
            if let Some(d) = nonneg(cpu_seconds_total - t.agent_cpu_seconds) {
                self.agent_cpu_seconds.inc_by(d);
            }
            t.agent_cpu_seconds = cpu_seconds_total;
        }
        self.agent_resident_bytes.set(resident_bytes);
    }

    /// The kernel memory of the agent's BPF maps (`kernel::mapmem::held_maps`).
    pub fn set_bpf_maps(&self, bytes: u64) {
        self.agent_bpf_map_bytes.set(bytes);
    }

    /// Takes the flight recorder's size, its budget and its cumulative count of lines dropped
    /// early (turned into increments like `set_lost_events`).
    pub fn set_flight_recorder(&self, bytes: u64, budget: u64, dropped_total: u64) {
        self.flight_recorder_bytes.set(bytes);
        self.agent_memory_budget.set(budget);
        let mut t = lock(&self.totals);
        self.flight_recorder_dropped
            .inc_by(dropped_total.saturating_sub(t.flight_recorder_dropped));
        t.flight_recorder_dropped = dropped_total;
    }

    /// One reading of a job's own memory cgroup (`cgroup::CgroupFamilies`).
    pub fn set_job_cgroup(
        &self,
        job: &str,
        c: &crate::model::host::CgroupMem,
        forecast: Option<crate::model::limit_clock::Forecast>,
    ) {
        self.cgroups.update(job, c, forecast);
    }

    /// The daemon's loop completed a beat.
    pub fn beat(&self) {
        self.beat_at.store(monotonic_s(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the loop beat recently enough to call the agent live.
    fn healthy(&self) -> bool {
        let at = self.beat_at.load(std::sync::atomic::Ordering::Relaxed);
        monotonic_s().saturating_sub(at) <= STALE_BEAT_S
    }

    /// The job's identity as its info series (replacing the one it had).
    pub fn set_job_identity(&self, job: &str, id: &crate::model::identity::Identity) {
        let info = JobInfo::of(job, id);
        let mut now = lock(&self.job_info_now);
        if let Some(old) = now.insert(job.to_string(), info.clone()).filter(|o| *o != info) {
            self.job_info.remove(&old);
        }
        self.job_info.get_or_create(&info).set(1);
    }

    /// Removes every series whose job label is `job`.
    pub fn forget_job(&self, job: &str) {
        self.cgroups.forget(job);
        for kind in crate::model::incident::IncidentKind::ALL {
            let labels = IncidentLabels { kind: kind.as_str().into(), training_job: job.into() };
            self.incidents.remove(&labels);
        }
        if let Some(info) = lock(&self.job_info_now).remove(job) {
            self.job_info.remove(&info);
        }
        let mut known = lock(&self.known);
        known.retain(|labels| {
            if labels.training_job == job {
                self.jobs.remove(labels);
                false
            } else {
                true
            }
        });
    }

    /// OTLP export to `signal` is on: its failure counter exists from now, at zero, so the
    /// first failure is an increase (see `track`).
    pub fn otlp_enabled(&self, signal: &str) {
        let _ = self.otlp_failures.get_or_create(&SignalLabel { signal: signal.to_string() });
    }

    /// An OTLP export to `signal`'s endpoint failed (or was dropped, its queue full).
    pub fn otlp_failure(&self, signal: &str) {
        self.otlp_failures.get_or_create(&SignalLabel { signal: signal.to_string() }).inc();
    }

    /// Every metric's value now, typed (the OTLP export's source): the registry's own
    /// protobuf data model, so no text is parsed back.
    pub fn snapshot(&self) -> Option<Vec<MetricFamily>> {
        prometheus_client::encoding::prometheus_protobuf::encode(&self.registry)
            .map_err(|e| log::warn!("reading the metrics for OTLP failed: {e}"))
            .ok()
    }

    /// The OpenMetrics text exposition of every metric, ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; an error could only come from a label encoder, and a
        // scrape with what was written is better than a panic in the daemon.
        if let Err(e) = encode(&mut out, &self.registry) {
            log::warn!("encoding metrics failed: {e}");
        }
        out
    }
}

/// The content type of the OpenMetrics text format, which `encode` writes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once. Scrapers need one or two; the cap keeps a misbehaving client from
/// growing the agent's memory, which runs under a tight limit on the nodes it watches.
const MAX_CONNECTIONS: usize = 64;

/// A client that opens a connection and sends nothing, or idles between requests, is dropped
/// after this; Prometheus simply reconnects for the next scrape.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A loop that has not beaten for this long is stuck: `/healthz` says so (503), and a
/// Kubernetes liveness probe restarts the agent.
const STALE_BEAT_S: u64 = 60;

fn monotonic_s() -> u64 {
    crate::sources::clock::monotonic_ns() / 1_000_000_000
}

fn respond(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") if metrics.healthy() => {
            (StatusCode::OK, "text/plain; charset=utf-8", "ok\n".to_string())
        }
        (&Method::GET | &Method::HEAD, "/healthz") => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            format!("the agent's loop has not run for over {STALE_BEAT_S} s\n"),
        ),
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, OPENMETRICS_CONTENT_TYPE, metrics.encode())
        }
        (&Method::GET | &Method::HEAD, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "gpustall agent: metrics are at /metrics, liveness at /healthz\n".to_string(),
        ),
        (_, "/metrics" | "/" | "/healthz") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed: use GET\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: metrics are at /metrics\n".to_string(),
        ),
    };
    // Built field by field: `Response::builder` returns a Result that only fails on invalid
    // header values, and these are all static.
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        resp.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    resp
}

/// Accept errors that mean the process is out of a resource: worth a warning, unlike a client
/// that hung up before accept (ECONNABORTED and the like).
fn is_resource_error(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Serves `GET /metrics` (OpenMetrics text) and `GET /` (a pointer to it) on `listener`, one
/// task per connection, until the task running it is dropped. Errors on one connection are
/// logged at debug and never stop the server.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = http1::Builder::new();
    // The timer makes the header read timeout take effect; without one hyper ignores it.
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        // Waiting for a free slot before accepting leaves further clients in the kernel's backlog.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            // Only a closed semaphore fails, and this one is never closed.
            anyhow::bail!("metrics server connection limiter closed");
        };
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                if is_resource_error(&e) {
                    log::warn!("metrics server: accept failed: {e}");
                } else {
                    log::debug!("metrics server: accept failed: {e}");
                }
                // A short pause so a persistent error (no file descriptors left) does not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        let http = http.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let resp = respond(&metrics, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            if let Err(e) = http.serve_connection(TokioIo::new(stream), service).await {
                log::debug!("metrics server: connection from {peer}: {e}");
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests;
