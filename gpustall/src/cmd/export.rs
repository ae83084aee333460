//! `gpustall export FILE --perfetto OUT [--html OUT] [--summary-json OUT]`: a recording's
//! files, without the report on the terminal (`report` writes the same and prints it).

use std::path::{Path, PathBuf};

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("outputs").required(true).multiple(true).args(["perfetto", "html", "summary_json"]))]
pub struct ExportArgs {
    /// The recording (JSON Lines).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Write a Perfetto / Chrome trace JSON (ui.perfetto.dev) to OUT.
    #[arg(long, value_name = "OUT")]
    perfetto: Option<PathBuf>,
    /// Write a self-contained HTML page (verdict, charts, tables) to OUT.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
    /// Write the summary as JSON to OUT (`-`: stdout).
    #[arg(long, value_name = "OUT")]
    summary_json: Option<PathBuf>,
}

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let file = &args.file;
    let outputs: Vec<(&str, &Path)> = [
        ("--perfetto", &args.perfetto),
        ("--html", &args.html),
        ("--summary-json", &args.summary_json),
    ]
    .into_iter()
    .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
    .collect();
    crate::recording::files::refuse_clashes(&[file], &outputs)?;
    let r = crate::recording::replay::open(file)?;
    let lines = r.lines;
    if args.html.is_some() || args.summary_json.is_some() {
        let summary = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
        if let Some(path) = &args.summary_json {
            crate::output::summary::write_json(&summary, path)?;
        }
        if let Some(path) = &args.html {
            let t = crate::output::timeline::from_file(file, lines)?;
            let page = crate::output::html::render(&summary, &t);
            crate::recording::files::write_private(path, page.as_bytes())?;
            say!("gpustall: wrote {}", path.display());
        }
    }
    if let Some(out) = &args.perfetto {
        crate::output::perfetto::write_recording_file(file, lines, out)?;
    }
    if let Some(e) = r.error {
        anyhow::bail!(
            "{} line {}: {}; the files cover lines 1-{}",
            file.display(),
            e.line,
            e.why,
            lines
        );
    }
    Ok(())
}
