//! The first line of every recording: what made it, on which host and kernel, and when. Typed
//! both ways: written by `trace` and `watch`, read back by the replay.

use serde::{Deserialize, Serialize};

/// The only recording format so far.
pub const VERSION: u32 = 1;

/// `{"type":"header",...}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    #[serde(default)]
    pub tool: String,
    /// `"watch"` for the daemon's bundles; absent for `trace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub kernel: String,
    #[serde(default)]
    pub clock: String,
    pub start_ns: u64,
    #[serde(default)]
    pub wall_clock_at_start_ns: u64,
    /// The pids `trace --pid` was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<u32>>,
    #[serde(default)]
    pub attached: Vec<String>,
    #[serde(default)]
    pub skipped: Vec<String>,
    pub gpu: GpuHeader,
    /// The incident a watch bundle was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<IncidentHeader>,
}

/// Whether GPU data was on, and the stall settings the replay must use to find the same stalls.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuHeader {
    pub enabled: bool,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_pct: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IncidentHeader {
    pub kind: crate::model::incident::IncidentKind,
    pub t_ns: u64,
    pub pid: u32,
}

/// The wall clock at monotonic time `start_ns` (taken earlier, before the programs loaded):
/// both clocks read back to back now, and the wall one moved back by the time since. Reading
/// the wall clock only now would shift the node on a merged timeline by the start-up time.
fn wall_at(start_ns: u64) -> u64 {
    let mono = crate::sources::clock::monotonic_ns();
    let wall = crate::sources::clock::wall_ns();
    wall.saturating_sub(mono.saturating_sub(start_ns))
}

impl Header {
    /// Where and when, for the model (and so every report).
    pub fn origin(&self) -> crate::model::origin::Origin {
        crate::model::origin::Origin {
            host: self.host.clone(),
            kernel: self.kernel.clone(),
            wall_clock_at_start_ns: self.wall_clock_at_start_ns,
            targets: self.targets.clone().unwrap_or_default(),
            command: None,
            tool: self.tool.clone(),
            incident: self.incident.as_ref().map(|i| crate::model::origin::OriginIncident {
                kind: i.kind,
                pid: i.pid,
                wall_ns: match self.wall_clock_at_start_ns {
                    0 => 0,
                    wall => wall.saturating_add(i.t_ns.saturating_sub(self.start_ns)),
                },
            }),
        }
    }

    /// A header for a recording made on this machine now.
    pub fn new(start_ns: u64, attached: &[String], skipped: &[String], gpu: GpuHeader) -> Self {
        Self {
            version: VERSION,
            tool: concat!("gpustall ", env!("CARGO_PKG_VERSION")).into(),
            mode: None,
            host: crate::sources::host::node_name(),
            kernel: crate::sources::host::kernel_release(),
            clock: "CLOCK_MONOTONIC".into(),
            start_ns,
            wall_clock_at_start_ns: wall_at(start_ns),
            targets: None,
            attached: attached.to_vec(),
            skipped: skipped.to_vec(),
            gpu,
            incident: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_keeps_the_field_names() {
        let h = Header::new(
            5,
            &["a".into()],
            &[],
            GpuHeader { enabled: false, status: "off".into(), ..Default::default() },
        );
        let v = serde_json::to_value(crate::recording::record::Line::Header(&h)).expect("json");
        assert_eq!(v["type"], "header");
        assert_eq!(v["version"], 1);
        assert_eq!(v["clock"], "CLOCK_MONOTONIC");
        assert!(
            v.get("targets").is_none()
                && v.get("mode").is_none()
                && v["gpu"].get("window_ns").is_none()
        );
        assert_eq!(serde_json::from_value::<Header>(v).expect("parses"), h);
    }
}
