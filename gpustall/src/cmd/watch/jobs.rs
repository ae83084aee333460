//! Which processes `gpustall watch` follows: jobs found by `--match` rules (process name,
//! cgroup path) and by the GPU (NVML's compute processes). A job is a root process and all its
//! descendants; the kernel follows the descendants once the root is tracked.

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;

#[derive(Debug, Clone)]
pub enum MatchRule {
    /// `comm:REGEX`: the process name (15 bytes, as the kernel keeps it).
    Comm(Regex),
    /// `cgroup:SUBSTRING`: a substring of the process's cgroup path (a pod, a Slurm job).
    Cgroup(String),
}

impl std::str::FromStr for MatchRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("comm", re)) => {
                Regex::new(re).map(MatchRule::Comm).map_err(|e| format!("bad regex in {s:?}: {e}"))
            }
            Some(("cgroup", sub)) if !sub.is_empty() => Ok(MatchRule::Cgroup(sub.to_string())),
            _ => Err(format!("{s:?} is not a rule: use comm:REGEX or cgroup:SUBSTRING")),
        }
    }
}

impl MatchRule {
    pub fn needs_cgroup(&self) -> bool {
        matches!(self, MatchRule::Cgroup(_))
    }

    pub fn matches(&self, comm: &str, cgroup: Option<&str>) -> bool {
        match self {
            MatchRule::Comm(re) => re.is_match(comm),
            MatchRule::Cgroup(sub) => cgroup.is_some_and(|c| c.contains(sub.as_str())),
        }
    }
}

/// A process as the scan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub cgroup: Option<String>,
}

/// New job roots among `procs`: processes that match a rule or use a GPU, and that are not
/// already inside a tracked tree (or under another new root).
pub fn new_roots(
    procs: &[Candidate],
    rules: &[MatchRule],
    gpu_pids: &BTreeSet<u32>,
    tracked: &BTreeSet<u32>,
) -> Vec<u32> {
    let parent: BTreeMap<u32, u32> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
    let wanted: BTreeSet<u32> = procs
        .iter()
        .filter(|p| {
            gpu_pids.contains(&p.pid)
                || rules.iter().any(|r| r.matches(&p.comm, p.cgroup.as_deref()))
        })
        .map(|p| p.pid)
        .collect();
    // A wanted process whose ancestor is tracked or wanted belongs to that job already.
    let covered = |pid: u32| {
        let mut cur = parent.get(&pid).copied();
        let mut hops = 0;
        while let Some(p) = cur {
            if p <= 1 || hops > 64 {
                return false;
            }
            if tracked.contains(&p) || wanted.contains(&p) {
                return true;
            }
            cur = parent.get(&p).copied();
            hops += 1;
        }
        false
    };
    wanted.iter().copied().filter(|&p| !tracked.contains(&p) && !covered(p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(pid: u32, ppid: u32, comm: &str, cg: &str) -> Candidate {
        Candidate { pid, ppid, comm: comm.into(), cgroup: Some(cg.into()) }
    }

    #[test]
    fn rules_parse_and_match() {
        let r: MatchRule = "comm:^python".parse().expect("rule");
        assert!(r.matches("python3", None) && !r.matches("bash", None));
        let r: MatchRule = "cgroup:slurm/uid_0/job_42".parse().expect("rule");
        assert!(
            r.matches("x", Some("/slurm/uid_0/job_42/step_0"))
                && !r.matches("x", Some("/user.slice"))
        );
        assert!("name:x".parse::<MatchRule>().is_err());
        assert!("comm:(".parse::<MatchRule>().is_err());
    }

    #[test]
    fn roots_are_the_topmost_matching_processes() {
        let procs = vec![
            c(1, 0, "init", "/"),
            c(100, 1, "bash", "/"),
            c(200, 100, "python3", "/job"),
            c(201, 200, "python3", "/job"), // a worker: under 200
            c(300, 1, "python3", "/other"),
            c(400, 1, "sleep", "/job"),
            c(500, 1, "trainer", "/"),
        ];
        let rules = vec!["comm:^python".parse().expect("rule")];
        assert_eq!(new_roots(&procs, &rules, &BTreeSet::new(), &BTreeSet::new()), vec![200, 300]);
        // Already tracked: nothing new under it.
        assert_eq!(new_roots(&procs, &rules, &BTreeSet::new(), &[200].into()), vec![300]);
        // A cgroup rule, and a GPU process found by NVML.
        let rules = vec!["cgroup:/job".parse().expect("rule")];
        assert_eq!(new_roots(&procs, &rules, &[500].into(), &BTreeSet::new()), vec![200, 400, 500]);
    }
}
