//! Reading every GPU once per tick through NVML (nvml-wrapper), onto the eBPF clock.

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};

use crate::{
    model::gpu::sample::{throttle_names, GpuProcess, GpuSample},
    sources::clock::monotonic_ns,
};
use std::ffi::OsString;
use std::path::Path;

/// Environment variable naming the NVML library when `--nvml-lib` is not given.
pub const NVML_LIB_ENV: &str = "GPUSTALL_NVML_LIB";

/// NVML's default library name (what nvml-wrapper loads when given no path).
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Why there is no GPU data. Each Display is one line meant for the user as it stands.
#[derive(Debug, thiserror::Error)]
pub enum GpuUnavailable {
    #[error("no NVIDIA driver ({lib} could not be loaded: {detail}): GPU data is off; pass --nvml-lib PATH if it is elsewhere")]
    NoLibrary { lib: String, detail: String },
    #[error("{lib} is not a usable NVML library ({detail}): GPU data is off; pass --nvml-lib PATH to the driver's libnvidia-ml.so.1")]
    NotNvml { lib: String, detail: String },
    #[error("the NVIDIA kernel driver is not loaded (NVML: {detail}): GPU data is off")]
    DriverNotLoaded { detail: String },
    #[error("NVML failed to start ({detail}): GPU data is off")]
    InitFailed { detail: String },
    #[error("NVML could not count the GPUs ({detail}): GPU data is off")]
    CountFailed { detail: String },
    #[error("NVML found no GPU: GPU data is off")]
    NoGpu,
}

/// One line, whatever the library's message holds: the Display promise above depends on it.
fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

impl GpuUnavailable {
    fn from_init(lib: &str, e: NvmlError) -> Self {
        let detail = one_line(&e);
        match e {
            NvmlError::LibloadingError(_) => Self::NoLibrary { lib: lib.to_string(), detail },
            NvmlError::FailedToLoadSymbol(_) => Self::NotNvml { lib: lib.to_string(), detail },
            NvmlError::DriverNotLoaded => Self::DriverNotLoaded { detail },
            _ => Self::InitFailed { detail },
        }
    }
}

/// What does not change while a GPU is up: read once at open.
struct GpuIdentity {
    uuid: String,
    name: String,
    /// "0000:3b:00", as the driver's kernel-log lines name the GPU (`pci_bus`).
    pci_bus_id: Option<String>,
}

/// NVML's PCI address as the NVIDIA driver writes it in its kernel-log lines ("NVRM: Xid
/// (PCI:0000:3b:00)"): domain, bus and device, lower-case hex, no function.
pub fn pci_bus(domain: u32, bus: u32, device: u32) -> String {
    format!("{:04x}:{bus:02x}:{device:02x}", domain & 0xffff)
}

/// NVML, open, with the GPUs it saw at start, and the event sets their critical Xid errors
/// come through. The event sets borrow NVML: it is boxed and leaked at open so that they can
/// live beside it, and freed after them on drop (nvmlShutdown then runs as before).
pub struct GpuSampler {
    nvml: &'static Nvml,
    gpus: Vec<GpuIdentity>,
    events: Vec<(u32, EventSet<'static>)>,
}

impl Drop for GpuSampler {
    fn drop(&mut self) {
        // The event sets first: they borrow NVML.
        self.events.clear();
        let nvml: *const Nvml = self.nvml;
        // SAFETY: `nvml` came from `Box::leak` in `open` and nothing borrows it any more (the
        // event sets are gone, devices are only borrowed within a call); it is freed once.
        drop(unsafe { Box::from_raw(nvml.cast_mut()) });
    }
}

/// Whether `path` is a regular file holding a whole 64-bit little-endian ELF object: its
/// header, program and section header tables, and every segment's bytes within the file.
fn loadable_elf(path: &Path) -> Result<(), String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?;
    if !len.is_file() {
        return Err("not a regular file".into());
    }
    let len = len.len();
    // Headers only: an NVML library is a few MB, its tables are within the first read.
    let mut head = Vec::new();
    f.by_ref().take(1 << 20).read_to_end(&mut head).map_err(|e| e.to_string())?;
    elf_within(&head, len)
}

/// The checks of [`loadable_elf`] on the file's first bytes `head` and its length.
fn elf_within(head: &[u8], len: u64) -> Result<(), String> {
    let u16_at = |o: usize| head.get(o..o + 2).map(|b| u64::from(u16::from_le_bytes([b[0], b[1]])));
    let u64_at =
        |o: usize| head.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return Err("not a 64-bit little-endian ELF library".into());
    }
    let short = || "truncated: its headers point past its end".to_string();
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    let (shoff, shentsize, shnum) = (u64_at(40), u16_at(58), u16_at(60));
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return Err(short());
    };
    let table_end = |off: u64, size: u64, n: u64| off.checked_add(size.checked_mul(n)?);
    let ph_end = table_end(phoff, phentsize, phnum).ok_or_else(short)?;
    let sh_end = match (shoff, shentsize, shnum) {
        (Some(o), Some(s), Some(n)) => table_end(o, s, n).ok_or_else(short)?,
        _ => return Err(short()),
    };
    if ph_end > len || sh_end > len {
        return Err(short());
    }
    for i in 0..phnum {
        let at = (phoff + i * phentsize) as usize;
        let (Some(offset), Some(filesz)) = (u64_at(at + 8), u64_at(at + 32)) else {
            return Err(short());
        };
        if offset.checked_add(filesz).is_none_or(|end| end > len) {
            return Err(short());
        }
    }
    Ok(())
}

impl GpuSampler {
    /// Loads NVML from `lib_path`, else from `$GPUSTALL_NVML_LIB`, else the driver's default,
    /// and lists the GPUs. Errors say, in one line, that GPU data is off and why.
    pub fn open(lib_path: Option<&Path>) -> Result<GpuSampler, GpuUnavailable> {
        let lib: OsString = match lib_path {
            Some(p) => p.as_os_str().to_owned(),
            None => std::env::var_os(NVML_LIB_ENV)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| DEFAULT_LIB.into()),
        };
        let shown = lib.to_string_lossy().into_owned();
        // A path (not a name for the loader to search) is checked first: dlopen of a FIFO
        // blocks for ever, of a truncated library dies of SIGBUS when a segment is mapped.
        if lib.as_encoded_bytes().contains(&b'/') && Path::new(&lib).exists() {
            loadable_elf(Path::new(&lib))
                .map_err(|detail| GpuUnavailable::NotNvml { lib: shown.clone(), detail })?;
        }
        let nvml = Nvml::builder()
            .lib_path(&lib)
            .init()
            .map_err(|e| GpuUnavailable::from_init(&shown, e))?;
        let count = nvml
            .device_count()
            .map_err(|e| GpuUnavailable::CountFailed { detail: one_line(&e) })?;
        if count == 0 {
            return Err(GpuUnavailable::NoGpu);
        }
        let gpus = (0..count)
            .map(|i| {
                let dev = nvml.device_by_index(i);
                let field = |f: fn(&nvml_wrapper::Device) -> Result<String, NvmlError>| {
                    // An unreadable name or UUID is left empty: the index still identifies it.
                    dev.as_ref().ok().and_then(|d| f(d).ok()).unwrap_or_default()
                };
                let pci = dev.as_ref().ok().and_then(|d| d.pci_info().ok());
                GpuIdentity {
                    uuid: field(|d| d.uuid()),
                    name: field(|d| d.name()),
                    pci_bus_id: pci.map(|p| pci_bus(p.domain, p.bus, p.device)),
                }
            })
            .collect();
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let events = xid_events(nvml, count);
        Ok(GpuSampler { nvml, gpus, events })
    }

    /// How many GPUs this sampler reads.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// The driver's version string, if NVML gives one (for the recording's header).
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// One sample per GPU, in index order. Never fails: what NVML cannot read is `None`.
    pub fn sample(&mut self) -> Vec<GpuSample> {
        let mut samples: Vec<GpuSample> =
            (0..self.gpus.len()).map(|i| self.sample_one(i)).collect();
        for (index, xid) in self.drain_xids() {
            if let Some(s) = samples.get_mut(index as usize) {
                s.xids.push(xid);
            }
        }
        samples
    }

    /// The critical Xid errors NVML queued since the last call: (GPU index, Xid). Bounded: a
    /// GPU raising them without end is read again next tick.
    fn drain_xids(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for (index, set) in &self.events {
            for _ in 0..64 {
                match set.wait(0) {
                    Ok(e) => out.push((
                        *index,
                        match e.event_data {
                            Some(XidError::Value(v)) => v,
                            Some(XidError::Unknown) | None => 999,
                        },
                    )),
                    Err(NvmlError::Timeout) => break,
                    Err(e) => {
                        log::debug!("NVML event wait on GPU {index}: {e}");
                        break;
                    }
                }
            }
        }
        out
    }

    fn sample_one(&self, i: usize) -> GpuSample {
        let id = &self.gpus[i];
        let mut s = GpuSample {
            t_ns: monotonic_ns(),
            index: i as u32,
            uuid: id.uuid.clone(),
            name: id.name.clone(),
            pci_bus_id: id.pci_bus_id.clone(),
            ..GpuSample::default()
        };
        // A GPU that fell off the bus still yields a sample, with nothing known.
        let Ok(dev) = self.nvml.device_by_index(i as u32) else {
            return s;
        };
        if let Ok(u) = dev.utilization_rates() {
            s.util_gpu_pct = Some(u.gpu);
            s.util_mem_pct = Some(u.memory);
        }
        if let Ok(m) = dev.memory_info() {
            s.mem_used_bytes = Some(m.used);
            s.mem_total_bytes = Some(m.total);
        }
        s.temperature_c = dev.temperature(TemperatureSensor::Gpu).ok();
        s.sm_clock_mhz = dev.clock_info(Clock::SM).ok();
        s.power_mw = dev.power_usage().ok();
        if let Ok(r) = dev.current_throttle_reasons() {
            s.throttle_mask = r.bits();
            s.throttle_reasons = throttle_names(s.throttle_mask);
        }
        s.processes = dev
            .running_compute_processes()
            .map(|ps| {
                ps.into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        s
    }
}

/// Per GPU (index), an event set with its critical Xid errors registered: one set each, since
/// NVML frees a set a registration fails on. A GPU, driver or NVML without events has none:
/// said once, not an error (the kernel log still has the driver's Xid lines).
fn xid_events(nvml: &'static Nvml, count: u32) -> Vec<(u32, EventSet<'static>)> {
    let mut sets = Vec::new();
    for i in 0..count {
        let registered = nvml.create_event_set().map_err(|e| e.to_string()).and_then(|set| {
            let dev = nvml.device_by_index(i).map_err(|e| e.to_string())?;
            dev.register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| e.error.to_string())
        });
        match registered {
            Ok(set) => sets.push((i, set)),
            Err(e) => log::info!(
                "NVML gives no Xid events for GPU {i} ({e}): its faults are read from the kernel log only"
            ),
        }
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_foreign_library_is_refused_before_loading() {
        let me = std::fs::read("/proc/self/exe").expect("this test binary, an ELF");
        let len = me.len() as u64;
        assert_eq!(elf_within(&me, len), Ok(()));
        assert!(elf_within(&me, len / 2).is_err_and(|e| e.contains("truncated")));
        assert!(elf_within(b"#!/bin/sh\n", 10).is_err_and(|e| e.contains("not a 64-bit")));
        let fifo = std::env::temp_dir().join(format!("gpustall-nvml-fifo-{}", std::process::id()));
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = loadable_elf(&fifo);
        let _ = std::fs::remove_file(&fifo);
        assert_eq!(e, Err("not a regular file".to_string()), "refused, not blocked on");
    }

    /// The stand-in library `cargo build -p nvml-stub` made, in this build's target directory
    /// (`CARGO_TARGET_DIR` when set, as it is for parallel work trees; `./target` otherwise).
    fn stub() -> std::path::PathBuf {
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
            std::path::PathBuf::from,
        );
        target.join("debug/libnvidia_ml_stub.so")
    }
    const MIB: u64 = 1024 * 1024;

    #[test]
    fn throttle_names_leave_out_gpu_idle() {
        assert_eq!(throttle_names(0x1 | 0x4 | 0x40), vec!["sw_power_cap", "hw_thermal_slowdown"]);
        assert!(throttle_names(0x1).is_empty());
    }

    #[test]
    fn monotonic_ns_is_the_monotonic_clock() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(a > 0 && b - a >= 5_000_000, "{a} {b}");
    }

    #[test]
    fn missing_library_is_one_clear_line() {
        let Err(e) = GpuSampler::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))) else {
            panic!("opened a library that does not exist");
        };
        let msg = e.to_string();
        assert!(matches!(e, GpuUnavailable::NoLibrary { .. }), "{e:?}");
        assert!(msg.starts_with("no NVIDIA driver (/nonexistent/libnvidia-ml.so.1"), "{msg}");
        assert!(msg.contains("GPU data is off") && !msg.contains('\n'), "{msg}");
    }

    fn write_scenario(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write scenario");
        path
    }

    /// Two GPUs: GPU 0 busy then idle and hot at 0.3 s (with an Xid), the trainer (this test's
    /// process) among its processes; GPU 1 gives only utilisation.
    fn two_gpus(dir: &Path) -> std::path::PathBuf {
        write_scenario(
            dir,
            "two-gpus.json",
            r#"{"gpus":[
              {"name":"Stand-in H200","uuid":"GPU-stub-0","pci_bus_id":"0000:3b:00.0","memory_total_mib":143771,"timeline":[
                {"at_s":0,"util_gpu":95,"util_mem":40,"memory_used_mib":60000,"temperature_c":60,
                 "sm_clock_mhz":1980,"power_w":600.5,"throttle":["gpu_idle","sw_power_cap"],
                 "pids":[{"pid":"$GPUSTALL_TEST_TRAINER_PID","used_mib":50000},{"pid":77}]},
                {"at_s":0.3,"util_gpu":0,"temperature_c":91,"throttle":["hw_thermal_slowdown"],
                 "xid":79}]},
              {"name":"Stand-in H200","uuid":"GPU-stub-1","timeline":[{"at_s":0,"util_gpu":3}]}]}"#,
        )
    }

    /// The first sample of [`two_gpus`], taken between `before` and `after`.
    fn check_first_sample(first: &[GpuSample], me: u32, before: u64, after: u64) {
        assert_eq!(first.len(), 2);
        let g0 = &first[0];
        assert!(g0.t_ns >= before && g0.t_ns <= after, "sample time on CLOCK_MONOTONIC");
        assert_eq!(
            (g0.index, g0.uuid.as_str(), g0.name.as_str()),
            (0, "GPU-stub-0", "Stand-in H200")
        );
        assert_eq!((g0.util_gpu_pct, g0.util_mem_pct), (Some(95), Some(40)));
        assert_eq!(
            (g0.mem_used_bytes, g0.mem_total_bytes),
            (Some(60000 * MIB), Some(143771 * MIB))
        );
        assert_eq!(
            (g0.temperature_c, g0.sm_clock_mhz, g0.power_mw),
            (Some(60), Some(1980), Some(600_500))
        );
        assert_eq!(
            (g0.throttle_mask, g0.throttle_reasons.clone()),
            (0x5, vec!["sw_power_cap".to_string()])
        );
        assert_eq!(
            g0.processes,
            vec![
                GpuProcess { pid: me, used_bytes: Some(50000 * MIB) },
                GpuProcess { pid: 77, used_bytes: None }
            ]
        );
        // GPU 1's scenario gives only utilisation: everything else is unknown, not zero.
        let g1 = &first[1];
        assert_eq!(
            (g1.index, g1.uuid.as_str(), g1.util_gpu_pct, g1.util_mem_pct),
            (1, "GPU-stub-1", Some(3), Some(0))
        );
        assert_eq!(
            (g1.mem_used_bytes, g1.temperature_c, g1.sm_clock_mhz, g1.power_mw),
            (None, None, None, None)
        );
        assert!(g1.processes.is_empty() && g1.throttle_mask == 0);
    }

    /// A sample of [`two_gpus`] after 0.3 s (`first`: the first one).
    fn check_later_sample(sampler: &mut GpuSampler, first: &[GpuSample]) {
        let later = sampler.sample();
        let g0 = &later[0];
        assert_eq!(
            (g0.util_gpu_pct, g0.temperature_c, g0.power_mw),
            (Some(0), Some(91), Some(600_500))
        );
        assert_eq!(g0.throttle_reasons, vec!["hw_thermal_slowdown".to_string()]);
        assert_eq!(g0.processes.len(), 2);
        assert_eq!(g0.pci_bus_id.as_deref(), Some("0000:3b:00"), "as the driver's Xid lines");
        assert_eq!(first[1].pci_bus_id, None, "a GPU whose PCI address NVML does not give");
        // The Xid raised at 0.3 s comes once, through NVML's event set, on its GPU only.
        assert_eq!((first[0].xids.len(), later[0].xids.clone()), (0, vec![79]));
        assert!(later[1].xids.is_empty() && sampler.sample()[0].xids.is_empty());
    }

    /// No GPU, no scenario, a broken scenario: each a clear refusal.
    fn check_refusals(dir: &Path, stub: &Path) {
        std::env::set_var(
            "GPUSTALL_NVML_STUB_SCENARIO",
            write_scenario(dir, "none.json", r#"{"gpus":[]}"#),
        );
        let e = GpuSampler::open(Some(stub)).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("NVML found no GPU: GPU data is off"));
        std::env::set_var("GPUSTALL_NVML_STUB_SCENARIO", dir.join("absent.json"));
        let e = GpuSampler::open(Some(stub)).err();
        assert!(matches!(e, Some(GpuUnavailable::DriverNotLoaded { .. })), "{e:?}");
        let bad = write_scenario(
            dir,
            "bad.json",
            r#"{"gpus":[{"name":"x","uuid":"u","timeline":[{"at_s":0,"throttle":["hot"]}]}]}"#,
        );
        std::env::set_var("GPUSTALL_NVML_STUB_SCENARIO", bad);
        let e = GpuSampler::open(Some(stub)).err();
        assert!(matches!(e, Some(GpuUnavailable::InitFailed { .. })), "{e:?}");
    }

    /// The real nvml-wrapper against the stand-in library. One test on purpose: the scenario
    /// is named by a process-wide environment variable, and the stub's state is global.
    #[test]
    fn samples_the_stub_through_real_nvml_wrapper() {
        let stub = stub();
        let stub = stub.as_path();
        assert!(
            stub.exists(),
            "{} is missing: build it first: cargo build -p nvml-stub",
            stub.display()
        );
        let dir = std::env::temp_dir().join(format!("gpustall-nvml-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let me = std::process::id();
        std::env::set_var("GPUSTALL_TEST_TRAINER_PID", me.to_string());

        let scenario = two_gpus(&dir);
        std::env::set_var("GPUSTALL_NVML_STUB_SCENARIO", &scenario);
        let mut sampler = match GpuSampler::open(Some(stub)) {
            Ok(s) => s,
            Err(e) => panic!("open the stub: {e}"),
        };
        assert_eq!(sampler.gpu_count(), 2);
        assert_eq!(sampler.driver_version().as_deref(), Some("nvml-stub"));
        let before = monotonic_ns();
        let first = sampler.sample();
        let after = monotonic_ns();
        check_first_sample(&first, me, before, after);
        // The timeline is a step function of the time since nvmlInit.
        std::thread::sleep(std::time::Duration::from_millis(400));
        check_later_sample(&mut sampler, &first);
        drop(sampler);

        check_refusals(&dir, stub);
        // The library path may also come from the environment.
        std::env::set_var("GPUSTALL_NVML_STUB_SCENARIO", &scenario);
        std::env::set_var(NVML_LIB_ENV, stub);
        let from_env = GpuSampler::open(None).map(|s| s.gpu_count());
        std::env::remove_var(NVML_LIB_ENV);
        assert_eq!(from_env.ok(), Some(2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
