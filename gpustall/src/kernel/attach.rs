//! The attach loop: each probe of the table ([`PROBES`], in its order) onto the tracepoint this
//! kernel has, its typed program where it can run, else its classic one. A tracepoint the
//! kernel lacks or refuses is a warning, unless the probe is required.

use aya::{
    programs::{BtfTracePoint, RawTracePoint, TracePoint},
    Ebpf,
};
use gpustall_common::names::programs;
use gpustall_common::offsets::TracepointOffsets;

use crate::kernel::layouts::Layouts;
use crate::kernel::loader::{LoadError, LoadOptions};
use crate::kernel::probes::{
    absence_covered, fallback_losses, paired, typed_ready, unneeded, Probe, Typed, TypedKind,
    PROBES,
};
use crate::kernel::tracefs::Tracefs;

/// What the loop knows of this kernel.
pub(super) struct Kernel<'a> {
    pub tracefs: &'a Tracefs,
    /// The kernel's BTF, or why it is unreadable.
    pub btf: Result<&'a btf_rs::Btf, &'a str>,
    pub layouts: &'a Layouts,
    /// The tracepoint offsets the programs were loaded with.
    pub offsets: &'a TracepointOffsets,
}

/// What was attached, and what not.
#[derive(Default)]
pub(super) struct Attached {
    /// `category:event` of each tracepoint a program runs on.
    pub names: Vec<String>,
    /// The programs attached (a probe's typed or its classic one).
    pub programs: Vec<&'static str>,
    /// `category:event` of each tracepoint the kernel lacks or refused.
    pub skipped: Vec<String>,
    /// What runs degraded, in words.
    pub degraded: Vec<String>,
}

/// Attaches every probe of the table this run wants (`options`) and the kernel has.
/// `classic_inflight`: see [`fallback_losses`].
pub(super) fn attach_all(
    ebpf: &mut Ebpf,
    kernel: &Kernel<'_>,
    options: &LoadOptions,
    classic_inflight: Option<u32>,
) -> Result<Attached, LoadError> {
    let mut attacher =
        Attacher { kernel, options, classic_inflight, aya_btf: None, out: Attached::default() };
    for probe in PROBES {
        attacher.probe(ebpf, probe)?;
    }
    Ok(attacher.out)
}

struct Attacher<'a> {
    kernel: &'a Kernel<'a>,
    options: &'a LoadOptions,
    classic_inflight: Option<u32>,
    /// aya's own parse of the kernel's BTF, made once and only if a tp_btf program loads.
    aya_btf: Option<Result<aya::Btf, String>>,
    out: Attached,
}

impl Attacher<'_> {
    fn probe(&mut self, ebpf: &mut Ebpf, probe: &Probe) -> Result<(), LoadError> {
        if !self.options.wants(probe.program) {
            return Ok(());
        }
        if let Some(why) = unneeded(probe.program, self.kernel.layouts, &self.out.programs) {
            log::debug!("{}: not attached: {why}", probe.program);
            return Ok(());
        }
        let tracefs = self.kernel.tracefs;
        let Some(&event) = probe.events.iter().find(|e| tracefs.exists(probe.category, e)) else {
            return self.absent(probe);
        };
        let name = format!("{}:{event}", probe.category);
        if let Some(typed) = &probe.typed {
            if self.typed(ebpf, typed, event, &name) {
                return Ok(());
            }
        }
        self.classic(ebpf, probe, event, name)
    }

    /// A probe whose tracepoint this kernel has under none of its names.
    fn absent(&mut self, probe: &Probe) -> Result<(), LoadError> {
        let name = format!("{}:{}", probe.category, probe.events[0]);
        if probe.required {
            return Err(LoadError::MissingRequired(name));
        }
        if let Some(why) = absence_covered(probe.program, self.kernel.offsets) {
            log::debug!("no {name}: {why}");
            return Ok(());
        }
        log::debug!("this kernel has no tracepoint {name}: skipping it");
        self.out.skipped.push(name);
        Ok(())
    }

    /// Attaches the typed program if it can run here; `false` (the reason logged, and said
    /// among the degradations where the classic program sees less) if the classic one must.
    fn typed(&mut self, ebpf: &mut Ebpf, typed: &Typed, event: &str, name: &str) -> bool {
        let ready = typed_ready(typed, self.typed_args(event), self.kernel.layouts)
            .and_then(|()| paired(&typed.pairs, event, &self.out.programs))
            .and_then(|()| {
                attach_typed(ebpf, typed, event, &mut self.aya_btf)
                    .map_err(|e| format!("the kernel refused it: {e}"))
            });
        match ready {
            Ok(()) => {
                log::debug!("{name}: typed program {} attached", typed.program);
                self.out.names.push(name.to_string());
                self.out.programs.push(typed.program);
                true
            }
            Err(why) => {
                log::debug!("{name}: no typed program ({why}): the classic one runs");
                let losses =
                    fallback_losses(typed, name, &why, &self.out.programs, self.classic_inflight);
                self.out.degraded.extend(losses);
                false
            }
        }
    }

    /// The event's prototype from BTF, for [`typed_ready`].
    fn typed_args(&self, event: &str) -> Result<Option<Vec<String>>, &str> {
        if self.options.classic_only {
            // Tests take the path of kernels without BTF on one that has it.
            return Err("GPUSTALL_TEST_CLASSIC_ONLY is set");
        }
        self.kernel.btf.map(|b| crate::kernel::btf::tracepoint_args(b, event))
    }

    /// Loads and attaches the probe's classic program; a refusal is fatal only if required.
    fn classic(
        &mut self,
        ebpf: &mut Ebpf,
        probe: &Probe,
        event: &str,
        name: String,
    ) -> Result<(), LoadError> {
        let prog = probe.program;
        let program: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| LoadError::MissingRequired(format!("program {prog}")))?
            .try_into()
            .map_err(|source| LoadError::Attach { tracepoint: name.clone(), source })?;
        let result =
            program.load().and_then(|()| program.attach(probe.category, event).map(|_| ()));
        match result {
            Ok(()) => {
                self.out.names.push(name);
                self.out.programs.push(prog);
            }
            Err(source) if probe.required => {
                return Err(LoadError::Attach { tracepoint: name, source })
            }
            Err(e) => {
                log::warn!("cannot attach {name}: {e}; going on without it");
                let refused = format!("{name}: the kernel refused its program: {}", tail_of(&e));
                self.out.degraded.push(refused);
                self.out.skipped.push(name);
            }
        }
        Ok(())
    }
}

/// Whether the typed block_io_start and block_io_done can both run here, as the attach loop
/// will find (BTF and tracepoints; the caller checks the test switch to classic programs).
pub(super) fn typed_requests_expected(kernel: &Kernel<'_>) -> bool {
    let Ok(btf) = kernel.btf else { return false };
    [(programs::BLOCK_IO_DONE, "block_io_done"), (programs::BLOCK_IO_START, "block_io_start")]
        .into_iter()
        .all(|(program, event)| {
            let typed = PROBES.iter().find(|p| p.program == program).and_then(|p| p.typed);
            typed.is_some_and(|typed| {
                kernel.tracefs.exists("block", event)
                    && typed_ready(
                        &typed,
                        Ok(crate::kernel::btf::tracepoint_args(btf, event)),
                        kernel.layouts,
                    )
                    .is_ok()
            })
        })
}

/// Loads and attaches a typed program on `event`; `aya_btf` caches aya's parse of the
/// kernel's BTF (tp_btf programs are loaded against the event's `btf_trace_` type).
fn attach_typed(
    ebpf: &mut Ebpf,
    typed: &Typed,
    event: &str,
    aya_btf: &mut Option<Result<aya::Btf, String>>,
) -> Result<(), String> {
    let program = ebpf
        .program_mut(typed.program)
        .ok_or_else(|| format!("program {} is not in the object", typed.program))?;
    match typed.kind {
        TypedKind::Btf => {
            let btf = aya_btf
                .get_or_insert_with(|| aya::Btf::from_sys_fs().map_err(|e| e.to_string()))
                .as_ref()
                .map_err(Clone::clone)?;
            let p: &mut BtfTracePoint = program.try_into().map_err(|e| format!("{e}"))?;
            p.load(event, btf).map_err(|e| format!("{e}"))?;
            p.attach().map(|_| ()).map_err(|e| format!("{e}"))
        }
        TypedKind::Raw => {
            let p: &mut RawTracePoint = program.try_into().map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("{e}"))?;
            p.attach(event).map(|_| ()).map_err(|e| format!("{e}"))
        }
    }
}

/// The end of an error that may carry the verifier's whole log: its last lines, where the
/// verifier says what it refused, on one line.
fn tail_of(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(4)..].join(" | ");
    match tail.char_indices().nth(400) {
        Some((cut, _)) => format!("{}...", &tail[..cut]),
        None => tail,
    }
}

/// Detaches and unloads every program, all at once: each detach waits for the kernel's RCU
/// grace period (75-85 ms on the machine measured), and one after the other they held every
/// trace's exit back by about a second. One thread per program lets the waits overlap.
pub fn detach_all(ebpf: &mut Ebpf) {
    std::thread::scope(|s| {
        for (name, program) in ebpf.programs_mut() {
            s.spawn(move || {
                if let Err(e) = unload(program) {
                    log::debug!("unloading {name}: {e}");
                }
            });
        }
    });
}

/// Detaches `program`'s links and unloads it (a program not loaded is left alone).
fn unload(program: &mut aya::programs::Program) -> Result<(), aya::programs::ProgramError> {
    use aya::programs::Program as P;
    match program {
        P::TracePoint(p) => p.unload(),
        P::BtfTracePoint(p) => p.unload(),
        P::RawTracePoint(p) => p.unload(),
        P::UProbe(p) => p.unload(),
        _ => Ok(()),
    }
}
