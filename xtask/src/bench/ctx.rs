//! `cargo xtask bench --only ctxswitch`: what off-CPU accounting (sched_switch, sched_waking,
//! the hottest tracepoints there are) costs a context-switch-heavy job. The job: a process and
//! a child named like a DataLoader worker passing a byte back and forth over two pipes
//! (`gpustall-workload pingpong`: two wakeups and four switches per round trip). Three cases,
//! alternating, ROUNDS each:
//!
//! - untraced (no gpustall running);
//! - outside: gpustall traces an unrelated idle job, nothing of the ping-pong is tracked (every
//!   switch still runs the programs, which find nothing to count);
//! - inside: the ping-pong is the traced job (trainer and worker accounted, every wait of the
//!   trainer charged to the worker).
//!
//! Reported: round trips per second (medians) and their ratio to the untraced runs, and each
//! sched program's runs and ns per run (kernel BPF stats, `kernel.bpf_stats_enabled=1`) from the
//! traced runs' summaries. The inside case also shows that the accounting was on: the time the
//! worker kept the trainer waiting per unit of ping-pong (near 1: the trainer does nothing
//! between its reads, so its run is one logical wait).

use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tests::procs::{Tracer, Workload};

use super::common::{median, workload_bin, BpfStats, TracedSummary};

const ROUNDS: usize = 3;
/// Ping-pong time, and the wait before it (the tracer's next beat accounts the child).
const RUN_MS: &str = "5000";
const SETTLE_MS: &str = "1500";
const PROGRAMS: [&str; 2] = ["sched_switch", "sched_waking"];

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Untraced,
    Outside,
    Inside,
}

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Untraced => "untraced",
            Case::Outside => "outside the traced job",
            Case::Inside => "inside the traced job",
        }
    }
}

/// One run: round trips per second, and the summary when gpustall ran.
struct Run {
    rate: f64,
    round_trips: u64,
    summary: Option<TracedSummary>,
}

fn ping_pong() -> Workload {
    Workload::start(&workload_bin(), &["pingpong", RUN_MS, SETTLE_MS], None)
}

/// The ping-pong's own count, its last line (`gpustall-workload pingpong`).
#[derive(Deserialize)]
struct PingPongLine {
    round_trips: u64,
    seconds: f64,
}

/// The workload's own count: (round trips, per second).
fn rate(lines: &[Value]) -> anyhow::Result<(u64, f64)> {
    let l = lines
        .iter()
        .find_map(|l| PingPongLine::deserialize(l).ok())
        .context("no round trips reported")?;
    Ok((l.round_trips, l.round_trips as f64 / l.seconds.max(1e-9)))
}

fn run_once(case: Case) -> anyhow::Result<Run> {
    let timeout = Duration::from_secs(60);
    let flags = ["--quiet", "--no-gpu"];
    let (code, lines, summary) = match case {
        Case::Untraced => {
            let mut w = ping_pong();
            w.go();
            let (code, lines) = w.wait(timeout);
            (code, lines, None)
        }
        Case::Outside => {
            let mut idle = Workload::start(&workload_bin(), &["spawn", "sleep", "600"], None);
            idle.go();
            let tracer = Tracer::start(idle.pid(), &flags);
            let mut w = ping_pong();
            w.go();
            let (code, lines) = w.wait(timeout);
            let t = tracer.stop();
            drop(idle);
            (code, lines, Some(t.summary))
        }
        Case::Inside => {
            let mut w = ping_pong();
            let tracer = Tracer::start(w.pid(), &flags);
            w.go();
            let (code, lines) = w.wait(timeout);
            (code, lines, Some(tracer.wait(timeout).summary))
        }
    };
    anyhow::ensure!(code == Some(0), "the ping-pong failed ({code:?})");
    let (round_trips, rate) = rate(&lines)?;
    let summary = summary.as_ref().map(TracedSummary::of).transpose()?;
    Ok(Run { rate, round_trips, summary })
}

/// A sched program's (runs, ns per run) in a summary.
fn program(summary: &TracedSummary, tracepoint: &str) -> (u64, f64) {
    summary
        .overhead
        .program(tracepoint)
        .map_or((0, 0.0), |p| (p.run_count, p.ns_per_run().unwrap_or(0.0)))
}

/// The inside case's accounting: the time the worker kept the trainer waiting, and the
/// trainer's data wait (logical waits: the ping-pong's trainer does nothing between its reads,
/// so its whole run is one wait, charged to the worker when it ends).
fn accounted(summary: &TracedSummary) -> (u64, u64) {
    (
        summary.sum_over("dataloader_worker", |p| p.kept_waiting_ns),
        summary.sum_over("trainer", |p| p.data_wait_ns.unwrap_or(0)),
    )
}

/// A sched program's figures over one case's traced runs.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct ProgFigures {
    pub runs: Vec<u64>,
    pub ns_per_run: Vec<f64>,
    pub median_ns_per_run: f64,
    /// Machine-wide: others' switches included.
    pub median_runs_per_s: f64,
}

/// The inside case's accounting, round by round.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct Accounting {
    /// The worker's kept-waiting time per ns of ping-pong (round 1).
    pub accounted_per_ns: f64,
    pub worker_kept_waiting_ns: Vec<u64>,
    pub trainer_data_wait_ns: Vec<u64>,
    pub round_trips: Vec<u64>,
}

/// One case's figures (drawn by `doc::ctxswitch`); the programs' where gpustall ran.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct CtxCase {
    pub round_trips_per_s: Vec<f64>,
    pub median_round_trips_per_s: f64,
    pub ratio_to_untraced: f64,
    pub sched_switch: Option<ProgFigures>,
    pub sched_waking: Option<ProgFigures>,
    #[serde(flatten)]
    pub accounting: Option<Accounting>,
}

/// The case's figures.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct CtxReport {
    pub untraced: CtxCase,
    pub outside_traced_job: CtxCase,
    pub inside_traced_job: CtxCase,
    pub rounds: usize,
    pub run_ms: u64,
}

/// A program's figures over `summaries`.
fn prog_figures(summaries: &[&TracedSummary], tracepoint: &str) -> ProgFigures {
    let per: Vec<(u64, f64)> = summaries.iter().map(|s| program(s, tracepoint)).collect();
    let per_s = per.iter().zip(summaries).map(|(p, s)| p.0 as f64 / s.duration_s.max(1e-3));
    ProgFigures {
        runs: per.iter().map(|p| p.0).collect(),
        ns_per_run: per.iter().map(|p| p.1).collect(),
        median_ns_per_run: median(per.iter().map(|p| p.1).collect()),
        median_runs_per_s: median(per_s.collect()),
    }
}

/// One case's figures from its runs; `base`: the untraced median round trips per second.
fn case_figures(case: Case, runs: &[Run], base: f64) -> CtxCase {
    let rates: Vec<f64> = runs.iter().map(|r| r.rate).collect();
    let r = median(rates.clone());
    let summaries: Vec<&TracedSummary> = runs.iter().filter_map(|r| r.summary.as_ref()).collect();
    let traced = !summaries.is_empty();
    let accounting = (traced && case == Case::Inside).then(|| {
        let (kept, waited): (Vec<u64>, Vec<u64>) = summaries.iter().map(|s| accounted(s)).unzip();
        let run_ns: f64 = RUN_MS.parse::<f64>().unwrap_or(1.0) * 1e6;
        Accounting {
            accounted_per_ns: kept[0] as f64 / run_ns,
            worker_kept_waiting_ns: kept,
            trainer_data_wait_ns: waited,
            round_trips: runs.iter().map(|r| r.round_trips).collect(),
        }
    });
    CtxCase {
        round_trips_per_s: rates,
        median_round_trips_per_s: r,
        ratio_to_untraced: r / base,
        sched_switch: traced.then(|| prog_figures(&summaries, PROGRAMS[0])),
        sched_waking: traced.then(|| prog_figures(&summaries, PROGRAMS[1])),
        accounting,
    }
}

pub fn run() -> anyhow::Result<Value> {
    let _stats = BpfStats::enable();
    let cases = [Case::Untraced, Case::Outside, Case::Inside];
    let mut runs: Vec<Vec<Run>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        for (i, &case) in cases.iter().enumerate() {
            let r = run_once(case)?;
            eprintln!("round {round}: {}: {:.0} round trips/s", case.label(), r.rate);
            runs[i].push(r);
        }
    }
    let base = median(runs[0].iter().map(|r| r.rate).collect());
    let [untraced, outside_traced_job, inside_traced_job] =
        [0, 1, 2].map(|i| case_figures(cases[i], &runs[i], base));
    let report = CtxReport {
        untraced,
        outside_traced_job,
        inside_traced_job,
        rounds: ROUNDS,
        run_ms: RUN_MS.parse().unwrap_or(0),
    };
    print_ctx(&report);
    Ok(serde_json::to_value(report)?)
}

/// The case on the terminal.
fn print_ctx(r: &CtxReport) {
    println!(
        "\n== context-switch-heavy job: pipe ping-pong, {ROUNDS} rounds of {RUN_MS} ms, medians =="
    );
    println!(
        "{:<24} {:>13} {:>9} {:>12} {:>12} {:>12} {:>12}",
        "case", "round trips/s", "ratio", "switches/s", "switch ns", "waking ns", "accounted"
    );
    let cases = [
        (Case::Untraced, &r.untraced),
        (Case::Outside, &r.outside_traced_job),
        (Case::Inside, &r.inside_traced_job),
    ];
    for (case, c) in cases {
        let prog = |p: &Option<ProgFigures>| {
            p.as_ref().map_or((0.0, 0.0), |p| (p.median_runs_per_s, p.median_ns_per_run))
        };
        let ((switches, switch_ns), (_, waking_ns)) =
            (prog(&c.sched_switch), prog(&c.sched_waking));
        let acc =
            c.accounting.as_ref().map_or(String::new(), |a| format!("{:.2}", a.accounted_per_ns));
        println!(
            "{:<24} {:>13.0} {:>9.3} {:>12.0} {:>12.0} {:>12.0} {:>12}",
            case.label(),
            c.median_round_trips_per_s,
            c.ratio_to_untraced,
            switches,
            switch_ns,
            waking_ns,
            acc
        );
    }
    println!("(switches/s: sched_switch runs per second machine-wide, others' included; accounted: the worker's kept_waiting_ns per ns of ping-pong, round 1)");
}
