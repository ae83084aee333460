//! Incidents: what happened to a job that deserves a bundle (watch) or an immediate fsync. The
//! kinds' JSON names are an interface: bundle directory names, the recording's header, metric
//! labels.

/// What kind of incident: its JSON name is the one in bundle names and metrics labels.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum IncidentKind {
    // In order of gravity: when several fall in one bundle, the gravest names it.
    GpuStall,
    ReclaimStorm,
    Sigkill,
    OomKill,
    /// The GPU or its driver reported a fault (an Xid in the kernel log).
    GpuFault,
}

impl IncidentKind {
    pub const ALL: [IncidentKind; 5] = [
        IncidentKind::GpuStall,
        IncidentKind::ReclaimStorm,
        IncidentKind::Sigkill,
        IncidentKind::OomKill,
        IncidentKind::GpuFault,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::GpuStall => "gpu_stall",
            Self::ReclaimStorm => "reclaim_storm",
            Self::Sigkill => "sigkill",
            Self::OomKill => "oom_kill",
            Self::GpuFault => "gpu_fault",
        }
    }
}

impl std::fmt::Display for IncidentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something that happened to the job that deserves a bundle (watch) or an immediate fsync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    pub kind: IncidentKind,
    pub t_ns: u64,
    pub pid: u32,
}
