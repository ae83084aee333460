//! `--record FILE`: JSON Lines. Line 1 is a header, then one object per event or sample, and
//! periodic and final summaries. Each line is written whole and flushed at every tick, so a
//! crash of the agent leaves every earlier line parseable.

use anyhow::Context as _;
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use bytes::{BufMut, BytesMut};

use crate::recording::record::Line;

/// Where record lines go: a file (`trace --record`) or the flight recorder (`watch`).
pub trait Sink {
    /// One line, serialized straight from its typed form: under reclaim the agent writes
    /// thousands of events a second.
    fn write(&mut self, line: Line<'_>);
    fn flush(&mut self) {}
    fn sync(&mut self) {}
    /// Why what was written is incomplete, if it is.
    fn failure(&self) -> Option<String> {
        None
    }
}

impl Sink for Recorder {
    fn write(&mut self, line: Line<'_>) {
        Recorder::write(self, line)
    }
    fn flush(&mut self) {
        Recorder::flush(self)
    }
    fn sync(&mut self) {
        Recorder::sync(self)
    }
    fn failure(&self) -> Option<String> {
        Recorder::failure(self)
    }
}

pub struct Recorder {
    out: BufWriter<File>,
    line: BytesMut,
    path: PathBuf,
    /// Writes, flushes and syncs that failed, and the first error: reported once as it
    /// happens and again when the trace ends (a recording with holes is not a success).
    failures: u64,
    first_failure: Option<String>,
}

impl Recorder {
    /// Creates (truncates) the file, readable by its owner only: it names processes and pids.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = crate::recording::files::create_private(path)
            .with_context(|| format!("cannot create the recording {}", path.display()))?;
        Ok(Self {
            out: BufWriter::with_capacity(64 * 1024, file),
            line: BytesMut::with_capacity(512),
            path: path.to_path_buf(),
            failures: 0,
            first_failure: None,
        })
    }

    /// Writes one record as one line. A failed write is reported once per call, never
    /// fatal: tracing goes on and the summary still reaches the terminal.
    pub fn write(&mut self, line: Line<'_>) {
        self.line.clear();
        let mut w = (&mut self.line).writer();
        if let Err(e) = serde_json::to_writer(&mut w, &line) {
            log::error!("serializing a record: {e}");
            return;
        }
        self.line.put_u8(b'\n');
        if let Err(e) = self.out.write_all(&self.line) {
            self.failed(e);
        }
    }

    fn failed(&mut self, e: std::io::Error) {
        self.failures += 1;
        if self.first_failure.is_none() {
            say!(
                "gpustall: error: writing the recording {}: {e}; tracing goes on",
                self.path.display()
            );
            self.first_failure = Some(e.to_string());
        }
    }

    /// Why the recording is incomplete, if it is.
    pub fn failure(&self) -> Option<String> {
        self.first_failure.as_ref().map(|e| {
            format!(
                "the recording {} is incomplete: {} writes failed ({e})",
                self.path.display(),
                self.failures
            )
        })
    }

    pub fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            self.failed(e);
        }
    }

    /// Flushes and asks the kernel to put the data on disk: done every few seconds and at once
    /// after an incident, so a crash (of the agent or the machine) loses little.
    pub fn sync(&mut self) {
        self.flush();
        // A stream (/dev/stdout, a pipe) cannot be synced: that is no failure.
        if let Err(e) = self.out.get_ref().sync_data() {
            if e.raw_os_error() != Some(libc::EINVAL) {
                self.failed(e);
            }
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
        let _ = self.out.get_ref().sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::samples::Sample;
    use crate::recording::header::Header;

    #[test]
    fn recording_is_private_and_line_per_record() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("gpustall-rec-{}.jsonl", std::process::id()));
        {
            let mut r = Recorder::create(&path).expect("create");
            r.write(Line::Header(&Header::default()));
            r.write(Line::Sample(&Sample::Vanished { t_ns: 1, pid: 2 }));
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        let _ = std::fs::remove_file(&path);
        assert_eq!(mode, 0o600);
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
        assert_eq!(lines.len(), 2);
    }
}
