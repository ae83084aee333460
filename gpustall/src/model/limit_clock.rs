//! Time to the memory limit: when the job's memory cgroup will reach its limit at the rate its
//! memory grew over the last 15 s, so an operator hears "OOM kill in about 40 s, worker
//! 3 growing" while there is still time to act, not only in the bundle afterwards.
//!
//! The level tracked is what reclaim cannot give back: the cgroup's charge less its file cache
//! (active and inactive file pages, which reclaim drops before the OOM killer acts). Usage
//! alone stops rising near the limit as cache is dropped, and would hide the growth that kills.
//! The rate is a least-squares slope over the window, so one noisy reading does not swing it,
//! and the window is short enough to follow the latest rate: workers that filled their caches
//! at start-up and one that keeps growing after make two rates, and the kill comes at the
//! second.

use std::collections::VecDeque;

use serde::Serialize;

use crate::model::host::CgroupMem;

/// The span of readings the growth rate is fitted over.
pub const WINDOW_NS: u64 = 15_000_000_000;
/// The span a process's own growth is measured over (30-60 s): which worker grows.
const GROWTH_NS: u64 = 30_000_000_000;
/// Fewer seconds of readings than this say nothing about a trend.
const MIN_SPAN_NS: u64 = 8_000_000_000;
const MIN_READINGS: usize = 5;
/// Slower growth than this (1 MiB a minute) is noise, or a limit hours away.
const MIN_RATE_BYTES_S: f64 = 1024.0 * 1024.0 / 60.0;
/// How well the readings must sit on a line (R²): a level that jumps up and down has no
/// forecast worth saying.
const MIN_FIT: f64 = 0.8;
/// An estimate under this is news: the status line prints at once and the alert fires.
pub const SOON_S: f64 = 600.0;
/// At most this many readings are kept (1 s apart at most, so a window's worth and some).
const MAX_READINGS: usize = 64;

/// When the limit will be reached at the growth measured.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Forecast {
    /// Seconds from the last reading to the limit.
    pub seconds: f64,
    /// The level's growth, bytes a second.
    pub rate_bytes_s: f64,
    /// The level (charge less file cache) and the limit it heads for, in bytes.
    pub level_bytes: u64,
    pub limit_bytes: u64,
    /// The reading it was made at (the model's clock).
    pub at_ns: u64,
}

impl Forecast {
    /// "memory limit (3000 MiB) in ~41 s at +432 MiB/min".
    pub fn describe(&self) -> String {
        format!(
            "memory limit ({} MiB) in ~{} at +{:.0} MiB/min",
            self.limit_bytes >> 20,
            human_s(self.seconds),
            self.rate_bytes_s * 60.0 / 1048576.0
        )
    }
}

/// "41 s", "7 min", "2.5 h".
fn human_s(s: f64) -> String {
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// The first forecast under [`SOON_S`]: when it was said and when it put the limit, set beside
/// the kill in the summary.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Warning {
    pub said_at_ns: u64,
    pub limit_at_ns: u64,
    pub rate_bytes_s: f64,
}

/// The readings of one memory cgroup and the forecast they make.
#[derive(Default, Clone, Debug)]
pub struct LimitClock {
    path: String,
    limit: Option<u64>,
    readings: VecDeque<(u64, u64)>,
    /// The first forecast that came under [`SOON_S`] in this cgroup.
    pub first_warning: Option<Warning>,
}

/// What reclaim cannot take back: the charge less the file cache.
pub fn level_bytes(c: &CgroupMem) -> u64 {
    c.usage_bytes.saturating_sub(c.file_bytes.unwrap_or(0))
}

impl LimitClock {
    /// Takes one reading at `t_ns`. A new cgroup or a new limit starts the clock over.
    pub fn add(&mut self, t_ns: u64, c: &CgroupMem) {
        if c.path != self.path || c.limit_bytes != self.limit {
            *self = LimitClock { path: c.path.clone(), limit: c.limit_bytes, ..Default::default() };
        }
        if self.readings.back().is_some_and(|&(t, _)| t >= t_ns) {
            return;
        }
        self.readings.push_back((t_ns, level_bytes(c)));
        while self.readings.len() > MAX_READINGS
            || self.readings.front().is_some_and(|&(t, _)| t + WINDOW_NS < t_ns)
        {
            self.readings.pop_front();
        }
        if self.first_warning.is_none() {
            if let Some(f) = self.forecast().filter(|f| f.seconds < SOON_S) {
                self.first_warning = Some(Warning {
                    said_at_ns: f.at_ns,
                    limit_at_ns: f.at_ns + (f.seconds * 1e9) as u64,
                    rate_bytes_s: f.rate_bytes_s,
                });
            }
        }
    }

    /// The forecast from the readings in the window; `None` without a limit, with too few
    /// readings, or when the level does not grow steadily.
    pub fn forecast(&self) -> Option<Forecast> {
        let limit = self.limit?;
        let &(first_t, _) = self.readings.front()?;
        let &(last_t, last_level) = self.readings.back()?;
        if self.readings.len() < MIN_READINGS || last_t - first_t < MIN_SPAN_NS {
            return None;
        }
        let (rate, fit) = slope(&self.readings)?;
        if rate < MIN_RATE_BYTES_S || fit < MIN_FIT {
            return None;
        }
        Some(Forecast {
            seconds: limit.saturating_sub(last_level) as f64 / rate,
            rate_bytes_s: rate,
            level_bytes: last_level,
            limit_bytes: limit,
            at_ns: last_t,
        })
    }
}

/// Least-squares slope (bytes a second) of the readings and its R².
fn slope(readings: &VecDeque<(u64, u64)>) -> Option<(f64, f64)> {
    let (t0, _) = *readings.front()?;
    let n = readings.len() as f64;
    let xs = || readings.iter().map(|&(t, _)| (t - t0) as f64 / 1e9);
    let ys = || readings.iter().map(|&(_, y)| y as f64);
    let (mx, my) = (xs().sum::<f64>() / n, ys().sum::<f64>() / n);
    let sxy: f64 = xs().zip(ys()).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs().map(|x| (x - mx) * (x - mx)).sum();
    let syy: f64 = ys().map(|y| (y - my) * (y - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let fit = if syy > 0.0 { sxy * sxy / (sxx * syy) } else { 0.0 };
    Some((sxy / sxx, fit))
}

/// A process's memory growth over the last half minute to a minute: two anchors, the older
/// one moved up when the newer is [`GROWTH_NS`] old, so the rate is always over 30-60 s of
/// readings, in constant memory.
#[derive(Default, Clone, Copy, Debug)]
pub struct Growth {
    older: Option<(u64, u64)>,
    newer: Option<(u64, u64)>,
    last: Option<(u64, u64)>,
}

impl Growth {
    pub fn add(&mut self, t_ns: u64, held_kb: u64) {
        let now = (t_ns, held_kb);
        match self.newer {
            None => (self.older, self.newer) = (Some(now), Some(now)),
            Some((t, _)) if t + GROWTH_NS <= t_ns => {
                (self.older, self.newer) = (self.newer, Some(now))
            }
            Some(_) => {}
        }
        self.last = Some(now);
    }

    /// kB a second over the anchors' span; `None` under [`MIN_SPAN_NS`] of it.
    pub fn rate_kb_s(&self) -> Option<f64> {
        let ((t0, k0), (t1, k1)) = (self.older?, self.last?);
        (t1 >= t0 + MIN_SPAN_NS).then(|| (k1 as f64 - k0 as f64) / ((t1 - t0) as f64 / 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MIB: u64 = 1 << 20;

    fn cg(usage_mib: u64, file_mib: u64, limit_mib: Option<u64>) -> CgroupMem {
        CgroupMem {
            path: "/job".into(),
            version: 1,
            limit_bytes: limit_mib.map(|l| l * MIB),
            usage_bytes: usage_mib * MIB,
            peak_bytes: None,
            swap_usage_bytes: None,
            oom_kills: None,
            failcnt: None,
            limit_set_by: None,
            swap_limit_bytes: None,
            swap_limit_set_by: None,
            events: None,
            pressure: None,
            file_bytes: Some(file_mib * MIB),
        }
    }

    #[test]
    fn steady_growth_puts_the_limit_where_the_line_meets_it() {
        let mut c = LimitClock::default();
        // 10 MiB/s of anonymous memory from 100 MiB, under a cache that stays at 50 MiB.
        for s in 0..=10 {
            c.add(s * S, &cg(150 + 10 * s, 50, Some(1000)));
        }
        let f = c.forecast().expect("a forecast");
        assert!((f.rate_bytes_s / MIB as f64 - 10.0).abs() < 1e-6, "{f:?}");
        // 200 MiB held at 10 s, 800 MiB to go at 10 MiB/s.
        assert!((f.seconds - 80.0).abs() < 1e-6, "{f:?}");
        assert_eq!(f.describe(), "memory limit (1000 MiB) in ~80 s at +600 MiB/min");
        assert_eq!(c.first_warning.map(|w| w.limit_at_ns), Some(90 * S));
    }

    #[test]
    fn cache_dropped_near_the_limit_does_not_hide_the_growth() {
        let mut c = LimitClock::default();
        // Usage pinned at the limit while reclaim drops cache as fast as anon grows.
        for s in 0..=10 {
            c.add(s * S, &cg(990, 500 - 20 * s, Some(1000)));
        }
        let f = c.forecast().expect("a forecast");
        assert!((f.rate_bytes_s / MIB as f64 - 20.0).abs() < 1e-6, "{f:?}");
        // 690 MiB held at 10 s: 310 MiB to go at 20 MiB/s.
        assert!((f.seconds - 15.5).abs() < 1e-6, "{f:?}");
    }

    #[test]
    fn no_forecast_without_a_limit_a_trend_or_enough_readings() {
        let flat = |limit| {
            let mut c = LimitClock::default();
            for s in 0..=10 {
                c.add(s * S, &cg(100 + 10 * s, 0, limit));
            }
            c.forecast()
        };
        assert!(flat(None).is_none(), "no limit");
        let mut c = LimitClock::default();
        for s in 0..=5 {
            c.add(s * S, &cg(100 + 10 * s, 0, Some(1000)));
        }
        assert!(c.forecast().is_none(), "5 s of readings");
        let mut c = LimitClock::default();
        for s in 0..=20 {
            c.add(s * S, &cg(if s % 2 == 0 { 100 } else { 400 }, 0, Some(1000)));
        }
        assert!(c.forecast().is_none(), "a level that jumps: {:?}", c.forecast());
        let mut c = LimitClock::default();
        for s in 0..=20 {
            c.add(s * S, &cg(500 - s, 0, Some(1000)));
        }
        assert!(c.forecast().is_none(), "shrinking");
        assert!(c.first_warning.is_none());
    }

    #[test]
    fn the_window_forgets_old_growth_and_a_new_limit_starts_over() {
        let mut c = LimitClock::default();
        for s in 0..=30 {
            c.add(s * S, &cg(100 + 20 * s, 0, Some(10_000)));
        }
        // Level from then on: growth stops.
        for s in 31..=70 {
            c.add(s * S, &cg(700, 0, Some(10_000)));
        }
        assert!(c.forecast().is_none(), "{:?}", c.forecast());
        c.add(71 * S, &cg(700, 0, Some(20_000)));
        assert_eq!(c.readings.len(), 1, "a new limit");
    }

    #[test]
    fn growth_is_measured_over_half_a_minute_to_a_minute() {
        let mut g = Growth::default();
        g.add(0, 1000);
        assert_eq!(g.rate_kb_s(), None);
        for s in 1..=45 {
            g.add(s * S, 1000 + 100 * s);
        }
        assert!((g.rate_kb_s().expect("a rate") - 100.0).abs() < 1e-9);
        // It stopped growing at 45 s: by 100 s the rate is over the flat part only.
        for s in 46..=100 {
            g.add(s * S, 5500);
        }
        assert_eq!(g.rate_kb_s(), Some(0.0));
    }
}
