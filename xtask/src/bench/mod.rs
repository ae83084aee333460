//! `cargo xtask bench`: what tracing costs, measured side by side in one run on the same
//! machine (timings on shared machines are only meaningful as ratios). Each case is a module
//! of its own; `common` holds what they share and imports none of them; `doc` turns their
//! figures into docs/BENCHMARKS.md's sections.
//!
//! - `swap-heavy` (swap.rs): a swap-heavy workload untraced and traced;
//! - `watch` (watch.rs): the `gpustall watch` daemon watching an idle job, then a busy one;
//! - `fork-burst` (fork.rs): the daemon through a fork burst;
//! - `incident` (incident.rs): the daemon at an 8,000-process incident, in its shipped limit;
//! - `peer` (peer.rs, with floor.rs): gpustall against a bpftrace script on one workload, then
//!   `outside`: what gpustall's programs cost processes it does not trace;
//! - `ctxswitch` (ctx.rs): a pipe ping-pong untraced, outside and inside the traced job;
//! - `py-stacks` (stacks.rs): a torch job with 8 workers traced with Python stacks off and on;
//! - `cuda-uprobes` (cuda.rs): what the uprobes on the CUDA driver add to each call.

mod common;
mod ctx;
mod cuda;
mod doc;
mod floor;
mod fork;
mod incident;
mod peer;
mod stacks;
mod swap;
mod watch;

use anyhow::Context as _;
use serde_json::Value;

use crate::util::{cargo, is_root, run_cmd, target_dir, workspace_root};

/// The cases `--only` takes, in the order of a whole run: the document's sections but its
/// header.
const CASES: &[&str] = doc::SECTIONS.split_at(1).1;

/// The key of a case's figures in overhead.json.
fn json_key(case: &str) -> &'static str {
    match case {
        "swap-heavy" => "swap_heavy_trace",
        "watch" => "watch_daemon",
        "fork-burst" => "watch_fork_burst",
        "incident" => "watch_big_incident",
        "peer" => "peer",
        "outside" => "outside_the_job",
        "py-stacks" => "py_stacks",
        "cuda-uprobes" => "cuda_uprobes",
        _ => "ctxswitch",
    }
}

fn run_case(case: &str) -> anyhow::Result<Value> {
    match case {
        "swap-heavy" => swap::run(),
        "watch" => watch::run(),
        "fork-burst" => fork::run(),
        "incident" => incident::run(),
        "peer" => peer::run(),
        "outside" => peer::outside_cases(),
        "ctxswitch" => ctx::run(),
        "py-stacks" => stacks::run(),
        "cuda-uprobes" => cuda::run(),
        other => anyhow::bail!("no bench case {other:?} (cases: {})", CASES.join(", ")),
    }
}

pub fn run(only: Option<&str>) -> anyhow::Result<()> {
    let cases: Vec<&str> = match only {
        None => CASES.to_vec(),
        // The peer case brings the outside one with it (both need bpftrace's absence checked).
        Some("peer") => vec!["peer", "outside"],
        Some(c) if CASES.contains(&c) => vec![c],
        Some(other) => anyhow::bail!("no bench case {other:?} (cases: {})", CASES.join(", ")),
    };
    anyhow::ensure!(is_root(), "the benchmark loads eBPF programs and makes cgroups: run as root");
    crate::setup::run_setup(true)?;
    crate::setup::ensure_test_tools()?;
    run_cmd(cargo().args(["build", "--release", "-p", "gpustall", "-p", "tests"]))?;
    std::env::set_var("GPUSTALL_BIN", common::release_bin("gpustall"));
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let machine = doc::Machine::read();
    let mut figures: Vec<(&str, Value)> = Vec::new();
    for case in cases {
        figures.push((case, run_case(case)?));
        // Written after each case: a later case's failure keeps what was measured.
        write_results(&figures, &machine)?;
    }
    Ok(())
}

/// target/bench/overhead.json (this run's figures) and docs/BENCHMARKS.md (this run's sections
/// replaced, the others kept).
fn write_results(figures: &[(&str, Value)], machine: &doc::Machine) -> anyhow::Result<()> {
    let all: serde_json::Map<String, Value> =
        figures.iter().map(|(c, v)| (json_key(c).to_string(), v.clone())).collect();
    let out = target_dir().join("bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let json = out.join("overhead.json");
    std::fs::write(&json, serde_json::to_string_pretty(&Value::Object(all))? + "\n")?;
    let path = workspace_root().join("docs/BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let sections: Vec<(&str, &Value)> = figures.iter().map(|(c, v)| (*c, v)).collect();
    std::fs::write(&path, doc::updated(&old, &sections, machine))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("written to {} and docs/BENCHMARKS.md", json.display());
    Ok(())
}
