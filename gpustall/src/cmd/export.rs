//! `gpustall export --perfetto OUT FILE`: a recording as a Perfetto / Chrome trace.

use std::{io::BufReader, path::PathBuf};

use anyhow::Context as _;

use crate::recording::replay::replay;

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
    let f = std::fs::File::open(file)
        .with_context(|| format!("cannot open the recording {}", file.display()))?;
    let r = replay(BufReader::new(f));
    for w in &r.warnings {
        say!("gpustall: warning: {}: {w}", file.display());
    }
    if r.lines == 0 {
        anyhow::bail!("{} is not a gpustall recording", file.display());
    }
    let timeline = crate::output::timeline::from_file(file, r.lines)?;
    crate::output::perfetto::write_file(&timeline, out)?;
    if let Some(e) = r.error {
        anyhow::bail!(
            "{} line {}: {}; the trace covers lines 1-{}",
            file.display(),
            e.line,
            e.why,
            r.lines
        );
    }
    Ok(())
}
