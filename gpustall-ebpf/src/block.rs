//! Block I/O attributed to the submitting process. Bytes are counted per bio at
//! block_bio_queue, which runs in the submitter (block_rq_issue often runs in a kworker) and
//! sees every byte once, whatever merging happens later. Request latency is paired by
//! (dev, sector) from block_io_start (also in the submitter) to block_io_done; kernels before
//! 6.5 have neither, and pair from block_bio_queue to block_rq_complete instead (the agent
//! sets `bio_starts_io` and points `done_*` at block_rq_complete's fields).
//!
//! Stacked devices (dm, md) queue a clone of each bio again, on the device below, in the same
//! task: block_bio_remap announces it, and the clone is not counted again; its request's
//! latency goes to the device the process used (`gpustall_common::stacked`).

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::TracePointContext,
};
use gpustall_common::{
    counters::{
        latency_bucket, HostCounter, InflightIo, InflightKey, IoCounters, IoKey, IoOp, LostCounter,
        LATENCY_BUCKETS,
    },
    reclaim::ReclaimKind,
    stacked::{MovedClone, Queued, StackSlot},
};

use crate::common::{
    add_lost, add_per_cpu, atomic_add, field, is_tracked, offset, pid_tgid, shared_value,
    BPF_F_NO_PREALLOC, HOST, RECLAIM_START,
};

/// Per (process, device, op, in reclaim), one value for all CPUs (see `PROC_COUNTERS`).
#[map]
pub static IO_COUNTERS: HashMap<IoKey, IoCounters> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Requests of tracked processes between start and done. A plain preallocated hash: its insert
/// and delete cost half an LRU's (no LRU lists and their locks). A request whose done never
/// comes (device removed, trace attached mid-flight, a bio that never starts a request) is
/// deleted by the agent once it is a minute old (`KernelMaps::read`).
#[map]
pub static IO_INFLIGHT: HashMap<InflightKey, InflightIo> = HashMap::with_max_entries(16384, 0);

/// Completed-request latency, log2 buckets, per direction: `op * LATENCY_BUCKETS + bucket`.
#[map]
pub static IO_LATENCY: PerCpuArray<u64> = PerCpuArray::with_max_entries(3 * LATENCY_BUCKETS, 0);

#[inline(always)]
fn io_op(rwbs: &[u8; 8]) -> IoOp {
    // rwbs: an optional 'F' (flush) first, then 'R', 'W', 'D' (discard), 'N' (none), ...
    let mut i = 0;
    while i < 2 {
        match rwbs[i] {
            b'R' => return IoOp::Read,
            b'W' => return IoOp::Write,
            b'F' => {}
            _ => return IoOp::Other,
        }
        i += 1;
    }
    IoOp::Other
}

/// The I/O key of the current task, or `None` for an untracked one. The tracked-set test
/// comes first; an untracked task costs one more lookup only when it has bytes to count.
#[inline(always)]
fn current_key(dev: u32, rwbs: &[u8; 8], bytes: u64) -> Option<IoKey> {
    let (tgid, tid) = pid_tgid();
    if !is_tracked(tgid) {
        if bytes > 0 {
            // SAFETY: read-only peek, one lookup for "in reclaim" and "is kswapd".
            if let Some(s) = unsafe { RECLAIM_START.get(tid) } {
                let idx = if s.kind == ReclaimKind::Kswapd as u32 {
                    HostCounter::KswapdIoBytes
                } else {
                    HostCounter::OtherReclaimIoBytes
                };
                add_per_cpu(&HOST, idx as u32, bytes);
            }
        }
        return None;
    }
    // SAFETY: presence test.
    let in_reclaim = unsafe { RECLAIM_START.get(tid) }.is_some();
    Some(IoKey { tgid, dev, op: io_op(rwbs) as u32, in_reclaim: in_reclaim as u32 })
}

/// Per CPU, the tracked thread that last queued a bio there: the key of its last counted bio,
/// the device of its last queued one, and the clones of counted bios that stacked devices
/// announced (block_bio_remap) and have not queued yet (`gpustall_common::stacked`).
/// block_io_start, which follows in the same task for the bio that starts a request, takes its
/// key from here too instead of two hash lookups.
#[map]
pub static LAST_BIO: PerCpuArray<StackSlot> = PerCpuArray::with_max_entries(1, 0);

/// The last clone announced on any CPU (`MovedClone`): for a thread that moved CPU between a
/// clone's remap and its queue. One entry shared by all CPUs, an array lookup (inlined).
#[map]
pub static MOVED_CLONE: Array<MovedClone> = Array::with_max_entries(1, 0);

#[tracepoint]
pub fn block_bio_queue(ctx: TracePointContext) -> u32 {
    let sectors = field::<u32>(&ctx, offset!(bio_nr_sector)).unwrap_or(0) as u64;
    let bytes = sectors * 512;
    let dev: u32 = field(&ctx, offset!(bio_dev)).unwrap_or(0);
    let rwbs: [u8; 8] = field(&ctx, offset!(bio_rwbs)).unwrap_or([0; 8]);
    let Some(own) = current_key(dev, &rwbs, bytes) else {
        return 0;
    };
    let sector: u64 = field(&ctx, offset!(bio_sector)).unwrap_or(0);
    let Some(slot) = LAST_BIO.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; no other program runs on this CPU meanwhile.
    let tid = key_tid();
    let mut queued = unsafe { (*slot).on_queue(tid, dev, sector, sectors, own) };
    if queued == Queued::Own {
        if let Some(mark) = MOVED_CLONE.get_ptr_mut(0) {
            // SAFETY: a live map value; a torn read matches nothing (see MovedClone).
            if let Some(above) = unsafe { (*mark).take(tid, dev, sector) } {
                // SAFETY: this CPU's slot, as above.
                unsafe { (*slot).adopt(above) };
                queued = Queued::Clone(above);
            }
        }
    }
    let key = match queued {
        Queued::Own => {
            if let Some(c) = shared_value(&IO_COUNTERS, &own) {
                // SAFETY: a live map value; `&raw mut` makes no reference to it.
                unsafe {
                    atomic_add(&raw mut (*c).bytes, bytes);
                    atomic_add(&raw mut (*c).bios, 1);
                }
            }
            own
        }
        // A stacked device's clone of a bio counted on the device above: its bytes are
        // counted there; its request (the one real request) is timed under that key.
        Queued::Clone(above) => IoKey { op: own.op, ..above },
    };
    if offset!(bio_starts_io) == 1 {
        start_io(dev, sector, key);
    }
    0
}

/// A stacked device's clone moves to the device below (or a partition's bio to its disk): the
/// slot learns of it before the clone is queued. Only for tracked threads.
#[tracepoint]
pub fn block_bio_remap(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = pid_tgid();
    if !is_tracked(tgid) {
        return 0;
    }
    let dev: u32 = field(&ctx, offset!(remap_dev)).unwrap_or(0);
    let sector: u64 = field(&ctx, offset!(remap_sector)).unwrap_or(0);
    let old_dev: u32 = field(&ctx, offset!(remap_old_dev)).unwrap_or(0);
    let old_sector: u64 = field(&ctx, offset!(remap_old_sector)).unwrap_or(0);
    let Some(slot) = LAST_BIO.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; no other program runs on this CPU meanwhile.
    let clone = unsafe { (*slot).on_remap(tid, dev, sector, old_dev, old_sector) };
    if clone {
        if let Some(mark) = MOVED_CLONE.get_ptr_mut(0) {
            // SAFETY: a live map value; racing writers may tear it (see MovedClone).
            unsafe { *mark = MovedClone { tid, dev, sector, key: (*slot).key } };
        }
    }
    if clone && offset!(bio_starts_io) == 1 {
        // Before 6.5 the bio above started a latency entry at queue; a bio-based device never
        // completes it as a request. Look first: a delete locks the bucket even on a miss.
        let k = InflightKey { dev: old_dev, _pad: 0, sector: old_sector };
        // SAFETY: presence test.
        if unsafe { IO_INFLIGHT.get(k) }.is_some() {
            let _ = IO_INFLIGHT.remove(k);
        }
    }
    0
}

#[inline(always)]
fn start_io(dev: u32, sector: u64, key: IoKey) {
    let inflight = InflightIo { start_ns: unsafe { bpf_ktime_get_ns() }, key };
    if IO_INFLIGHT.insert(InflightKey { dev, _pad: 0, sector }, inflight, 0).is_err() {
        add_lost(LostCounter::MapFull);
    }
}

#[inline(always)]
fn key_tid() -> u32 {
    pid_tgid().1
}

#[tracepoint]
pub fn block_io_start(ctx: TracePointContext) -> u32 {
    let dev: u32 = field(&ctx, offset!(rq_dev)).unwrap_or(0);
    let sector: u64 = field(&ctx, offset!(rq_sector)).unwrap_or(0);
    let rwbs: [u8; 8] = field(&ctx, offset!(rq_rwbs)).unwrap_or([0; 8]);
    // The bio that starts this request (or, split below, a part of it), queued just before by
    // this task on this CPU: its key. A bio merged into another request leaves the slot until
    // the next tracked bio here; it matches no request but one this thread starts inside it.
    if let Some(slot) = LAST_BIO.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; no other program runs on this CPU meanwhile.
        if let Some(key) = unsafe { (*slot).take_request(key_tid(), dev, sector) } {
            start_io(dev, sector, IoKey { op: io_op(&rwbs) as u32, ..key });
            return 0;
        }
    }
    if let Some(key) = current_key(dev, &rwbs, 0) {
        start_io(dev, sector, key);
    }
    0
}

/// block_io_done, or block_rq_complete on kernels before 6.5 (the `done_*` offsets are the
/// attached one's).
#[tracepoint]
pub fn block_io_done(ctx: TracePointContext) -> u32 {
    let dev: u32 = field(&ctx, offset!(done_dev)).unwrap_or(0);
    let sector: u64 = field(&ctx, offset!(done_sector)).unwrap_or(0);
    let k = InflightKey { dev, _pad: 0, sector };
    // SAFETY: copied out at once.
    let Some(io) = (unsafe { IO_INFLIGHT.get(k) }).copied() else {
        return 0;
    };
    let _ = IO_INFLIGHT.remove(k);
    let lat = unsafe { bpf_ktime_get_ns() }.saturating_sub(io.start_ns);
    if let Some(c) = shared_value(&IO_COUNTERS, &io.key) {
        // SAFETY: a live map value; `&raw mut` makes no reference to it.
        unsafe {
            atomic_add(&raw mut (*c).completed, 1);
            atomic_add(&raw mut (*c).latency_ns_sum, lat);
            // No atomic max in BPF (5.10 has no cmpxchg either): two completions of one
            // process on one device racing on two CPUs may keep the smaller. Counts and sums
            // are exact; the max is a lower bound only under that race.
            if lat > (*c).latency_ns_max {
                (*c).latency_ns_max = lat;
            }
        }
    }
    let op = if io.key.op > 2 { 2 } else { io.key.op };
    add_per_cpu(&IO_LATENCY, op * LATENCY_BUCKETS + latency_bucket(lat), 1);
    0
}
