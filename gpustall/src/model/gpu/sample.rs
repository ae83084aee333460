//! What one NVML sample of one GPU says, as the model and the recording hold it.

use serde::Serialize;

/// NVML's clocks-event ("throttle") reason bits and the names gpustall reports them by.
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The names of the reasons in `mask` that slow a GPU down. `gpu_idle` is left out: an idle
/// GPU lowers its clocks because it has no work, which is a consequence of a stall, not a cause.
pub fn throttle_names(mask: u64) -> Vec<String> {
    THROTTLE_REASONS
        .iter()
        .filter(|(bit, name)| mask & bit != 0 && *name != "gpu_idle")
        .map(|(_, name)| (*name).to_string())
        .collect()
}

/// A compute process NVML lists on a GPU.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where the driver does not say (NVML_VALUE_NOT_AVAILABLE, e.g. in some containers).
    pub used_bytes: Option<u64>,
}

/// One GPU at one moment. A field NVML could not read is `None`, never a guessed 0.
#[derive(Serialize, serde::Deserialize, Clone, Debug, Default)]
pub struct GpuSample {
    /// CLOCK_MONOTONIC ns taken just before this GPU's queries.
    pub t_ns: u64,
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Its PCI address as the driver's kernel-log lines name it ("0000:3b:00"), where NVML
    /// gives it (absent in recordings before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub util_gpu_pct: Option<u32>,
    pub util_mem_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub power_mw: Option<u32>,
    /// NVML's raw clocks-event reason bits (0 when unreadable).
    pub throttle_mask: u64,
    /// [`throttle_names`] of `throttle_mask`.
    pub throttle_reasons: Vec<String>,
    pub processes: Vec<GpuProcess>,
    /// Critical Xid errors NVML reported for this GPU since its previous sample (its event
    /// set; 999: an Xid NVML could not name). Absent in recordings before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<u64>,
}
