//! Where and when a trace ran: the host (the Kubernetes node where the agent is told it), the
//! kernel, the wall clock at its start, what was traced and by which gpustall. Taken from the
//! recording's header, live and on replay alike, so every report can say where and when.

use serde::Serialize;

#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub host: String,
    pub kernel: String,
    /// Nanoseconds since the epoch at the trace's start (0: not recorded).
    pub wall_clock_at_start_ns: u64,
    /// The pids `trace --pid` was given, or the launched command's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<u32>,
    /// The first target's command line, as the tree knows it (filled in for the summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The gpustall that recorded it.
    pub tool: String,
    /// A `watch` bundle's incident: what happened to which process, and when on the wall clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incident: Option<OriginIncident>,
}

#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct OriginIncident {
    pub kind: crate::model::incident::IncidentKind,
    pub pid: u32,
    /// Nanoseconds since the epoch (0: the recording has no wall clock).
    pub wall_ns: u64,
}
