//! The names the eBPF object and the agent agree on: maps (the `static`s of gpustall-ebpf, whose
//! names are the map names in the object), programs (the `#[tracepoint]` functions) and the
//! global the loader rewrites. The agent looks everything up by these; a unit test in the agent
//! checks each one against the built object, so a rename on one side fails the build's tests.

/// The `log` target of the kernel side's own lines (aya-log): `RUST_LOG=gpustall::ebpf=debug`
/// turns them on; without it the programs do not even format them.
pub const LOG_TARGET: &str = "gpustall::ebpf";

/// Map names.
pub mod maps {
    pub const TRACKED: &str = "TRACKED";
    pub const TRACKED_HINT: &str = "TRACKED_HINT";
    pub const CRITICAL: &str = "CRITICAL";
    pub const BULK: &str = "BULK";
    pub const LOST: &str = "LOST";
    pub const PROC_COUNTERS: &str = "PROC_COUNTERS";
    pub const HOST: &str = "HOST";
    pub const IO_COUNTERS: &str = "IO_COUNTERS";
    pub const IO_LATENCY: &str = "IO_LATENCY";
    pub const IO_INFLIGHT: &str = "IO_INFLIGHT";
    pub const RQ_SLOTS: &str = "RQ_SLOTS";
    pub const RQ_HINT: &str = "RQ_HINT";
    pub const OFFCPU_THREADS: &str = "OFFCPU_THREADS";
    pub const OFFCPU: &str = "OFFCPU";
    pub const WAKES: &str = "WAKES";
    pub const SYSCALL_WAITS: &str = "SYSCALL_WAITS";
    pub const FEEDERS: &str = "FEEDERS";
    pub const KILLED_THREADS: &str = "KILLED_THREADS";
    pub const GPU_CALLS: &str = "GPU_CALLS";
    pub const GPU_WAITS: &str = "GPU_WAITS";
}

/// The global holding this kernel's tracepoint field offsets.
pub const OFFSETS: &str = "OFFSETS";
/// The global holding the sched_switch / sched_waking field offsets.
pub const SCHED_OFFSETS: &str = "SCHED_OFFSETS";
/// The global holding task_struct/signal_struct/siginfo offsets (`task::TaskOffsets`, from BTF).
pub const TASK_OFFSETS: &str = "TASK_OFFSETS";
/// The global holding where a folio's flags and order are (`folio::FolioLayout`, from BTF).
pub const FOLIO_LAYOUT: &str = "FOLIO_LAYOUT";
/// The global holding the offset of the syscall number in `struct pt_regs` (x86_64 `orig_ax`,
/// from BTF; `task::UNKNOWN` elsewhere), read by the typed sched_switch program.
pub const SYSCALL_NR_OFFSET: &str = "SYSCALL_NR_OFFSET";
/// The global holding the offset of the thread's CPU time in `struct task_struct`
/// (`se.sum_exec_runtime`, from BTF; `task::UNKNOWN` without it), read by the CUDA uprobes.
pub const CPU_TIME_OFFSET: &str = "CPU_TIME_OFFSET";
/// The typed sched_waking's `StackLayout` global (`gpustall_common::sched`).
pub const STACK_LAYOUT: &str = "STACK_LAYOUT";
/// The typed block programs' `BlockLayout` global.
pub const BLOCK_LAYOUT: &str = "BLOCK_LAYOUT";

/// Program names (one per tracepoint family member).
pub mod programs {
    pub const TASK_NEWTASK: &str = "task_newtask";
    pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
    pub const TASK_RENAME: &str = "task_rename";
    pub const SCHED_PROCESS_EXEC: &str = "sched_process_exec";
    pub const MARK_VICTIM: &str = "mark_victim";
    pub const SIGNAL_GENERATE: &str = "signal_generate";
    /// The raw tracepoint twin of SIGNAL_GENERATE (reads the target task's tgid); the classic one
    /// is its fallback.
    pub const SIGNAL_GENERATE_RAW: &str = "signal_generate_raw";
    pub const DIRECT_RECLAIM_BEGIN: &str = "mm_vmscan_direct_reclaim_begin";
    pub const DIRECT_RECLAIM_END: &str = "mm_vmscan_direct_reclaim_end";
    pub const MEMCG_RECLAIM_BEGIN: &str = "mm_vmscan_memcg_reclaim_begin";
    pub const MEMCG_RECLAIM_END: &str = "mm_vmscan_memcg_reclaim_end";
    pub const KSWAPD_WAKE: &str = "mm_vmscan_kswapd_wake";
    pub const KSWAPD_SLEEP: &str = "mm_vmscan_kswapd_sleep";
    pub const WRITE_FOLIO: &str = "mm_vmscan_write_folio";
    /// The BTF-typed twin of WRITE_FOLIO (reads the folio's order); the classic one is its
    /// fallback.
    pub const WRITE_FOLIO_BTF: &str = "mm_vmscan_write_folio_btf";
    pub const WAKEUP_KSWAPD: &str = "mm_vmscan_wakeup_kswapd";
    pub const THROTTLED: &str = "mm_vmscan_throttled";
    pub const BLOCK_BIO_QUEUE: &str = "block_bio_queue";
    pub const BLOCK_BIO_REMAP: &str = "block_bio_remap";
    pub const BLOCK_IO_START: &str = "block_io_start";
    pub const BLOCK_IO_DONE: &str = "block_io_done";
    pub const BLOCK_BIO_QUEUE_BTF: &str = "block_bio_queue_btf";
    pub const BLOCK_IO_START_BTF: &str = "block_io_start_btf";
    pub const BLOCK_IO_DONE_BTF: &str = "block_io_done_btf";
    pub const SCHED_SWITCH_BTF: &str = "sched_switch_btf";
    pub const DIRECT_RECLAIM_END_BTF: &str = "mm_vmscan_direct_reclaim_end_btf";
    pub const MEMCG_RECLAIM_END_BTF: &str = "mm_vmscan_memcg_reclaim_end_btf";
    pub const SCHED_WAKING_BTF: &str = "sched_waking_btf";
    pub const SCHED_SWITCH: &str = "sched_switch";
    pub const SCHED_WAKING: &str = "sched_waking";
    pub const HRTIMER_EXPIRE_ENTRY: &str = "hrtimer_expire_entry";
    pub const HRTIMER_EXPIRE_EXIT: &str = "hrtimer_expire_exit";
    /// The uprobe and uretprobe on the CUDA driver's synchronising calls (`kernel::cuda`).
    pub const CUDA_SYNC_ENTER: &str = "cuda_sync_enter";
    pub const CUDA_SYNC_EXIT: &str = "cuda_sync_exit";
}
