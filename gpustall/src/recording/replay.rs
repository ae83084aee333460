//! `gpustall report FILE`: rebuilds the model from a recording, line by line, through the same
//! `Model::apply` / `Model::observe` the live agent used, so the summary is the live one.
//! A corrupt or truncated file stops the replay at the bad line; what came before still counts.

use anyhow::Context as _;
use std::{
    io::{BufRead, BufReader},
    path::Path,
};

use serde_json::Value;

use crate::model::samples::Sample;
use crate::model::Model;
use crate::recording::writer::event_from_json;

/// Where and why a replay stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayError {
    /// 1-based line number.
    pub line: usize,
    pub why: String,
}

pub struct Replay {
    pub model: Model,
    /// The end of the trace: the final summary's time, else the last time seen.
    pub end_ns: u64,
    pub header: Value,
    /// Lines read successfully.
    pub lines: usize,
    pub error: Option<ReplayError>,
    /// The recording's own final summary, when it has one.
    pub recorded_summary: Option<Value>,
}

fn apply_header(model: &mut Model, h: &Value) -> Result<(), String> {
    let start = h["start_ns"].as_u64().ok_or("the header has no start_ns")?;
    model.start_ns = start;
    model.last_ns = start;
    let gpu = &h["gpu"];
    let status = gpu["status"].as_str().unwrap_or_default().to_string();
    if gpu["enabled"].as_bool() == Some(true) {
        let threshold = gpu["threshold_pct"].as_u64().ok_or("gpu.threshold_pct missing")? as u32;
        let window = gpu["window_ns"].as_u64().ok_or("gpu.window_ns missing")?;
        model.gpu.enable(status, threshold, window);
    } else {
        model.gpu.status = status;
    }
    Ok(())
}

fn apply_line(r: &mut Replay, v: Value) -> Result<(), String> {
    match v["type"].as_str() {
        Some("event") => {
            if let Some(e) = event_from_json(&v).map_err(|e| format!("bad event: {e}"))? {
                r.model.apply(&e);
            }
        }
        Some("sample") => {
            let s: Sample = serde_json::from_value(v).map_err(|e| format!("bad sample: {e}"))?;
            r.model.observe(&s);
        }
        Some("summary") if v["final"].as_bool() == Some(true) => {
            r.end_ns = v["t_ns"].as_u64().unwrap_or(r.end_ns);
            r.recorded_summary = Some(v);
        }
        Some("header") => return Err("a second header".into()),
        // A newer gpustall may add record types: skip, do not fail.
        _ => {}
    }
    Ok(())
}

pub fn replay(input: impl BufRead) -> Replay {
    let mut r = Replay {
        model: Model::default(),
        end_ns: 0,
        header: Value::Null,
        lines: 0,
        error: None,
        recorded_summary: None,
    };
    for (i, line) in input.split(b'\n').enumerate() {
        let n = i + 1;
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                r.error = Some(ReplayError { line: n, why: format!("cannot read: {e}") });
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let v: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                let why = if e.is_eof() {
                    "truncated (the line ends mid-record)".to_string()
                } else {
                    format!("not JSON ({e})")
                };
                r.error = Some(ReplayError { line: n, why });
                break;
            }
        };
        let result = if n == 1 {
            if v["type"] != "header" {
                Err("not a gpustall recording: the first line is not a header".to_string())
            } else {
                r.header = v.clone();
                apply_header(&mut r.model, &v)
            }
        } else {
            apply_line(&mut r, v)
        };
        if let Err(why) = result {
            r.error = Some(ReplayError { line: n, why });
            break;
        }
        r.lines = n;
    }
    if r.recorded_summary.is_none() {
        r.end_ns = r.model.last_ns;
    }
    let end = r.end_ns;
    r.model.finish(end);
    r
}

/// The first `max_lines` lines of a recording that parse (a corrupt tail is left out, as the
/// replay leaves it out).
pub fn read_lines(file: &Path, max_lines: usize) -> anyhow::Result<Vec<Value>> {
    let f = std::fs::File::open(file)
        .with_context(|| format!("cannot open the recording {}", file.display()))?;
    Ok(BufReader::new(f)
        .lines()
        .take(max_lines)
        .map_while(Result::ok)
        .map_while(|l| serde_json::from_str(&l).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        r#"{"type":"header","version":1,"start_ns":1000,"gpu":{"enabled":false,"status":"off"}}"#;

    #[test]
    fn replays_seeds_events_and_samples() {
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n",
            r#"{"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}"#,
            r#"{"type":"event","kind":"fork","t_ns":2000,"pid":10,"tid":10,"comm":"python","child_pid":11,"clone_flags":17}"#,
            r#"{"type":"sample","kind":"proc_mem","t_ns":3000,"pid":11,"rss_kb":5,"anon_kb":5,"file_kb":0,"shmem_kb":0,"swap_kb":0,"hwm_kb":6,"majflt":0}"#,
        );
        let r = replay(text.as_bytes());
        assert_eq!(r.error, None);
        assert_eq!(r.lines, 4);
        assert_eq!(r.model.tree.get(11).map(|n| n.ppid), Some(10));
        assert_eq!(r.model.procs[&11].peak_rss_kb, 6);
        assert_eq!(r.end_ns, 3000);
    }

    #[test]
    fn a_truncated_last_line_is_named_and_the_rest_kept() {
        let text = format!(
            "{HEADER}\n{}\n{{\"type\":\"event\",\"kind\":\"fo",
            r#"{"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}"#
        );
        let r = replay(text.as_bytes());
        let e = r.error.expect("an error");
        assert_eq!(e.line, 3);
        assert!(e.why.contains("truncated"), "{}", e.why);
        assert!(r.model.tree.contains(10));
    }

    #[test]
    fn garbage_and_missing_headers_are_errors_with_line_numbers() {
        let r = replay("hello\n".as_bytes());
        assert_eq!(r.error.map(|e| e.line), Some(1));
        let r = replay(r#"{"type":"event"}"#.as_bytes());
        assert!(r.error.is_some_and(|e| e.why.contains("not a gpustall recording")));
        let r = replay(format!("{HEADER}\n{{\"type\":\"event\",\"kind\":\"exit\"}}\n").as_bytes());
        assert_eq!(r.error.map(|e| e.line), Some(2));
    }

    /// A recording made by gpustall before events were serialised by serde derive
    /// (testdata/trace-v1.jsonl: fork, exec, rename, memcg reclaim, a throttled reclaim, an OOM
    /// kill and its signals, exits, GPU samples and a stall, from the stand-in NVML). It must
    /// still replay into the very summary it recorded, and every event must serialise back to
    /// the line it was read from: the format did not change.
    #[test]
    fn a_recording_from_before_replays_to_its_own_summary_and_lines() {
        let text = include_str!("testdata/trace-v1.jsonl");
        let r = replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        let recorded = r.recorded_summary.clone().expect("the recording's final summary");
        let replayed =
            serde_json::to_value(crate::output::summary::Summary::of(&r.model, r.end_ns, true))
                .expect("summary json");
        assert_eq!(replayed, recorded);
        assert_eq!(recorded["verdict"]["cause"], "host_memory_oom");
        let mut kinds = std::collections::BTreeSet::new();
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("json line");
            if v["type"] != "event" || v["kind"] == "gpu_stall" {
                continue;
            }
            let e = event_from_json(&v).expect("reads").expect("an event");
            assert_eq!(crate::recording::writer::event_json(&e), v, "{line}");
            kinds.insert(v["kind"].as_str().unwrap_or_default().to_string());
        }
        let all = [
            "exec",
            "exit",
            "fork",
            "oom_kill",
            "reclaim",
            "reclaim_throttled",
            "rename",
            "signal",
        ];
        assert_eq!(kinds, all.iter().map(|k| k.to_string()).collect());
    }
}
