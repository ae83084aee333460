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

use crate::decode::Event;

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
        Ok(Self { out: BufWriter::with_capacity(64 * 1024, file), line: BytesMut::with_capacity(512), path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
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

    pub fn write_serialize<T: serde::Serialize>(&mut self, v: &T) {
        match serde_json::to_value(v) {
            Ok(v) => self.write(&v),
            Err(e) => log::error!("serializing a record: {e}"),
        }
    }

    pub fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            log::error!("flushing {}: {e}", self.path.display());
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
        let _ = self.out.get_ref().sync_all();
    }
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
        Event::Fork { child_pid, clone_flags, .. } => json!({"child_pid": child_pid, "clone_flags": clone_flags}),
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
            "reclaim": format!("{kind:?}").to_lowercase(),
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
    use crate::decode::Header;

    #[test]
    fn exit_record_splits_status_and_signal() {
        let h = Header { t_ns: 1, tgid: 5, tid: 5, comm: "w".into() };
        let v = event_json(&Event::Exit { h: h.clone(), exit_code: Some(9) });
        assert_eq!((v["kind"].as_str(), v["exit_signal"].as_i64(), v["exit_code"].is_null()), (Some("exit"), Some(9), true));
        let v = event_json(&Event::Exit { h, exit_code: Some(2 << 8) });
        assert_eq!((v["exit_code"].as_i64(), v["exit_signal"].is_null()), (Some(2), true));
        assert_eq!(v["type"], "event");
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
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
        assert_eq!(lines.len(), 2);
    }
}
