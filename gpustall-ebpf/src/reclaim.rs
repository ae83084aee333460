//! The memory-pressure chain: reclaim stalls paired per thread, swap-out counted per process,
//! kswapd wakeups and reclaim throttling.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use gpustall_common::{
    counters::{HostCounter, LostCounter},
    events::{EventKind, ReclaimEvent, ThrottledEvent},
    folio::{pages, FolioLayout},
    reclaim::{on_begin, on_end, on_kswapd_wake, EndOutcome, ReclaimKind},
};

use crate::{
    common::{
        add_lost, add_per_cpu, current_ids, emit_bulk, field, header, header_at, is_tracked,
        offset, proc_add, HOST, RECLAIM_START,
    },
    diag::{kdebug, kwarn},
};

/// A begin always starts a new episode (see `on_begin`): no lookup of what was there.
#[inline(always)]
fn begin(kind: ReclaimKind) -> u32 {
    let (_, tid) = current_ids();
    let next = on_begin(kind, unsafe { bpf_ktime_get_ns() });
    if RECLAIM_START.insert(tid, next, 0).is_err() {
        add_lost(LostCounter::MapFull);
        kwarn!("RECLAIM_START is full: a reclaim of thread {} is not timed", tid);
    }
    0
}

/// A reclaim ends: `nr_reclaimed` is read only for a tracked thread.
#[inline(always)]
fn end(nr_reclaimed: impl FnOnce() -> u64) -> u32 {
    let (pid, tid) = current_ids();
    // SAFETY: the value is copied out at once.
    let existing = unsafe { RECLAIM_START.get(tid) }.copied();
    let now = unsafe { bpf_ktime_get_ns() };
    let (kind, start_ns, duration_ns) = match on_end(existing.as_ref(), now) {
        EndOutcome::Unmatched => {
            kdebug!("a reclaim of thread {} ends without its begin: not timed", tid);
            return 0;
        }
        EndOutcome::Complete { kind, start_ns, duration_ns } => (kind, start_ns, duration_ns),
    };
    let _ = RECLAIM_START.remove(tid);
    if kind == ReclaimKind::Kswapd as u32 {
        // Only kswapd_sleep ends a kswapd episode (see kswapd_sleep).
        return 0;
    }
    if is_tracked(pid) {
        crate::sched::reclaimed(tid, now, duration_ns);
        let nr_reclaimed = nr_reclaimed();
        // One lookup of the process's counters for all three adds.
        let counted = if kind == ReclaimKind::Memcg as u32 {
            proc_add!(
                pid,
                memcg_reclaim_count += 1,
                memcg_reclaim_ns += duration_ns,
                reclaimed_pages += nr_reclaimed
            )
        } else {
            proc_add!(
                pid,
                direct_reclaim_count += 1,
                direct_reclaim_ns += duration_ns,
                reclaimed_pages += nr_reclaimed
            )
        };
        if !counted {
            kwarn!("PROC_COUNTERS is full: a reclaim of process {} is not counted", pid);
        }
        let sent = emit_bulk(ReclaimEvent {
            header: header_at(EventKind::Reclaim, pid, tid, now),
            kind,
            _pad: 0,
            start_ns,
            duration_ns,
            nr_reclaimed,
        });
        if !sent {
            kwarn!("the bulk ring is full: a reclaim record of process {} is lost", pid);
        }
    } else if kind == ReclaimKind::Memcg as u32 {
        add_per_cpu(&HOST, HostCounter::OtherMemcgReclaimCount as u32, 1);
        add_per_cpu(&HOST, HostCounter::OtherMemcgReclaimNs as u32, duration_ns);
    } else {
        add_per_cpu(&HOST, HostCounter::OtherDirectReclaimCount as u32, 1);
        add_per_cpu(&HOST, HostCounter::OtherDirectReclaimNs as u32, duration_ns);
    }
    0
}

#[tracepoint]
pub fn mm_vmscan_direct_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(ReclaimKind::Direct)
}

#[tracepoint]
pub fn mm_vmscan_direct_reclaim_end(ctx: TracePointContext) -> u32 {
    end(|| field(&ctx, offset!(reclaim_end_nr_reclaimed)).unwrap_or(0))
}

/// The same, BTF-typed: `nr_reclaimed` is the tracepoint's argument, not a field copied out.
#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn mm_vmscan_direct_reclaim_end_btf(ctx: BtfTracePointContext) -> i32 {
    let nr: u64 = ctx.arg(0);
    end(|| nr);
    0
}

#[tracepoint]
pub fn mm_vmscan_memcg_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(ReclaimKind::Memcg)
}

#[tracepoint]
pub fn mm_vmscan_memcg_reclaim_end(ctx: TracePointContext) -> u32 {
    end(|| field(&ctx, offset!(reclaim_end_nr_reclaimed)).unwrap_or(0))
}

/// The same, BTF-typed.
#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn mm_vmscan_memcg_reclaim_end_btf(ctx: BtfTracePointContext) -> i32 {
    let nr: u64 = ctx.arg(0);
    end(|| nr);
    0
}

/// kswapd wakes to balance a node: its swap-out and I/O until it sleeps are background reclaim.
/// Rounds without a sleep between them are one episode (`on_kswapd_wake`).
#[tracepoint]
pub fn mm_vmscan_kswapd_wake(_ctx: TracePointContext) -> u32 {
    let (_, tid) = current_ids();
    // SAFETY: the value is copied out at once.
    let existing = unsafe { RECLAIM_START.get(tid) }.copied();
    if let Some(start) = on_kswapd_wake(existing.as_ref(), unsafe { bpf_ktime_get_ns() }) {
        if RECLAIM_START.insert(tid, start, 0).is_err() {
            add_lost(LostCounter::MapFull);
            kwarn!("RECLAIM_START is full: kswapd {} is not timed", tid);
        }
    }
    0
}

#[tracepoint]
pub fn mm_vmscan_kswapd_sleep(_ctx: TracePointContext) -> u32 {
    let (pid, tid) = current_ids();
    // SAFETY: the value is copied out at once.
    let existing = unsafe { RECLAIM_START.get(tid) }.copied();
    let EndOutcome::Complete { kind, start_ns, duration_ns } =
        on_end(existing.as_ref(), unsafe { bpf_ktime_get_ns() })
    else {
        kdebug!("kswapd {} sleeps without its wake: not timed", tid);
        return 0;
    };
    let _ = RECLAIM_START.remove(tid);
    let sent = emit_bulk(ReclaimEvent {
        header: header(EventKind::Reclaim, pid, tid),
        kind,
        _pad: 0,
        start_ns,
        duration_ns,
        nr_reclaimed: 0,
    });
    if !sent {
        kwarn!("the bulk ring is full: a kswapd record is lost");
    }
    0
}

/// True when the current thread is kswapd between wake and sleep.
#[inline(always)]
pub fn in_kswapd(tid: u32) -> bool {
    // SAFETY: read-only peek.
    matches!(unsafe { RECLAIM_START.get(tid) }, Some(s) if s.kind == ReclaimKind::Kswapd as u32)
}

const RECLAIM_WB_ANON: i32 = 0x1;

/// Written by the agent before load (`EbpfLoader::override_global`): where this kernel keeps a
/// folio's flags and order, from its BTF.
#[unsafe(no_mangle)]
pub static FOLIO_LAYOUT: FolioLayout = FolioLayout::unknown();

/// One folio written out by reclaim, `pages` long: counted per process, never sent as a record.
#[inline(always)]
fn count_write(anon: bool, pages: u64) {
    let (pid, tid) = current_ids();
    if is_tracked(pid) {
        if anon {
            proc_add!(pid, swapout_anon_pages += pages);
        } else {
            proc_add!(pid, writeback_file_pages += pages);
        }
        return;
    }
    let idx = match (in_kswapd(tid), anon) {
        (true, true) => HostCounter::KswapdSwapoutAnon,
        (true, false) => HostCounter::KswapdWritebackFile,
        (false, true) => HostCounter::OtherSwapoutAnon,
        (false, false) => HostCounter::OtherWritebackFile,
    };
    add_per_cpu(&HOST, idx as u32, pages);
}

/// The fallback where the kernel has no BTF: the classic record has no order, so a folio
/// counts one page (the loader says so in its degradations).
#[tracepoint]
pub fn mm_vmscan_write_folio(ctx: TracePointContext) -> u32 {
    let flags: i32 = field(&ctx, offset!(write_folio_flags)).unwrap_or(0);
    count_write(flags & RECLAIM_WB_ANON != 0, 1);
    0
}

/// The same event, BTF-typed: its argument is the folio (the page before 5.18), whose order
/// gives the pages written (a 2 MiB THP is 512 pages, one hit). One read of the flags word
/// (large? swap-backed?), and a second of the order byte for a large folio only.
#[btf_tracepoint(function = "mm_vmscan_write_folio")]
pub fn mm_vmscan_write_folio_btf(ctx: BtfTracePointContext) -> i32 {
    // The tracepoint's first argument: the folio (or the page), only ever read through the helper.
    let folio: *const u8 = ctx.arg(0);
    // SAFETY: FOLIO_LAYOUT is a plain static of integers the loader rewrites before load.
    let layout = unsafe { core::ptr::read_volatile(&FOLIO_LAYOUT) };
    // SAFETY: kernel memory read through the helper; a fault gives an error, not a crash.
    let flags: u64 =
        unsafe { core::ptr::read_volatile(folio.add(layout.flags as usize) as *const u64) };
    let order = if layout.is_large(flags) {
        // SAFETY: as above; the head of a large folio has its second page right after it.
        unsafe { bpf_probe_read_kernel(folio.wrapping_add(layout.order as usize)) }.ok()
    } else {
        None
    };
    count_write(layout.is_anon(flags), pages(order));
    0
}

/// Fired in the allocating task: who woke kswapd.
#[tracepoint]
pub fn mm_vmscan_wakeup_kswapd(_ctx: TracePointContext) -> u32 {
    let (pid, _) = current_ids();
    if is_tracked(pid) {
        proc_add!(pid, kswapd_wakeups += 1);
    } else {
        add_per_cpu(&HOST, HostCounter::KswapdWakeups as u32, 1);
    }
    0
}

/// Reclaim waited (on writeback, congestion, isolation): the "disk busy with swap" signal.
#[tracepoint]
pub fn mm_vmscan_throttled(ctx: TracePointContext) -> u32 {
    let (pid, tid) = current_ids();
    if !is_tracked(pid) {
        add_per_cpu(&HOST, HostCounter::OtherThrottledCount as u32, 1);
        return 0;
    }
    let delayed: i32 = field(&ctx, offset!(throttled_usec_delayed)).unwrap_or(0);
    if !proc_add!(pid, throttled_count += 1, throttled_us += delayed.max(0) as u64) {
        kwarn!("PROC_COUNTERS is full: a throttling of process {} is not counted", pid);
    }
    let sent = emit_bulk(ThrottledEvent {
        header: header(EventKind::Throttled, pid, tid),
        usec_timeout: field(&ctx, offset!(throttled_usec_timeout)).unwrap_or(0),
        usec_delayed: delayed,
        reason: field(&ctx, offset!(throttled_reason)).unwrap_or(0),
        nid: field(&ctx, offset!(throttled_nid)).unwrap_or(0),
    });
    if !sent {
        kwarn!("the bulk ring is full: a throttling record of process {} is lost", pid);
    }
    0
}
