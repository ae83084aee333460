//! Training steps from the log (`data_time` per step) and their trend over the trace.

use serde::Serialize;

/// The times one log line reports, in seconds.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct StepTimes {
    pub data_time_s: Option<f64>,
    pub iter_time_s: Option<f64>,
    /// The training iteration the line was logged at, counted from the start of training
    /// (mmengine's `Epoch(train) [E][I/N]` or `Iter(train) [I/N]`), where the line says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iter: Option<u64>,
}

/// mmengine's LogProcessor prints `data_time` as the mean over the last this many iterations
/// (its `window_size`), at each logging interval.
pub const MMENGINE_WINDOW: u64 = 10;

/// The log's data_time read as what it is: per iteration, or window means at logging
/// intervals turned back into the time each interval took.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct LoggedDataTime {
    /// data_time over the iterations the log covers, in seconds.
    pub total_s: f64,
    /// The iterations it covers.
    pub iterations: u64,
    /// How it was read, for the report.
    pub read_as: String,
}

/// The data_time the log accounts for. Lines with iteration numbers are mmengine's: each value
/// is the mean of the last [`MMENGINE_WINDOW`] iterations (fewer at the start), so summing
/// them counts some iterations several times and others not at all. The sum up to a logged
/// iteration i is mean x window plus the sum up to i - window: exact where that is a logged
/// iteration too (an interval that divides the window, or the start), else estimated from
/// the interval's mean. Lines without numbers are one step each.
pub fn logged_data_time(steps: &[StepTimes]) -> Option<LoggedDataTime> {
    let logged: Vec<(u64, f64)> =
        steps.iter().filter_map(|s| Some((s.iter?, s.data_time_s?))).collect();
    if logged.is_empty() {
        let v: Vec<f64> = steps.iter().filter_map(|s| s.data_time_s).collect();
        return (!v.is_empty()).then(|| LoggedDataTime {
            total_s: v.iter().sum(),
            iterations: v.len() as u64,
            read_as: "one data_time per logged step, summed".into(),
        });
    }
    let w = MMENGINE_WINDOW;
    // The sum of data_time over iterations 1..=i, at each logged i.
    let mut sums: std::collections::BTreeMap<u64, f64> = std::collections::BTreeMap::new();
    let (mut estimated, mut prev) = (0usize, None::<(u64, f64)>);
    let first = logged[0].0;
    for &(i, mean) in &logged {
        if prev.is_some_and(|(p, _)| i <= p) {
            continue; // a restart or a repeated line: the first account stands
        }
        let sum = if i <= w && first <= w {
            mean * i as f64
        } else if let Some(before) = sums.get(&(i - w)) {
            mean * w as f64 + before
        } else {
            estimated += 1;
            let (p, s) = prev.unwrap_or((i.saturating_sub(w), 0.0));
            s + mean * (i - p) as f64
        };
        sums.insert(i, sum);
        prev = Some((i, sum));
    }
    let (last, total) = prev?;
    let from = first.saturating_sub(w);
    let read_as = format!(
        "mmengine's data_time: means of the last {w} iterations at each logged one, turned back into the time of iterations {}-{last} ({})",
        from + 1,
        if estimated == 0 {
            "exact: every interval divides the window".to_string()
        } else {
            format!("{estimated} of {} intervals estimated from their means: log every {w} iterations or fewer for exact figures", logged.len())
        }
    );
    Some(LoggedDataTime {
        total_s: total - sums.get(&from).copied().unwrap_or(0.0),
        iterations: last - from,
        read_as,
    })
}

/// How `data_time` moved over a run: the figure behind "the input pipeline slowed 12x from
/// step N on".
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct DataTimeTrend {
    pub steps: usize,
    /// Mean data_time of the first min(20, n/3) steps.
    pub baseline_s: f64,
    /// Mean data_time of the last min(20, n/3) steps.
    pub recent_s: f64,
    pub max_s: f64,
    /// recent / baseline.
    pub ratio: f64,
    /// The step (after the baseline window) at which the mean data_time of the last 10 steps
    /// first reaches 3x the baseline.
    pub first_rise_index: Option<usize>,
    /// The highest mean of 10 steps in a row after the baseline window: what a rise that
    /// fell back by the end rose to. Absent in older recordings.
    #[serde(default)]
    pub peak_window_s: f64,
}

/// The trend of `values` (one data_time per step, in order); `None` with fewer than 4.
pub fn data_time_trend(values: &[f64]) -> Option<DataTimeTrend> {
    let n = values.len();
    if n < 4 {
        return None;
    }
    // Means, not medians: with prefetching, data_time is bursty (most steps find a batch ready,
    // every few steps one waits for seconds), and the waiting is the point. mmengine logs a
    // window mean for the same reason.
    let window = (n / 3).clamp(1, 20);
    let baseline_s = mean(&values[..window]);
    let recent_s = mean(&values[n - window..]);
    let floor = baseline_s.max(MIN_BASELINE_S);
    // The baseline window is excluded: its first step often carries the workers' start-up.
    let roll = window.min(10);
    let first_rise_index = (window.max(roll)..=n)
        .find(|&end| mean(&values[end - roll..end]) >= 3.0 * floor)
        .map(|end| end - 1);
    let peak_window_s =
        (window.max(roll)..=n).map(|end| mean(&values[end - roll..end])).fold(recent_s, f64::max);
    Some(DataTimeTrend {
        steps: n,
        baseline_s,
        recent_s,
        max_s: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ratio: recent_s / floor,
        first_rise_index,
        peak_window_s,
    })
}

/// A baseline under 1 ms (mmengine prints 0.0000 for a warm pipeline) counts as 1 ms, so the
/// ratio stays finite (JSON has no infinity) and "3x baseline" is not "any value at all".
const MIN_BASELINE_S: f64 = 1e-3;

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// How data_time moved, in words: "rose 0.011 -> 0.269 s per step", or for a rise that fell
/// back by the end, "rose 0.091 -> 0.310 s per step (10-step mean) and was 0.044 s at the
/// end"; a data_time that only fell is no rise.
pub fn rise_words(t: &DataTimeTrend) -> String {
    if t.recent_s >= t.peak_window_s * 0.8 || t.peak_window_s <= t.baseline_s {
        format!("rose {:.3} -> {:.3} s per step", t.baseline_s, t.recent_s)
    } else {
        format!(
            "rose {:.3} -> {:.3} s per step (10-step mean) and was {:.3} s at the end",
            t.baseline_s, t.peak_window_s, t.recent_s
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// data_time per iteration d(i) = i ms for 40 iterations, as mmengine would log it.
    fn mmengine_log(interval: u64) -> Vec<StepTimes> {
        let d = |i: u64| i as f64 / 1000.0;
        (1..=40u64)
            .filter(|i| i % interval == 0)
            .map(|i| {
                let from = i.saturating_sub(MMENGINE_WINDOW) + 1;
                let mean = (from..=i).map(d).sum::<f64>() / (i - from + 1) as f64;
                StepTimes { data_time_s: Some(mean), iter_time_s: None, iter: Some(i) }
            })
            .collect()
    }

    #[test]
    fn mmengines_window_means_are_read_back_into_the_time_they_cover() {
        // 1 + 2 + ... + 40 ms = 0.820 s, whatever the interval that divides the window.
        for interval in [1, 2, 5, 10] {
            let l = logged_data_time(&mmengine_log(interval)).expect("read");
            assert!((l.total_s - 0.820).abs() < 1e-9, "interval {interval}: {l:?}");
            assert_eq!(l.iterations, 40);
            assert!(l.read_as.contains("exact"), "{}", l.read_as);
        }
        // Summing the printed means instead (interval 5): 1.1 s, 34 % too much.
        let naive: f64 = mmengine_log(5).iter().filter_map(|s| s.data_time_s).sum::<f64>() * 5.0;
        assert!((naive - 0.820).abs() > 0.05, "{naive}");
        // An interval past the window (20): the skipped iterations are estimated, and said so.
        // The first line at 20 covers 11-20 only: 11 + ... + 40 ms = 0.765 s.
        let l = logged_data_time(&mmengine_log(20)).expect("read");
        assert!(l.read_as.contains("estimated") && l.read_as.contains("11-40"), "{}", l.read_as);
        assert_eq!(l.iterations, 30);
        assert!((l.total_s - 0.765).abs() < 0.15, "{l:?}");
        // Lines without iteration numbers: one step each.
        let plain =
            [0.5, 0.25].map(|d| StepTimes { data_time_s: Some(d), iter_time_s: None, iter: None });
        assert_eq!(logged_data_time(&plain).map(|l| (l.total_s, l.iterations)), Some((0.75, 2)));
    }

    #[test]
    fn a_rise_that_fell_back_is_said_with_its_peak_and_a_fall_is_no_rise() {
        // Warm-up slow (0.09), a spike of 0.31, then fast (0.044): the trend at the end fell.
        let mut v = vec![0.09; 10];
        v.extend(vec![0.31; 10]);
        v.extend(vec![0.044; 10]);
        let t = data_time_trend(&v).expect("trend");
        assert!(t.first_rise_index.is_some() && t.recent_s < t.baseline_s, "{t:?}");
        assert_eq!(
            rise_words(&t),
            "rose 0.090 -> 0.310 s per step (10-step mean) and was 0.044 s at the end"
        );
        // Only falling: never a rise.
        let t = data_time_trend(&[0.091, 0.09, 0.05, 0.045, 0.044, 0.044]).expect("trend");
        assert_eq!(t.first_rise_index, None, "{t:?}");
    }

    #[test]
    fn trend_of_a_starving_pipeline() {
        let mut v = vec![0.06; 30];
        v.extend([0.2, 0.5]);
        v.extend(vec![0.74; 20]);
        let t = data_time_trend(&v).expect("test setup");
        assert_eq!(t.steps, 52);
        assert!((t.baseline_s - 0.06).abs() < 1e-12);
        assert!((t.recent_s - 0.74).abs() < 1e-12);
        assert!((t.ratio - 12.33).abs() < 0.01, "{t:?}");
        assert_eq!(t.max_s, 0.74);
        // The 10-step mean first reaches 3 x 0.06 = 0.18 at index 32 (0.186).
        assert_eq!(t.first_rise_index, Some(32));
    }

    #[test]
    fn bursty_prefetching_pipeline_rises_in_the_mean() {
        // With prefetching most steps find a batch ready; every sixth waits: the median stays ~0.
        let mut v = vec![0.001; 60];
        for i in 0..60 {
            v.push(if i % 6 == 5 { 1.8 } else { 0.0002 });
        }
        let t = data_time_trend(&v).expect("test setup");
        assert!(t.recent_s > 0.25, "{t:?}");
        assert!(t.ratio > 100.0, "{t:?}");
        assert!(t.first_rise_index.is_some_and(|i| i >= 60), "{t:?}");
    }

    #[test]
    fn trend_edge_cases() {
        assert_eq!(data_time_trend(&[0.1, 0.1, 0.1]), None);
        let flat = data_time_trend(&[0.1, 0.1, 0.1, 0.1]).expect("test setup");
        assert_eq!((flat.ratio, flat.first_rise_index), (1.0, None));
        // A slow first step (worker start-up) is no rise; a zero baseline keeps ratio finite.
        let t = data_time_trend(&[5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]).expect("test setup");
        assert_eq!(t.first_rise_index, None);
        assert!(t.ratio.is_finite());
    }
}
