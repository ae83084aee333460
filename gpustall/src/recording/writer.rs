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
use serde::Deserialize as _;
use serde_json::{json, Value};

use crate::model::event::Event;

/// Where record lines go: a file (`trace --record`) or the flight recorder (`watch`).
pub trait Sink {
    fn write(&mut self, v: &Value);
    /// One event line. The default goes through a JSON value; a sink that writes text
    /// serializes the event straight into its line: under reclaim the agent writes thousands
    /// of events a second, and a map of every event's fields was built and dropped for each.
    fn write_event(&mut self, e: &Event) {
        self.write(&event_json(e));
    }
    fn flush(&mut self) {}
    fn sync(&mut self) {}
    /// Why what was written is incomplete, if it is.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// Writes any serializable value as one line.
pub fn write_serialize<T: serde::Serialize>(sink: &mut dyn Sink, v: &T) {
    match serde_json::to_value(v) {
        Ok(v) => sink.write(&v),
        Err(e) => log::error!("serializing a record: {e}"),
    }
}

impl Sink for Recorder {
    fn write(&mut self, v: &Value) {
        Recorder::write(self, v)
    }
    fn write_event(&mut self, e: &Event) {
        self.write_line(&EventLine::of(e))
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
        let file = crate::output::files::create_private(path)
            .with_context(|| format!("cannot create the recording {}", path.display()))?;
        Ok(Self {
            out: BufWriter::with_capacity(64 * 1024, file),
            line: BytesMut::with_capacity(512),
            path: path.to_path_buf(),
            failures: 0,
            first_failure: None,
        })
    }

    /// Writes one value as one line. A failed write is reported once per call, never fatal:
    /// tracing goes on and the summary still reaches the terminal.
    pub fn write(&mut self, v: &Value) {
        self.write_line(v)
    }

    fn write_line<T: serde::Serialize + ?Sized>(&mut self, v: &T) {
        self.line.clear();
        let mut w = (&mut self.line).writer();
        if serde_json::to_writer(&mut w, v).is_err() {
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

/// A GPU stall episode as an event line (derived data: replay recomputes it from the samples).
pub fn stall_json(e: &crate::model::gpu::StallEpisode) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("type".into(), json!("event"));
        o.insert("kind".into(), json!("gpu_stall"));
        o.insert("t_ns".into(), json!(e.start_ns));
    }
    v
}

/// Why a record line could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RecordError(#[from] serde_json::Error);

/// The inverse of [`event_json`]. `Ok(None)` for derived events (`gpu_stall`), which a replay
/// recomputes.
pub fn event_from_json(v: &Value) -> Result<Option<Event>, RecordError> {
    if v["kind"] == "gpu_stall" {
        return Ok(None);
    }
    Ok(Some(Event::deserialize(v)?))
}

/// One event as a record line: `"type": "event"` beside the event's own serde form.
#[derive(serde::Serialize)]
pub struct EventLine<'a> {
    #[serde(rename = "type")]
    line_type: &'static str,
    #[serde(flatten)]
    event: &'a Event,
}

impl<'a> EventLine<'a> {
    pub fn of(event: &'a Event) -> Self {
        Self { line_type: "event", event }
    }
}

/// One event as a record line, as a JSON value.
pub fn event_json(e: &Event) -> Value {
    serde_json::to_value(EventLine::of(e)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::Header;
    use gpustall_common::reclaim::ReclaimKind;

    #[test]
    fn exit_record_splits_status_and_signal() {
        let h = Header { t_ns: 1, tgid: 5, tid: 5, comm: "w".into() };
        let v = event_json(&Event::Exit { h: h.clone(), exit_code: Some(9) });
        assert_eq!(
            (v["kind"].as_str(), v["exit_signal"].as_i64(), v["exit_code"].is_null()),
            (Some("exit"), Some(9), true)
        );
        let v = event_json(&Event::Exit { h, exit_code: Some(2 << 8) });
        assert_eq!((v["exit_code"].as_i64(), v["exit_signal"].is_null()), (Some(2), true));
        assert_eq!(v["type"], "event");
    }

    #[test]
    fn every_event_kind_reads_back_as_written() {
        use crate::model::event::OomRss;
        let h = |t| Header { t_ns: t, tgid: 10, tid: 11, comm: "pt_data_worker".into() };
        let events = vec![
            Event::Fork { h: h(1), child_pid: 12, clone_flags: 0x1200011 },
            Event::Exit { h: h(2), exit_code: Some(9) },
            Event::Exit { h: h(2), exit_code: None },
            Event::Rename { h: h(3), pid: 11, new_comm: "pt_data_pin".into() },
            Event::Exec { h: h(4), old_pid: 10, filename: "/usr/bin/python3".into() },
            Event::OomVictim {
                h: h(5),
                victim_pid: 12,
                victim_tid: Some(13),
                victim_comm: "w".into(),
                rss: Some(OomRss {
                    total_vm_kb: 1,
                    anon_rss_kb: 2,
                    file_rss_kb: 3,
                    shmem_rss_kb: 4,
                }),
                oom_score_adj: -5,
                uid: 0,
            },
            Event::OomVictim {
                h: h(5),
                victim_pid: 12,
                victim_tid: None,
                victim_comm: "w".into(),
                rss: None,
                oom_score_adj: 0,
                uid: 0,
            },
            Event::Signal {
                h: h(6),
                sig: 9,
                code: 0x80,
                target_pid: 12,
                target_tid: Some(12),
                result: 0,
                target_comm: "w".into(),
            },
            Event::Reclaim {
                h: h(7),
                kind: ReclaimKind::Memcg,
                start_ns: 6,
                duration_ns: 1,
                nr_reclaimed: 32,
            },
            Event::Throttled { h: h(8), usec_timeout: 100, usec_delayed: 50, reason: 1, nid: 0 },
        ];
        for e in events {
            // Written straight from the event, the line is the value's, key for key.
            let direct = serde_json::to_string(&EventLine::of(&e)).expect("json");
            let direct: Value = serde_json::from_str(&direct).expect("parse");
            assert_eq!(direct, event_json(&e));
            let line = serde_json::to_string(&event_json(&e)).expect("json");
            let back =
                event_from_json(&serde_json::from_str(&line).expect("parse")).expect("reads back");
            assert_eq!(back, Some(e));
        }
        assert!(matches!(event_from_json(&json!({"kind": "gpu_stall"})), Ok(None)));
        assert!(event_from_json(
            &json!({"kind": "fork", "t_ns": 1, "pid": 1, "tid": 1, "comm": "x"})
        )
        .is_err());
    }

    #[test]
    fn recording_is_private_and_line_per_record() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("gpustall-rec-{}.jsonl", std::process::id()));
        {
            let mut r = Recorder::create(&path).expect("create");
            r.write(&json!({"type": "header"}));
            r.write(&json!({"type": "event", "t_ns": 1}));
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        let _ = std::fs::remove_file(&path);
        assert_eq!(mode, 0o600);
        let lines: Vec<Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
        assert_eq!(lines.len(), 2);
    }
}
