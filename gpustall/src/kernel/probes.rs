//! The probe table: which program attaches to which tracepoint, in what order, and when a
//! program's BTF-typed twin runs instead of it. The rules here are the table's; the loop that
//! applies them is [`crate::kernel::attach`].

use gpustall_common::names::programs;
use gpustall_common::offsets::TracepointOffsets;
use gpustall_common::task::UNKNOWN as TASK_UNKNOWN;

use crate::kernel::layouts::Layouts;
use crate::kernel::tracefs::Tracefs;

/// One program and where it attaches.
#[derive(Clone, Copy, Debug)]
pub(super) struct Probe {
    /// Its name in the object.
    pub(super) program: &'static str,
    /// Tracepoint category (tracefs events/ subdirectory).
    pub(super) category: &'static str,
    /// Candidate events, newest name first: the first the kernel has wins.
    pub(super) events: &'static [&'static str],
    /// Tracing is meaningless without it: its absence is an error, not a warning.
    pub(super) required: bool,
    /// A typed program on the same event, attached instead of `program` where it can run.
    pub(super) typed: Option<Typed>,
}

const fn probe(
    program: &'static str,
    category: &'static str,
    events: &'static [&'static str],
    required: bool,
) -> Probe {
    Probe { program, category, events, required, typed: None }
}

impl Probe {
    /// The same probe with a typed program preferred to its classic one.
    const fn or_typed(self, typed: Typed) -> Probe {
        Probe { typed: Some(typed), ..self }
    }
}

/// A BTF-typed (`tp_btf`) or raw tracepoint program on a probe's event. The kernel hands it
/// the tracepoint's own arguments (pointers to its structs, read at offsets from BTF) instead
/// of the classic record, which it does not build: the program sees more (`task->tgid` of a
/// signal's target thread) and costs less. It is attached instead of the probe's classic
/// program when this kernel's BTF declares the event with the arguments it reads and gives the
/// offsets it needs ([`typed_ready`]); otherwise the classic program runs and `fallback` is said
/// among the degradations, with the reason.
#[derive(Clone, Copy, Debug)]
pub(super) struct Typed {
    /// Its name in the object.
    pub(super) program: &'static str,
    pub(super) kind: TypedKind,
    /// The event's leading arguments the program reads, as BTF spells their types
    /// (`btf_trace_<event>`, less `void *__data`): another prototype means another meaning.
    pub(super) args: &'static [&'static str],
    /// What it needs from [`Layouts`] that this kernel's BTF did not give, if anything.
    pub(super) blocker: fn(&Layouts) -> Option<&'static str>,
    /// What the classic program cannot see, said when it runs instead; `None` where it sees
    /// the same and only costs more (the typed program is there to be cheaper).
    pub(super) fallback: Option<&'static str>,
    /// Where it keeps state its partner reads: attached only if that typed program (attached
    /// earlier in the table) was, and only on these events (empty: any).
    pub(super) pairs: Pairing,
}

/// A typed program that shares state with another: the typed request start and done keep the
/// request in `RQ_SLOTS` (by its address), the classic ones in `IO_INFLIGHT` (by dev and
/// sector), so the two kinds do not pair with each other.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pairing {
    pub(super) requires: Option<&'static str>,
    pub(super) events: &'static [&'static str],
}

const UNPAIRED: Pairing = Pairing { requires: None, events: &[] };

/// How a typed program attaches. Both run from the tracepoint itself (bpf_trace_run), with the
/// same arguments; `tp_btf` needs the kernel's BTF and has the verifier check the arguments'
/// types, `raw_tp` attaches by name alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code, reason = "both kinds are offered to the probe table; not every kind is in use")]
pub(super) enum TypedKind {
    Btf,
    Raw,
}

/// Whether `typed` can run on this kernel (`Ok`), or why the classic program runs instead.
/// `args` is the event's prototype from BTF: `Err` when BTF is unreadable, `Ok(None)` when it
/// has no such tracepoint.
pub(super) fn typed_ready(
    typed: &Typed,
    args: Result<Option<Vec<String>>, &str>,
    layouts: &Layouts,
) -> Result<(), String> {
    let args = match args {
        Err(why) => return Err(why.to_string()),
        Ok(None) => return Err("the kernel's BTF has no typed tracepoint for it".to_string()),
        Ok(Some(a)) => a,
    };
    if !crate::kernel::btf::prototype_matches(&args, typed.args) {
        return Err(format!(
            "its arguments are ({}) on this kernel, not ({}, ..)",
            args.join(", "),
            typed.args.join(", ")
        ));
    }
    match (typed.blocker)(layouts) {
        Some(missing) => Err(format!("BTF does not give {missing}")),
        None => Ok(()),
    }
}

/// Whether a typed program's pairing allows it here (see [`Pairing`]).
pub(super) fn paired(pairs: &Pairing, event: &str, attached: &[&str]) -> Result<(), String> {
    if !pairs.events.is_empty() && !pairs.events.contains(&event) {
        return Err(format!("its partner has no typed program on {event}"));
    }
    match pairs.requires {
        Some(partner) if !attached.contains(&partner) => {
            Err(format!("its partner {partner} runs classic"))
        }
        _ => Ok(()),
    }
}

/// Why `prog` need not run on this kernel, if it need not: the hrtimer programs where the
/// typed sched_waking (attached earlier in the table) tells a wakeup in interrupt context
/// itself (`StackLayout`).
pub(super) fn unneeded(prog: &str, layouts: &Layouts, attached: &[&str]) -> Option<&'static str> {
    let timers = [programs::HRTIMER_EXPIRE_ENTRY, programs::HRTIMER_EXPIRE_EXIT];
    (timers.contains(&prog)
        && layouts.stack.knows()
        && attached.contains(&programs::SCHED_WAKING_BTF))
    .then_some("the typed sched_waking tells interrupt context itself")
}

/// Why the absence of `prog`'s tracepoint loses nothing, if it does not: before 6.5 (no
/// block_io_start) block_bio_queue starts the I/O latency (`bio_starts_io`).
pub(super) fn absence_covered(prog: &str, offsets: &TracepointOffsets) -> Option<&'static str> {
    (prog == programs::BLOCK_IO_START && offsets.bio_starts_io == 1)
        .then_some("block_bio_queue starts the I/O latency instead")
}

/// What is lost, in words, when `typed` could not run on `name` (`why`) and its classic program
/// runs instead. `classic_inflight`: the classic request hash's entries, where it was made
/// small because the typed request programs were expected (`kernel::maps::inflight_entries`).
pub(super) fn fallback_losses(
    typed: &Typed,
    name: &str,
    why: &str,
    attached: &[&str],
    classic_inflight: Option<u32>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(fallback) = typed.fallback {
        notes.push(format!("{name}: {fallback} ({why})"));
    }
    if let (programs::BLOCK_IO_DONE_BTF, Some(inflight)) = (typed.program, classic_inflight) {
        notes.push(format!(
            "{name}: the classic request programs time at most {inflight} requests in flight at once ({why})"
        ));
    }
    // Its partner, attached already, reads state this one will not keep.
    if typed.pairs.requires.is_some_and(|partner| attached.contains(&partner)) {
        notes.push(format!("{name}: block request latency is not measured ({why})"));
    }
    notes
}

/// A reclaim end's typed twin: `nr_reclaimed` is its argument (no field copied out).
const fn reclaim_end(program: &'static str) -> Typed {
    Typed {
        program,
        kind: TypedKind::Btf,
        args: &["long unsigned int"],
        blocker: |_| None,
        fallback: None,
        pairs: UNPAIRED,
    }
}

pub(super) const PROBES: &[Probe] = &[
    probe(programs::TASK_NEWTASK, "task", &["task_newtask"], true),
    probe(programs::SCHED_PROCESS_EXIT, "sched", &["sched_process_exit"], true),
    probe(programs::TASK_RENAME, "task", &["task_rename"], false),
    probe(programs::SCHED_PROCESS_EXEC, "sched", &["sched_process_exec"], false),
    probe(programs::MARK_VICTIM, "oom", &["mark_victim"], false),
    probe(programs::SIGNAL_GENERATE, "signal", &["signal_generate"], false).or_typed(Typed {
        program: programs::SIGNAL_GENERATE_RAW,
        kind: TypedKind::Raw,
        // (int sig, struct kernel_siginfo *info, struct task_struct *task, int group, int result)
        args: &["int", "struct kernel_siginfo *", "struct task_struct *", "int", "int"],
        blocker: |l| (!l.task.knows_signal_target()).then_some("task_struct.tgid/pid/comm"),
        fallback: Some("a fatal signal aimed at a thread other than a process's main thread (tgkill, abort() in a thread) is not seen, nor an OOM kill of such a thread"),
        pairs: UNPAIRED,
    }),
    // Ends attach before their begins (the table is the attach order): a begin seen without
    // its end program would leave the thread "in reclaim" until its next begin.
    probe(programs::DIRECT_RECLAIM_END, "vmscan", &["mm_vmscan_direct_reclaim_end"], false)
        .or_typed(reclaim_end(programs::DIRECT_RECLAIM_END_BTF)),
    probe(programs::MEMCG_RECLAIM_END, "vmscan", &["mm_vmscan_memcg_reclaim_end"], false)
        .or_typed(reclaim_end(programs::MEMCG_RECLAIM_END_BTF)),
    probe(programs::KSWAPD_SLEEP, "vmscan", &["mm_vmscan_kswapd_sleep"], false),
    probe(programs::DIRECT_RECLAIM_BEGIN, "vmscan", &["mm_vmscan_direct_reclaim_begin"], false),
    probe(programs::MEMCG_RECLAIM_BEGIN, "vmscan", &["mm_vmscan_memcg_reclaim_begin"], false),
    probe(programs::KSWAPD_WAKE, "vmscan", &["mm_vmscan_kswapd_wake"], false),
    // mm_vmscan_writepage before 5.18. Typed, it reads the folio's order: pages, not folios.
    probe(
        programs::WRITE_FOLIO,
        "vmscan",
        &["mm_vmscan_write_folio", "mm_vmscan_writepage"],
        false,
    )
    .or_typed(Typed {
        program: programs::WRITE_FOLIO_BTF,
        kind: TypedKind::Btf,
        // `struct folio *`, or `struct page *` for writepage: checked with the layout
        // (kernel::folio::from_btf), since the table takes one prototype.
        args: &[],
        blocker: |l| l.folio.err(),
        fallback: Some(
            "swap-out counted per folio: a THP or mTHP swapped whole counts one page, not its 512 or 16",
        ),
        pairs: UNPAIRED,
    }),
    probe(programs::WAKEUP_KSWAPD, "vmscan", &["mm_vmscan_wakeup_kswapd"], false),
    probe(programs::THROTTLED, "vmscan", &["mm_vmscan_throttled"], false),
    // Stacked devices (dm, md, NVMe multipath) announce each clone here before queueing it on
    // the device below: attached before block_bio_queue, so that no clone is queued unseen
    // (it would count twice).
    probe(programs::BLOCK_BIO_REMAP, "block", &["block_bio_remap"], false),
    // The block and scheduler programs run per bio, request and context switch: their typed
    // twins read the kernel's structs with plain loads instead of copying fields out of a
    // record the kernel built first (see `gpustall_common::blocklayout`). Same data.
    probe(programs::BLOCK_BIO_QUEUE, "block", &["block_bio_queue"], false).or_typed(Typed {
        program: programs::BLOCK_BIO_QUEUE_BTF,
        kind: TypedKind::Btf,
        args: &["struct bio *"],
        blocker: |l| (!l.block.knows_bio()).then_some("bio.bi_bdev/bi_iter, gendisk.major"),
        fallback: None,
        pairs: UNPAIRED,
    }),
    // 6.5+. Before, block_bio_queue starts the latency (`bio_starts_io`) and block_rq_complete
    // ends it: block_io_start's absence is then no loss.
    // The done attaches first (no start without its done); the typed start only where the
    // typed done did, so that both read the request alike.
    probe(programs::BLOCK_IO_DONE, "block", &["block_io_done", "block_rq_complete"], false)
        .or_typed(Typed {
            program: programs::BLOCK_IO_DONE_BTF,
            kind: TypedKind::Btf,
            args: &["struct request *"],
            blocker: |l| (!l.block.knows_request()).then_some("request.q/__sector, queue.disk"),
            fallback: None,
            pairs: Pairing { requires: None, events: &["block_io_done"] },
        }),
    probe(programs::BLOCK_IO_START, "block", &["block_io_start"], false).or_typed(Typed {
        program: programs::BLOCK_IO_START_BTF,
        kind: TypedKind::Btf,
        args: &["struct request *"],
        blocker: |l| (!l.block.knows_request()).then_some("request.q/__sector, queue.disk"),
        fallback: None,
        pairs: Pairing { requires: Some(programs::BLOCK_IO_DONE_BTF), events: &[] },
    }),
    // Off-CPU accounting (kernel::offcpu_maps): wakeups before switches, so that a switch-in is
    // never seen without the wakeup that preceded it.
    probe(programs::SCHED_WAKING, "sched", &["sched_waking"], false).or_typed(Typed {
        program: programs::SCHED_WAKING_BTF,
        kind: TypedKind::Btf,
        args: &["struct task_struct *"],
        blocker: |l| (l.task.task_pid == TASK_UNKNOWN).then_some("task_struct.pid"),
        fallback: None,
        pairs: UNPAIRED,
    }),
    // (bool preempt, prev, next, unsigned int prev_state): the state is an argument since 5.18.
    probe(programs::SCHED_SWITCH, "sched", &["sched_switch"], false).or_typed(Typed {
        program: programs::SCHED_SWITCH_BTF,
        kind: TypedKind::Btf,
        args: &["bool", "struct task_struct *", "struct task_struct *", "unsigned int"],
        blocker: |l| (l.task.task_pid == TASK_UNKNOWN).then_some("task_struct.pid"),
        fallback: Some(crate::kernel::offcpu_maps::NO_SYSCALL_CLASS),
        pairs: UNPAIRED,
    }),
    // A wakeup inside an hrtimer callback is a timeout's, not the interrupted task's doing:
    // the exit attaches first, so a CPU is never left marked "in a timer". Only where
    // sched_waking cannot tell interrupt context itself ([`unneeded`]): they run on
    // every timer of every CPU.
    probe(programs::HRTIMER_EXPIRE_EXIT, "timer", &["hrtimer_expire_exit"], false),
    probe(programs::HRTIMER_EXPIRE_ENTRY, "timer", &["hrtimer_expire_entry"], false),
];

/// The first of `events` this kernel has (the probe table's choice), or the newest name.
fn chosen<'a>(tracefs: &Tracefs, category: &str, events: &[&'a str]) -> &'a str {
    events.iter().copied().find(|e| tracefs.exists(category, e)).unwrap_or(events[0])
}

/// The event `program` attaches to on this kernel (see [`chosen`]).
pub(super) fn event_of(tracefs: &Tracefs, program: &str) -> &'static str {
    let p = PROBES.iter().find(|p| p.program == program).expect("in the probe table");
    chosen(tracefs, p.category, p.events)
}

#[cfg(test)]
mod tests {
    use gpustall_common::{
        names::{maps, programs},
        task::TaskOffsets,
    };

    use super::{typed_ready, Typed, PROBES};
    use crate::kernel::layouts::Layouts;

    /// The object the agent embeds, parsed without the kernel.
    fn object() -> aya_obj::Object {
        let bytes = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall"));
        aya_obj::Object::parse(bytes).expect("the built eBPF object parses")
    }

    #[test]
    fn every_shared_name_is_in_the_built_object() {
        let obj = object();
        let map_names = [
            maps::TRACKED,
            maps::TRACKED_HINT,
            maps::CRITICAL,
            maps::BULK,
            maps::LOST,
            maps::PROC_COUNTERS,
            maps::HOST,
            maps::IO_COUNTERS,
            maps::IO_LATENCY,
            maps::IO_INFLIGHT,
            maps::RQ_SLOTS,
            maps::RQ_HINT,
            maps::OFFCPU_THREADS,
            maps::OFFCPU,
            maps::WAKES,
            maps::SYSCALL_WAITS,
            maps::FEEDERS,
            maps::GPU_CALLS,
            maps::GPU_WAITS,
            // aya-log-ebpf's, which the loader sizes and the logger reads.
            crate::kernel::klog::LOG_MAP,
        ];
        for m in map_names {
            assert!(
                obj.maps.contains_key(m),
                "map {m} is not in the object: {:?}",
                obj.maps.keys()
            );
        }
        let mut table: Vec<&str> = PROBES
            .iter()
            .flat_map(|p| [Some(p.program), p.typed.map(|t| t.program)])
            .flatten()
            .collect();
        // The CUDA uprobes, attached per library by `kernel::cuda`, not by the table.
        table.extend([programs::CUDA_SYNC_ENTER, programs::CUDA_SYNC_EXIT]);
        for p in &table {
            assert!(obj.programs.contains_key(*p), "program {p} is not in the object");
        }
        // Every program of the object is attached by the table or kernel::cuda (none forgotten).
        assert_eq!(obj.programs.len(), table.len(), "{:?}", obj.programs.keys());
    }

    fn signal_typed() -> Typed {
        PROBES
            .iter()
            .find_map(|p| p.typed.filter(|t| t.program == programs::SIGNAL_GENERATE_RAW))
            .expect("signal_generate has a typed program")
    }

    #[test]
    fn a_typed_program_runs_only_where_the_kernel_can_run_it() {
        let typed = signal_typed();
        let known = Layouts {
            task: TaskOffsets {
                task_pid: 1,
                task_tgid: 2,
                task_comm: 3,
                task_signal: 4,
                signal_live: 5,
                siginfo_code: 8,
            },
            ..Layouts::unknown()
        };
        let proto = |a: &[&str]| Ok(Some(a.iter().map(|s| s.to_string()).collect()));
        let this_kernel =
            proto(&["int", "struct kernel_siginfo *", "struct task_struct *", "int", "int"]);
        assert_eq!(typed_ready(&typed, this_kernel.clone(), &known), Ok(()));
        // No BTF at all, or no such tracepoint in it: the classic program, with the reason.
        let no_btf = typed_ready(&typed, Err("cannot read /sys/kernel/btf/vmlinux"), &known);
        assert!(no_btf.unwrap_err().contains("vmlinux"));
        assert!(typed_ready(&typed, Ok(None), &known).is_err());
        // Another prototype (the task moved): never read a pointer where an int is.
        let other = typed_ready(&typed, proto(&["int", "struct task_struct *"]), &known);
        assert!(other.unwrap_err().contains("not (int"), "the reason names both prototypes");
        // The prototype fits but BTF did not give the task's offsets.
        let blocked = typed_ready(&typed, this_kernel, &Layouts::unknown());
        assert!(blocked.unwrap_err().contains("tgid"));
    }

    /// The folio-reading write_folio runs where BTF gave the folio's layout, whatever the
    /// event's argument (folio or page: checked with the layout); else the per-folio fallback.
    #[test]
    fn write_folio_counts_pages_only_with_the_folio_layout() {
        let typed = PROBES
            .iter()
            .find_map(|p| p.typed.filter(|t| t.program == programs::WRITE_FOLIO_BTF))
            .expect("write_folio has a typed program");
        let args = || Ok(Some(vec!["struct page *".to_string()]));
        let layout = gpustall_common::folio::FolioLayout {
            flags: 0,
            order: 64,
            head_bit: 6,
            swapbacked_bit: 17,
        };
        let known = Layouts { folio: Ok(layout), ..Layouts::unknown() };
        assert_eq!(typed_ready(&typed, args(), &known), Ok(()));
        let why = typed_ready(&typed, args(), &Layouts::unknown()).unwrap_err();
        assert!(why.contains("folio"), "{why}");
        assert!(typed.fallback.unwrap().starts_with("swap-out counted per folio"));
    }
}
