//! The time to the OOM kill, forecast while there is time to act: a DataLoader-style worker
//! that grows at a steady rate in a memory cgroup is forecast to reach the limit from the
//! growth gpustall measures (the cgroup's charge less file cache, over the last 15 s), the
//! forecast is said on the status line (a batch job's error file: no terminal) at least 30 s
//! before the kernel's OOM killer acts, and it puts the kill within 25 % of the time that was
//! really left.

use std::time::Duration;

use tests::{
    cgroup::MemCgroup,
    procs::{Tracer, Workload},
};

/// "[  12.0s] ... | memory limit (700 MiB) in ~41 s at +686 MiB/min, growing: ...": the
/// elapsed seconds and the forecast seconds.
fn forecast_of(line: &str) -> Option<(f64, f64)> {
    let elapsed = line.strip_prefix('[')?.split("s]").next()?.trim().parse().ok()?;
    let rest = line.split("memory limit (").nth(1)?.split(" in ~").nth(1)?;
    let mut words = rest.split_whitespace();
    let n: f64 = words.next()?.parse().ok()?;
    let unit = match words.next()? {
        "s" => 1.0,
        "min" => 60.0,
        _ => 3600.0,
    };
    Some((elapsed, n * unit))
}

#[test]
fn a_worker_growing_steadily_is_forecast_to_reach_its_limit_before_the_kill() {
    tests::require_privileged_env();
    let _memory = tests::pressure_lock();
    let cg = MemCgroup::new("limit-forecast", 700, false);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // Worker 0 grows 8 MiB every 0.7 s (about 11 MiB/s) towards 900 MiB; worker 1 holds 30.
    let mut w = Workload::start(bin, &["hog", "900,30", "8", "60000", "pace=700"], Some(&cg));
    let tracer = Tracer::start(w.pid(), &["--status-every", "5s"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(180));
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1), "the parent saw its worker killed");
    assert!(cg.oom_kills() >= 1, "the cgroup's own count");
    let worker0 =
        lines.iter().find(|l| l["role"] == "worker" && l["index"] == 0).expect("worker 0")["pid"]
            .as_u64()
            .expect("pid");
    let kill = &t.summary["oom_kills"][0];
    assert_eq!(kill["victim_pid"], worker0, "{kill}");
    let kill_ns = kill["t_ns"].as_u64().expect("t_ns");

    // The first warning (under 10 min), on the kill's clock.
    let w = &t.summary["context"]["limit_warning"];
    eprintln!("limit warning: {w}; the kill at {kill_ns}");
    let said = w["said_at_ns"].as_u64().unwrap_or_else(|| panic!("a warning: {}", t.stderr));
    let put = w["limit_at_ns"].as_u64().expect("limit_at_ns");
    let left = kill_ns.saturating_sub(said) as f64 / 1e9;
    let forecast = put.saturating_sub(said) as f64 / 1e9;
    eprintln!("said {left:.1} s before the kill, forecast {forecast:.1} s");
    assert!(left >= 30.0, "said {left:.1} s before the kill");
    assert!((forecast - left).abs() <= 0.25 * left, "forecast {forecast:.1} s, left {left:.1} s");
    assert!(t.stdout.contains("memory limit forecast at +"), "{}", t.stdout);

    // Every status line that gave a forecast, against the time really left.
    let start_ns = t.summary["t_ns"].as_u64().expect("t_ns")
        - (t.summary["duration_s"].as_f64().expect("duration_s") * 1e9) as u64;
    let kill_s = kill_ns.saturating_sub(start_ns) as f64 / 1e9;
    let said: Vec<(f64, f64)> = t.stderr.lines().filter_map(forecast_of).collect();
    eprintln!("status lines with a forecast (elapsed, forecast; kill at {kill_s:.1} s): {said:?}");
    let first = said.first().unwrap_or_else(|| panic!("no forecast said:\n{}", t.stderr));
    assert!(kill_s - first.0 >= 30.0, "first said at {:.1} s, the kill at {kill_s:.1} s", first.0);
    assert!(
        t.stderr.contains(&format!("growing: worker 0 (pid {worker0})")),
        "the growing worker named:\n{}",
        t.stderr
    );
    for &(at, eta) in said.iter().filter(|(at, _)| kill_s - at >= 10.0) {
        let left = kill_s - at;
        assert!(
            (eta - left).abs() <= 0.25 * left,
            "at {at:.1} s: forecast {eta} s, left {left:.1}"
        );
    }
    // Quiet otherwise: no terminal, a line at most every 5 s or at news.
    let status = t.stderr.lines().filter(|l| l.starts_with('[')).count();
    assert!(status as f64 <= kill_s / 5.0 + 6.0, "{status} status lines:\n{}", t.stderr);
}
