//! Case `cuda-uprobes`: what timing the trainer's waits for the GPU adds to each call into the
//! CUDA driver. A Python loop calls the stand-in libcuda's `cuStreamSynchronize` (returning at
//! once) 200,000 times, untraced and traced, alternating; the difference per call is the
//! uprobe's and uretprobe's cost (two traps into the kernel and two short programs). The
//! programs' own run time comes from the kernel's BPF stats in the traced summary.

use std::process::Command;

use anyhow::Context as _;
use serde_json::Value;

use super::common::{median, release_bin, Program, TracedSummary};
use crate::util::{target_dir, workspace_root};

const ROUNDS: usize = 3;

/// The case's figures (drawn by `doc::cuda_uprobes`); the programs' times are absent where the
/// kernel kept no BPF stats.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct CudaReport {
    pub calls: u64,
    pub rounds: usize,
    pub untraced_ns_per_call: Vec<f64>,
    pub traced_ns_per_call: Vec<f64>,
    pub median_untraced_ns_per_call: f64,
    pub median_traced_ns_per_call: f64,
    pub median_added_ns_per_call: f64,
    pub enter_program_avg_ns: Option<f64>,
    pub exit_program_avg_ns: Option<f64>,
}
const CALLS: u64 = 200_000;

/// The loop's own line (tests/py/cuda_calls.py): its calls and their time, in seconds.
#[derive(serde::Deserialize)]
struct LoopLine {
    calls: u64,
    s: f64,
}

/// The loop's time per call in ns, and the traced summary's programs.
fn run_once(python: &std::path::Path, traced: bool) -> anyhow::Result<(f64, Vec<Program>)> {
    let dir = tests::TempDir::new("bench-cuda");
    let lib = dir.path("libcuda.so.1");
    std::fs::copy(target_dir().join("release/libcuda_stub.so"), &lib)?;
    let summary = dir.path("summary.json");
    let script = workspace_root().join("tests/py/cuda_calls.py");
    let mut cmd = if traced {
        let mut c = Command::new(release_bin("gpustall"));
        c.args(["trace", "--quiet", "--no-gpu", "--py-stacks", "off", "--summary-json"])
            .arg(&summary)
            .arg("--")
            .arg(python);
        c
    } else {
        Command::new(python)
    };
    let o = cmd
        .arg(&script)
        .arg(&lib)
        .arg(CALLS.to_string())
        .env("GPUSTALL_CUDA_STUB", "spin:0")
        .output()
        .context("the cuda calls loop")?;
    anyhow::ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().find(|l| l.starts_with("{\"calls\"")).context("the loop's line")?;
    let l: LoopLine = serde_json::from_str(line).context("the loop's line")?;
    anyhow::ensure!(l.calls == CALLS, "the loop made {} calls of {CALLS}", l.calls);
    let per_call = l.s * 1e9 / CALLS as f64;
    let programs = if traced {
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary)?)?;
        let s = TracedSummary::of(&s)?;
        let t = s.processes.iter().find(|p| p.role == "trainer").and_then(|p| p.gpu_wait.clone());
        anyhow::ensure!(
            t.as_ref().map(|g| g.calls) == Some(CALLS),
            "the traced loop's calls were not all timed: {t:?}"
        );
        s.overhead.programs
    } else {
        Vec::new()
    };
    Ok((per_call, programs))
}

pub fn run() -> anyhow::Result<Value> {
    let python = crate::torch::ensure_venv()?;
    crate::util::run_cmd(crate::util::cargo().args(["build", "--release", "-p", "cuda-stub"]))?;
    // The programs' run time (restored at the end, whatever happens).
    let _stats = super::common::BpfStats::enable();
    let (mut plain, mut traced, mut programs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let (p, _) = run_once(&python, false)?;
        let (t, progs) = run_once(&python, true)?;
        eprintln!("round {round}: {p:.0} ns a call untraced, {t:.0} ns traced");
        plain.push(p);
        traced.push(t);
        programs = progs;
    }
    let ours = |name: &str| programs.iter().find(|p| p.name == name).and_then(Program::ns_per_run);
    let (p, t) = (median(plain.clone()), median(traced.clone()));
    let report = CudaReport {
        calls: CALLS,
        rounds: ROUNDS,
        untraced_ns_per_call: plain,
        traced_ns_per_call: traced,
        median_untraced_ns_per_call: p,
        median_traced_ns_per_call: t,
        median_added_ns_per_call: t - p,
        enter_program_avg_ns: ours("cuda_sync_enter"),
        exit_program_avg_ns: ours("cuda_sync_exit"),
    };
    Ok(serde_json::to_value(report)?)
}
