//! Harness for gpustall's privileged end-to-end tests: they run the real tracer against real
//! processes on the running kernel, and compare with the kernel's own counters.
//!
//! Everything that changes the machine (memory cgroups, swap files) is undone by a guard that
//! runs on failure too, and memory-pressure scenarios are serialised across test processes.

pub mod apt;
pub mod blockdev;
pub mod cgroup;
pub mod cpucg;
pub mod incident;
pub mod kernel;
pub mod mm;
pub mod otlp;
pub mod procs;
pub mod slowfs;
pub mod watcher;

use std::path::PathBuf;

/// Fails loudly (never skips) when the machine cannot run these tests.
pub fn require_privileged_env() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests load eBPF programs and make cgroups: run them as root (cargo xtask test)"
    );
    assert!(
        std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        "the kernel has no BTF (/sys/kernel/btf/vmlinux): gpustall needs CONFIG_DEBUG_INFO_BTF"
    );
    if !std::path::Path::new("/sys/kernel/tracing/events").is_dir() {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "tracefs is not mounted and cannot be mounted at /sys/kernel/tracing");
    }
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The gpustall binary under test: `GPUSTALL_BIN`, or the workspace's debug build.
pub fn gpustall_bin() -> PathBuf {
    let p = std::env::var_os("GPUSTALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/gpustall"));
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p gpustall, or cargo xtask test)",
        p.display()
    );
    p
}

/// The python of the venv with torch that `cargo xtask test` makes
/// (`$GPUSTALL_TEST_TORCH_PYTHON`); a failure, not a skip, when a torch test runs some other way.
pub fn torch_python() -> PathBuf {
    const VAR: &str = "GPUSTALL_TEST_TORCH_PYTHON";
    let Some(python) = std::env::var_os(VAR) else {
        if kernel::in_vm_test() {
            panic!("{VAR} is not set: vm-test guests have no torch venv unless it is exported (run this test on the host through `cargo xtask test`)");
        }
        panic!("{VAR} is not set: run this test through `cargo xtask test`, which makes target/torch-venv with torch");
    };
    let python = PathBuf::from(python);
    assert!(python.exists(), "{VAR}={} does not exist: run `cargo xtask test`", python.display());
    python
}

/// A library the workspace builds (`file`, crate `krate`): beside `GPUSTALL_BIN` when that is
/// set (another target directory), else in the workspace's debug build.
fn built_library(file: &str, krate: &str) -> PathBuf {
    let p = std::env::var_os("GPUSTALL_BIN")
        .map(|b| PathBuf::from(b).with_file_name(file))
        .unwrap_or_else(|| workspace_root().join("target/debug").join(file));
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p {krate}, or cargo xtask test)",
        p.display()
    );
    p
}

/// The stand-in NVML library (crate nvml-stub).
pub fn nvml_stub() -> PathBuf {
    built_library("libnvidia_ml_stub.so", "nvml-stub")
}

/// The stand-in CUDA driver (crate cuda-stub), copied into `dir` as `libcuda.so.1`: the name
/// gpustall looks for in a process's maps.
pub fn cuda_stub(dir: &TempDir) -> PathBuf {
    let p = dir.path("libcuda.so.1");
    std::fs::copy(built_library("libcuda_stub.so", "cuda-stub"), &p)
        .expect("copying the stand-in libcuda");
    p
}

/// A private scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        Self::new_in(std::env::temp_dir(), tag)
    }

    /// Under `base`: /var/tmp for O_DIRECT I/O, which tmpfs (often /tmp) refuses.
    pub fn new_in(base: impl AsRef<std::path::Path>, tag: &str) -> Self {
        let name = format!("gpustall-{tag}-{}-{}", std::process::id(), unique());
        let p = base.as_ref().join(name);
        std::fs::create_dir_all(&p).expect("creating a temp dir");
        Self(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a command to its end; panics with the command line and what it printed if it fails.
pub fn run_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let shown = format!("{cmd:?}");
    let o = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        o.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// What a command that must succeed printed on stdout.
pub fn stdout_ok(cmd: &mut std::process::Command) -> String {
    String::from_utf8_lossy(&run_ok(cmd).stdout).into_owned()
}

/// A number unique within this process, for names.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Holds the machine-wide lock under which one memory-pressure scenario runs at a time, across
/// test threads and test processes (flock on a file in /run/lock).
pub struct PressureLock {
    _held: std::fs::File,
}

pub fn pressure_lock() -> PressureLock {
    PressureLock { _held: machine_lock("gpustall-tests.lock") }
}

/// As [`pressure_lock`], for the scenarios that measure how the job's processes share the
/// CPUs (a CPU-bound pipeline, a straggler): two at once on 2 CPUs would each see the other
/// as the bottleneck.
pub fn cpu_lock() -> PressureLock {
    PressureLock { _held: machine_lock("gpustall-tests-cpu.lock") }
}

/// As [`pressure_lock`], for the tests that run a Slurm cluster: munged is the machine's (one
/// socket), started by the first test that finds none and stopped by it.
pub fn slurm_lock() -> PressureLock {
    PressureLock { _held: machine_lock("gpustall-tests-slurm.lock") }
}

/// An exclusive flock on `name` in /run/lock (or /tmp), held until the file is dropped.
fn machine_lock(name: &str) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let open = |dir: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::path::Path::new(dir).join(name))
    };
    let f = open("/run/lock").or_else(|_| open("/tmp")).expect("opening the test lock file");
    // SAFETY: a valid fd; the lock is released when the file is closed.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

pub use apt::lock as apt_lock;

/// Notes that this test passed with gpustall measuring something from its documented next-best
/// source on this kernel (`cargo xtask vm-test` shows the test as "degraded", with `what`).
/// Written to `$GPUSTALL_VM_DEGRADED` when set, as `TEST<TAB>WHAT` (libtest names each test's
/// thread after the test).
pub fn degraded(what: &str) {
    eprintln!("degraded on this kernel: {what}");
    let Some(path) = std::env::var_os("GPUSTALL_VM_DEGRADED") else { return };
    let test = std::thread::current().name().unwrap_or("main").to_string();
    let line = format!("{test}\t{what}\n");
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
}

/// Reports what gpustall said it could not get on this kernel (its start-up notes and the
/// tracepoints it skipped) as this test's degradations.
pub fn report_kernel_degradations(gpustall_stderr: &str) {
    for line in gpustall_stderr.lines() {
        if let Some(note) = line.strip_prefix("gpustall: note: ") {
            degraded(note);
        } else if let Some(tp) = line
            .strip_prefix("gpustall: warning: tracepoint ")
            .and_then(|r| r.split_whitespace().next())
        {
            degraded(&format!("no tracepoint {tp}"));
        }
    }
}

/// The summary's process `pid` (`null` when it is not there).
pub fn summary_process(summary: &serde_json::Value, pid: u64) -> serde_json::Value {
    summary["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == pid))
        .cloned()
        .unwrap_or_default()
}
