//! Where a process's cgroup lies on disk. /proc/PID/cgroup gives the path relative to the
//! READER's cgroup namespace root, and a cgroup mount shows a subtree whose root mountinfo
//! gives relative to that same namespace root. On the host both are absolute and join
//! directly. An agent in a container with a private cgroup namespace (a DaemonSet) that has
//! the host's tree mounted sees a mount root such as "/../.." (the host's root, two levels
//! above its namespace) and other pods' cgroups as "/../../kubepods/pod1/c1": it needs where its
//! own namespace root lies under the mount, which only a look at the tree tells (see
//! `sources::cgroup::find_own_dir`). Everything here is pure.

use std::path::{Path, PathBuf};

/// A cgroup hierarchy mounted on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    /// The mount's root as mountinfo shows it, relative to the reader's cgroup namespace root.
    pub root: String,
    /// 1: a v1 hierarchy with the memory controller; 2: the unified hierarchy.
    pub version: u8,
}

/// The memory-relevant cgroup mounts in a /proc/self/mountinfo text: v1 hierarchies with the
/// memory controller, and cgroup2 mounts, in the order the text lists them.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

/// "36 35 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory" (proc(5)): the
/// optional fields before " - " vary in number, so the fields after it are found by the
/// separator.
fn parse_mountinfo_line(line: &str) -> Option<CgroupMount> {
    let (before, after) = line.split_once(" - ")?;
    let f: Vec<&str> = before.split(' ').collect();
    let (root, mount_point) = (f.get(3)?, f.get(4)?);
    let mut a = after.split(' ');
    let fstype = a.next()?;
    let _source = a.next()?;
    let options = a.next().unwrap_or("");
    let version = match fstype {
        "cgroup2" => 2,
        "cgroup" if options.split(',').any(|o| o == "memory") => 1,
        _ => return None,
    };
    Some(CgroupMount {
        mount_point: PathBuf::from(unescape(mount_point)),
        root: unescape(root),
        version,
    })
}

/// mountinfo writes space, tab, newline and backslash in paths as \ooo octal escapes.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b.get(i + 1..i + 4).and_then(|o| {
            let o = std::str::from_utf8(o).ok()?;
            u8::from_str_radix(o, 8).ok()
        });
        match (b[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A cgroup path resolved lexically: how many levels it climbs above its base, then the names
/// below that. "/../a/./b/.." is (1, ["a"]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lexical {
    pub ups: usize,
    pub names: Vec<String>,
}

pub fn lexical(path: &str) -> Lexical {
    let mut l = Lexical { ups: 0, names: Vec::new() };
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if l.names.pop().is_none() {
                    l.ups += 1;
                }
            }
            name => l.names.push(name.to_string()),
        }
    }
    l
}

/// The names of `names` as an absolute cgroup path ("/" for none).
fn absolute(names: &[String]) -> String {
    format!("/{}", names.join("/"))
}

/// Where the cgroup `seen` (as /proc/PID/cgroup shows it to the agent) lies under `mount`:
/// its directory, and its path from the mount's root (the host's path when the mount is the
/// host's whole tree). `ns_root_in_mount` is where the agent's namespace root lies under the
/// mount, needed only when the mount's root climbs above it ("/.."). `None` when the cgroup is
/// outside what the mount shows.
pub fn resolve(
    mount: &CgroupMount,
    ns_root_in_mount: Option<&str>,
    seen: &str,
) -> Option<(PathBuf, String)> {
    let root = lexical(&mount.root);
    let names = if root.ups == 0 {
        // The mount shows the subtree `root.names` of the namespace: the cgroup must be in it.
        let seen = lexical(seen);
        if seen.ups > 0 || !seen.names.starts_with(&root.names) {
            return None;
        }
        seen.names[root.names.len()..].to_vec()
    } else {
        // The mount reaches above the namespace root: go through where that root lies in it.
        let base = ns_root_in_mount?;
        let full = lexical(&format!("{base}/{seen}"));
        if full.ups > 0 {
            return None;
        }
        full.names
    };
    let dir = names.iter().fold(mount.mount_point.clone(), |d, n| d.join(n));
    let shown = if root.ups == 0 && root.names.is_empty() {
        absolute(&lexical(seen).names)
    } else if root.ups == 0 {
        // A subtree mount: name the cgroup as the namespace sees it.
        absolute(&[root.names.clone(), names].concat())
    } else {
        absolute(&names)
    };
    Some((dir, shown))
}

/// Where the namespace root lies under a mount, from the agent's own cgroup: its directory
/// under the mount (`own_dir_in_mount`, from the mount point) and its path as the agent sees
/// it (`own_seen`, relative to the namespace root). The root is what is left of the former
/// once the latter is taken off its end.
pub fn ns_root_from_own(own_dir_in_mount: &str, own_seen: &str) -> Option<String> {
    let dir = lexical(own_dir_in_mount);
    let seen = lexical(own_seen);
    if dir.ups > 0 || seen.ups > 0 || !dir.names.ends_with(&seen.names) {
        return None;
    }
    Some(absolute(&dir.names[..dir.names.len() - seen.names.len()]))
}

/// The directories from `dir` up to `mount_point`, nearest first, `dir` excluded: the
/// ancestors whose limits bound the job's.
pub fn ancestors(dir: &Path, mount_point: &Path) -> Vec<PathBuf> {
    if !dir.starts_with(mount_point) {
        return Vec::new();
    }
    dir.ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(mount_point))
        .map(Path::to_path_buf)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
36 25 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:17 - cgroup cgroup rw,memory
37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw shared:18 - cgroup cgroup rw,cpu,cpuacct
38 25 0:29 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate
90 80 0:29 /../.. /host/sys/fs\\040cgroup rw - cgroup2 cgroup2 rw
";

    fn mount(point: &str, root: &str, version: u8) -> CgroupMount {
        CgroupMount { mount_point: point.into(), root: root.into(), version }
    }

    #[test]
    fn memory_and_unified_mounts_are_found() {
        assert_eq!(
            parse_mountinfo(MOUNTINFO),
            vec![
                mount("/sys/fs/cgroup/memory", "/", 1),
                mount("/sys/fs/cgroup/unified", "/", 2),
                mount("/host/sys/fs cgroup", "/../..", 2),
            ]
        );
    }

    #[test]
    fn lexical_resolution() {
        assert_eq!(lexical("/../a/./b/.."), Lexical { ups: 1, names: vec!["a".into()] });
        assert_eq!(lexical("/"), Lexical { ups: 0, names: vec![] });
    }

    #[test]
    fn host_agent_joins_the_path() {
        let m = mount("/sys/fs/cgroup", "/", 2);
        let got = resolve(&m, None, "/kubepods/pod1/c1").expect("resolves");
        assert_eq!(got, ("/sys/fs/cgroup/kubepods/pod1/c1".into(), "/kubepods/pod1/c1".into()));
        assert_eq!(resolve(&m, None, "/").expect("root").0, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn a_subtree_mount_strips_its_root() {
        // cgroupns=host container: the mount shows its own subtree only.
        let m = mount("/sys/fs/cgroup/memory", "/docker/abc", 1);
        let got = resolve(&m, None, "/docker/abc/job").expect("resolves");
        assert_eq!(got, ("/sys/fs/cgroup/memory/job".into(), "/docker/abc/job".into()));
        assert_eq!(resolve(&m, None, "/docker/other"), None, "outside the mount");
    }

    #[test]
    fn an_agent_in_a_cgroup_namespace_goes_through_its_own_root() {
        // The agent's namespace root is /kubepods/agentpod; the host's tree is mounted.
        let m = mount("/host/cg", "/../..", 2);
        let base = ns_root_from_own("/kubepods/agentpod/ctr", "/ctr").expect("own");
        assert_eq!(base, "/kubepods/agentpod");
        let got = resolve(&m, Some(&base), "/../../kubepods/pod1/c1").expect("resolves");
        assert_eq!(got, ("/host/cg/kubepods/pod1/c1".into(), "/kubepods/pod1/c1".into()));
        // Without knowing where its root is, the agent cannot place the path.
        assert_eq!(resolve(&m, None, "/../../kubepods/pod1/c1"), None);
        // A namespace-private mount does not show what is above the namespace root.
        assert_eq!(resolve(&mount("/sys/fs/cgroup", "/", 2), None, "/../x"), None);
    }

    #[test]
    fn own_cgroup_must_end_the_dir() {
        assert_eq!(ns_root_from_own("/a/b", "/").as_deref(), Some("/a/b"));
        assert_eq!(ns_root_from_own("/a/b", "/c"), None);
    }

    #[test]
    fn ancestors_stop_at_the_mount() {
        let got = ancestors(Path::new("/cg/a/b/c"), Path::new("/cg"));
        let want: Vec<PathBuf> = vec!["/cg/a/b".into(), "/cg/a".into(), "/cg".into()];
        assert_eq!(got, want);
        assert!(ancestors(Path::new("/cg"), Path::new("/cg")).is_empty());
    }
}
