//! Block I/O attributed to the submitting process. Bytes are counted per bio at
//! block_bio_queue, which runs in the submitter (block_rq_issue often runs in a kworker) and
//! sees every byte once, whatever merging happens later. Request latency runs from
//! block_io_start (also in the submitter) to block_io_done: the typed programs keep the request
//! in an array slot found from its address (`gpustall_common::rqslot`), the classic ones, which
//! see no address, in a hash keyed by (dev, sector). Kernels before 6.5 have neither
//! tracepoint, and pair from block_bio_queue to block_rq_complete in the hash (the agent sets
//! `bio_starts_io` and points `done_*` at block_rq_complete's fields).
//!
//! Stacked devices (dm, md) queue a clone of each bio again, on the device below, in the same
//! task: block_bio_remap announces it, and the clone is not counted again; its request's
//! latency goes to the device the process used (`gpustall_common::stacked`).

use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, TracePointContext},
};
use gpustall_common::{
    blocklayout::{disk_devt, op_of, reclaiming, BlockLayout},
    counters::{
        latency_bucket, HostCounter, InflightIo, InflightKey, IoCounters, IoKey, IoOp, LostCounter,
        LATENCY_BUCKETS,
    },
    reclaim::ReclaimKind,
    rqslot::{self, RqSlot, SlotTable, Started},
    stacked::{MovedClone, Queued, StackSlot},
};

use crate::common::{
    add_lost, add_per_cpu, atomic_add, current_ids, field, is_tracked, kload, offset, shared_value,
    BPF_F_NO_PREALLOC, HOST, RECLAIM_START,
};

/// Written by the agent before load, from BTF: where the typed programs find a bio's and a
/// request's fields (only attached where all of them are known).
#[unsafe(no_mangle)]
pub static BLOCK_LAYOUT: BlockLayout = BlockLayout::unknown();

macro_rules! layout {
    ($field:ident) => {
        // SAFETY: a plain static of integers; the loader rewrites it before load.
        unsafe { core::ptr::read_volatile(&BLOCK_LAYOUT.$field) }
    };
}

/// The disk's `dev_t` behind a `struct gendisk *`, as the classic records give it.
#[inline(always)]
fn disk_dev(disk: *const u8) -> u32 {
    disk_devt(kload(disk, layout!(disk_major)), kload(disk, layout!(disk_first_minor)))
}

/// The disk's `dev_t` of a request (`rq->q->disk`).
#[inline(always)]
fn rq_dev(rq: *const u8) -> u32 {
    let q: *const u8 = kload(rq, layout!(rq_q));
    disk_dev(kload(q, layout!(q_disk)))
}

/// Per (process, device, op, in reclaim), one value for all CPUs (see `PROC_COUNTERS`).
#[map]
pub static IO_COUNTERS: HashMap<IoKey, IoCounters> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Requests of tracked processes between start and done, for the classic programs. A plain
/// preallocated hash: its insert and delete cost half an LRU's (no LRU lists and their locks).
/// A request whose done never comes (device removed, trace attached mid-flight, a bio that
/// never starts a request) is deleted by the agent once it is a minute old
/// (`KernelMaps::read`). The loader shrinks it where the typed programs pair in `RQ_SLOTS`.
#[map]
pub static IO_INFLIGHT: HashMap<InflightKey, InflightIo> = HashMap::with_max_entries(16384, 0);

/// Requests of tracked processes between start and done, for the typed programs: a slot per
/// request found from its address (`gpustall_common::rqslot`). One entry where the classic
/// programs pair (the loader shrinks it).
#[map]
pub static RQ_SLOTS: Array<RqSlot> = Array::with_max_entries(rqslot::RQ_SLOTS, 0);

/// `RQ_SLOTS`' slots in use per bucket of homes (`rqslot`): the done of a request no one
/// tracked reads one word here instead of a slot.
#[map]
pub static RQ_HINT: Array<u64> = Array::with_max_entries(rqslot::RQ_HINTS, 0);

/// A number for a struct the kernel handed a typed program: its distance from a global of this
/// object. The verifier allows no arithmetic on a typed pointer, nor a narrower read of one
/// spilled to the stack, but one pointer less another is a plain number for a program of root
/// or CAP_PERFMON (which may see kernel addresses). The global stays put while the programs are
/// loaded, so the number is the address shifted by a constant: as unique, and the same in the
/// start and the done. (A per-CPU word to store the pointer in and read it back would race with
/// a done in an interrupt between the two.)
#[inline(always)]
fn address(p: *const u8) -> u64 {
    let base = (&raw const BLOCK_LAYOUT).cast::<u8>();
    (p as u64).wrapping_sub(base as u64)
}

/// `RQ_SLOTS` for `rqslot`'s probing: inlined array lookups, and BPF's cmpxchg.
struct Slots;

impl SlotTable for Slots {
    #[inline(always)]
    fn slot(&self, idx: u32) -> Option<*mut RqSlot> {
        RQ_SLOTS.get_ptr_mut(idx)
    }

    #[inline(always)]
    fn claim(&self, slot: *mut RqSlot, old: u64, new: u64) -> bool {
        use core::intrinsics::{atomic_cxchg, AtomicOrdering::Relaxed};
        // SAFETY: a live map value; the typed start runs on 6.5+, whose BPF has cmpxchg.
        unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(&raw mut (*slot).rq, old, new) }.1
    }

    #[inline(always)]
    fn in_use(&self, bucket: u32) -> u64 {
        // SAFETY: a live map value, read once (other CPUs add to it).
        RQ_HINT.get_ptr(bucket).map_or(0, |p| unsafe { core::ptr::read_volatile(p) })
    }

    #[inline(always)]
    fn count(&self, bucket: u32, delta: u64) {
        if let Some(p) = RQ_HINT.get_ptr_mut(bucket) {
            atomic_add(p, delta);
        }
    }
}

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
fn current_key(ids: (u32, u32), dev: u32, op: u32, bytes: u64) -> Option<IoKey> {
    current_key_with(ids, || dev, op, || bytes, reclaim_pairing)
}

/// Whether thread `tid` is reclaiming (`Some(is kswapd)`), from the reclaim-pairing map: one
/// read-only lookup.
#[inline(always)]
fn reclaim_pairing(tid: u32) -> Option<bool> {
    // SAFETY: read-only peek.
    unsafe { RECLAIM_START.get(tid) }.map(|s| s.kind == ReclaimKind::Kswapd as u32)
}

/// The same, told whether the thread is reclaiming (`Some(is kswapd)`) by `reclaiming`: the
/// reclaim-pairing map, or the task's flags in a typed program. `dev` is read only for a
/// tracked task (a typed program loads it through three structs).
#[inline(always)]
fn current_key_with(
    (pid, tid): (u32, u32),
    dev: impl FnOnce() -> u32,
    op: u32,
    bytes: impl FnOnce() -> u64,
    reclaiming: impl Fn(u32) -> Option<bool>,
) -> Option<IoKey> {
    if !is_tracked(pid) {
        // Bytes first: a request start has none (and then no lookup).
        let bytes = bytes();
        if bytes > 0 {
            if let Some(kswapd) = reclaiming(tid) {
                let idx = if kswapd {
                    HostCounter::KswapdIoBytes
                } else {
                    HostCounter::OtherReclaimIoBytes
                };
                add_per_cpu(&HOST, idx as u32, bytes);
            }
        }
        return None;
    }
    let in_reclaim = reclaiming(tid).is_some();
    Some(IoKey { pid, dev: dev(), op, in_reclaim: in_reclaim as u32 })
}

/// Whether the current task is reclaiming, from its flags (typed programs).
#[inline(always)]
fn reclaiming_now() -> Option<bool> {
    // SAFETY: plain helper call: the current task, a pointer the verifier types by BTF.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    reclaiming(kload(task, layout!(task_flags)))
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
    let dev: u32 = field(&ctx, offset!(bio_dev)).unwrap_or(0);
    let rwbs: [u8; 8] = field(&ctx, offset!(bio_rwbs)).unwrap_or([0; 8]);
    let ids = current_ids();
    let own = current_key(ids, dev, io_op(&rwbs) as u32, sectors * 512);
    on_bio_queue(ids.1, own, dev, sectors, || field(&ctx, offset!(bio_sector)).unwrap_or(0))
}

/// The same, BTF-typed: the bio's fields are plain loads.
#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue_btf(ctx: BtfTracePointContext) -> i32 {
    let bio: *const u8 = ctx.arg(0);
    let bytes = || u64::from(kload::<u32>(bio, layout!(bio_size)));
    let dev = || {
        let bdev: *const u8 = kload(bio, layout!(bio_bdev));
        disk_dev(kload(bdev, layout!(bdev_disk)))
    };
    let op = op_of(kload(bio, layout!(bio_opf)));
    let ids = current_ids();
    // An untracked bio costs the tracked-set test and the task's flags, no more.
    let Some(own) = current_key_with(ids, dev, op, bytes, |_| reclaiming_now()) else {
        return 0;
    };
    on_bio_queue(ids.1, Some(own), own.dev, bytes() / 512, || kload(bio, layout!(bio_sector)));
    0
}

/// A bio queued: its bytes to the submitting process (`sector` read only for a tracked one).
#[inline(always)]
fn on_bio_queue(
    tid: u32,
    own: Option<IoKey>,
    dev: u32,
    sectors: u64,
    sector: impl FnOnce() -> u64,
) -> u32 {
    let bytes = sectors * 512;
    let Some(own) = own else {
        return 0;
    };
    let sector = sector();
    let Some(slot) = LAST_BIO.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; no other program runs on this CPU meanwhile.
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
    let (pid, tid) = current_ids();
    if !is_tracked(pid) {
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

#[tracepoint]
pub fn block_io_start(ctx: TracePointContext) -> u32 {
    let dev: u32 = field(&ctx, offset!(rq_dev)).unwrap_or(0);
    let sector: u64 = field(&ctx, offset!(rq_sector)).unwrap_or(0);
    let rwbs: [u8; 8] = field(&ctx, offset!(rq_rwbs)).unwrap_or([0; 8]);
    on_io_start(dev, sector, io_op(&rwbs) as u32, |key| start_io(dev, sector, key))
}

/// The same, BTF-typed: the request's fields are plain loads, and the request waits for its
/// done in a slot found from its address (no hash insert).
#[btf_tracepoint(function = "block_io_start")]
pub fn block_io_start_btf(ctx: BtfTracePointContext) -> i32 {
    let rq: *const u8 = ctx.arg(0);
    let op = op_of(kload(rq, layout!(rq_cmd_flags)));
    let key = io_start_key_with(|| (rq_dev(rq), kload(rq, layout!(rq_sector))), op);
    let io = key.map(|key| InflightIo { start_ns: 0, key });
    // The clock only for a request that is timed.
    let now = if io.is_some() { unsafe { bpf_ktime_get_ns() } } else { 0 };
    // SAFETY: `Slots` gives live slots of RQ_SLOTS.
    let started = unsafe { rqslot::start(&Slots, address(rq), io, now) };
    if started == Started::Full {
        add_lost(LostCounter::MapFull);
    }
    0
}

#[inline(always)]
fn on_io_start(dev: u32, sector: u64, op: u32, start: impl FnOnce(IoKey)) -> u32 {
    if let Some(key) = io_start_key(dev, sector, op) {
        start(key);
    }
    0
}

/// Whose request starts: the key of the bio that starts it (or, split below, a part of it),
/// queued just before by this task on this CPU, else the current task's if it is tracked. A
/// bio merged into another request leaves the slot until the next tracked bio here; it matches
/// no request but one this thread starts inside it.
#[inline(always)]
fn io_start_key(dev: u32, sector: u64, op: u32) -> Option<IoKey> {
    io_start_key_with(|| (dev, sector), op)
}

/// The same, `where_` giving the request's (dev, sector) only when needed: when this thread
/// queued the last tracked bio here, or is tracked.
#[inline(always)]
fn io_start_key_with(where_: impl Fn() -> (u32, u64), op: u32) -> Option<IoKey> {
    let ids = current_ids();
    if let Some(slot) = LAST_BIO.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; no other program runs on this CPU meanwhile.
        if unsafe { (*slot).tid } == ids.1 {
            let (dev, sector) = where_();
            // SAFETY: as above.
            if let Some(key) = unsafe { (*slot).take_request(ids.1, dev, sector) } {
                return Some(IoKey { op, ..key });
            }
        }
    }
    current_key_with(ids, || where_().0, op, || 0, reclaim_pairing)
}

/// block_io_done, or block_rq_complete on kernels before 6.5 (the `done_*` offsets are the
/// attached one's).
#[tracepoint]
pub fn block_io_done(ctx: TracePointContext) -> u32 {
    let dev: u32 = field(&ctx, offset!(done_dev)).unwrap_or(0);
    let sector: u64 = field(&ctx, offset!(done_sector)).unwrap_or(0);
    on_io_done(dev, sector)
}

/// The same, BTF-typed: the request's slot, found from its address (the loader attaches it on
/// block_io_done only, with the typed start).
#[btf_tracepoint(function = "block_io_done")]
pub fn block_io_done_btf(ctx: BtfTracePointContext) -> i32 {
    let rq: *const u8 = ctx.arg(0);
    // SAFETY: `Slots` gives live slots of RQ_SLOTS.
    if let Some(io) = unsafe { rqslot::done(&Slots, address(rq)) } {
        done(io.key, io.start_ns);
    }
    0
}

#[inline(always)]
fn on_io_done(dev: u32, sector: u64) -> u32 {
    let k = InflightKey { dev, _pad: 0, sector };
    // SAFETY: copied out at once.
    let Some(io) = (unsafe { IO_INFLIGHT.get(k) }).copied() else {
        return 0;
    };
    let _ = IO_INFLIGHT.remove(k);
    done(io.key, io.start_ns);
    0
}

/// A tracked request completed: its latency to its process and the host histogram.
#[inline(always)]
fn done(key: IoKey, start_ns: u64) {
    let lat = unsafe { bpf_ktime_get_ns() }.saturating_sub(start_ns);
    if let Some(c) = shared_value(&IO_COUNTERS, &key) {
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
    let op = if key.op > 2 { 2 } else { key.op };
    add_per_cpu(&IO_LATENCY, op * LATENCY_BUCKETS + latency_bucket(lat), 1);
}
