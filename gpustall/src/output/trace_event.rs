//! One Chrome trace event (the format ui.perfetto.dev opens), typed: the fields gpustall's
//! traces use, each named as the format names it, and what a phase does not use left out.
//! `perfetto` makes them from a timeline, `merged` moves a node's events into its group.

use serde::Serialize;
use serde_json::{Map, Value};

/// An event's phase (the format's `ph`).
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A track's name or order.
    #[serde(rename = "M")]
    Metadata,
    /// A slice with its duration.
    #[serde(rename = "X")]
    Complete,
    /// A flow arrow's start and end (v1 flow events).
    #[serde(rename = "s")]
    FlowStart,
    #[serde(rename = "f")]
    FlowEnd,
    #[serde(rename = "i")]
    Instant,
    #[serde(rename = "C")]
    Counter,
}

/// An instant's scope (the format's `s`): a line across the whole trace, its process or its
/// thread.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    #[serde(rename = "g")]
    Global,
    #[serde(rename = "p")]
    Process,
    #[serde(rename = "t")]
    Thread,
}

/// A flow end bound to the slice enclosing it (the format's `bp`: "e").
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    #[serde(rename = "e")]
    Enclosing,
}

/// One event: its phase and name on a process track (`pid`), and the fields its phase uses.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TraceEvent {
    pub ph: Phase,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cat: Option<&'static str>,
    pub pid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u64>,
    /// Microseconds on the trace's axis; a slice's duration likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    /// A flow's id: its start and end share it, trace-wide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bp: Option<Binding>,
    #[serde(rename = "s", skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// What the UI shows with the event: a track's name, a counter's value, a slice's details.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub args: Value,
}

impl TraceEvent {
    /// An event of phase `ph` named `name` on process track `pid`, nothing else set.
    pub fn new(ph: Phase, name: impl Into<String>, pid: u64) -> Self {
        TraceEvent {
            ph,
            name: name.into(),
            cat: None,
            pid,
            tid: None,
            ts: None,
            dur: None,
            id: None,
            bp: None,
            scope: None,
            args: Value::Null,
        }
    }

    /// A track's metadata: `name` (`process_name`, `process_sort_index`) with its `args`.
    pub fn meta(name: &str, pid: u64, args: Value) -> Self {
        TraceEvent { args, ..Self::new(Phase::Metadata, name, pid) }
    }

    /// Sets `key` in the event's args (made an object if they were none).
    pub fn set_arg(&mut self, key: &str, value: Value) {
        if !self.args.is_object() {
            self.args = Value::Object(Map::new());
        }
        if let Value::Object(a) = &mut self.args {
            a.insert(key.to_string(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_writes_only_the_fields_its_phase_uses_as_the_format_names_them() {
        let mut flow = TraceEvent::new(Phase::FlowEnd, "waiting for data", 10);
        (flow.tid, flow.ts, flow.id, flow.bp) =
            (Some(12), Some(1.5), Some(3), Some(Binding::Enclosing));
        assert_eq!(
            serde_json::to_value(&flow).expect("json"),
            json!({"ph": "f", "name": "waiting for data", "pid": 10, "tid": 12, "ts": 1.5, "id": 3, "bp": "e"})
        );
        let mut oom = TraceEvent::new(Phase::Instant, "OOM kill", 10);
        oom.scope = Some(Scope::Global);
        oom.set_arg("victim", json!(11));
        assert_eq!(
            serde_json::to_value(&oom).expect("json"),
            json!({"ph": "i", "name": "OOM kill", "pid": 10, "s": "g", "args": {"victim": 11}})
        );
    }
}
