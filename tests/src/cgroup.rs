//! A memory-limited cgroup for one test (v1 memory controller, or cgroup v2 where it has the
//! memory controller), removed on drop after killing whatever is left in it.

use std::path::PathBuf;

pub struct MemCgroup {
    pub path: PathBuf,
    v2: bool,
}

/// Writes a cgroup control file, or panics naming it (a test cannot go on without its limit).
pub(crate) fn write(path: &std::path::Path, value: &str) {
    std::fs::write(path, value)
        .unwrap_or_else(|e| panic!("writing {value} to {}: {e}", path.display()));
}

/// Whether the memory controller is on cgroup v2 (else v1's, at /sys/fs/cgroup/memory).
fn v2_has_memory() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .map(|c| c.split_whitespace().any(|x| x == "memory"))
        .unwrap_or(false)
}

impl MemCgroup {
    /// Whether [`MemCgroup::with_swap_limit`] can bound swap here: v2 (memory.swap.max), or v1
    /// where the kernel accounts swap per cgroup (memory.memsw.*, `swapaccount=1`).
    pub fn can_limit_swap() -> bool {
        v2_has_memory()
            || std::path::Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
    }

    /// `limit_mib` of memory; swap allowed or not.
    pub fn new(tag: &str, limit_mib: u64, allow_swap: bool) -> Self {
        let name = format!("gpustall-test-{tag}-{}-{}", std::process::id(), crate::unique());
        let v2_root = PathBuf::from("/sys/fs/cgroup");
        let v2 = v2_has_memory();
        let cg = if v2 {
            let _ = std::fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            Self { path: v2_root.join(name), v2 }
        } else {
            let root = PathBuf::from("/sys/fs/cgroup/memory");
            assert!(
                root.join("memory.limit_in_bytes").exists(),
                "no memory cgroup controller (v1 at {} or v2 at /sys/fs/cgroup)",
                root.display()
            );
            Self { path: root.join(name), v2 }
        };
        std::fs::create_dir(&cg.path)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", cg.path.display()));
        let bytes = (limit_mib << 20).to_string();
        if cg.v2 {
            write(&cg.path.join("memory.max"), &bytes);
            write(&cg.path.join("memory.swap.max"), if allow_swap { "max" } else { "0" });
        } else {
            write(&cg.path.join("memory.limit_in_bytes"), &bytes);
            // memsw is memory+swap: equal to the limit means no swap at all.
            let memsw = cg.path.join("memory.memsw.limit_in_bytes");
            if !allow_swap && memsw.exists() {
                write(&memsw, &bytes);
            }
            write(&cg.path.join("memory.swappiness"), if allow_swap { "60" } else { "0" });
        }
        cg
    }

    /// `limit_mib` of memory and at most `swap_mib` of swap: the chain reaches the OOM killer
    /// after swapping that much, quickly.
    pub fn with_swap_limit(tag: &str, limit_mib: u64, swap_mib: u64) -> Self {
        let cg = Self::new(tag, limit_mib, true);
        if cg.v2 {
            write(&cg.path.join("memory.swap.max"), &(swap_mib << 20).to_string());
        } else {
            let memsw = cg.path.join("memory.memsw.limit_in_bytes");
            assert!(memsw.exists(), "no memory.memsw.limit_in_bytes: the kernel does not account swap per cgroup (swapaccount=1)");
            write(&memsw, &((limit_mib + swap_mib) << 20).to_string());
        }
        cg
    }

    /// A child cgroup with no limit of its own: the parent's binds it (a Slurm step under its
    /// job, a container under its pod). On v1 the parent's charges reach it through
    /// memory.use_hierarchy, set here (always on since Linux 5.11). Drop it before the parent.
    pub fn child(&self, tag: &str) -> Self {
        if self.v2 {
            write(&self.path.join("cgroup.subtree_control"), "+memory");
        } else {
            // Writable only while the cgroup has no children; reads 1 and refuses 0 on 5.11+.
            let _ = std::fs::write(self.path.join("memory.use_hierarchy"), "1");
        }
        let path = self.path.join(format!("{tag}-{}", crate::unique()));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path, v2: self.v2 }
    }

    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// Its path as /proc/PID/cgroup shows it from the host ("/gpustall-test-x/child").
    pub fn cgroup_path(&self) -> String {
        let root = if self.v2 { "/sys/fs/cgroup" } else { "/sys/fs/cgroup/memory" };
        let rel = self.path.strip_prefix(root).expect("under the cgroup mount");
        format!("/{}", rel.display())
    }

    /// One counter of its v2 memory.events (`None` on v1, or without that key).
    pub fn memory_event(&self, key: &str) -> Option<u64> {
        std::fs::read_to_string(self.path.join("memory.events"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }

    pub fn add(&self, pid: u32) {
        write(&self.path.join("cgroup.procs"), &pid.to_string());
    }

    fn procs(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The cgroup's own count of OOM kills.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        std::fs::read_to_string(self.path.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            let procs = self.procs();
            for p in &procs {
                // SAFETY: plain kill of a leftover test process.
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        eprintln!("warning: could not remove cgroup {}", self.path.display());
    }
}
