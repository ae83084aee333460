//! A process's identity in its cluster (`model::identity`), read from /proc: every path of
//! /proc/PID/cgroup (v1 lists one per hierarchy, v2 one), the few environment variables of
//! `identity::ENV_VARS` in /proc/PID/environ (the rest is never kept), and in a Kubernetes pod
//! the names the kubelet gives its log files and the namespace of its service account, seen
//! inside the container's root. Best effort: a process that exited, or whose files cannot be
//! read, has what could be read.

use std::io::Read;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::model::identity::{Identity, ENV_VARS};

/// The service-account namespace file a pod's containers get, inside the container.
const SA_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The kubelet's pod log directories (`<namespace>_<pod>_<uid>`) and its links to container
/// logs (`<pod>_<namespace>_<container>-<id>.log`), on the node. The DaemonSet mounts both.
const POD_LOGS: &str = "/var/log/pods";
const CONTAINER_LOGS: &str = "/var/log/containers";

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
    if !id.in_pod() {
        return id;
    }
    let ns = read_in_root(pid, SA_NAMESPACE).map(|s| s.trim().to_string());
    id.namespace = ns.filter(|s| {
        let ok = crate::model::identity::is_dns_label(s);
        if !ok && !s.is_empty() {
            log::warn!("pid {pid}'s service-account namespace is not a Kubernetes name: not used");
        }
        ok
    });
    let (pods, containers) = (dir_names(POD_LOGS), dir_names(CONTAINER_LOGS));
    id.with_kubelet_logs(pods.iter().map(String::as_str), containers.iter().map(String::as_str))
}

/// The most read of a file in a job's world: a namespace is 63 bytes.
const MAX_FILE: u64 = 4096;

/// A file of `pid`'s as the process sees it, read only where that process itself could read
/// it: the job's world is the job's to arrange, and gpustall reads as root. Not through the
/// plain /proc/PID/root/<path>: an absolute link on the way (/var/run -> /run in most images,
/// where the runtime mounts the service account) would resolve in gpustall's own root.
/// openat2's RESOLVE_IN_ROOT resolves it in the process's (the kubelet's own links,
/// `namespace -> ..data/namespace`, are followed). Opened first as a path only (O_PATH: a FIFO
/// or a device put there is neither waited on nor opened), then read when it is a small
/// regular file the process may read.
fn read_in_root(pid: u32, path: &str) -> Option<String> {
    let root = rustix::fs::open(
        format!("/proc/{pid}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    let at =
        rustix::fs::openat2(&root, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), resolve)
            .ok()?;
    let st = rustix::fs::fstat(&at).ok()?;
    let creds = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::RegularFile || st.st_size as u64 > MAX_FILE {
        log::warn!("{path} in pid {pid}'s root is not a small regular file: not read");
        return None;
    }
    if !readable_by(&creds, st.st_uid, st.st_gid, st.st_mode) {
        log::warn!("{path} in pid {pid}'s root is not readable by that process: not read");
        return None;
    }
    // The path opened above, now for reading: through our own fd's link, no new lookup.
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&at)),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .ok()?;
    let mut text = String::new();
    std::fs::File::from(fd).take(MAX_FILE).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Whether a process with the credentials of its /proc/PID/status (`Uid:`, `Gid:`, `Groups:`:
/// the effective ones count) may read a file of that owner, group and mode.
fn readable_by(status: &str, uid: u32, gid: u32, mode: u32) -> bool {
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|r| r.split_whitespace().filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default()
    };
    let (euid, egid) = (ids("Uid:").get(1).copied(), ids("Gid:").get(1).copied());
    let groups = ids("Groups:");
    match euid {
        None => false,
        Some(0) => true,
        Some(u) if u == uid => mode & 0o400 != 0,
        Some(_) if egid == Some(gid) || groups.contains(&gid) => mode & 0o040 != 0,
        Some(_) => mode & 0o004 != 0,
    }
}

/// The names in a directory (none where it is absent: a node without a kubelet).
fn dir_names(dir: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()
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
    fn a_file_is_readable_as_its_owner_group_and_mode_say() {
        let status = |uid: u32, gid: u32, groups: &str| {
            format!("Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\nGroups:\t{groups}\n")
        };
        // A root-only file: root reads it, a job's user does not.
        assert!(readable_by(&status(0, 0, ""), 0, 0, 0o600));
        assert!(!readable_by(&status(1000, 1000, "1000"), 0, 0, 0o600));
        // The kubelet's 0644 files, and a group-readable one through a supplementary group.
        assert!(readable_by(&status(1000, 1000, "1000"), 0, 0, 0o644));
        assert!(readable_by(&status(1000, 1000, "1000 2000"), 0, 2000, 0o640));
        assert!(!readable_by(&status(1000, 1000, "1000"), 0, 2000, 0o640));
        assert!(!readable_by("", 0, 0, 0o644), "no credentials read: not read");
    }

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

    #[test]
    fn a_file_is_read_inside_the_processs_root() {
        // This process's root is the reader's: a file reads as it always does.
        let pid = std::process::id();
        let direct = std::fs::read_to_string("/etc/hostname").ok();
        assert_eq!(read_in_root(pid, "/etc/hostname"), direct);
        assert_eq!(read_in_root(pid, "/no/such/file"), None);
    }
}
