//! Pairing of reclaim begin/end tracepoints per thread. This is pure logic, run by the eBPF
//! programs in the kernel and unit-tested here on the host: the kernel keeps one
//! [`ReclaimStart`] per thread in a hash map and calls [`on_begin`] / [`on_end`].

/// Which reclaim a stall was in.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "user", serde(rename_all = "snake_case"))]
pub enum ReclaimKind {
    /// Global direct reclaim: the allocating task reclaims for the whole machine.
    Direct = 1,
    /// memcg reclaim: the task's cgroup hit its limit (container, Slurm job, pod).
    Memcg = 2,
    /// kswapd's background reclaim, wake to sleep (host level).
    Kswapd = 3,
}

impl TryFrom<u32> for ReclaimKind {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        match v {
            1 => Ok(Self::Direct),
            2 => Ok(Self::Memcg),
            3 => Ok(Self::Kswapd),
            other => Err(other),
        }
    }
}

/// A thread's reclaim in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimStart {
    pub start_ns: u64,
    pub kind: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<ReclaimStart>() == 16);

/// The entry to store after a begin: always a new episode. Direct and memcg reclaim never nest
/// (reclaim runs with PF_MEMALLOC, and a charge under PF_MEMALLOC is forced, not reclaimed), so
/// an entry already there is stale: its end was missed (the thread began reclaim before the end
/// program was attached, or the end was lost). Deepening it would leave the thread "in reclaim"
/// for the rest of its life.
#[inline(always)]
pub fn on_begin(kind: ReclaimKind, now_ns: u64) -> ReclaimStart {
    ReclaimStart { start_ns: now_ns, kind: kind as u32, _pad: 0 }
}

/// The entry to store when kswapd wakes, or `None` to keep the one there. Under sustained
/// pressure kswapd wakes round after round without sleeping: its episode runs from the first
/// wake to the sleep, so a wake inside an episode must not move the start.
#[inline(always)]
pub fn on_kswapd_wake(existing: Option<&ReclaimStart>, now_ns: u64) -> Option<ReclaimStart> {
    match existing {
        Some(s) if s.kind == ReclaimKind::Kswapd as u32 => None,
        _ => Some(on_begin(ReclaimKind::Kswapd, now_ns)),
    }
}

/// What an end means for the thread's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndOutcome {
    /// The outermost end: the stall is over. Delete the entry and report it.
    Complete { kind: u32, start_ns: u64, duration_ns: u64 },
    /// An end without a begin (tracing started mid-reclaim, or the entry was lost): ignore.
    Unmatched,
}

#[inline(always)]
pub fn on_end(existing: Option<&ReclaimStart>, now_ns: u64) -> EndOutcome {
    match existing {
        None => EndOutcome::Unmatched,
        Some(s) => EndOutcome::Complete {
            kind: s.kind,
            start_ns: s.start_ns,
            duration_ns: now_ns.saturating_sub(s.start_ns),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_end_gives_duration() {
        let s = on_begin(ReclaimKind::Memcg, 1_000);
        assert_eq!(
            on_end(Some(&s), 1_750),
            EndOutcome::Complete { kind: 2, start_ns: 1_000, duration_ns: 750 }
        );
    }

    #[test]
    fn a_begin_over_a_stale_entry_starts_afresh() {
        // The first end was missed (attached later, or lost): the next episode stands alone.
        let _stale = on_begin(ReclaimKind::Direct, 100);
        let next = on_begin(ReclaimKind::Memcg, 5_000);
        assert_eq!(next, ReclaimStart { start_ns: 5_000, kind: 2, _pad: 0 });
        assert_eq!(
            on_end(Some(&next), 5_400),
            EndOutcome::Complete { kind: 2, start_ns: 5_000, duration_ns: 400 }
        );
    }

    #[test]
    fn kswapd_rounds_without_sleep_are_one_episode_from_the_first_wake() {
        let first = on_kswapd_wake(None, 1_000).expect("a new episode");
        assert_eq!(on_kswapd_wake(Some(&first), 2_000), None, "a second wake keeps the start");
        assert_eq!(
            on_end(Some(&first), 9_000),
            EndOutcome::Complete { kind: 3, start_ns: 1_000, duration_ns: 8_000 }
        );
    }

    #[test]
    fn end_without_begin_is_unmatched() {
        assert_eq!(on_end(None, 5), EndOutcome::Unmatched);
    }

    #[test]
    fn thread_exiting_inside_reclaim_leaves_nothing_to_pair() {
        // The exit program deletes the thread's entry; a later end for a reused tid is unmatched.
        let s = on_begin(ReclaimKind::Memcg, 10);
        let after_exit: Option<&ReclaimStart> = None;
        let _ = s;
        assert_eq!(on_end(after_exit, 20), EndOutcome::Unmatched);
    }

    #[test]
    fn clock_going_backwards_saturates() {
        let s = on_begin(ReclaimKind::Direct, 500);
        assert_eq!(
            on_end(Some(&s), 400),
            EndOutcome::Complete { kind: 1, start_ns: 500, duration_ns: 0 }
        );
    }

    #[test]
    fn latency_buckets_are_log2() {
        use crate::counters::latency_bucket;
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 0);
        assert_eq!(latency_bucket(1023), 9);
        assert_eq!(latency_bucket(1024), 10);
        assert_eq!(latency_bucket(u64::MAX), 39);
    }
}
