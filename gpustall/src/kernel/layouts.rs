//! What this kernel's BTF says about the structs the programs read.

use gpustall_common::blocklayout::BlockLayout;
use gpustall_common::folio::FolioLayout;
use gpustall_common::sched::StackLayout;
use gpustall_common::task::{TaskOffsets, UNKNOWN as TASK_UNKNOWN};

/// What this kernel's BTF says about its structs: written into the programs' globals before
/// load, and what decides whether a typed program can run.
#[derive(Clone, Copy, Debug)]
pub struct Layouts {
    pub task: TaskOffsets,
    /// Where a folio's flags and order are, or what BTF lacks for it (kernel::folio).
    pub folio: Result<FolioLayout, &'static str>,
    pub block: BlockLayout,
    /// Where `struct pt_regs` keeps the syscall number (kernel::offcpu_maps::syscall_nr_offset).
    pub syscall_nr: u32,
    /// How the typed sched_waking tells interrupt context (kernel::offcpu_maps::stack_layout).
    pub stack: StackLayout,
    /// Where `struct task_struct` keeps the thread's CPU time (`se.sum_exec_runtime`), read
    /// by the CUDA uprobes (kernel::cuda).
    pub cpu_time: u32,
}

impl Layouts {
    /// Nothing known (no BTF): every typed program falls back.
    pub const fn unknown() -> Self {
        Self {
            task: TaskOffsets::unknown(),
            folio: Err("the folio's layout"),
            block: BlockLayout::unknown(),
            syscall_nr: TASK_UNKNOWN,
            stack: StackLayout::unknown(),
            cpu_time: TASK_UNKNOWN,
        }
    }

    pub fn from_btf(btf: &btf_rs::Btf) -> Self {
        let syscall_nr = crate::kernel::offcpu_maps::syscall_nr_offset(btf);
        Self {
            task: crate::kernel::btf::task_offsets(btf),
            folio: crate::kernel::folio::from_btf(btf),
            block: crate::kernel::btf::block_layout(btf),
            syscall_nr: syscall_nr.unwrap_or(TASK_UNKNOWN),
            stack: crate::kernel::offcpu_maps::stack_layout(btf, syscall_nr),
            cpu_time: crate::kernel::btf::cpu_time_offset(btf).unwrap_or(TASK_UNKNOWN),
        }
    }
}
