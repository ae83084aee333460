//! A stand-in for the NVIDIA driver's `libnvidia-ml.so.1` (NVML), for tests.
//!
//! gpustall reads GPUs through the real `nvml-wrapper` crate, which `dlopen`s NVML and looks
//! each symbol up when it is first called. Tests load this library in its place
//! (`Nvml::builder().lib_path(..)`, or a copy named `libnvidia-ml.so.1`) so the whole real
//! path, C ABI included, runs without a GPU. It implements only the calls gpustall makes;
//! any other NVML call fails in nvml-wrapper with `FailedToLoadSymbol`, never with a made-up
//! answer.
//!
//! # Exported symbols
//! `nvmlInit_v2`, `nvmlInitWithFlags`, `nvmlShutdown`, `nvmlErrorString`,
//! `nvmlSystemGetDriverVersion`, `nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`,
//! `nvmlDeviceGetIndex`, `nvmlDeviceGetName`, `nvmlDeviceGetUUID`,
//! `nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetMemoryInfo`, `nvmlDeviceGetMemoryInfo_v2`,
//! `nvmlDeviceGetTemperature` (GPU sensor), `nvmlDeviceGetClockInfo` (SM clock only),
//! `nvmlDeviceGetPowerUsage`, `nvmlDeviceGetCurrentClocksThrottleReasons` (what
//! nvml-wrapper 0.13 calls) and its newer name `nvmlDeviceGetCurrentClocksEventReasons`,
//! `nvmlDeviceGetComputeRunningProcesses_v3`, `nvmlDeviceGetPciInfo_v3`, and the event calls `nvmlEventSetCreate`,
//! `nvmlDeviceRegisterEvents` (critical Xid errors only), `nvmlEventSetWait_v2`,
//! `nvmlEventSetFree`.
//!
//! # Scenario
//! `nvmlInit` reads the JSON file named by `GPUSTALL_NVML_STUB_SCENARIO`. Unset or unreadable:
//! init fails with `NVML_ERROR_DRIVER_NOT_LOADED` (there is no stand-in driver). Invalid
//! (bad JSON, unknown field, unknown throttle name, unset `$VAR`): init fails with
//! `NVML_ERROR_UNKNOWN`. Either way one line on stderr, prefixed `nvml-stub:`, says why.
//!
//! ```json
//! {"driver_version": "550.54.15",
//!  "gpus": [{"name": "Stand-in H200", "uuid": "GPU-stub-0", "memory_total_mib": 143771,
//!    "timeline": [
//!      {"at_s": 0, "util_gpu": 95, "util_mem": 40, "memory_used_mib": 60000,
//!       "temperature_c": 60, "sm_clock_mhz": 1980, "power_w": 600, "throttle": [],
//!       "pids": [{"pid": "$TRAINER", "used_mib": 50000}, {"pid": 1234}]},
//!      {"at_s": 2, "util_gpu": 0, "temperature_c": 91, "throttle": ["hw_thermal_slowdown"]}]}]}
//! ```
//! - `driver_version` is optional (default `"nvml-stub"`); `gpus` may be empty (a host whose
//!   driver sees no GPU). Device index = position in `gpus`.
//! - Time counts from the first `nvmlInit` on CLOCK_MONOTONIC. The state at time t is the last
//!   timeline entry with `at_s <= t` (a step function; entries are sorted by `at_s`).
//! - A field left out of an entry keeps the value an earlier entry gave it. A field no entry
//!   has given (and everything before the first entry) is unknown: its query returns
//!   `NVML_ERROR_NOT_SUPPORTED`, as a real GPU does for a sensor it lacks. `throttle` and
//!   `pids` default to empty. Utilisation needs `util_gpu` (`util_mem` then defaults to 0);
//!   memory info needs `memory_total_mib` (`memory_used_mib` defaults to 0).
//! - `pids` entries: `pid` is a number or `"$NAME"`, the value of environment variable NAME
//!   at init (so a test can list a process it started); `used_mib` left out reports
//!   `NVML_VALUE_NOT_AVAILABLE`, as drivers do inside some containers.
//! - `throttle` names and their NVML clocks-event-reason bits: `gpu_idle` 0x1,
//!   `applications_clocks_setting` 0x2, `sw_power_cap` 0x4, `hw_slowdown` 0x8, `sync_boost`
//!   0x10, `sw_thermal_slowdown` 0x20, `hw_thermal_slowdown` 0x40, `hw_power_brake_slowdown`
//!   0x80, `display_clock_setting` 0x100.
//! - `pci_bus_id` ("0000:3b:00.0", optional) is the GPU's PCI address; left out, the PCI
//!   query answers `NVML_ERROR_NOT_SUPPORTED`.
//! - `xid` (a number) raises that critical Xid error at the entry's time, once: an event set
//!   registered for the GPU before then gets it from `nvmlEventSetWait_v2`.
//! - Units as NVML's: power is reported in milliwatts, memory in bytes (MiB × 1048576).
//!
//! No panic crosses the C boundary: each export runs under `catch_unwind` and answers
//! `NVML_ERROR_UNKNOWN` if anything inside panics.
#![allow(non_snake_case)]
// The exports are C functions; their safety contract is nvml.h's (valid pointers and buffer
// lengths), documented there rather than repeated on each one.
#![allow(clippy::missing_safety_doc)]

mod abi;
mod scenario;
mod state;

use abi::*;
use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs an export's body, turning a panic into an error code: unwinding into C is undefined.
fn guarded(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(NVML_ERROR_UNKNOWN)
}

/// Stores `value` through an out-pointer from the caller.
///
/// # Safety
/// `out` must be null or valid for writing a `T`.
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    // SAFETY: the caller guarantees `out` is null or valid and aligned for a write of T.
    match unsafe { out.as_mut() } {
        Some(slot) => {
            *slot = value;
            NVML_SUCCESS
        }
        None => NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// Copies a string, NUL included, into the caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for writing `len` bytes.
unsafe fn put_str(s: &CStr, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    let bytes = s.to_bytes_with_nul();
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if bytes.len() > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` is non-null and valid for `len >= bytes.len()` bytes (caller's contract);
    // a fresh CString cannot overlap the caller's buffer.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len()) };
    NVML_SUCCESS
}

/// Answers from a value the scenario may leave unknown.
///
/// # Safety
/// As for [`put`].
unsafe fn put_known<T>(out: *mut T, value: Option<T>) -> nvmlReturn_t {
    match value {
        // SAFETY: forwarded from this function's contract.
        Some(v) => unsafe { put(out, v) },
        None => NVML_ERROR_NOT_SUPPORTED,
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guarded(state::init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    // The flags only relax checks (e.g. allow zero GPUs) that the stand-in never makes.
    guarded(state::init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guarded(state::shutdown)
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    // NVML's own wording; static strings, so the pointer stays valid forever as NVML promises.
    let s: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: `version` is valid for `length` bytes (nvml.h contract).
    guarded(|| state::with_scenario(|s| unsafe { put_str(&s.driver_version, version, length) }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `count` is null or valid for a write (nvml.h contract).
    guarded(|| state::with_scenario(|s| unsafe { put(count, s.gpus.len() as c_uint) }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_scenario(|s| {
            if index as usize >= s.gpus.len() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            // SAFETY: `device` is null or valid for a write (nvml.h contract).
            unsafe { put(device, state::handle(index as usize)) }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |_, _| match state::index_of(device) {
            // SAFETY: `index` is null or valid for a write (nvml.h contract).
            Some(i) => unsafe { put(index, i as c_uint) },
            None => NVML_ERROR_INVALID_ARGUMENT,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: `name` is valid for `length` bytes (nvml.h contract).
    guarded(|| state::with_device(device, |gpu, _| unsafe { put_str(&gpu.name, name, length) }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: `uuid` is valid for `length` bytes (nvml.h contract).
    guarded(|| state::with_device(device, |gpu, _| unsafe { put_str(&gpu.uuid, uuid, length) }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |_, now| {
            let value = now
                .util_gpu
                .map(|gpu| nvmlUtilization_t { gpu, memory: now.util_mem.unwrap_or(0) });
            // SAFETY: `utilization` is null or valid for a write (nvml.h contract).
            unsafe { put_known(utilization, value) }
        })
    })
}

/// (total, free, used) in bytes, when the scenario gives the total.
fn memory(gpu: &scenario::Gpu, now: &scenario::State) -> Option<(u64, u64, u64)> {
    let total = gpu.memory_total_bytes?;
    let used = now.memory_used_bytes.unwrap_or(0);
    Some((total, total.saturating_sub(used), used))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory_out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |gpu, now| {
            let value =
                memory(gpu, now).map(|(total, free, used)| nvmlMemory_t { total, free, used });
            // SAFETY: `memory_out` is null or valid for a write (nvml.h contract).
            unsafe { put_known(memory_out, value) }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory_out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |gpu, now| {
            // SAFETY: `memory_out` is null or valid for reads and writes (nvml.h contract).
            let Some(out) = (unsafe { memory_out.as_mut() }) else {
                return NVML_ERROR_INVALID_ARGUMENT;
            };
            // Real NVML refuses a struct of another version rather than misreading it.
            if out.version != NVML_MEMORY_V2 {
                return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
            }
            let Some((total, free, used)) = memory(gpu, now) else {
                return NVML_ERROR_NOT_SUPPORTED;
            };
            *out = nvmlMemory_v2_t { version: NVML_MEMORY_V2, total, reserved: 0, free, used };
            NVML_SUCCESS
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |_, now| {
            if sensor != NVML_TEMPERATURE_GPU {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            // SAFETY: `temp` is null or valid for a write (nvml.h contract).
            unsafe { put_known(temp, now.temperature_c) }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |_, now| match clock_type {
            // SAFETY: `clock` is null or valid for a write (nvml.h contract).
            NVML_CLOCK_SM => unsafe { put_known(clock, now.sm_clock_mhz) },
            t if t < NVML_CLOCK_COUNT => NVML_ERROR_NOT_SUPPORTED,
            _ => NVML_ERROR_INVALID_ARGUMENT,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: `power` is null or valid for a write (nvml.h contract).
    guarded(|| state::with_device(device, |_, now| unsafe { put_known(power, now.power_mw) }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: `reasons` is null or valid for a write (nvml.h contract).
    guarded(|| state::with_device(device, |_, now| unsafe { put(reasons, now.throttle_mask) }))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: same contract; NVML 12.2 renamed this call, the old name stays exported.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device, reasons) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |_, now| {
            // SAFETY: `info_count` is null or valid for reads and writes (nvml.h contract).
            let Some(count) = (unsafe { info_count.as_mut() }) else {
                return NVML_ERROR_INVALID_ARGUMENT;
            };
            let n = now.processes.len();
            // nvml.h: too small a buffer (or none) gets the needed count and INSUFFICIENT_SIZE;
            // no processes is a success with a count of 0 whatever the buffer.
            if n > 0 && (infos.is_null() || (*count as usize) < n) {
                *count = n as c_uint;
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (i, p) in now.processes.iter().enumerate() {
                let info = nvmlProcessInfo_t {
                    pid: p.pid,
                    usedGpuMemory: p.used_bytes.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
                    gpuInstanceId: NVML_NO_INSTANCE,
                    computeInstanceId: NVML_NO_INSTANCE,
                };
                // SAFETY: `infos` is non-null here and holds at least `*count >= n > i` elements.
                unsafe { infos.add(i).write(info) };
            }
            *count = n as c_uint;
            NVML_SUCCESS
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guarded(|| {
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if state::with_scenario(|_| NVML_SUCCESS) != NVML_SUCCESS {
            return NVML_ERROR_UNINITIALIZED;
        }
        // SAFETY: `set` is non-null and valid for a write (nvml.h contract).
        unsafe { put(set, state::event_set_create()) }
    })
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guarded(|| state::event_set_free(set))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guarded(|| state::register_events(device, event_types, set))
}

/// Waits up to `timeout_ms` for a registered GPU's next Xid (polled every 10 ms, as the
/// scenario's clock moves), or answers NVML_ERROR_TIMEOUT.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        if data.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let end = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.into());
        loop {
            match state::next_event(set) {
                Err(e) => return e,
                Ok(Some((dev, xid))) => {
                    let event = nvmlEventData_t {
                        device: state::handle(dev),
                        eventType: NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                        eventData: xid,
                        gpuInstanceId: NVML_NO_INSTANCE,
                        computeInstanceId: NVML_NO_INSTANCE,
                    };
                    // SAFETY: `data` is non-null and valid for a write (nvml.h contract).
                    return unsafe { put(data, event) };
                }
                Ok(None) if std::time::Instant::now() >= end => return NVML_ERROR_TIMEOUT,
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    })
}

/// Copies `text` into a C char array, NUL-terminated (cut to fit).
fn c_chars<const N: usize>(text: &str) -> [std::ffi::c_char; N] {
    let mut out = [0 as std::ffi::c_char; N];
    for (o, b) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *o = b as std::ffi::c_char;
    }
    out
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guarded(|| {
        state::with_device(device, |gpu, _| {
            let Some((domain, bus, dev, func)) = gpu.pci else {
                return NVML_ERROR_NOT_SUPPORTED;
            };
            let info = nvmlPciInfo_t {
                busIdLegacy: c_chars(&format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}")),
                domain,
                bus,
                device: dev,
                pciDeviceId: 0x2335_10de,
                pciSubSystemId: 0,
                busId: c_chars(&format!("{domain:08x}:{bus:02x}:{dev:02x}.{func:x}")),
            };
            // SAFETY: `pci` is null or valid for a write (nvml.h contract); null is refused.
            if pci.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            unsafe { put(pci, info) }
        })
    })
}
