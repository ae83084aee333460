//! The slice of NVML's C ABI the stand-in implements, copied from nvml.h as bound by
//! nvml-wrapper-sys 0.10 (`src/bindings.rs`): a layout mismatch here would not fail to link,
//! it would corrupt the caller's memory, so every type below mirrors a binding exactly.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_uint, c_ulonglong, c_void};

/// `nvmlReturn_t` is a C enum, passed as `unsigned int`.
pub type nvmlReturn_t = c_uint;
/// `nvmlDevice_t` is a pointer to an opaque struct; the stand-in's handles are `index + 1`.
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `nvmlTemperatureSensors_t::NVML_TEMPERATURE_GPU`, the only sensor NVML defines.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
/// `nvmlClockType_t::NVML_CLOCK_SM`.
pub const NVML_CLOCK_SM: c_uint = 1;
/// `nvmlClockType_t::NVML_CLOCK_COUNT`: clock types at or above it are invalid.
pub const NVML_CLOCK_COUNT: c_uint = 4;
/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned long long: "used memory unknown".
pub const NVML_VALUE_NOT_AVAILABLE_ULL: c_ulonglong = c_ulonglong::MAX;
/// gpuInstanceId / computeInstanceId of a process outside MIG.
pub const NVML_NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`: the caller sets `version` to `NVML_STRUCT_VERSION(Memory, 2)`.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2` as `NVML_STRUCT_VERSION(Memory, 2)` spells it: size | version << 24.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`), the element type of
/// `nvmlDeviceGetComputeRunningProcesses_v3`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlEventSet_t` is a pointer to an opaque struct; the stand-in's are `id + 1`.
pub type nvmlEventSet_t = *mut c_void;

/// `nvmlEventTypeXidCriticalError`.
pub const NVML_EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 0x8;

/// `nvmlEventData_t`, filled by `nvmlEventSetWait_v2`.
#[repr(C)]
pub struct nvmlEventData_t {
    pub device: nvmlDevice_t,
    pub eventType: c_ulonglong,
    pub eventData: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlPciInfo_t` (v3, as `nvmlDeviceGetPciInfo_v3` fills it).
#[repr(C)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [std::ffi::c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [std::ffi::c_char; 32],
}
