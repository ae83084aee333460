//! Reading a scenario file into per-GPU step-function timelines.
//!
//! All validation happens here, at `nvmlInit`, so that a typo in a test's scenario fails the
//! init loudly instead of silently yielding a different GPU than the test meant.

use serde::Deserialize;
use std::ffi::CString;

const MIB: u64 = 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default)]
    driver_version: Option<String>,
    gpus: Vec<GpuFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuFile {
    name: String,
    uuid: String,
    #[serde(default)]
    memory_total_mib: Option<u64>,
    /// "DDDD:BB:DD.F" (as the kernel names the device); left out: unknown.
    #[serde(default)]
    pci_bus_id: Option<String>,
    #[serde(default)]
    timeline: Vec<EntryFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    at_s: f64,
    util_gpu: Option<u32>,
    util_mem: Option<u32>,
    memory_used_mib: Option<u64>,
    temperature_c: Option<u32>,
    sm_clock_mhz: Option<u32>,
    power_w: Option<f64>,
    throttle: Option<Vec<String>>,
    pids: Option<Vec<PidFile>>,
    /// A critical Xid error raised at this entry's time (an event, not a level: once).
    xid: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PidFile {
    pid: PidRef,
    #[serde(default)]
    used_mib: Option<u64>,
}

/// A pid written as a number, or as `"$NAME"`: the value of environment variable NAME at init,
/// so a test can name a process it started itself.
#[derive(Deserialize)]
#[serde(untagged)]
enum PidRef {
    Number(u32),
    Env(String),
}

/// NVML's clocks-event (formerly "throttle") reason bits, by the names scenarios use.
const THROTTLE_BITS: [(&str, u64); 9] = [
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
];

/// One compute process as NVML reports it.
#[derive(Clone, Copy)]
pub struct Process {
    pub pid: u32,
    /// `None`: NVML_VALUE_NOT_AVAILABLE, as drivers report inside some containers.
    pub used_bytes: Option<u64>,
}

/// The state of one GPU from `at_ns` on. `None` means "never given": the query answers
/// NVML_ERROR_NOT_SUPPORTED, as a real GPU does for a sensor it lacks.
#[derive(Clone, Default)]
pub struct State {
    pub at_ns: u64,
    pub util_gpu: Option<u32>,
    pub util_mem: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub power_mw: Option<u32>,
    pub throttle_mask: u64,
    pub processes: Vec<Process>,
    /// A critical Xid error raised at `at_ns` (delivered once to each event set).
    pub xid: Option<u64>,
}

pub struct Gpu {
    pub name: CString,
    pub uuid: CString,
    pub memory_total_bytes: Option<u64>,
    /// (domain, bus, device, function) of its PCI address.
    pub pci: Option<(u32, u32, u32, u32)>,
    /// Sorted by `at_ns`; each entry already carries forward what earlier ones set.
    timeline: Vec<State>,
}

impl Gpu {
    /// How many timeline entries have begun by `elapsed_ns`.
    pub fn entries_by(&self, elapsed_ns: u64) -> usize {
        self.timeline.partition_point(|s| s.at_ns <= elapsed_ns)
    }

    /// The Xid of timeline entry `i`, if it raises one.
    pub fn xid_of(&self, i: usize) -> Option<u64> {
        self.timeline.get(i).and_then(|s| s.xid)
    }

    /// The state at `elapsed_ns` after init: the last entry at or before it (a step function);
    /// before the first entry nothing is known.
    pub fn state_at(&self, elapsed_ns: u64) -> State {
        let after = self.timeline.partition_point(|s| s.at_ns <= elapsed_ns);
        match after.checked_sub(1).and_then(|i| self.timeline.get(i)) {
            Some(state) => state.clone(),
            None => State::default(),
        }
    }
}

pub struct Scenario {
    pub driver_version: CString,
    pub gpus: Vec<Gpu>,
}

/// Parses and validates a scenario; the error says what is wrong, for the test author.
pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Scenario, String> {
    let file: ScenarioFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let driver_version = cstring(file.driver_version.as_deref().unwrap_or("nvml-stub"))?;
    let gpus = file.gpus.into_iter().map(|g| gpu(g, &env)).collect::<Result<Vec<_>, _>>()?;
    Ok(Scenario { driver_version, gpus })
}

fn gpu(file: GpuFile, env: &impl Fn(&str) -> Option<String>) -> Result<Gpu, String> {
    let mut entries = file.timeline;
    if let Some(bad) = entries.iter().find(|e| !(e.at_s.is_finite() && e.at_s >= 0.0)) {
        return Err(format!("gpu {:?}: at_s {} is not a time >= 0", file.name, bad.at_s));
    }
    // Stable sort: of two entries at the same time the later one in the file wins.
    entries.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let mut timeline: Vec<State> = Vec::with_capacity(entries.len());
    for e in entries {
        let prev = timeline.last().cloned().unwrap_or_default();
        timeline.push(entry(e, prev, env)?);
    }
    let pci = file.pci_bus_id.as_deref().map(pci_address).transpose()?;
    Ok(Gpu {
        name: cstring(&file.name)?,
        uuid: cstring(&file.uuid)?,
        memory_total_bytes: file.memory_total_mib.map(|m| m.saturating_mul(MIB)),
        pci,
        timeline,
    })
}

/// One timeline entry on top of the state before it: a field left out keeps its old value.
fn entry(
    e: EntryFile,
    prev: State,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<State, String> {
    let power_mw = match e.power_w {
        Some(w) if !(w.is_finite() && (0.0..4_000_000.0).contains(&w)) => {
            return Err(format!("power_w {w} is out of range"))
        }
        Some(w) => Some((w * 1000.0).round() as u32),
        None => prev.power_mw,
    };
    let throttle_mask = match e.throttle {
        Some(names) => {
            names.iter().try_fold(0u64, |mask, n| Ok::<u64, String>(mask | throttle_bit(n)?))?
        }
        None => prev.throttle_mask,
    };
    let processes = match e.pids {
        Some(pids) => pids.iter().map(|p| process(p, env)).collect::<Result<Vec<_>, _>>()?,
        None => prev.processes,
    };
    Ok(State {
        at_ns: (e.at_s * 1e9) as u64,
        util_gpu: e.util_gpu.or(prev.util_gpu),
        util_mem: e.util_mem.or(prev.util_mem),
        memory_used_bytes: e
            .memory_used_mib
            .map(|m| m.saturating_mul(MIB))
            .or(prev.memory_used_bytes),
        temperature_c: e.temperature_c.or(prev.temperature_c),
        sm_clock_mhz: e.sm_clock_mhz.or(prev.sm_clock_mhz),
        power_mw,
        throttle_mask,
        processes,
        xid: e.xid,
    })
}

/// "DDDD:BB:DD.F" as (domain, bus, device, function).
fn pci_address(s: &str) -> Result<(u32, u32, u32, u32), String> {
    let bad = || format!("pci_bus_id {s:?} is not DDDD:BB:DD.F");
    let (dbd, f) = s.split_once('.').ok_or_else(bad)?;
    let mut p = dbd.split(':').map(|x| u32::from_str_radix(x, 16));
    match (p.next(), p.next(), p.next(), p.next(), u32::from_str_radix(f, 16)) {
        (Some(Ok(d)), Some(Ok(b)), Some(Ok(dev)), None, Ok(f)) => Ok((d, b, dev, f)),
        _ => Err(bad()),
    }
}

fn throttle_bit(name: &str) -> Result<u64, String> {
    THROTTLE_BITS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bit)| *bit)
        .ok_or_else(|| format!("unknown throttle reason {name:?}"))
}

fn process(p: &PidFile, env: &impl Fn(&str) -> Option<String>) -> Result<Process, String> {
    let pid = match &p.pid {
        PidRef::Number(n) => *n,
        PidRef::Env(s) => {
            let name = s
                .strip_prefix('$')
                .ok_or_else(|| format!("pid {s:?}: write a number or \"$ENVNAME\""))?;
            let value = env(name)
                .ok_or_else(|| format!("pid {s:?}: environment variable {name} is not set"))?;
            value.trim().parse().map_err(|_| format!("pid {s:?}: {name}={value:?} is not a pid"))?
        }
    };
    Ok(Process { pid, used_bytes: p.used_mib.map(|m| m.saturating_mul(MIB)) })
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TRAINER").then(|| "4242".to_string())
    }

    #[test]
    fn step_function_carries_fields_forward() {
        let s = parse(
            r#"{"gpus":[{"name":"g","uuid":"GPU-0","memory_total_mib":10,"timeline":[
                {"at_s":2,"util_gpu":0,"throttle":["hw_thermal_slowdown","gpu_idle"]},
                {"at_s":0,"util_gpu":95,"temperature_c":60,"pids":[{"pid":"$TRAINER","used_mib":5},{"pid":7}]}]}]}"#,
            env,
        )
        .expect("valid scenario");
        let g = &s.gpus[0];
        assert_eq!(g.memory_total_bytes, Some(10 * MIB));
        let t0 = g.state_at(1_999_999_999);
        assert_eq!((t0.util_gpu, t0.temperature_c, t0.throttle_mask), (Some(95), Some(60), 0));
        assert_eq!(t0.processes[0].pid, 4242);
        assert_eq!(t0.processes[0].used_bytes, Some(5 * MIB));
        assert_eq!(t0.processes[1].used_bytes, None);
        let t2 = g.state_at(2_000_000_000);
        assert_eq!((t2.util_gpu, t2.temperature_c, t2.throttle_mask), (Some(0), Some(60), 0x41));
        assert_eq!(t2.processes.len(), 2);
        assert_eq!(t2.power_mw, None);
    }

    #[test]
    fn mistakes_are_errors() {
        for bad in [
            r#"{"gpus":[{"name":"g","uuid":"u","timeline":[{"at_s":0,"throttle":["too_hot"]}]}]}"#,
            r#"{"gpus":[{"name":"g","uuid":"u","timeline":[{"at_s":0,"pids":[{"pid":"$NOPE"}]}]}]}"#,
            r#"{"gpus":[{"name":"g","uuid":"u","timeline":[{"at_s":0,"util":5}]}]}"#,
            r#"{"gpus":[{"name":"g","uuid":"u","timeline":[{"at_s":-1}]}]}"#,
            r#"{"gpu":[]}"#,
        ] {
            assert!(parse(bad, env).is_err(), "{bad}");
        }
    }
}
