//! The library's global state between `nvmlInit` and `nvmlShutdown`, as NVML keeps it:
//! init calls are counted and only the last shutdown unloads.

use crate::abi::*;
use crate::scenario::{self, Gpu, Scenario, State};
use std::ffi::c_void;
use std::io::Write;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// The variable that names the scenario file.
pub const SCENARIO_ENV: &str = "GPUSTALL_NVML_STUB_SCENARIO";

struct Loaded {
    /// `Instant` is CLOCK_MONOTONIC on Linux: the clock the scenario's `at_s` counts on.
    t0: Instant,
    scenario: Scenario,
}

struct Global {
    init_count: u32,
    loaded: Option<Loaded>,
    /// Event sets by id (`None`: freed): per registered GPU, the next timeline entry whose
    /// Xid it has not been given.
    event_sets: Vec<Option<Vec<(usize, usize)>>>,
}

static GLOBAL: Mutex<Global> =
    Mutex::new(Global { init_count: 0, loaded: None, event_sets: Vec::new() });

fn global() -> MutexGuard<'static, Global> {
    // A panic while holding the lock was already caught and answered with an error code;
    // the data it guards is still consistent (every write is a single assignment).
    GLOBAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Says why init failed, once, on stderr: an error code alone would leave a test author guessing.
fn complain(msg: &str) {
    let _ = writeln!(std::io::stderr(), "nvml-stub: {msg}");
}

pub fn init() -> nvmlReturn_t {
    let mut g = global();
    if g.init_count == 0 {
        let path = match std::env::var_os(SCENARIO_ENV) {
            Some(p) => p,
            None => {
                // No scenario: no stand-in GPUs to drive, which is what "driver not loaded" means.
                complain(&format!("{SCENARIO_ENV} is not set: no stand-in driver"));
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                complain(&format!("cannot read scenario {}: {e}", path.to_string_lossy()));
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
        };
        match scenario::parse(&text, |name| std::env::var(name).ok()) {
            Ok(scenario) => g.loaded = Some(Loaded { t0: Instant::now(), scenario }),
            Err(e) => {
                complain(&format!("invalid scenario {}: {e}", path.to_string_lossy()));
                return NVML_ERROR_UNKNOWN;
            }
        }
    }
    g.init_count += 1;
    NVML_SUCCESS
}

pub fn shutdown() -> nvmlReturn_t {
    let mut g = global();
    match g.init_count {
        0 => NVML_ERROR_UNINITIALIZED,
        n => {
            g.init_count = n - 1;
            if g.init_count == 0 {
                g.loaded = None;
            }
            NVML_SUCCESS
        }
    }
}

/// Runs `f` on the scenario, or answers NVML_ERROR_UNINITIALIZED.
pub fn with_scenario(f: impl FnOnce(&Scenario) -> nvmlReturn_t) -> nvmlReturn_t {
    match &global().loaded {
        Some(l) => f(&l.scenario),
        None => NVML_ERROR_UNINITIALIZED,
    }
}

/// Runs `f` on the GPU behind a handle and its state now.
pub fn with_device(
    dev: nvmlDevice_t,
    f: impl FnOnce(&Gpu, &State) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let g = global();
    let Some(l) = &g.loaded else {
        return NVML_ERROR_UNINITIALIZED;
    };
    let Some(gpu) = index_of(dev).and_then(|i| l.scenario.gpus.get(i)) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let elapsed = u64::try_from(l.t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    f(gpu, &gpu.state_at(elapsed))
}

/// Handles are `index + 1` (never null, never dereferenced): NVML's are opaque pointers too.
pub fn handle(index: usize) -> nvmlDevice_t {
    std::ptr::without_provenance_mut::<c_void>(index + 1)
}

pub fn index_of(dev: nvmlDevice_t) -> Option<usize> {
    (dev as usize).checked_sub(1)
}

/// A new event set's handle (`id + 1`).
pub fn event_set_create() -> nvmlEventSet_t {
    let mut g = global();
    g.event_sets.push(Some(Vec::new()));
    std::ptr::without_provenance_mut::<c_void>(g.event_sets.len())
}

pub fn event_set_free(set: nvmlEventSet_t) -> nvmlReturn_t {
    let mut g = global();
    match (set as usize).checked_sub(1).and_then(|i| g.event_sets.get_mut(i)) {
        Some(s @ Some(_)) => {
            *s = None;
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// Registers a GPU's critical Xid errors from now on (those already past are not given).
pub fn register_events(dev: nvmlDevice_t, types: u64, set: nvmlEventSet_t) -> nvmlReturn_t {
    if types & !NVML_EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    let mut g = global();
    let Some(l) = &g.loaded else { return NVML_ERROR_UNINITIALIZED };
    let Some(i) = index_of(dev).filter(|&i| i < l.scenario.gpus.len()) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let elapsed = u64::try_from(l.t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let next = l.scenario.gpus[i].entries_by(elapsed);
    match (set as usize).checked_sub(1).and_then(|s| g.event_sets.get_mut(s)) {
        Some(Some(regs)) => {
            regs.retain(|&(d, _)| d != i);
            regs.push((i, next));
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// The next Xid of a registered GPU whose time has come: (GPU index, Xid).
pub fn next_event(set: nvmlEventSet_t) -> Result<Option<(usize, u64)>, nvmlReturn_t> {
    let mut g = global();
    let g = &mut *g;
    let Some(l) = &g.loaded else { return Err(NVML_ERROR_UNINITIALIZED) };
    let Some(Some(regs)) = (set as usize).checked_sub(1).and_then(|s| g.event_sets.get_mut(s))
    else {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    };
    let elapsed = u64::try_from(l.t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    for (dev, next) in regs.iter_mut() {
        let gpu = &l.scenario.gpus[*dev];
        let by = gpu.entries_by(elapsed);
        while *next < by {
            let i = *next;
            *next += 1;
            if let Some(xid) = gpu.xid_of(i) {
                return Ok(Some((*dev, xid)));
            }
        }
    }
    Ok(None)
}
