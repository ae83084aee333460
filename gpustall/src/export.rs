//! `gpustall export --perfetto OUT FILE` and `trace --perfetto OUT`.

use std::{
    io::{BufRead, BufReader},
    path::Path,
};

use serde_json::Value;

/// The first `max_lines` lines of a recording that parse (a corrupt tail is left out, as the
/// replay leaves it out).
pub fn read_lines(file: &Path, max_lines: usize) -> anyhow::Result<Vec<Value>> {
    let f = std::fs::File::open(file).map_err(|e| anyhow::anyhow!("cannot open the recording {}: {e}", file.display()))?;
    Ok(BufReader::new(f)
        .lines()
        .take(max_lines)
        .map_while(Result::ok)
        .map_while(|l| serde_json::from_str(&l).ok())
        .collect())
}

pub fn perfetto_file(file: &Path, out: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::open(file).map_err(|e| anyhow::anyhow!("cannot open the recording {}: {e}", file.display()))?;
    let r = crate::replay::replay(BufReader::new(f));
    if r.lines == 0 {
        anyhow::bail!("{} is not a gpustall recording", file.display());
    }
    let lines = read_lines(file, r.lines)?;
    write_perfetto(&lines, out)?;
    if let Some(e) = r.error {
        anyhow::bail!("{} line {}: {}; the trace covers lines 1-{}", file.display(), e.line, e.why, r.lines);
    }
    Ok(())
}

pub fn write_perfetto(lines: &[Value], out: &Path) -> anyhow::Result<()> {
    let trace = crate::perfetto::render(&crate::timeline::build(lines));
    let text = serde_json::to_string(&trace)?;
    std::fs::write(out, text).map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    eprintln!("gpustall: wrote {} (open it in https://ui.perfetto.dev)", out.display());
    Ok(())
}
