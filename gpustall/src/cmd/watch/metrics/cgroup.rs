//! Per-job memory cgroup series: the effective limit and usage, and the kernel's own account of
//! pressure (v2 memory.events, PSI). The cgroup files count over the cgroup's life; a job's
//! counters count from when the agent first read them, so a restarted agent or a reused cgroup
//! never shows a jump.

use std::{
    collections::HashMap,
    sync::{atomic::AtomicU64, Mutex},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, gauge::Gauge},
    registry::{Registry, Unit},
};

use crate::model::host::{CgroupMem, MemEvents, Psi};
use crate::model::limit_clock::Forecast;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub training_job: String,
}

/// A memory.events counter (`event`: low, high, max, oom, oom_kill, oom_group_kill) or a PSI
/// share (`event`: some, full).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobEvent {
    pub training_job: String,
    pub event: String,
}

type SecondsCounter = Counter<f64, AtomicU64>;

/// A job's memory.events and PSI at its previous reading.
type LastReading = (Option<MemEvents>, Option<Psi>);

super::families::families! {
    /// A job's cgroup gauges, set at each reading (none made at zero: a job with no limit has
    /// no limit series).
    JobGauges<JobLabel> {
        limit_bytes: Gauge<u64, AtomicU64>, "job_memory_limit", Some(Unit::Bytes), false,
            "The job's effective memory limit: the smallest memory.max (v1 limit_in_bytes) from its cgroup up to the root";
        usage_bytes: Gauge<u64, AtomicU64>, "job_memory_cgroup_usage", Some(Unit::Bytes), false,
            "Memory charged to the job's cgroup (memory.current, v1 usage_in_bytes)";
        limit_eta_seconds: Gauge<f64, AtomicU64>, "job_memory_limit_eta", Some(Unit::Seconds), false,
            "When the job's memory cgroup reaches its limit at the growth of its last 15 s (charge less file cache, a least-squares slope); absent while it does not grow steadily";
    }
}

super::families::families! {
    /// A job's cgroup counters, one series per event.
    JobEventCounters<JobEvent> {
        events: Counter, "job_memory_events", None, false,
            "cgroup v2 memory.events of the cgroup that sets the job's limit, counted from when the agent first read it";
        pressure_seconds: SecondsCounter, "job_memory_pressure", Some(Unit::Seconds), false,
            "Time the job cgroup's tasks waited for memory (PSI: some = at least one, full = all at once)";
    }
}

#[derive(Default)]
pub struct CgroupFamilies {
    gauges: JobGauges,
    counters: JobEventCounters,
    /// Each job's last reading, to turn the files' totals into increments.
    last: Mutex<HashMap<String, LastReading>>,
}

/// Every `event` label a job's counters may have.
const EVENTS: [&str; 8] =
    ["low", "high", "max", "oom", "oom_kill", "oom_group_kill", "some", "full"];

/// The memory.events counters by name.
fn event_counts(e: &MemEvents) -> Vec<(&'static str, u64)> {
    let mut v = vec![
        ("low", e.low),
        ("high", e.high),
        ("max", e.max),
        ("oom", e.oom),
        ("oom_kill", e.oom_kill),
    ];
    if let Some(g) = e.oom_group_kill {
        v.push(("oom_group_kill", g));
    }
    v
}

impl CgroupFamilies {
    pub fn register(&self, r: &mut Registry) {
        self.gauges.register(r);
        self.counters.register(r);
    }

    /// Takes one reading of `job`'s cgroup, and the forecast of its limit made from them.
    pub fn update(&self, job: &str, c: &CgroupMem, forecast: Option<Forecast>) {
        let label = JobLabel { training_job: job.to_string() };
        match forecast {
            Some(f) => {
                self.gauges.limit_eta_seconds.get_or_create(&label).set(f.seconds);
            }
            None => {
                self.gauges.limit_eta_seconds.remove(&label);
            }
        }
        match c.limit_bytes {
            Some(l) => {
                self.gauges.limit_bytes.get_or_create(&label).set(l);
            }
            None => {
                self.gauges.limit_bytes.remove(&label);
            }
        }
        self.gauges.usage_bytes.get_or_create(&label).set(c.usage_bytes);
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (prev_events, prev_psi) = last.entry(job.to_string()).or_insert_with(|| {
            // The first reading is the base: the series start at zero.
            (c.events.clone(), c.pressure.clone())
        });
        let ev = |event: &str| JobEvent { training_job: job.to_string(), event: event.into() };
        if let Some(e) = &c.events {
            let d = e.minus(prev_events.as_ref().unwrap_or(e));
            for (name, n) in event_counts(&d) {
                self.counters.events.get_or_create(&ev(name)).inc_by(n);
            }
            *prev_events = Some(e.clone());
        }
        if let Some(p) = &c.pressure {
            let base = prev_psi.as_ref().unwrap_or(p);
            let some = p.some_total_us.saturating_sub(base.some_total_us) as f64 / 1e6;
            let full = p.full_total_us.saturating_sub(base.full_total_us) as f64 / 1e6;
            self.counters.pressure_seconds.get_or_create(&ev("some")).inc_by(some);
            self.counters.pressure_seconds.get_or_create(&ev("full")).inc_by(full);
            *prev_psi = Some(p.clone());
        }
    }

    /// Removes every series of `job`.
    pub fn forget(&self, job: &str) {
        self.gauges.remove(&JobLabel { training_job: job.to_string() });
        for event in EVENTS {
            self.counters.remove(&JobEvent { training_job: job.to_string(), event: event.into() });
        }
        self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(job);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    /// A cgroup v2 job with a 1 GiB limit, `max` limit hits and `some_us` of memory PSI.
    pub(in crate::cmd::watch::metrics) fn cg(max: u64, some_us: u64) -> CgroupMem {
        CgroupMem {
            path: "/job".into(),
            version: 2,
            limit_bytes: Some(1 << 30),
            usage_bytes: 5,
            peak_bytes: None,
            swap_usage_bytes: None,
            oom_kills: None,
            failcnt: None,
            limit_set_by: Some("/".into()),
            swap_limit_bytes: None,
            swap_limit_set_by: None,
            events: Some(MemEvents { max, ..Default::default() }),
            pressure: Some(Psi { some_total_us: some_us, ..Default::default() }),
            file_bytes: None,
        }
    }

    #[test]
    fn counts_from_the_first_reading_and_forgets_the_job() {
        let f = CgroupFamilies::default();
        let mut r = Registry::with_prefix("gpustall");
        f.register(&mut r);
        // 100 limit hits and 9 s of pressure before the agent looked: not this job's news.
        f.update("a-1", &cg(100, 9_000_000), None);
        let forecast = Forecast {
            seconds: 41.5,
            rate_bytes_s: 1e6,
            level_bytes: 1 << 29,
            limit_bytes: 1 << 30,
            at_ns: 0,
        };
        f.update("a-1", &cg(130, 11_500_000), Some(forecast));
        let mut out = String::new();
        encode(&mut out, &r).expect("encode");
        assert!(
            out.contains(r#"gpustall_job_memory_events_total{training_job="a-1",event="max"} 30"#),
            "{out}"
        );
        assert!(
            out.contains(
                r#"gpustall_job_memory_pressure_seconds_total{training_job="a-1",event="some"} 2.5"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"gpustall_job_memory_limit_bytes{training_job="a-1"} 1073741824"#),
            "{out}"
        );
        assert!(
            out.contains(r#"gpustall_job_memory_limit_eta_seconds{training_job="a-1"} 41.5"#),
            "{out}"
        );
        // No longer growing: the series goes, as a gauge with nothing to say.
        f.update("a-1", &cg(130, 11_500_000), None);
        let mut out = String::new();
        encode(&mut out, &r).expect("encode");
        assert!(!out.contains("limit_eta_seconds{"), "{out}");
        f.forget("a-1");
        let mut out = String::new();
        encode(&mut out, &r).expect("encode");
        assert!(!out.contains("a-1"), "{out}");
    }
}
