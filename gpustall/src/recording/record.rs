//! One line of a recording, typed both ways. The writer, the flight recorder, the watch
//! bundle, the replay and the timeline all go through [`Line`] (to write) and [`Record`] (to
//! read): this module is the only code that looks at a recording's `type` and `kind` keys, so
//! a renamed field is a decoding error here, never a silent zero somewhere else.
//!
//! `{"type":"header",..}` first, then `{"type":"event","kind":..}` (a kernel event, or a GPU
//! stall episode: derived, the replay recomputes it), `{"type":"sample","kind":..}` and
//! `{"type":"summary","final":..}` (the summary as it was printed: an output, kept whole and
//! never reinterpreted). A type or kind this gpustall does not know (a newer one wrote it) is
//! [`Record::Unknown`]: skipped, counted, never fatal.

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::model::event::Event;
use crate::model::gpu::StallEpisode;
use crate::model::samples::Sample;
use crate::recording::header::Header;

/// A recording line read back.
#[derive(Debug, Clone)]
pub enum Record {
    Header(Box<Header>),
    Event(Event),
    /// A GPU stall episode the live run detected (the replay detects it again from samples).
    GpuStall(Box<StallEpisode>),
    Sample(Sample),
    Summary(SummaryLine),
    /// A line of a type or kind this gpustall does not know.
    Unknown {
        line_type: String,
        kind: Option<String>,
    },
}

/// A summary line: when it was written, whether it is the final one, and the summary whole.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryLine {
    pub t_ns: Option<u64>,
    pub is_final: bool,
    pub body: Value,
}

impl SummaryLine {
    /// The verdict it printed.
    pub fn verdict(&self) -> Option<&Value> {
        self.body.get("verdict")
    }
}

/// A line to write, borrowed: writing an event or a sample copies nothing.
#[derive(Debug, Clone, Copy)]
pub enum Line<'a> {
    Header(&'a Header),
    Event(&'a Event),
    GpuStall(&'a StallEpisode),
    Sample(&'a Sample),
    /// A summary as JSON (its type lives in `output/`, after this stage).
    Summary(&'a Value),
}

/// Why a line is not a record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("truncated (the line ends mid-record)")]
    Truncated,
    #[error("not JSON ({0})")]
    NotJson(String),
    #[error("not a record: {0}")]
    NoType(&'static str),
    #[error("bad {line_type}: {why}")]
    Bad { line_type: &'static str, why: String },
}

impl Record {
    /// One line's bytes (without its newline).
    /// Every string in it is shown safely (`model::untrusted`): a recording may come from
    /// another node, or have been written by hand, and each output made from it (the report,
    /// the timeline, a merge) then starts from clean names.
    pub fn parse(line: &[u8]) -> Result<Record, RecordError> {
        let mut v: Value = serde_json::from_slice(line).map_err(|e| {
            if e.is_eof() {
                RecordError::Truncated
            } else {
                RecordError::NotJson(e.to_string())
            }
        })?;
        crate::model::untrusted::clean_json(&mut v);
        Record::from_value(v)
    }

    pub fn from_value(v: Value) -> Result<Record, RecordError> {
        let Some(line_type) = v.get("type").and_then(Value::as_str).map(str::to_string) else {
            return Err(RecordError::NoType("it has no \"type\""));
        };
        let kind = v.get("kind").and_then(Value::as_str).map(str::to_string);
        match line_type.as_str() {
            "header" => typed(v, "header").map(|h| Record::Header(Box::new(h))),
            "event" if kind.as_deref() == Some(GPU_STALL) => {
                typed(v, "event").map(|e| Record::GpuStall(Box::new(e)))
            }
            "event" => typed(v, "event").map(Record::Event).or_else(|e| unknown_kind(kind, e)),
            "sample" => typed(v, "sample").map(Record::Sample).or_else(|e| unknown_kind(kind, e)),
            "summary" => Ok(Record::Summary(SummaryLine {
                t_ns: v.get("t_ns").and_then(Value::as_u64),
                is_final: v.get("final").and_then(Value::as_bool) == Some(true),
                body: v,
            })),
            _ => Ok(Record::Unknown { line_type, kind }),
        }
    }

    /// When it happened (a header's start; `None` for a summary without a time and unknowns).
    pub fn t_ns(&self) -> Option<u64> {
        match self {
            Record::Header(h) => Some(h.start_ns),
            Record::Event(e) => Some(e.header().t_ns),
            Record::GpuStall(s) => Some(s.start_ns),
            Record::Sample(s) => Some(s.t_ns()),
            Record::Summary(s) => s.t_ns,
            Record::Unknown { .. } => None,
        }
    }

    /// The line to write it back (`None` for an unknown line: it is not carried on).
    pub fn as_line(&self) -> Option<Line<'_>> {
        Some(match self {
            Record::Header(h) => Line::Header(h),
            Record::Event(e) => Line::Event(e),
            Record::GpuStall(s) => Line::GpuStall(s),
            Record::Sample(s) => Line::Sample(s),
            Record::Summary(s) => Line::Summary(&s.body),
            Record::Unknown { .. } => return None,
        })
    }
}

const GPU_STALL: &str = "gpu_stall";

fn typed<T: serde::de::DeserializeOwned>(
    v: Value,
    line_type: &'static str,
) -> Result<T, RecordError> {
    serde_json::from_value(v).map_err(|e| RecordError::Bad { line_type, why: e.to_string() })
}

/// An event or sample of a kind serde does not know is a newer gpustall's: unknown, not bad.
/// (serde names it "unknown variant" in the error of the `kind` tag; any other error is a
/// line of a known kind that does not read.)
fn unknown_kind(kind: Option<String>, e: RecordError) -> Result<Record, RecordError> {
    match &e {
        RecordError::Bad { line_type, why } if why.starts_with("unknown variant") => {
            Ok(Record::Unknown { line_type: line_type.to_string(), kind })
        }
        _ => Err(e),
    }
}

/// `"type": ..` beside a value's own fields.
#[derive(Serialize)]
struct Tagged<'a, T: Serialize + ?Sized> {
    #[serde(rename = "type")]
    line_type: &'static str,
    #[serde(flatten)]
    inner: &'a T,
}

/// A stall episode's line: its fields, `kind` and the time it began as `t_ns`.
#[derive(Serialize)]
struct StallLine<'a> {
    #[serde(rename = "type")]
    line_type: &'static str,
    kind: &'static str,
    t_ns: u64,
    #[serde(flatten)]
    episode: &'a StallEpisode,
}

impl Serialize for Line<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tagged = |line_type, inner| Tagged { line_type, inner };
        match *self {
            Line::Header(h) => Tagged { line_type: "header", inner: h }.serialize(s),
            Line::Event(e) => Tagged { line_type: "event", inner: e }.serialize(s),
            Line::Sample(x) => Tagged { line_type: "sample", inner: x }.serialize(s),
            Line::GpuStall(episode) => {
                StallLine { line_type: "event", kind: GPU_STALL, t_ns: episode.start_ns, episode }
                    .serialize(s)
            }
            // The summary carries its own `type` (its JSON file has it too).
            Line::Summary(v) if v.get("type").is_some() => v.serialize(s),
            Line::Summary(v) => tagged("summary", v).serialize(s),
        }
    }
}

impl Line<'_> {
    /// When it happened, for the flight recorder's window (`None`: a summary without one).
    pub fn t_ns(&self) -> Option<u64> {
        match self {
            Line::Header(h) => Some(h.start_ns),
            Line::Event(e) => Some(e.header().t_ns),
            Line::GpuStall(s) => Some(s.start_ns),
            Line::Sample(s) => Some(s.t_ns()),
            Line::Summary(v) => v.get("t_ns").and_then(Value::as_u64),
        }
    }

    pub fn to_json(self) -> serde_json::Result<String> {
        serde_json::to_string(&self)
    }
}

/// Reads a recording line by line into records (the replay's and the timeline's reader).
impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Record::from_value(Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::Header as EventHeader;
    use gpustall_common::reclaim::ReclaimKind;

    fn as_value(e: &Event) -> Value {
        serde_json::to_value(Line::Event(e)).expect("json")
    }

    fn round_trip(line: Line<'_>) -> Record {
        let text = line.to_json().expect("serializes");
        Record::parse(text.as_bytes()).expect("reads back")
    }

    #[test]
    fn every_line_reads_back_as_what_was_written() {
        let e = Event::Fork {
            h: EventHeader { t_ns: 5, pid: 1, tid: 1, comm: "python".into() },
            child_pid: 2,
            clone_flags: 17,
        };
        assert!(matches!(round_trip(Line::Event(&e)), Record::Event(back) if back == e));
        let s = Sample::Vanished { t_ns: 7, pid: 3 };
        assert!(matches!(
            round_trip(Line::Sample(&s)),
            Record::Sample(Sample::Vanished { t_ns: 7, pid: 3 })
        ));
        let h = Header { version: 1, start_ns: 9, ..Default::default() };
        assert!(matches!(round_trip(Line::Header(&h)), Record::Header(back) if *back == h));
        let stall =
            StallEpisode { gpu_index: 1, start_ns: 11, duration_ns: 4, ..Default::default() };
        let text = Line::GpuStall(&stall).to_json().expect("json");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            (v["type"].as_str(), v["kind"].as_str(), v["t_ns"].as_u64()),
            (Some("event"), Some("gpu_stall"), Some(11))
        );
        assert!(
            matches!(Record::parse(text.as_bytes()), Ok(Record::GpuStall(back)) if back.gpu_index == 1)
        );
        let summary = serde_json::json!({"t_ns": 12, "final": true, "verdict": {"cause": "x"}});
        let Record::Summary(back) = round_trip(Line::Summary(&summary)) else {
            panic!("a summary")
        };
        assert_eq!(
            (back.t_ns, back.is_final, &back.body["verdict"]["cause"]),
            (Some(12), true, &Value::from("x"))
        );
    }

    #[test]
    fn what_a_newer_gpustall_adds_is_unknown_and_what_does_not_read_is_an_error() {
        let unknown = |l: &str| Record::parse(l.as_bytes());
        assert!(
            matches!(unknown(r#"{"type":"annotation","kind":"x"}"#), Ok(Record::Unknown { line_type, kind: Some(k) }) if line_type == "annotation" && k == "x")
        );
        assert!(matches!(
            unknown(r#"{"type":"sample","kind":"quantum","t_ns":1}"#),
            Ok(Record::Unknown { .. })
        ));
        assert!(matches!(
            unknown(r#"{"type":"event","kind":"teleport","t_ns":1}"#),
            Ok(Record::Unknown { .. })
        ));
        // A known kind that lacks a field is no newer format: it is a bad line.
        assert!(matches!(
            unknown(r#"{"type":"sample","kind":"vanished","t_ns":1}"#),
            Err(RecordError::Bad { line_type: "sample", .. })
        ));
        assert_eq!(
            unknown(r#"{"kind":"fork"}"#).unwrap_err(),
            RecordError::NoType("it has no \"type\"")
        );
        assert_eq!(unknown(r#"{"type":"eve"#).unwrap_err(), RecordError::Truncated);
        assert!(matches!(unknown("hello"), Err(RecordError::NotJson(_))));
    }
    #[test]
    fn exit_record_splits_status_and_signal() {
        let h = EventHeader { t_ns: 1, pid: 5, tid: 5, comm: "w".into() };
        let v = as_value(&Event::Exit { h: h.clone(), exit_code: Some(9) });
        assert_eq!(
            (v["kind"].as_str(), v["exit_signal"].as_i64(), v["exit_code"].is_null()),
            (Some("exit"), Some(9), true)
        );
        let v = as_value(&Event::Exit { h, exit_code: Some(2 << 8) });
        assert_eq!((v["exit_code"].as_i64(), v["exit_signal"].is_null()), (Some(2), true));
        assert_eq!(v["type"], "event");
    }

    #[test]
    fn every_event_kind_reads_back_as_written() {
        use crate::model::event::OomRss;
        let h = |t| EventHeader { t_ns: t, pid: 10, tid: 11, comm: "pt_data_worker".into() };
        let events = vec![
            Event::Fork { h: h(1), child_pid: 12, clone_flags: 0x1200011 },
            Event::Exit { h: h(2), exit_code: Some(9) },
            Event::Exit { h: h(2), exit_code: None },
            Event::Rename { h: h(3), renamed_tid: 11, new_comm: "pt_data_pin".into() },
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
            let back = round_trip(Line::Event(&e));
            assert!(matches!(back, Record::Event(ref b) if *b == e), "{e:?}: {back:?}");
        }
        let no_flags = br#"{"type":"event","kind":"fork","t_ns":1,"pid":1,"tid":1,"comm":"x"}"#;
        assert!(Record::parse(no_flags).is_err());
    }
}
