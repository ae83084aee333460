//! A CPU cgroup for one test (v1 `cpu` controller, or cgroup v2 with the cpu controller): a
//! quota that throttles the job, or a weight that keeps other work on the machine from
//! contending with it. Removed on drop after killing whatever is left in it.

use std::path::PathBuf;

pub struct CpuCgroup {
    pub path: PathBuf,
    v2: bool,
}

use crate::cgroup::write;

impl CpuCgroup {
    pub fn new(tag: &str) -> Self {
        let name = format!("gpustall-test-{tag}-{}-{}", std::process::id(), crate::unique());
        let v2_root = PathBuf::from("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(v2_root.join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|x| x == "cpu"))
            .unwrap_or(false);
        let path = if v2 {
            let _ = std::fs::write(v2_root.join("cgroup.subtree_control"), "+cpu");
            v2_root.join(name)
        } else {
            let root = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
                .iter()
                .map(PathBuf::from)
                .find(|r| r.join("cpu.cfs_quota_us").exists())
                .expect("no cpu cgroup controller (v1 at /sys/fs/cgroup/cpu or v2)");
            root.join(name)
        };
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path, v2 }
    }

    /// A quota of `cpus` CPUs (100 ms periods), with the largest weight: the quota, not the
    /// machine's other work, is what holds the job back.
    pub fn with_quota(tag: &str, cpus: f64) -> Self {
        let cg = Self::favoured(tag);
        let quota = ((cpus * 100_000.0) as u64).to_string();
        if cg.v2 {
            write(&cg.path.join("cpu.max"), &format!("{quota} 100000"));
        } else {
            write(&cg.path.join("cpu.cfs_period_us"), "100000");
            write(&cg.path.join("cpu.cfs_quota_us"), &quota);
        }
        cg
    }

    /// The largest weight: whatever else runs on the machine yields to it.
    pub fn favoured(tag: &str) -> Self {
        let cg = Self::new(tag);
        if cg.v2 {
            write(&cg.path.join("cpu.weight"), "10000");
        } else {
            write(&cg.path.join("cpu.shares"), "262144");
        }
        cg
    }

    /// Its path as /proc/PID/cgroup shows it from the host.
    pub fn cgroup_path(&self) -> String {
        let name = self.path.file_name().expect("name").to_string_lossy();
        format!("/{name}")
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
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            for p in &self.procs() {
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
