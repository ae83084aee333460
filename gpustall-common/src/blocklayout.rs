//! Where this kernel keeps the block-layer fields the BTF-typed block programs read (`struct
//! bio`, `struct request` and the disk behind them), from its BTF: aya has no CO-RE. A typed
//! program reads them with plain loads from the tracepoint's own pointers, where the classic
//! one copies each field out of a record the kernel first had to build: the block programs
//! run once per bio and twice per request, the hottest gpustall has after the scheduler's.
//!
//! The typed programs compute the same values as the classic records (`dev` is the disk's, as
//! `disk_devt()`; a request's sector is `blk_rq_pos()`), so either kind pairs with the other.

/// Marks an offset the running kernel's BTF does not give.
pub const UNKNOWN: u32 = u32::MAX;

/// Byte offsets inside block-layer structures; [`UNKNOWN`] where BTF lacks the field (before
/// 5.12 a bio names its disk, not its `block_device`; before 5.15 a queue has no `disk`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// `bio.bi_bdev` (`struct block_device *`).
    pub bio_bdev: u32,
    /// `bio.bi_opf` (the op in its low 8 bits, `REQ_OP_MASK`).
    pub bio_opf: u32,
    /// `bio.bi_iter.bi_sector`.
    pub bio_sector: u32,
    /// `bio.bi_iter.bi_size` (bytes left: all of them when queued).
    pub bio_size: u32,
    /// `block_device.bd_disk` (`struct gendisk *`).
    pub bdev_disk: u32,
    /// `gendisk.major` (`int`).
    pub disk_major: u32,
    /// `gendisk.first_minor` (`int`).
    pub disk_first_minor: u32,
    /// `request.q` (`struct request_queue *`).
    pub rq_q: u32,
    /// `request_queue.disk` (`struct gendisk *`).
    pub q_disk: u32,
    /// `request.__sector` (`blk_rq_pos()`).
    pub rq_sector: u32,
    /// `request.cmd_flags` (the op in its low 8 bits).
    pub rq_cmd_flags: u32,
    /// `task_struct.flags` of the submitting task: `PF_MEMALLOC` says it is reclaiming.
    pub task_flags: u32,
}
const _: () = assert!(core::mem::size_of::<BlockLayout>() == 48);

/// `PF_MEMALLOC`: set on a task while it reclaims memory: direct and memcg reclaim (the
/// tracepoints' begin to end, `memalloc_noreclaim_save`), and kswapd always. The same flag
/// lets the reclaimer's own allocations dip into reserves, which is why the kernel keeps it
/// exact. `PF_KSWAPD` marks kswapd. Values of include/linux/sched.h, the same 5.10 to 7.2.
pub const PF_MEMALLOC: u32 = 0x0000_0800;
pub const PF_KSWAPD: u32 = 0x0002_0000;

/// Whether a bio's submitter was reclaiming, from its task flags: `None` when not, else
/// whether it is kswapd. The typed block_bio_queue reads this instead of looking the thread up
/// in the reclaim-pairing map (a hash lookup per bio).
#[inline(always)]
pub const fn reclaiming(task_flags: u32) -> Option<bool> {
    if task_flags & PF_MEMALLOC == 0 {
        None
    } else {
        Some(task_flags & PF_KSWAPD != 0)
    }
}

/// `REQ_OP_MASK`: the operation in `bi_opf` / `cmd_flags` (8 bits since 4.10).
pub const REQ_OP_MASK: u32 = 0xff;
/// `REQ_OP_READ`, `REQ_OP_WRITE`.
pub const REQ_OP_READ: u32 = 0;
pub const REQ_OP_WRITE: u32 = 1;

impl BlockLayout {
    /// Nothing known: the classic programs run.
    pub const fn unknown() -> Self {
        Self {
            bio_bdev: UNKNOWN,
            bio_opf: UNKNOWN,
            bio_sector: UNKNOWN,
            bio_size: UNKNOWN,
            bdev_disk: UNKNOWN,
            disk_major: UNKNOWN,
            disk_first_minor: UNKNOWN,
            rq_q: UNKNOWN,
            q_disk: UNKNOWN,
            rq_sector: UNKNOWN,
            rq_cmd_flags: UNKNOWN,
            task_flags: UNKNOWN,
        }
    }

    /// Enough for the typed block_bio_queue.
    pub const fn knows_bio(&self) -> bool {
        self.bio_bdev != UNKNOWN
            && self.bio_opf != UNKNOWN
            && self.bio_sector != UNKNOWN
            && self.bio_size != UNKNOWN
            && self.task_flags != UNKNOWN
            && self.knows_disk()
    }

    /// Enough for the typed block_io_start and block_io_done.
    pub const fn knows_request(&self) -> bool {
        self.rq_q != UNKNOWN
            && self.q_disk != UNKNOWN
            && self.rq_sector != UNKNOWN
            && self.rq_cmd_flags != UNKNOWN
            && self.knows_disk()
    }

    const fn knows_disk(&self) -> bool {
        self.bdev_disk != UNKNOWN && self.disk_major != UNKNOWN && self.disk_first_minor != UNKNOWN
    }
}

/// The kernel's `dev_t` of a disk (`MKDEV(major, first_minor)`: 12 bits of major above 20 of
/// minor), as the classic block records carry it.
#[inline(always)]
pub const fn disk_devt(major: i32, first_minor: i32) -> u32 {
    ((major as u32) << 20) | (first_minor as u32 & 0xfffff)
}

/// The I/O direction of an op word (`bi_opf`, `cmd_flags`), as `counters::IoOp` numbers it
/// (read 0, write 1, other 2), the same the classic records' `rwbs` gives: a flush with data is
/// its write, a bare flush or a discard is other.
#[inline(always)]
pub const fn op_of(flags: u32) -> u32 {
    match flags & REQ_OP_MASK {
        REQ_OP_READ => 0,
        REQ_OP_WRITE => 1,
        _ => 2,
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only u32s, no padding (size pinned above).
unsafe impl aya::Pod for BlockLayout {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devt_packs_as_the_kernel_does() {
        // loop0 is 7:0, sda 8:0, nvme0n1 259:0; MKDEV(8, 16) is sdb.
        assert_eq!(disk_devt(7, 0), 7 << 20);
        assert_eq!(disk_devt(8, 16), (8 << 20) | 16);
        assert_eq!(disk_devt(259, 0), 259 << 20);
    }

    #[test]
    fn ops_read_as_rwbs_does() {
        assert_eq!(op_of(0), 0);
        // REQ_OP_WRITE with REQ_SYNC (bit 11) and REQ_PREFLUSH: still a write ("FWS").
        assert_eq!(op_of(1 | 1 << 11 | 1 << 18), 1);
        assert_eq!(op_of(2), 2); // flush
        assert_eq!(op_of(3), 2); // discard
    }

    #[test]
    fn reclaimers_are_told_by_their_flags() {
        assert_eq!(reclaiming(0x0040_0040), None); // PF_FORKNOEXEC | PF_RANDOMIZE-like bits
        assert_eq!(reclaiming(PF_MEMALLOC | 0x40), Some(false)); // a direct reclaimer
        assert_eq!(reclaiming(PF_MEMALLOC | PF_KSWAPD | 0x0020_0000), Some(true));
        // kswapd
    }

    #[test]
    fn a_layout_is_usable_only_whole() {
        assert!(!BlockLayout::unknown().knows_bio());
        let mut l = BlockLayout { bio_bdev: 8, ..BlockLayout::unknown() };
        assert!(!l.knows_bio());
        l = BlockLayout {
            bio_bdev: 8,
            bio_opf: 16,
            bio_sector: 32,
            bio_size: 40,
            bdev_disk: 0,
            disk_major: 0,
            disk_first_minor: 4,
            task_flags: 44,
            ..l
        };
        assert!(l.knows_bio());
        assert!(!l.knows_request());
    }
}
