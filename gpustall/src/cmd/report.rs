//! `gpustall report FILE`: the summary, verdict and report of a recording, offline.

use std::path::PathBuf;

use crate::output::{html, text, timeline};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The recording (JSON Lines).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Write the summary as JSON to OUT (`-`: stdout, the report then on stderr).
    #[arg(long, value_name = "OUT")]
    summary_json: Option<PathBuf>,
    /// The summary as JSON on stdout (`--summary-json -`), the report on stderr.
    #[arg(long, conflicts_with = "summary_json")]
    json: bool,
    /// Write a self-contained HTML page (verdict and timeline chart, no network) to OUT.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
    /// Write a Perfetto / Chrome trace (ui.perfetto.dev) of the recording to OUT, as `export`.
    #[arg(long, value_name = "OUT")]
    perfetto: Option<PathBuf>,
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let file = &args.file;
    let stdout = PathBuf::from("-");
    let summary_json = args.summary_json.clone().or(args.json.then_some(stdout));
    let outputs: Vec<(&str, &std::path::Path)> =
        [("--summary-json", &summary_json), ("--html", &args.html), ("--perfetto", &args.perfetto)]
            .into_iter()
            .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
            .collect();
    crate::recording::files::refuse_clashes(&[file], &outputs)?;
    let r = crate::recording::replay::open(file)?;
    let summary = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
    if let Some(path) = &summary_json {
        crate::output::summary::write_json(&summary, path)?;
    }
    if let Some(path) = &args.html {
        let page = html::render(&summary, &timeline::from_file(file, r.lines)?);
        crate::recording::files::write_private(path, page.as_bytes())?;
    }
    if let Some(path) = &args.perfetto {
        crate::output::perfetto::write_recording_file(file, r.lines, path)?;
    }
    let json_on_stdout = summary_json.as_deref().is_some_and(crate::recording::files::is_stdout);
    text::print_beside(&text::render(&summary), summary.verdict.cause.severity(), json_on_stdout)?;
    if let Some(e) = r.error {
        anyhow::bail!(
            "{} line {}: {}; the report above covers lines 1-{}",
            file.display(),
            e.line,
            e.why,
            r.lines
        );
    }
    Ok(())
}
