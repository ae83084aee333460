//! `gpustall report FILE`: the summary, verdict and report of a recording, offline.

use std::{io::BufReader, path::PathBuf};

use anyhow::Context as _;

use crate::{
    output::{html, summary::Summary, text, timeline},
    recording::replay::{replay, Replay},
};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The recording (JSON Lines).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Write the summary as JSON to OUT (`-`: stdout, the report then on stderr).
    #[arg(long, value_name = "OUT")]
    summary_json: Option<PathBuf>,
    /// Write a self-contained HTML page (verdict and timeline chart, no network) to OUT.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let file = &args.file;
    let outputs: Vec<(&str, &std::path::Path)> =
        [("--summary-json", &args.summary_json), ("--html", &args.html)]
            .into_iter()
            .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
            .collect();
    crate::recording::files::refuse_clashes(&[file], &outputs)?;
    let r = open_recording(file)?;
    let summary = Summary::of(&r.model, r.end_ns, true);
    if let Some(path) = &args.summary_json {
        crate::output::summary::write_json(&summary, path)?;
    }
    if let Some(path) = &args.html {
        let page = html::render(&summary, &timeline::from_file(file, r.lines)?);
        crate::recording::files::write_private(path, page.as_bytes())?;
    }
    let json_on_stdout = args.summary_json.as_deref().is_some_and(crate::recording::files::is_stdout);
    text::print_beside(&text::render(&summary), json_on_stdout);
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

/// Replays the recording at `file`, saying its warnings; an error when it holds nothing that
/// parses. A recording cut short comes back with its `error` (the caller reports what parsed).
pub fn open_recording(file: &std::path::Path) -> anyhow::Result<Replay> {
    let f = std::fs::File::open(file)
        .with_context(|| format!("cannot open the recording {}", file.display()))?;
    let r = replay(BufReader::new(f));
    for w in &r.warnings {
        say!("gpustall: warning: {}: {w}", file.display());
    }
    if r.lines == 0 {
        let why = r
            .error
            .as_ref()
            .map_or("it is empty".to_string(), |e| format!("line {}: {}", e.line, e.why));
        anyhow::bail!("{} is not a gpustall recording: {why}", file.display());
    }
    Ok(r)
}
