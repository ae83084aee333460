//! A process's identity in its cluster (`model::identity`), read from /proc: every path of
//! /proc/PID/cgroup (v1 lists one per hierarchy, v2 one), the few environment variables of
//! `identity::ENV_VARS` in /proc/PID/environ (the rest is never kept), and in a Kubernetes pod
//! the namespace of its service account, seen through /proc/PID/root. Best effort: a process
//! that exited, or whose files cannot be read, has what could be read.

use crate::model::identity::{Identity, ENV_VARS};

/// The service-account namespace file a pod's containers get, under the process's root.
const SA_NAMESPACE: &str = "var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// What /proc says of `pid` (empty when nothing is known).
pub fn read(pid: u32) -> Identity {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut id = Identity::default();
    for path in cgroups.lines().filter_map(|l| l.splitn(3, ':').nth(2)) {
        let more = Identity::from_cgroup(path);
        id = Identity::of_job([&id, &more]);
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let mut id = id.with_env(env_pairs(&environ));
    if id.in_pod() {
        let ns = std::fs::read_to_string(format!("/proc/{pid}/root/{SA_NAMESPACE}"));
        id.namespace = ns.ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    }
    id
}

/// The variables of [`ENV_VARS`] in a NUL-separated environment block; nothing else.
fn env_pairs(environ: &[u8]) -> Vec<(&str, &str)> {
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('='))
        .filter(|(k, _)| ENV_VARS.contains(k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_variables_are_kept() {
        let env = b"PATH=/bin\0RANK=2\0AWS_SECRET_ACCESS_KEY=hush\0WORLD_SIZE=4\0\0";
        assert_eq!(env_pairs(env), [("RANK", "2"), ("WORLD_SIZE", "4")]);
    }

    #[test]
    fn this_process_reads_without_error() {
        // Whatever this machine is, reading it works and names no pod it is not in.
        let id = read(std::process::id());
        assert!(id.namespace.is_none() || id.in_pod());
    }
}
