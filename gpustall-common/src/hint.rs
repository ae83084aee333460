//! A cheap first test for "is this process tracked?" and "is this thread accounted?", asked by
//! nearly every program on every run, nearly always about a task outside the job: a context
//! switch or a wakeup anywhere on the host, another process's bio. The answer lives in hash
//! maps (`TRACKED` by pid, `OFFCPU_THREADS` by tid), and a hash lookup is most of what such a
//! run costs. A hint array beside each counts the map's entries per bucket of ids: a bucket at
//! 0 means "not in the map" after one inlined array load; otherwise the map is asked.
//!
//! The count must never be under the truth (a tracked process read as untracked would lose its
//! events), and may be over it (a needless lookup). So every writer adds 1 before inserting a
//! new key and takes it back if the insert did not add one, and subtracts 1 only after a
//! delete that removed a key. Entries that leave otherwise (LRU eviction) leave the count high:
//! harmless. The kernel adds with BPF's atomic add; the agent, which also tracks and forgets
//! processes, with atomic adds on the array mapped into its memory (`BPF_F_MMAPABLE`).

/// Buckets per hint array (a power of two). 16,384 x 8 bytes = 128 KiB per array; ids share a
/// bucket every 16,384, so a bucket of a tracked process's pid sends others to the map too.
pub const HINT_SLOTS: u32 = 16384;

/// The bucket of a pid or tid.
#[inline(always)]
pub const fn slot(id: u32) -> u32 {
    id & (HINT_SLOTS - 1)
}

/// `BPF_F_MMAPABLE`: the agent maps the tracked-process hint (5.5+).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_fill_buckets_in_turn() {
        assert_eq!(slot(0), 0);
        assert_eq!(slot(16383), 16383);
        assert_eq!(slot(16384), 0);
        assert_eq!(slot(4_194_303), 16383);
    }
}
