//! Case `py-stacks`: what sampling the job's Python stacks costs, on a real torch DataLoader
//! with 8 workers (tests/py/stacks.py big: 80 MiB batches on 2 CPUs), traced with
//! `--py-stacks off`, `auto` and 10 a second, alternating. The agent's CPU after its start-up
//! (its own /proc figures, in the summary's `overhead`) and the job's own time are compared
//! side by side; the samples taken say what the cost bought.

use std::process::Command;

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{median, release_bin, StackSamples, TracedSummary};
use crate::util::workspace_root;

const ROUNDS: usize = 3;
const STEPS: &str = "300";
/// (label, --py-stacks).
const CASES: [(&str, &str); 3] = [("off", "off"), ("auto", "auto"), ("10 Hz", "10")];

/// One `--py-stacks` setting's figures, medians of the rounds (drawn by `doc::py_stacks`).
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct StacksCase {
    /// The `--py-stacks` given.
    pub py_stacks: String,
    pub agent_cpu_pct: Vec<f64>,
    pub median_agent_cpu_pct: f64,
    pub median_duration_s: f64,
    /// The job's time against its time with stacks off.
    pub duration_to_off: f64,
    pub median_trainer_samples: f64,
    pub median_worker_samples: f64,
    pub median_failed_samples: f64,
}

/// The case's figures: each setting's, by label, and how it ran.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct StacksReport {
    #[serde(flatten)]
    pub cases: BTreeMap<String, StacksCase>,
    pub rounds: usize,
    pub steps: String,
}

struct Run {
    /// The agent's CPU after its start-up, as a share of one CPU over the trace.
    agent_cpu_pct: f64,
    duration_s: f64,
    trainer_samples: u64,
    worker_samples: u64,
    failed: u64,
}

fn run_once(python: &std::path::Path, rate: &str) -> anyhow::Result<Run> {
    let dir = tests::TempDir::new("bench-stacks");
    let summary = dir.path("summary.json");
    let script = workspace_root().join("tests/py/stacks.py");
    let o = Command::new(release_bin("gpustall"))
        .args(["trace", "--quiet", "--no-gpu", "--py-stacks", rate, "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg(python)
        .arg(&script)
        .args(["big", "--workers", "8", "--steps", STEPS])
        .output()
        .context("gpustall trace")?;
    anyhow::ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary)?)?;
    let s = TracedSummary::of(&s)?;
    let samples = |role: &str, figure: fn(&StackSamples) -> u64| {
        s.sum_over(role, |p| p.py_stacks.as_ref().map_or(0, figure))
    };
    let failed = |s: &StackSamples| s.failed_samples;
    Ok(Run {
        agent_cpu_pct: 100.0 * s.overhead.cpu_while_tracing_s() / s.duration_s.max(1e-3),
        duration_s: s.duration_s,
        trainer_samples: samples("trainer", |s| s.samples),
        worker_samples: samples("dataloader_worker", |s| s.samples),
        failed: samples("trainer", failed) + samples("dataloader_worker", failed),
    })
}

pub fn run() -> anyhow::Result<Value> {
    let python = crate::torch::ensure_venv()?;
    let mut runs: Vec<Vec<Run>> = CASES.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        for (i, (label, rate)) in CASES.iter().enumerate() {
            let r = run_once(&python, rate)?;
            eprintln!(
                "round {round}: stacks {label}: agent {:.2} % of a CPU, {:.1} s, {} trainer and {} worker samples",
                r.agent_cpu_pct, r.duration_s, r.trainer_samples, r.worker_samples
            );
            runs[i].push(r);
        }
    }
    let base = median(runs[0].iter().map(|r| r.duration_s).collect());
    let mut cases = BTreeMap::new();
    for (i, (label, rate)) in CASES.iter().enumerate() {
        let rs = &runs[i];
        let m = |f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
        let case = StacksCase {
            py_stacks: (*rate).to_string(),
            agent_cpu_pct: rs.iter().map(|r| r.agent_cpu_pct).collect(),
            median_agent_cpu_pct: m(&|r| r.agent_cpu_pct),
            median_duration_s: m(&|r| r.duration_s),
            duration_to_off: m(&|r| r.duration_s) / base.max(1e-9),
            median_trainer_samples: m(&|r| r.trainer_samples as f64),
            median_worker_samples: m(&|r| r.worker_samples as f64),
            median_failed_samples: m(&|r| r.failed as f64),
        };
        cases.insert((*label).to_string(), case);
    }
    let report = StacksReport { cases, rounds: ROUNDS, steps: STEPS.to_string() };
    Ok(serde_json::to_value(report)?)
}
