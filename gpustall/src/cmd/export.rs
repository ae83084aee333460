//! `gpustall export --perfetto OUT FILE`: a recording as a Perfetto / Chrome trace.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ExportArgs {
    /// Where to write the Perfetto / Chrome trace JSON.
    #[arg(long, value_name = "OUT", required = true)]
    perfetto: PathBuf,
    /// The recording (JSON Lines).
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let (file, out) = (&args.file, &args.perfetto);
    crate::recording::files::refuse_clashes(&[file], &[("--perfetto", out)])?;
    let r = crate::recording::replay::open(file)?;
    let lines = r.lines;
    let error = r.error;
    crate::output::perfetto::write_recording_file(file, lines, out)?;
    if let Some(e) = error {
        anyhow::bail!(
            "{} line {}: {}; the trace covers lines 1-{}",
            file.display(),
            e.line,
            e.why,
            lines
        );
    }
    Ok(())
}
