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
    /// The outermost reclaim's kind: a nested begin does not change what the stall is.
    pub kind: u32,
    /// Begins seen without their end yet (memcg reclaim can nest inside direct reclaim).
    pub depth: u32,
}
const _: () = assert!(core::mem::size_of::<ReclaimStart>() == 16);

/// The entry to store after a begin. A begin inside a running episode only deepens it, so the
/// stall is measured from the outermost begin.
#[inline(always)]
pub fn on_begin(existing: Option<&ReclaimStart>, kind: ReclaimKind, now_ns: u64) -> ReclaimStart {
    match existing {
        Some(s) => ReclaimStart { depth: s.depth.saturating_add(1), ..*s },
        None => ReclaimStart { start_ns: now_ns, kind: kind as u32, depth: 1 },
    }
}

/// What an end means for the thread's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndOutcome {
    /// The outermost end: the stall is over. Delete the entry and report it.
    Complete { kind: u32, start_ns: u64, duration_ns: u64 },
    /// An inner end: store the entry back with one level less.
    Inner(ReclaimStart),
    /// An end without a begin (tracing started mid-reclaim, or the entry was lost): ignore.
    Unmatched,
}

#[inline(always)]
pub fn on_end(existing: Option<&ReclaimStart>, now_ns: u64) -> EndOutcome {
    match existing {
        None => EndOutcome::Unmatched,
        Some(s) if s.depth > 1 => EndOutcome::Inner(ReclaimStart { depth: s.depth - 1, ..*s }),
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
        let s = on_begin(None, ReclaimKind::Memcg, 1_000);
        assert_eq!(s.depth, 1);
        assert_eq!(
            on_end(Some(&s), 1_750),
            EndOutcome::Complete { kind: 2, start_ns: 1_000, duration_ns: 750 }
        );
    }

    #[test]
    fn nested_begin_keeps_outer_start_and_kind() {
        let outer = on_begin(None, ReclaimKind::Direct, 100);
        let inner = on_begin(Some(&outer), ReclaimKind::Memcg, 150);
        assert_eq!(inner, ReclaimStart { start_ns: 100, kind: 1, depth: 2 });
        let after_inner_end = match on_end(Some(&inner), 180) {
            EndOutcome::Inner(s) => s,
            other => panic!("inner end completed the stall: {other:?}"),
        };
        assert_eq!(
            on_end(Some(&after_inner_end), 400),
            EndOutcome::Complete { kind: 1, start_ns: 100, duration_ns: 300 }
        );
    }

    #[test]
    fn end_without_begin_is_unmatched() {
        assert_eq!(on_end(None, 5), EndOutcome::Unmatched);
    }

    #[test]
    fn thread_exiting_inside_reclaim_leaves_nothing_to_pair() {
        // The exit program deletes the thread's entry; a later end for a reused tid is unmatched.
        let s = on_begin(None, ReclaimKind::Memcg, 10);
        let after_exit: Option<&ReclaimStart> = None;
        let _ = s;
        assert_eq!(on_end(after_exit, 20), EndOutcome::Unmatched);
    }

    #[test]
    fn clock_going_backwards_saturates() {
        let s = on_begin(None, ReclaimKind::Direct, 500);
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
