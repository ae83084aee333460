//! `--record FILE`: JSON Lines. Line 1 is a header, then one object per event or sample, and
//! periodic and final summaries. Each line is written whole and flushed at every tick, so a
//! crash of the agent leaves every earlier line parseable.

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use bytes::{BufMut, BytesMut};
use serde_json::{json, Value};

use gpustall_common::reclaim::ReclaimKind;

use crate::model::event::Event;

/// Where record lines go: a file (`trace --record`) or the flight recorder (`watch`).
pub trait Sink {
    fn write(&mut self, v: &Value);
    fn flush(&mut self) {}
    fn sync(&mut self) {}
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
    fn flush(&mut self) {
        Recorder::flush(self)
    }
    fn sync(&mut self) {
        Recorder::sync(self)
    }
}

pub struct Recorder {
    out: BufWriter<File>,
    line: BytesMut,
    path: PathBuf,
}

impl Recorder {
    /// Creates (truncates) the file, readable by its owner only: it names processes and pids.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| anyhow::anyhow!("cannot create the recording {}: {e}", path.display()))?;
        Ok(Self {
            out: BufWriter::with_capacity(64 * 1024, file),
            line: BytesMut::with_capacity(512),
            path: path.to_path_buf(),
        })
    }

    /// Writes one value as one line. A failed write is reported once per call, never fatal:
    /// tracing goes on and the summary still reaches the terminal.
    pub fn write(&mut self, v: &Value) {
        self.line.clear();
        let mut w = (&mut self.line).writer();
        if serde_json::to_writer(&mut w, v).is_err() {
            return;
        }
        self.line.put_u8(b'\n');
        if let Err(e) = self.out.write_all(&self.line) {
            log::error!("writing {}: {e}", self.path.display());
        }
    }

    pub fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            log::error!("flushing {}: {e}", self.path.display());
        }
    }

    /// Flushes and asks the kernel to put the data on disk: done every few seconds and at once
    /// after an incident, so a crash (of the agent or the machine) loses little.
    pub fn sync(&mut self) {
        self.flush();
        if let Err(e) = self.out.get_ref().sync_data() {
            log::error!("syncing {}: {e}", self.path.display());
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
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("field {0} is missing or has the wrong type")]
    Field(&'static str),
    #[error("unknown event kind {0:?}")]
    UnknownKind(String),
}

fn num<T: TryFrom<i64>>(v: &Value, key: &'static str) -> Result<T, RecordError> {
    let n = v[key].as_i64().or_else(|| v[key].as_u64().and_then(|u| i64::try_from(u).ok()));
    n.and_then(|n| T::try_from(n).ok()).ok_or(RecordError::Field(key))
}

fn u64_of(v: &Value, key: &'static str) -> Result<u64, RecordError> {
    v[key].as_u64().ok_or(RecordError::Field(key))
}

fn text(v: &Value, key: &'static str) -> Result<String, RecordError> {
    v[key].as_str().map(str::to_string).ok_or(RecordError::Field(key))
}

/// The inverse of [`event_json`]. `Ok(None)` for derived events (`gpu_stall`), which a replay
/// recomputes.
pub fn event_from_json(v: &Value) -> Result<Option<Event>, RecordError> {
    use crate::model::event::Header;
    use crate::model::event::OomRss;
    let kind = text(v, "kind")?;
    if kind == "gpu_stall" {
        return Ok(None);
    }
    let h = Header {
        t_ns: u64_of(v, "t_ns")?,
        tgid: num(v, "pid")?,
        tid: num(v, "tid")?,
        comm: text(v, "comm")?,
    };
    Ok(Some(match kind.as_str() {
        "fork" => Event::Fork {
            h,
            child_pid: num(v, "child_pid")?,
            clone_flags: u64_of(v, "clone_flags")?,
        },
        "exit" => Event::Exit {
            h,
            exit_code: v["wait_status"].as_u64().and_then(|c| u32::try_from(c).ok()),
        },
        "rename" => {
            Event::Rename { h, pid: num(v, "renamed_tid")?, new_comm: text(v, "new_comm")? }
        }
        "exec" => Event::Exec { h, old_pid: num(v, "old_pid")?, filename: text(v, "filename")? },
        "oom_kill" => Event::OomVictim {
            h,
            victim_pid: num(v, "victim_pid")?,
            victim_comm: text(v, "victim_comm")?,
            rss: match v["anon_rss_kb"].as_u64() {
                Some(anon) => Some(OomRss {
                    total_vm_kb: u64_of(v, "total_vm_kb")?,
                    anon_rss_kb: anon,
                    file_rss_kb: u64_of(v, "file_rss_kb")?,
                    shmem_rss_kb: u64_of(v, "shmem_rss_kb")?,
                }),
                None => None,
            },
            oom_score_adj: num(v, "oom_score_adj")?,
            uid: num(v, "uid")?,
        },
        "signal" => Event::Signal {
            h,
            sig: num(v, "sig")?,
            code: num(v, "si_code")?,
            target_pid: num(v, "target_pid")?,
            result: num(v, "result")?,
            target_comm: text(v, "target_comm")?,
        },
        "reclaim" => Event::Reclaim {
            h,
            kind: match text(v, "reclaim")?.as_str() {
                "direct" => ReclaimKind::Direct,
                "memcg" => ReclaimKind::Memcg,
                "kswapd" => ReclaimKind::Kswapd,
                _ => return Err(RecordError::Field("reclaim")),
            },
            start_ns: u64_of(v, "start_ns")?,
            duration_ns: u64_of(v, "duration_ns")?,
            nr_reclaimed: u64_of(v, "nr_reclaimed")?,
        },
        "reclaim_throttled" => Event::Throttled {
            h,
            usec_timeout: num(v, "usec_timeout")?,
            usec_delayed: num(v, "usec_delayed")?,
            reason: num(v, "reason")?,
            nid: num(v, "nid")?,
        },
        other => return Err(RecordError::UnknownKind(other.to_string())),
    }))
}

/// One event as a record line: common fields first, then the event's own.
pub fn event_json(e: &Event) -> Value {
    let h = e.header();
    let mut v = json!({
        "type": "event",
        "t_ns": h.t_ns,
        "kind": e.kind_name(),
        "pid": h.tgid,
        "tid": h.tid,
        "comm": h.comm,
    });
    let extra = match e {
        Event::Fork { child_pid, clone_flags, .. } => {
            json!({"child_pid": child_pid, "clone_flags": clone_flags})
        }
        Event::Exit { exit_code, .. } => json!({
            "exit_code": exit_code.filter(|c| c & 0x7f == 0).map(|c| (c >> 8) & 0xff),
            "exit_signal": exit_code.map(|c| c & 0x7f).filter(|&s| s != 0),
            "wait_status": exit_code,
        }),
        Event::Rename { pid, new_comm, .. } => json!({"renamed_tid": pid, "new_comm": new_comm}),
        Event::Exec { old_pid, filename, .. } => json!({"old_pid": old_pid, "filename": filename}),
        Event::OomVictim { victim_pid, victim_comm, rss, oom_score_adj, uid, .. } => json!({
            "victim_pid": victim_pid,
            "victim_comm": victim_comm,
            "anon_rss_kb": rss.map(|r| r.anon_rss_kb),
            "file_rss_kb": rss.map(|r| r.file_rss_kb),
            "shmem_rss_kb": rss.map(|r| r.shmem_rss_kb),
            "total_vm_kb": rss.map(|r| r.total_vm_kb),
            "oom_score_adj": oom_score_adj,
            "uid": uid,
        }),
        Event::Signal { sig, code, target_pid, result, target_comm, .. } => json!({
            "sig": sig, "si_code": code, "target_pid": target_pid, "target_comm": target_comm, "result": result,
        }),
        Event::Reclaim { kind, start_ns, duration_ns, nr_reclaimed, .. } => json!({
            "reclaim": match kind { ReclaimKind::Direct => "direct", ReclaimKind::Memcg => "memcg", ReclaimKind::Kswapd => "kswapd" },
            "start_ns": start_ns,
            "duration_ns": duration_ns,
            "nr_reclaimed": nr_reclaimed,
        }),
        Event::Throttled { usec_timeout, usec_delayed, reason, nid, .. } => json!({
            "usec_timeout": usec_timeout, "usec_delayed": usec_delayed, "reason": reason, "nid": nid,
        }),
    };
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), extra) {
        obj.extend(extra);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::Header;

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
            let line = serde_json::to_string(&event_json(&e)).expect("json");
            let back =
                event_from_json(&serde_json::from_str(&line).expect("parse")).expect("reads back");
            assert_eq!(back, Some(e));
        }
        assert_eq!(event_from_json(&json!({"kind": "gpu_stall"})), Ok(None));
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
