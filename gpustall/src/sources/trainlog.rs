//! Follows a training log (`--log`) and picks up each step's `data_time` and iteration time.
//!
//! Why: a rising `data_time` is the job's own account of the stall, the one signal that exists
//! even with no GPU data (0.06 s -> 0.74 s per step in the incident that motivated this tool).
//! Lining it up with reclaim and swap on the timeline shows the input pipeline starving the GPU
//! as it happens, and the trend says from which step on.
//!
//! The tail is polled from the agent's loop, so it never panics and never blocks on a writer:
//! it hands out complete lines only, and reopens the file when it is truncated or rotated.

use anyhow::Context as _;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use regex::Regex;

use crate::model::steps::StepTimes;

/// mmengine/mmcv style: `data_time: 0.7384`.
const DATA_TIME_RE: &str = r"\bdata_time[:=]\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)";
/// `time: 0.2154`, but not the `time` inside `data_time`: it must start the line or follow a
/// space, comma or parenthesis.
const ITER_TIME_RE: &str = r"(?:^|[\s,(])time[:=]\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)";

/// mmengine's training iteration: `Epoch(train) [3][ 50/500]` (epoch, iteration in it, its
/// length) or `Iter(train) [  50/1000]`.
const EPOCH_ITER_RE: &str = r"Epoch\(train\)\s*\[(\d+)\]\[\s*(\d+)/(\d+)\]";
const ITER_RE: &str = r"Iter\(train\)\s*\[\s*(\d+)/(\d+)\]";
/// What mmengine's MMLogger puts before each message.
const MMENGINE_LOGGER: &str = " - mmengine - ";

/// A step time above this (a day) is no step time: a garbled or foreign line.
const MAX_STEP_S: f64 = 86_400.0;

/// At most this much is read per poll, so a large log opened from the start cannot hold the
/// loop for long or take much memory; the rest comes on later polls.
const MAX_READ_PER_POLL: u64 = 16 << 20;

/// A "line" that never ends (a progress bar without newlines) is dropped past this size.
const MAX_PARTIAL_LINE: usize = 1 << 20;

/// The patterns that find the times in a line.
#[derive(Clone, Debug)]
pub struct LogPatterns {
    data_time: Regex,
    iter_time: Regex,
    epoch_iter: Regex,
    iter: Regex,
}

impl LogPatterns {
    /// The mmengine patterns, or `custom_data_time` for other loggers; a custom pattern must have
    /// exactly one capture group, which matches the seconds.
    pub fn new(custom_data_time: Option<&str>) -> Result<Self, regex::Error> {
        let data_time = Regex::new(custom_data_time.unwrap_or(DATA_TIME_RE))?;
        // Group 0 is the whole match, so one capture group makes two.
        if data_time.captures_len() != 2 {
            return Err(regex::Error::Syntax(format!(
                "the data_time pattern {:?} must have exactly one capture group (the seconds), \
                 it has {}",
                data_time.as_str(),
                data_time.captures_len() - 1
            )));
        }
        Ok(LogPatterns {
            data_time,
            iter_time: Regex::new(ITER_TIME_RE)?,
            epoch_iter: Regex::new(EPOCH_ITER_RE)?,
            iter: Regex::new(ITER_RE)?,
        })
    }

    /// The times in `line`; `None` when it has neither.
    pub fn parse(&self, line: &str) -> Option<StepTimes> {
        let data_time_s = first_number(&self.data_time, line);
        let iter_time_s = first_number(&self.iter_time, line);
        if data_time_s.is_none() && iter_time_s.is_none() {
            return None;
        }
        Some(StepTimes { data_time_s, iter_time_s, iter: self.iteration(line) })
    }

    /// The training iteration counted from the start (epochs of N iterations before this one),
    /// on mmengine's own lines only ("12/06 07:35:01 - mmengine - INFO - Iter(train) ..."): its
    /// data_time is a window mean. A log that only borrows the layout (the bundled demo's,
    /// one data_time per iteration) is read one value per line.
    fn iteration(&self, line: &str) -> Option<u64> {
        if !line.contains(MMENGINE_LOGGER) {
            return None;
        }
        let n = |c: &regex::Captures, i| c.get(i)?.as_str().parse::<u64>().ok();
        if let Some(c) = self.epoch_iter.captures(line) {
            let (epoch, i, len) = (n(&c, 1)?, n(&c, 2)?, n(&c, 3)?);
            return epoch.checked_sub(1)?.checked_mul(len)?.checked_add(i);
        }
        self.iter.captures(line).and_then(|c| n(&c, 1))
    }
}

/// Group 1 of the first match, as a finite number.
fn first_number(re: &Regex, line: &str) -> Option<f64> {
    let v: f64 = re.captures(line)?.get(1)?.as_str().parse().ok()?;
    (v.is_finite() && v <= MAX_STEP_S).then_some(v)
}

/// Follows a log file as it grows, like `tail -F`.
#[derive(Debug)]
pub struct LogTail {
    path: PathBuf,
    file: File,
    /// (device, inode) of `file`, to notice rotation (the path now names another file).
    id: (u64, u64),
    /// Offset of the next byte to read.
    pos: u64,
    /// The bytes after the last line end: a line still being written.
    partial: Vec<u8>,
    /// When tailing from the end in the middle of a line, its rest is no complete line.
    skip_to_line_end: bool,
    /// An I/O error has been logged since the last good read: log a streak of them once.
    warned: bool,
}

impl LogTail {
    /// Opens `path`; `from_start` false skips what is already there, so only new lines count.
    pub fn open(path: &Path, from_start: bool) -> anyhow::Result<Self> {
        let open_err =
            |e: std::io::Error| anyhow::anyhow!("cannot open training log {}: {e}", path.display());
        let (file, meta) = open_regular(path).map_err(open_err)?;
        let mut tail = LogTail {
            path: path.to_path_buf(),
            file,
            id: (meta.dev(), meta.ino()),
            pos: 0,
            partial: Vec::new(),
            skip_to_line_end: false,
            warned: false,
        };
        if !from_start && meta.len() > 0 {
            tail.pos = meta.len();
            tail.skip_to_line_end = !ends_with_newline(&mut tail.file, meta.len());
        }
        Ok(tail)
    }

    /// The complete lines written since the last poll, without their line ends.
    pub fn poll(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) != self.id => {
                // Rotated: finish the old file (the writer may have added to it before the
                // switch), then follow the new one from its start.
                self.read_new(&mut lines);
                self.flush_partial(&mut lines);
                self.reopen();
            }
            Ok(meta) if meta.len() < self.pos => {
                // Truncated in place (copytruncate): what was buffered belongs to the old text.
                self.pos = 0;
                self.partial.clear();
                self.skip_to_line_end = false;
            }
            // Unchanged, grown, or the path is gone mid-rotation: keep reading our handle.
            _ => {}
        }
        self.read_new(&mut lines);
        lines
    }

    /// Appends the complete lines from `pos` to the end of the current handle.
    fn read_new(&mut self, lines: &mut Vec<String>) {
        let mut buf = Vec::new();
        let read = self
            .file
            .seek(SeekFrom::Start(self.pos))
            .and_then(|_| (&mut self.file).take(MAX_READ_PER_POLL).read_to_end(&mut buf));
        match read {
            Ok(n) => {
                self.warned = false;
                self.pos += n as u64;
                self.split_lines(&buf, lines);
            }
            Err(e) => self.warn_once(&format!("cannot read training log: {e}")),
        }
    }

    /// Splits on '\n' and '\r' (progress bars redraw with '\r'); empty lines carry no data.
    fn split_lines(&mut self, buf: &[u8], lines: &mut Vec<String>) {
        for &b in buf {
            if b != b'\n' && b != b'\r' {
                self.partial.push(b);
                continue;
            }
            let line = std::mem::take(&mut self.partial);
            if std::mem::replace(&mut self.skip_to_line_end, false) {
                continue;
            }
            if !line.is_empty() {
                lines.push(String::from_utf8_lossy(&line).into_owned());
            }
        }
        if self.partial.len() > MAX_PARTIAL_LINE {
            self.partial.clear();
            self.skip_to_line_end = true;
            self.warn_once("a training log line exceeds 1 MiB without a line end: dropping it");
        }
    }

    /// A rotated-away file will not be written to again: its last line is complete.
    fn flush_partial(&mut self, lines: &mut Vec<String>) {
        let line = std::mem::take(&mut self.partial);
        if !line.is_empty() && !std::mem::replace(&mut self.skip_to_line_end, false) {
            lines.push(String::from_utf8_lossy(&line).into_owned());
        }
    }

    fn reopen(&mut self) {
        match open_regular(&self.path) {
            Ok((file, meta)) => {
                self.file = file;
                self.id = (meta.dev(), meta.ino());
                self.pos = 0;
                self.partial.clear();
                self.skip_to_line_end = false;
            }
            Err(e) => self.warn_once(&format!("cannot reopen rotated training log: {e}")),
        }
    }

    fn warn_once(&mut self, what: &str) {
        if !self.warned {
            log::warn!("{}: {what}", self.path.display());
            self.warned = true;
        }
    }
}

/// Opens a log for reading, never blocking: a FIFO (or device) put at the log's path would
/// block an open, and the trace with it, until a writer came; it is refused instead.
fn open_regular(path: &Path) -> std::io::Result<(File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO or device is never read as a log)",
        ));
    }
    Ok((file, meta))
}

/// Whether the byte before `len` is a line end (true when it cannot be read: no harm then in
/// taking the next line whole).
fn ends_with_newline(file: &mut File, len: u64) -> bool {
    let mut last = [0u8; 1];
    let read = file.seek(SeekFrom::Start(len - 1)).and_then(|_| file.read_exact(&mut last));
    read.is_err() || matches!(last[0], b'\n' | b'\r')
}

/// `--log FILE`: followed from its end; a file that does not exist yet (a job that has just
/// started) is waited for, with one notice.
pub struct LogSource {
    path: std::path::PathBuf,
    pub patterns: crate::sources::trainlog::LogPatterns,
    tail: Option<crate::sources::trainlog::LogTail>,
}

impl LogSource {
    pub fn new(path: &std::path::Path, regex: Option<&str>) -> anyhow::Result<Self> {
        let patterns = crate::sources::trainlog::LogPatterns::new(regex)
            .context("--log-regex is not a valid regular expression")?;
        let tail = if path.exists() {
            ensure_regular(path)?;
            Some(crate::sources::trainlog::LogTail::open(path, false)?)
        } else {
            say!("gpustall: waiting for the training log {} to appear", path.display());
            None
        };
        Ok(Self { path: path.to_path_buf(), patterns, tail })
    }

    /// New complete lines (all of a file that appeared after the start: it is this run's).
    pub fn poll(&mut self) -> Vec<String> {
        if self.tail.is_none() && self.path.exists() {
            match ensure_regular(&self.path) {
                Ok(()) => {
                    self.tail = crate::sources::trainlog::LogTail::open(&self.path, true).ok()
                }
                Err(e) => {
                    say!("gpustall: warning: {e:#}; not reading it");
                    self.path = std::path::PathBuf::new();
                }
            }
        }
        self.tail.as_mut().map(|t| t.poll()).unwrap_or_default()
    }
}

/// A FIFO or a device would block the agent's loop on open or read: only a file is tailed.
fn ensure_regular(path: &std::path::Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("--log {}", path.display()))?;
    anyhow::ensure!(
        meta.is_file(),
        "--log {} is not a regular file (a FIFO or device would block): give the log file itself",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const MMENGINE: &str = "12/06 07:35:01 - mmengine - INFO - Epoch(train) [1][ 50/500]  \
                            lr: 1.0e-04  eta: 0:10:00  time: 0.2154  data_time: 0.0612  \
                            memory: 9000  loss: 0.5";

    #[test]
    fn mmengine_line() {
        let p = LogPatterns::new(None).expect("test setup");
        let t = p.parse(MMENGINE).expect("test setup");
        assert_eq!(
            t,
            StepTimes { data_time_s: Some(0.0612), iter_time_s: Some(0.2154), iter: Some(50) }
        );
        let t = p
            .parse("06 - mmengine - INFO - Epoch(train)  [3][ 20/100]  time: 0.2  data_time: 0.1")
            .expect("line");
        assert_eq!(t.iter, Some(220), "two epochs of 100 before");
        let t = p
            .parse("06 - mmengine - INFO - Iter(train) [  70/1000]  lr: 1e-2  data_time: 0.1")
            .expect("line");
        assert_eq!(t.iter, Some(70));
        // The layout without mmengine's logger (the demo's per-iteration log): a step a line.
        let t = p.parse("Epoch(train) [1][ 50/500]  time: 0.2  data_time: 0.1").expect("line");
        assert_eq!(t.iter, None);
    }

    #[test]
    fn data_time_alone_is_not_iter_time() {
        let p = LogPatterns::new(None).expect("test setup");
        let t = p.parse("step 3 data_time: 0.7").expect("test setup");
        assert_eq!(t, StepTimes { data_time_s: Some(0.7), iter_time_s: None, iter: None });
        let t = p.parse("iter 3, time=.5 (data_time=1)").expect("test setup");
        assert_eq!(t, StepTimes { data_time_s: Some(1.0), iter_time_s: Some(0.5), iter: None });
    }

    #[test]
    fn lines_without_times() {
        let p = LogPatterns::new(None).expect("test setup");
        for line in ["", "loading annotations", "eta: 0:10:00  memory: 9000", "runtime: 3", "time:"]
        {
            assert_eq!(p.parse(line), None, "{line:?}");
        }
    }

    #[test]
    fn custom_pattern() {
        let p = LogPatterns::new(Some(r"load=([0-9.]+)s")).expect("test setup");
        let t = p.parse("it 7 load=0.31s time: 1.0").expect("test setup");
        assert_eq!(t, StepTimes { data_time_s: Some(0.31), iter_time_s: Some(1.0), iter: None });
        assert_eq!(p.parse(MMENGINE).expect("test setup").data_time_s, None);
        let err = LogPatterns::new(Some(r"load=[0-9.]+s")).expect_err("must fail");
        assert!(err.to_string().contains("one capture group"), "{err}");
        assert!(LogPatterns::new(Some(r"(a)(b)")).is_err());
        assert!(LogPatterns::new(Some(r"(")).is_err());
    }

    /// A log file in the temp dir, removed on drop.
    struct TempLog(PathBuf);

    impl TempLog {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir()
                .join(format!("gpustall-trainlog-{}-{name}.log", std::process::id()));
            std::fs::write(&p, "").expect("test setup");
            TempLog(p)
        }

        fn append(&self, text: &str) {
            let mut f = std::fs::OpenOptions::new().append(true).open(&self.0).expect("test setup");
            f.write_all(text.as_bytes()).expect("test setup");
        }
    }

    impl Drop for TempLog {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn tail_keeps_partial_lines() {
        let log = TempLog::new("partial");
        log.append("old line\n");
        let mut t = LogTail::open(&log.0, false).expect("test setup");
        assert!(t.poll().is_empty(), "from the end: old lines do not count");
        log.append("first\nsec");
        assert_eq!(t.poll(), ["first"]);
        assert!(t.poll().is_empty());
        log.append("ond\r\nthird\n");
        assert_eq!(t.poll(), ["second", "third"]);

        let mut from_start = LogTail::open(&log.0, true).expect("test setup");
        assert_eq!(from_start.poll(), ["old line", "first", "second", "third"]);
    }

    #[test]
    fn tail_from_end_mid_line_skips_its_rest() {
        let log = TempLog::new("midline");
        log.append("complete\nhalf-writ");
        let mut t = LogTail::open(&log.0, false).expect("test setup");
        log.append("ten\nnew\n");
        assert_eq!(t.poll(), ["new"]);
    }

    #[test]
    fn tail_survives_truncation_and_rotation() {
        let log = TempLog::new("trunc");
        let mut t = LogTail::open(&log.0, true).expect("test setup");
        log.append("a long first line\nb\n");
        assert_eq!(t.poll(), ["a long first line", "b"]);
        std::fs::write(&log.0, "").expect("test setup");
        assert!(t.poll().is_empty());
        log.append("c\n");
        assert_eq!(t.poll(), ["c"]);

        // Rotation: the old file is renamed away after a last write, a new one takes the path.
        let rotated = log.0.with_extension("1");
        log.append("d (last of old)");
        std::fs::rename(&log.0, &rotated).expect("test setup");
        std::fs::write(&log.0, "e\n").expect("test setup");
        assert_eq!(t.poll(), ["d (last of old)", "e"]);
        log.append("f\n");
        assert_eq!(t.poll(), ["f"]);
        let _ = std::fs::remove_file(rotated);
    }

    #[test]
    fn tail_path_vanishing_does_not_panic() {
        let log = TempLog::new("vanish");
        let mut t = LogTail::open(&log.0, true).expect("test setup");
        std::fs::remove_file(&log.0).expect("test setup");
        assert!(t.poll().is_empty());
    }

    #[test]
    fn a_fifo_at_the_logs_path_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("gpustall-fifo-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let fifo = dir.join("train.log");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let Err(e) = LogTail::open(&fifo, true) else { panic!("a FIFO is refused") };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn open_missing_names_the_path() {
        let p = Path::new("/no/such/dir/train.log");
        let err = LogTail::open(p, false).expect_err("must fail").to_string();
        assert!(err.contains("/no/such/dir/train.log"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}
