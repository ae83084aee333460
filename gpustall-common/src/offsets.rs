//! Tracepoint field offsets, read by the agent from
//! `/sys/kernel/tracing/events/<sys>/<event>/format` at start-up and written into the programs'
//! `.rodata` before load. aya has no CO-RE, so this is what lets one object run on many kernels.

/// Marks a field the running kernel's format does not have.
pub const MISSING: u16 = u16::MAX;

/// Offsets (bytes into the tracepoint record) of every field the programs read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TracepointOffsets {
    // task:task_newtask
    pub newtask_pid: u16,
    pub newtask_clone_flags: u16,
    // sched:sched_process_exit
    pub exit_group_dead: u16,
    // task:task_rename
    pub rename_pid: u16,
    pub rename_newcomm: u16,
    // sched:sched_process_exec
    pub exec_filename: u16,
    pub exec_old_pid: u16,
    // oom:mark_victim
    pub oom_pid: u16,
    pub oom_comm: u16,
    pub oom_total_vm: u16,
    pub oom_anon_rss: u16,
    pub oom_file_rss: u16,
    pub oom_shmem_rss: u16,
    pub oom_uid: u16,
    pub oom_score_adj: u16,
    // signal:signal_generate
    pub sig_sig: u16,
    pub sig_code: u16,
    pub sig_comm: u16,
    pub sig_pid: u16,
    pub sig_result: u16,
    // vmscan:mm_vmscan_{direct,memcg}_reclaim_end
    pub reclaim_end_nr_reclaimed: u16,
    // vmscan:mm_vmscan_write_folio (or writepage)
    pub write_folio_flags: u16,
    // vmscan:mm_vmscan_throttled
    pub throttled_usec_timeout: u16,
    pub throttled_usec_delayed: u16,
    pub throttled_reason: u16,
    pub throttled_nid: u16,
    // block:block_bio_queue: bytes per submitter, counted per bio (exact whatever merges later)
    pub bio_dev: u16,
    pub bio_nr_sector: u16,
    pub bio_rwbs: u16,
    pub bio_sector: u16,
    // block:block_io_start (6.5+): request latency starts
    pub rq_dev: u16,
    pub rq_sector: u16,
    pub rq_rwbs: u16,
    // block:block_io_done, or block_rq_complete before 6.5: request latency ends
    pub done_dev: u16,
    pub done_sector: u16,
    /// 1 when the kernel has no block_io_start (before 6.5): latency is then measured from
    /// block_bio_queue (in the submitter too) to the request's completion.
    pub bio_starts_io: u16,
    // block:block_bio_remap: a stacked device's clone (or a partition's bio) moves down
    pub remap_dev: u16,
    pub remap_sector: u16,
    pub remap_old_dev: u16,
    pub remap_old_sector: u16,
    /// Offset of `exit_code` in `struct task_struct`, from the kernel's BTF; `u32::MAX` if unknown.
    pub task_exit_code: u32,
}
const _: () = assert!(core::mem::size_of::<TracepointOffsets>() == 84);

impl TracepointOffsets {
    /// All fields missing: the state before the agent has read the format files.
    pub const fn missing() -> Self {
        Self {
            newtask_pid: MISSING,
            newtask_clone_flags: MISSING,
            exit_group_dead: MISSING,
            rename_pid: MISSING,
            rename_newcomm: MISSING,
            exec_filename: MISSING,
            exec_old_pid: MISSING,
            oom_pid: MISSING,
            oom_comm: MISSING,
            oom_total_vm: MISSING,
            oom_anon_rss: MISSING,
            oom_file_rss: MISSING,
            oom_shmem_rss: MISSING,
            oom_uid: MISSING,
            oom_score_adj: MISSING,
            sig_sig: MISSING,
            sig_code: MISSING,
            sig_comm: MISSING,
            sig_pid: MISSING,
            sig_result: MISSING,
            reclaim_end_nr_reclaimed: MISSING,
            write_folio_flags: MISSING,
            throttled_usec_timeout: MISSING,
            throttled_usec_delayed: MISSING,
            throttled_reason: MISSING,
            throttled_nid: MISSING,
            bio_dev: MISSING,
            bio_nr_sector: MISSING,
            bio_rwbs: MISSING,
            bio_sector: MISSING,
            rq_dev: MISSING,
            rq_sector: MISSING,
            rq_rwbs: MISSING,
            done_dev: MISSING,
            done_sector: MISSING,
            bio_starts_io: 0,
            remap_dev: MISSING,
            remap_sector: MISSING,
            remap_old_dev: MISSING,
            remap_old_sector: MISSING,
            task_exit_code: u32::MAX,
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (size pinned above).
unsafe impl aya::Pod for TracepointOffsets {}
#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (size pinned in counters.rs).
unsafe impl aya::Pod for crate::counters::ProcCounters {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for crate::counters::IoKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for crate::counters::IoCounters {}
#[cfg(feature = "user")]
// SAFETY: as above (explicit padding field, size pinned in counters.rs).
unsafe impl aya::Pod for crate::counters::InflightKey {}
#[cfg(feature = "user")]
// SAFETY: as above (u64 then IoKey: no padding, size pinned in counters.rs).
unsafe impl aya::Pod for crate::counters::InflightIo {}
