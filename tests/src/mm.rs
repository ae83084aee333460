//! Memory-management settings a test changes for its length: transparent huge page sizes and a
//! swap device that takes large folios whole. Each is a guard that puts back what was there,
//! on failure too.

use std::path::{Path, PathBuf};

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

fn run(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The selected word of a sysfs choice file ("always [madvise] never" -> "madvise"), or the
/// whole value for a plain one.
pub fn selected(text: &str) -> String {
    let t = text.trim();
    t.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or(t)
        .to_string()
}

/// A sysfs file set to a value, put back on drop.
pub struct SysfsSetting {
    path: PathBuf,
    old: String,
}

impl SysfsSetting {
    pub fn set(path: impl AsRef<Path>, value: &str) -> Self {
        let path = path.as_ref().to_path_buf();
        let old = selected(
            &std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display())),
        );
        std::fs::write(&path, value)
            .unwrap_or_else(|e| panic!("writing {value} to {}: {e}", path.display()));
        Self { path, old }
    }
}

impl Drop for SysfsSetting {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.path, &self.old) {
            eprintln!("warning: could not put {} back to {}: {e}", self.path.display(), self.old);
        }
    }
}

/// The sizes of multi-size THP this kernel offers (6.8+), in KiB: `hugepages-64kB` -> 64.
pub fn mthp_sizes_kb() -> Vec<u64> {
    let mut sizes: Vec<u64> = std::fs::read_dir(THP)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

/// `/sys/kernel/mm/transparent_hugepage/<rel>`.
pub fn thp_path(rel: &str) -> PathBuf {
    Path::new(THP).join(rel)
}

/// Folios of `size_kb` swapped out whole since boot (`hugepages-*/stats/swpout`, 6.10+); for
/// the PMD size, /proc/vmstat's thp_swpout where the per-size stats are missing.
pub fn swpout_of_size(size_kb: u64) -> Option<u64> {
    std::fs::read_to_string(thp_path(&format!("hugepages-{size_kb}kB/stats/swpout")))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// A swap device on which reclaim writes large folios whole: non-rotational (the swap
/// allocator hands out whole clusters only there). zram where the kernel has it, else a swap
/// file on /var/tmp's disk marked non-rotational for the test. The highest priority, so the
/// test's swap goes there whatever other swap is on; all undone on drop.
pub struct FastSwap {
    what: Swap,
    /// The disk's rotational flag, put back on drop.
    _rotational: Option<SysfsSetting>,
}

enum Swap {
    Zram(PathBuf),
    File(PathBuf),
}

impl FastSwap {
    pub fn new(mib: u64) -> Self {
        if !Path::new("/sys/block/zram0").exists() {
            run("modprobe", &["zram"]);
        }
        let zram = Path::new("/sys/block/zram0");
        let zram_free = std::fs::read_to_string(zram.join("disksize"))
            .is_ok_and(|s| s.trim() == "0")
            && !std::fs::read_to_string("/proc/swaps").unwrap_or_default().contains("/dev/zram0");
        if zram_free {
            let guard = Self { what: Swap::Zram(zram.to_path_buf()), _rotational: None };
            std::fs::write(zram.join("disksize"), format!("{mib}M")).expect("zram0 disksize");
            assert!(run("mkswap", &["/dev/zram0"]), "mkswap /dev/zram0");
            assert!(run("swapon", &["-p", "32767", "/dev/zram0"]), "swapon /dev/zram0");
            return guard;
        }
        let dir = Path::new("/var/tmp");
        let rotational = disk_of(dir)
            .map(|d| SysfsSetting::set(format!("/sys/dev/block/{d}/queue/rotational"), "0"));
        let path =
            dir.join(format!("gpustall-test-fastswap-{}-{}", std::process::id(), crate::unique()));
        let guard = Self { what: Swap::File(path.clone()), _rotational: rotational };
        let p = path.to_str().expect("utf-8 path");
        assert!(run("fallocate", &["-l", &format!("{mib}M"), p]), "fallocate {p}");
        assert!(run("chmod", &["600", p]), "chmod {p}");
        assert!(run("mkswap", &["-q", p]), "mkswap {p}");
        assert!(run("swapon", &["-p", "32767", p]), "swapon {p}");
        guard
    }

    /// What backs it, in words (for the test's log).
    pub fn describe(&self) -> String {
        match &self.what {
            Swap::Zram(_) => "zram0".into(),
            Swap::File(p) => format!("{} (disk marked non-rotational)", p.display()),
        }
    }
}

/// The whole disk (`major:minor`) under a directory's filesystem: a partition's queue
/// settings are its disk's.
fn disk_of(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if sys.join("queue").exists() {
        return Some(format!("{major}:{minor}"));
    }
    // A partition: its parent directory is the disk.
    let disk = std::fs::canonicalize(&sys).ok()?.parent()?.join("dev");
    std::fs::read_to_string(disk).ok().map(|s| s.trim().to_string())
}

impl Drop for FastSwap {
    fn drop(&mut self) {
        match &self.what {
            Swap::Zram(z) => {
                run("swapoff", &["/dev/zram0"]);
                let _ = std::fs::write(z.join("reset"), "1");
            }
            Swap::File(p) => {
                if let Some(p) = p.to_str() {
                    run("swapoff", &[p]);
                }
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_selected_choice() {
        assert_eq!(super::selected("always [madvise] never\n"), "madvise");
        assert_eq!(super::selected("always inherit madvise [never]"), "never");
        assert_eq!(super::selected("1\n"), "1");
    }
}
