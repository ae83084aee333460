//! `gpustall merge FILE...`: the recordings of several nodes or ranks (`trace --record` files,
//! or the incident bundles `watch` writes) on one wall-clock timeline, with the job's verdict:
//! which node stalled first, by how long it preceded the others, and why (its own verdict).
//! A directory that is not a bundle is searched for recordings and bundles, which are grouped
//! by their run (torchrun's run id, or the Slurm job): one job's verdict per run.
//!
//! Each recording is replayed on its own, exactly as `gpustall report` replays it; only the
//! alignment and the job-level answer are new (`pipeline::lanes`, deciding with
//! `diagnose::job_verdict`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    output::merged::{self as out, Lane},
    pipeline::lanes::{conclude_job, is_same_recording, load, recording_of, JobVerdict},
};

#[derive(clap::Args)]
pub struct MergeArgs {
    /// Recordings (`trace --record`) or incident bundle directories (with record.jsonl), one or
    /// more per node; or directories holding them (a node's bundle directory, a copy of every
    /// node's), grouped by run.
    #[arg(value_name = "FILE", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// Of recordings of several runs (torchrun's run id, or the Slurm job id), merge this one:
    /// the file outputs need one run.
    #[arg(long, value_name = "ID")]
    run: Option<String>,
    /// Write one self-contained HTML page: the job's verdict, a lane per node, each node's report.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
    /// Write a Perfetto / Chrome trace with a process group per node.
    #[arg(long, value_name = "OUT")]
    perfetto: Option<PathBuf>,
    /// Write the job's summary (its verdict, every node's summary) as JSON.
    #[arg(long, value_name = "OUT")]
    summary_json: Option<PathBuf>,
    /// How far the nodes' wall clocks may disagree (NTP keeps them within milliseconds): a node
    /// that led by less is not called first for sure, and recordings of one host whose clocks
    /// differ by more are warned about.
    #[arg(long, value_name = "D", default_value = "1s", value_parser = crate::cmd::units::parse_duration)]
    max_skew: Duration,
}

pub fn run(args: &MergeArgs) -> anyhow::Result<()> {
    let inputs = expand(&args.files)?;
    let recordings: Vec<PathBuf> =
        inputs.iter().map(|f| recording_of(f)).collect::<anyhow::Result<_>>()?;
    let outputs: Vec<(&str, &Path)> = [
        ("--html", &args.html),
        ("--perfetto", &args.perfetto),
        ("--summary-json", &args.summary_json),
    ]
    .into_iter()
    .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
    .collect();
    let inputs: Vec<&Path> = recordings.iter().map(PathBuf::as_path).collect();
    crate::recording::files::refuse_clashes(&inputs, &outputs)?;

    let mut lanes: Vec<Lane> = Vec::new();
    let mut stopped = Vec::new();
    let mut skipped = Vec::new();
    for input in &inputs {
        // One recording that cannot be read costs only its lane: the job's other nodes are
        // still merged, and the exit status says one was left out.
        let (lane, err) = match load(input, args.html.is_some()) {
            Ok(loaded) => loaded,
            Err(e) => {
                say!("gpustall: warning: {e:#}: skipped");
                skipped.push(format!("{e:#}"));
                continue;
            }
        };
        if let Some(same) = lanes.iter().find(|l| is_same_recording(&l.source, &lane.source)) {
            say!(
                "gpustall: warning: {} is the same recording as {}: skipped",
                lane.file,
                same.file
            );
            continue;
        }
        stopped.extend(err);
        lanes.push(lane);
    }
    anyhow::ensure!(!lanes.is_empty(), "no recording could be merged: {}", skipped.join("; "));
    if !skipped.is_empty() {
        let n = inputs.len();
        stopped.push(format!("{} of {n} inputs could not be merged (said above)", skipped.len()));
    }
    let max_skew = args.max_skew.as_nanos() as u64;
    let mut runs = by_run(lanes);
    if let Some(id) = &args.run {
        let known: Vec<String> = runs.keys().map(run_name).collect();
        let lanes = runs.remove(&Some(id.clone())).with_context(|| {
            format!("no recording of run {id} here; the runs are: {}", known.join(", "))
        })?;
        runs = [(Some(id.clone()), lanes)].into();
    }
    if runs.len() > 1 {
        let names: Vec<String> = runs.keys().map(run_name).collect();
        let files = [&args.html, &args.perfetto, &args.summary_json];
        anyhow::ensure!(
            files.iter().all(|f| f.is_none()),
            "the recordings are of {} runs ({}): choose one with --run ID for the files",
            runs.len(),
            names.join(", ")
        );
    }
    for (run, mut lanes) in runs {
        let (verdict, warnings) = conclude_job(&mut lanes, max_skew);
        write_outputs(args, &lanes, &verdict, &warnings, max_skew)?;
        let heading = match &run {
            Some(_) if args.run.is_none() => format!("\n#### run {} ####\n", run_name(&run)),
            _ => String::new(),
        };
        crate::output::text::print(&(heading + &out::text(&lanes, &verdict, &warnings)))?;
    }
    anyhow::ensure!(stopped.is_empty(), "{}", stopped.join("; "));
    Ok(())
}

/// The inputs, with each directory that is not a bundle replaced by the recordings (`*.jsonl`)
/// and bundles in it, in name order.
fn expand(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for input in inputs {
        if !input.is_dir() || input.join("record.jsonl").is_file() {
            out.push(input.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(input)
            .with_context(|| format!("cannot read the directory {}", input.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.join("record.jsonl").is_file()
                    || (p.is_file() && p.extension().is_some_and(|e| e == "jsonl"))
            })
            .collect();
        found.sort();
        if found.is_empty() {
            say!("gpustall: warning: {} holds no recording or bundle: skipped", input.display());
        }
        out.extend(found);
    }
    Ok(out)
}

/// Lanes by the run they recorded (torchrun's run id, else the Slurm job); `None` for
/// recordings that name none.
fn by_run(lanes: Vec<Lane>) -> std::collections::BTreeMap<Option<String>, Vec<Lane>> {
    let mut runs: std::collections::BTreeMap<Option<String>, Vec<Lane>> = Default::default();
    for l in lanes {
        let job = l.summary.job.as_ref();
        let run = job.and_then(|j| j.run_id.clone().or_else(|| j.slurm_job.clone()));
        runs.entry(run).or_default().push(l);
    }
    runs
}

fn run_name(run: &Option<String>) -> String {
    run.clone().unwrap_or_else(|| "(no run id)".into())
}

fn write_outputs(
    args: &MergeArgs,
    lanes: &[Lane],
    verdict: &JobVerdict,
    warnings: &[String],
    max_skew: u64,
) -> anyhow::Result<()> {
    if let Some(path) = &args.summary_json {
        let s = out::summary(lanes, verdict, warnings, max_skew);
        let text = serde_json::to_string_pretty(&s)? + "\n";
        crate::recording::files::write_private(path, text.as_bytes())
            .with_context(|| format!("writing the summary to {}", path.display()))?;
    }
    if let Some(path) = &args.html {
        crate::recording::files::write_private(
            path,
            out::html_page(lanes, verdict, warnings).as_bytes(),
        )?;
    }
    if let Some(path) = &args.perfetto {
        crate::recording::files::write_private_with(path, |w| {
            out::write_perfetto(lanes, verdict, w)
                .map_err(|e| std::io::Error::other(format!("{e:#}")))
        })?;
        say!("gpustall: wrote {} (open it in https://ui.perfetto.dev)", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::job_verdict::{self, Source};

    /// A pair of recordings made on this machine (`gpustall trace --record`, two process
    /// trees in memory cgroups, hosts renamed node-a and node-b): on node-a a worker is
    /// OOM-killed; on node-b the GPU (the stand-in NVML) goes idle and the trainer exits 1
    /// after its "timeout". Merged, node-a is first and its verdict the cause.
    #[test]
    fn the_committed_pair_merges_into_one_story() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/recording/testdata");
        let mut lanes = Vec::new();
        for f in ["merge-node-a.jsonl", "merge-node-b.jsonl"] {
            let (lane, stopped) = load(&dir.join(f), true).expect("loads");
            assert_eq!(stopped, None);
            lanes.push(lane);
        }
        let names = job_verdict::labels(
            &lanes
                .iter()
                .map(|l| (l.source.host.clone(), l.source.label.clone()))
                .collect::<Vec<_>>(),
        );
        assert_eq!(names, ["node-a", "node-b"]);
        for (l, name) in lanes.iter_mut().zip(names) {
            l.source.label = name;
        }
        let sources: Vec<Source> = lanes.iter().map(|l| l.source.clone()).collect();
        let v = job_verdict::decide(&sources, 1_000_000_000);
        assert_eq!(v.first.as_deref(), Some("node-a"), "{}", v.text);
        assert_eq!(v.cause.as_deref(), Some("host_memory_oom"), "{}", v.text);
        assert!(v.order_certain, "{}", v.clock);
        assert!(v.lead_s.is_some_and(|l| l > 1.0), "{:?}", v.lead_s);
        assert_eq!(v.order.len(), 2);
        assert!(v.text.contains("OOM-killed"), "{}", v.text);
        assert!(v.text.contains("node-b waited from"), "{}", v.text);
        assert!(job_verdict::disagreements(&sources, 1_000_000_000).is_empty());
        // The outputs: a lane per node in the page, a process group per node in the trace.
        let page = out::html_page(&lanes, &v, &[]);
        assert!(page.contains("<h1>node-a: <span class=\"cause\">host_memory_oom</span></h1>"));
        assert!(page.contains("aria-label=\"nodes\""));
        let mut trace = Vec::new();
        out::write_perfetto(&lanes, &v, &mut trace).expect("written");
        let trace: serde_json::Value = serde_json::from_slice(&trace).expect("json");
        let ev = trace["traceEvents"].as_array().expect("events");
        let groups: std::collections::BTreeSet<u64> =
            ev.iter().filter_map(|e| e["pid"].as_u64()).collect();
        assert_eq!(groups, [1, 2].into(), "one process group per node");
        // Streamed from the files, every lane's events are there: each recording's own trace,
        // a name and a place per node, and the first stall.
        let own: usize = ["merge-node-a.jsonl", "merge-node-b.jsonl"]
            .iter()
            .map(|f| {
                let t = crate::output::timeline::from_file(&dir.join(f), usize::MAX).expect("read");
                crate::output::perfetto::render(&t)["traceEvents"].as_array().map_or(0, Vec::len)
            })
            .sum();
        assert_eq!(ev.len(), own + 2 * 2 + 1);
        assert!(ev.iter().any(|e| e["pid"] == 1 && e["name"] == "OOM kill"));
        let s = serde_json::to_value(out::summary(&lanes, &v, &[], 1_000_000_000)).expect("json");
        assert_eq!(s["nodes"][0]["summary"]["verdict"]["cause"], "host_memory_oom");
        assert_eq!(s["verdict"]["first"], "node-a");
    }
}
