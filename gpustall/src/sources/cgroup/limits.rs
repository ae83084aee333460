//! The limit that binds a job, and the cgroup files that say how often it did: pure functions
//! of what the files read, unit-tested without /sys.
//!
//! Why the ancestors: a Slurm job or a Kubernetes pod sets memory.max on a parent cgroup and
//! runs the job in a child whose own file says "max". The kernel charges every page to each
//! cgroup on the way up, so the job runs out at the smallest limit on that path.

use crate::model::host::{MemEvents, Psi};

/// One cgroup on the path from the job's cgroup up to the mount's root, as its files read.
#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    pub path: String,
    /// `None`: no limit ("max", or v1's huge "unlimited").
    pub limit: Option<u64>,
    /// v2 memory.swap.max; v1 memory.memsw.limit_in_bytes (memory + swap).
    pub swap_limit: Option<u64>,
    /// v1 memory.use_hierarchy: its children's charges reach it only when set (always on v2,
    /// and on v1 since Linux 5.11, where the file reads 1).
    pub hierarchical: bool,
}

/// A limit in bytes, and the index of the level that sets it.
pub type Bound = (u64, usize);

/// The smallest of `value` over the levels the job's charges reach (`levels[0]` is the job's
/// own cgroup, then its parent, ...), with the index of the level that sets it.
pub fn smallest(levels: &[Level], value: impl Fn(&Level) -> Option<u64>) -> Option<Bound> {
    let mut best: Option<Bound> = None;
    for (i, l) in levels.iter().enumerate() {
        // A v1 parent without use_hierarchy does not see its children's charges: neither it
        // nor anything above it limits them.
        if i > 0 && !l.hierarchical {
            break;
        }
        if let Some(v) = value(l) {
            if best.is_none_or(|(b, _)| v < b) {
                best = Some((v, i));
            }
        }
    }
    best
}

/// The job's effective limits: (memory, its setter's index), (swap, its setter's index). On
/// v1 the swap allowed is the memory+swap limit less the memory limit.
pub fn effective(levels: &[Level], version: u8) -> (Option<Bound>, Option<Bound>) {
    let mem = smallest(levels, |l| l.limit);
    let swap = smallest(levels, |l| l.swap_limit);
    let swap = if version == 1 {
        swap.map(|(memsw, i)| (memsw.saturating_sub(mem.map_or(memsw, |m| m.0)), i))
    } else {
        swap
    };
    (mem, swap)
}

/// The value of `key` in "key value" lines (memory.events, memory.oom_control).
pub fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(char::is_whitespace)?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

/// v2 memory.events; `None` when the text is not one (no `max` line).
pub fn parse_events(text: &str) -> Option<MemEvents> {
    let v = |k| keyed_value(text, k);
    Some(MemEvents {
        low: v("low").unwrap_or(0),
        high: v("high").unwrap_or(0),
        max: v("max")?,
        oom: v("oom").unwrap_or(0),
        oom_kill: v("oom_kill").unwrap_or(0),
        oom_group_kill: v("oom_group_kill"),
    })
}

/// A PSI file (memory.pressure, /proc/pressure/memory):
/// "some avg10=0.12 avg60=0.05 avg300=0.01 total=12345" and a "full" line of the same form.
/// `None` without a "some" line.
pub fn parse_psi(text: &str) -> Option<Psi> {
    let line = |kind: &str| {
        let l = text.lines().find(|l| l.split_whitespace().next() == Some(kind))?;
        let field = |name: &str| {
            l.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        Some((field("avg10")?.parse::<f64>().ok()?, field("total")?.parse::<u64>().ok()?))
    };
    let (some_avg10, some_total_us) = line("some")?;
    let (full_avg10, full_total_us) = line("full").unwrap_or((0.0, 0));
    Some(Psi { some_avg10, some_total_us, full_avg10, full_total_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(path: &str, limit: Option<u64>, swap: Option<u64>, h: bool) -> Level {
        Level { path: path.into(), limit, swap_limit: swap, hierarchical: h }
    }

    #[test]
    fn the_parents_limit_binds_a_leaf_without_one() {
        // A Slurm step: the job sets 4 GiB, the step says max.
        let levels = vec![
            level("/slurm/job_1/step_0", None, None, true),
            level("/slurm/job_1", Some(4 << 30), Some(1 << 30), true),
            level("/slurm", Some(64 << 30), None, true),
            level("/", None, None, true),
        ];
        assert_eq!(effective(&levels, 2), (Some((4 << 30, 1)), Some((1 << 30, 1))));
        // The leaf's own, when smaller, is the one.
        let mut l = levels.clone();
        l[0].limit = Some(1 << 30);
        assert_eq!(smallest(&l, |l| l.limit), Some((1 << 30, 0)));
        assert_eq!(smallest(&levels[3..], |l| l.limit), None, "no limit anywhere");
    }

    #[test]
    fn v1_without_use_hierarchy_stops_the_walk() {
        let levels = vec![
            level("/a/b", None, None, true),
            level("/a", Some(1 << 30), None, false),
            level("/", None, None, true),
        ];
        assert_eq!(smallest(&levels, |l| l.limit), None);
    }

    #[test]
    fn v1_swap_is_memsw_less_memory() {
        let levels = vec![
            level("/job/x", None, None, true),
            level("/job", Some(512 << 20), Some(768 << 20), true),
        ];
        assert_eq!(effective(&levels, 1).1, Some((256 << 20, 1)));
    }

    #[test]
    fn events_and_psi_parse() {
        let e = parse_events("low 1\nhigh 2\nmax 1234\noom 4\noom_kill 3\n").expect("events");
        assert_eq!((e.low, e.high, e.max, e.oom, e.oom_kill), (1, 2, 1234, 4, 3));
        assert_eq!(e.oom_group_kill, None, "before 5.17");
        assert_eq!(parse_events("oom_kill 3\n"), None, "v1's oom_control is not memory.events");
        let p = parse_psi(
            "some avg10=12.50 avg60=3.00 avg300=0.10 total=987654\nfull avg10=1.25 avg60=0.00 avg300=0.00 total=4321\n",
        )
        .expect("psi");
        assert_eq!(
            p,
            Psi { some_avg10: 12.5, some_total_us: 987654, full_avg10: 1.25, full_total_us: 4321 }
        );
        assert_eq!(parse_psi(""), None, "psi=0: the file reads EOPNOTSUPP or is empty");
    }
}
