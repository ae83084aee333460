//! The block I/O limits on a process's cgroup and its ancestors: v1's
//! blkio.throttle.{read,write}_{bps,iops}_device and v2's io.max. A throttled bio waits in the
//! throttle and is issued later from a kernel thread: the job's disk looks idle, its
//! processes sit in D state, and the limit, not the disk, is the bottleneck.

use std::path::{Path, PathBuf};

use crate::model::host::IoLimit;
use crate::sources::cgroup::mounts;
use crate::sources::cpu_sample::{controller_mounts, controller_paths};
use crate::sources::host::read_text;

/// The limits set on `pid`'s block I/O cgroup or any ancestor, nearest first; none where no
/// limit is set or the controller is absent. `None` where `pid` is gone (its cgroup unread).
pub fn read_io_limits(pid: u32) -> Option<Vec<IoLimit>> {
    let cgroup = read_text(Path::new(&format!("/proc/{pid}/cgroup")))?;
    let Some((dir, path, version, mount_point)) = find_io_cgroup(&cgroup) else {
        return Some(Vec::new());
    };
    let names = mounts::lexical(&path).names;
    let dirs: Vec<PathBuf> =
        std::iter::once(dir.clone()).chain(mounts::ancestors(&dir, &mount_point)).collect();
    let limits = dirs
        .iter()
        .enumerate()
        .flat_map(|(up, d)| {
            let path = format!("/{}", names[..names.len().saturating_sub(up)].join("/"));
            read_level(d, &path, version)
        })
        .map(|l| IoLimit { device: device_name(&l.dev), ..l })
        .collect();
    Some(limits)
}

/// The block I/O cgroup of a process whose /proc/PID/cgroup reads `cgroup`.
fn find_io_cgroup(cgroup: &str) -> Option<(PathBuf, String, u8, PathBuf)> {
    let mountinfo = read_text(Path::new("/proc/self/mountinfo"))?;
    let (v1, v2) = controller_paths(cgroup, "blkio");
    for (version, seen, ctrl) in [(1u8, v1, "blkio"), (2, v2, "io")] {
        let Some(seen) = seen else { continue };
        for m in controller_mounts(&mountinfo, ctrl).iter().filter(|m| m.version == version) {
            let Some((dir, path)) = mounts::resolve(m, None, &seen) else { continue };
            let has = if version == 1 {
                dir.join("blkio.throttle.read_bps_device")
            } else {
                dir.join("io.max")
            };
            // v2's root has no io.max: its children are where limits live.
            if has.exists() || (version == 2 && dir.join("cgroup.controllers").exists()) {
                return Some((dir, path, version, m.mount_point.clone()));
            }
        }
    }
    None
}

fn read_level(dir: &Path, path: &str, version: u8) -> Vec<IoLimit> {
    if version == 2 {
        return read_text(&dir.join("io.max")).map_or_else(Vec::new, |t| parse_io_max(path, &t));
    }
    let mut limits: Vec<IoLimit> = Vec::new();
    for (file, set) in [
        (
            "blkio.throttle.read_bps_device",
            (|l: &mut IoLimit, v| l.rbps = Some(v)) as fn(&mut IoLimit, u64),
        ),
        ("blkio.throttle.write_bps_device", |l, v| l.wbps = Some(v)),
        ("blkio.throttle.read_iops_device", |l, v| l.riops = Some(v)),
        ("blkio.throttle.write_iops_device", |l, v| l.wiops = Some(v)),
    ] {
        for (dev, v) in read_text(&dir.join(file)).map_or_else(Vec::new, |t| parse_v1_device(&t)) {
            let at = match limits.iter().position(|l| l.dev == dev) {
                Some(i) => i,
                None => {
                    limits.push(IoLimit { path: path.to_string(), dev, ..Default::default() });
                    limits.len() - 1
                }
            };
            set(&mut limits[at], v);
        }
    }
    limits
}

/// A v1 blkio.throttle.*_device file: "8:0 8388608" a line.
pub fn parse_v1_device(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// v2 io.max: "8:0 rbps=8388608 wbps=max riops=max wiops=max" a line ("max": no limit).
pub fn parse_io_max(path: &str, text: &str) -> Vec<IoLimit> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let mut limit = IoLimit {
                path: path.to_string(),
                dev: f.next()?.to_string(),
                ..Default::default()
            };
            for kv in f {
                let Some((k, v)) = kv.split_once('=') else { continue };
                let v = v.parse().ok();
                match k {
                    "rbps" => limit.rbps = v,
                    "wbps" => limit.wbps = v,
                    "riops" => limit.riops = v,
                    "wiops" => limit.wiops = v,
                    _ => {}
                }
            }
            limit.is_set().then_some(limit)
        })
        .collect()
}

/// The kernel's name of block device MAJ:MIN (/sys/dev/block/MAJ:MIN links to it).
fn device_name(dev: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/dev/block/{dev}")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_from_v1_and_v2_files() {
        assert_eq!(
            parse_v1_device("7:3 8388608\n253:0 100\n"),
            [("7:3".into(), 8388608), ("253:0".into(), 100)]
        );
        let v2 = parse_io_max("/job", "7:3 rbps=8388608 wbps=max riops=max wiops=200\n8:0 rbps=max wbps=max riops=max wiops=max\n");
        assert_eq!(v2.len(), 1, "a device with every limit at max is not limited");
        assert_eq!(
            (v2[0].dev.as_str(), v2[0].rbps, v2[0].wbps, v2[0].wiops),
            ("7:3", Some(8388608), None, Some(200))
        );
    }

    /// A gone process answers nothing, so a reading taken after the job exited cannot replace
    /// the limits read while it ran with "none" (the race that made io_throttle flaky).
    #[test]
    fn a_gone_process_has_no_reading_and_a_live_one_has_one() {
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        child.wait().expect("reaped");
        assert_eq!(read_io_limits(pid), None);
        assert!(read_io_limits(std::process::id()).is_some());
    }
}
