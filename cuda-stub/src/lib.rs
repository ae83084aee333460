//! A stand-in `libcuda.so.1`: the CUDA driver's synchronising calls gpustall probes, exported
//! under their real names, each waiting as a GPU would make its caller wait. Loaded by a real
//! program (Python's ctypes in the tests), so that the real uprobes fire on real calls.
//!
//! `GPUSTALL_CUDA_STUB=spin:MS` (the default, `spin:10`): each call spins on its CPU for MS
//! milliseconds, yielding between checks, as CUDA's default `cudaDeviceScheduleAuto` does;
//! `sleep:MS`: it blocks (as `cudaDeviceScheduleBlockingSync` does).
//! `cuCtxSynchronize` waits by calling `cuStreamSynchronize` (a probed call inside another).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `CUresult`: 0 is `CUDA_SUCCESS`.
type CuResult = i32;

#[derive(Clone, Copy)]
enum Wait {
    Spin(Duration),
    Sleep(Duration),
}

fn scenario() -> Wait {
    static WAIT: OnceLock<Wait> = OnceLock::new();
    *WAIT.get_or_init(|| {
        let s = std::env::var("GPUSTALL_CUDA_STUB").unwrap_or_default();
        let (how, ms) = s.split_once(':').unwrap_or(("spin", "10"));
        let d = Duration::from_millis(ms.parse().unwrap_or(10));
        if how == "sleep" {
            Wait::Sleep(d)
        } else {
            Wait::Spin(d)
        }
    })
}

/// Waits as the scenario says; `extra_ms` more (so that no two calls share a body the linker
/// could fold into one address).
fn wait(extra_ms: u64) -> CuResult {
    match scenario() {
        Wait::Spin(d) => {
            let end = Instant::now() + d + Duration::from_millis(extra_ms);
            while Instant::now() < end {
                // SAFETY: no arguments; gives the CPU to a runnable thread, as CUDA's spin does.
                unsafe { libc::sched_yield() };
            }
        }
        Wait::Sleep(d) => std::thread::sleep(d + Duration::from_millis(extra_ms)),
    }
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: u32) -> CuResult {
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(_stream: *mut std::ffi::c_void) -> CuResult {
    wait(0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(_event: *mut std::ffi::c_void) -> CuResult {
    std::hint::black_box(wait(0))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    cuStreamSynchronize(std::ptr::null_mut())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoH_v2(
    _dst: *mut std::ffi::c_void,
    _src: u64,
    bytes: usize,
) -> CuResult {
    wait(u64::from(bytes > 1 << 30))
}
