//! Processes under test: a workload released on cue, and the tracer, started on it and waited
//! for until it has attached.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{cgroup::MemCgroup, TempDir};

/// A workload process that waits for a line on stdin before it does anything.
pub struct Workload {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Lines already taken from `lines` by `wait_for_role`, kept for `wait`.
    seen: Vec<String>,
    comm: String,
}

/// A process name (comm, at most 15 bytes) no other test in any test process uses: `gw` + this
/// test process's pid + a counter.
pub fn unique_comm() -> String {
    let comm = format!("gw{}x{}", std::process::id(), crate::unique());
    assert!(comm.len() <= 15, "comm {comm} is longer than the kernel keeps");
    comm
}

impl Workload {
    /// Starts `bin args..`, in `cgroup` if given (moved there before it is released).
    pub fn start(bin: &Path, args: &[&str], cgroup: Option<&MemCgroup>) -> Self {
        Self::start_in(bin, args, cgroup, None)
    }

    /// The same, with `cwd` as its working directory.
    pub fn start_in(
        bin: &Path,
        args: &[&str],
        cgroup: Option<&MemCgroup>,
        cwd: Option<&Path>,
    ) -> Self {
        Self::start_named(&unique_comm(), bin, args, cgroup, cwd)
    }

    /// The same, named `comm` (from [`unique_comm`]) from its first instruction on.
    pub fn start_named(
        comm: &str,
        bin: &Path,
        args: &[&str],
        cgroup: Option<&MemCgroup>,
        cwd: Option<&Path>,
    ) -> Self {
        Self::start_env(comm, bin, args, cgroup, cwd, &[])
    }

    /// The same, with these variables in its environment (a launcher's `RANK`, say).
    pub fn start_env(
        comm: &str,
        bin: &Path,
        args: &[&str],
        cgroup: Option<&MemCgroup>,
        cwd: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Self {
        let mut cmd = Command::new(bin);
        cmd.env("GPUSTALL_WORKLOAD_COMM", comm).envs(env.iter().copied());
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        if let Some(cg) = cgroup {
            cg.add(child.id());
        }
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, lines: rx, seen: Vec::new(), comm: comm.to_string() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its process name, unique to this test.
    pub fn comm(&self) -> &str {
        &self.comm
    }

    /// Releases the workload.
    pub fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        stdin.write_all(b"go\n").expect("releasing the workload");
        stdin.flush().expect("flush");
    }

    /// Waits until one of its processes prints a line with this `role`, and returns it.
    pub fn wait_for_role(&mut self, role: &str, timeout: Duration) -> Value {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("workload {} printed no {role:?} line within {timeout:?}", self.child.id())
            });
            self.seen.push(line.clone());
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["role"] == role {
                    return v;
                }
            }
        }
    }

    /// Waits for the workload to end (killing it after `timeout`); returns its exit code and the
    /// JSON lines its processes printed.
    pub fn wait(mut self, timeout: Duration) -> (Option<i32>, Vec<Value>) {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("workload {} did not finish within {timeout:?}", self.child.id());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(50));
        let lines = std::mem::take(&mut self.seen)
            .into_iter()
            .chain(self.lines.try_iter())
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect();
        (status.code(), lines)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// gpustall trace running on a pid.
pub struct Tracer {
    child: Child,
    /// Read as it comes: a report bigger than the pipe would otherwise block gpustall forever.
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: mpsc::Receiver<String>,
    pub dir: TempDir,
    stderr_seen: Vec<String>,
}

/// What a finished trace left.
pub struct TraceResult {
    /// Holds the recording and summary files until the result is dropped.
    pub dir: TempDir,
    pub code: Option<i32>,
    pub summary: Value,
    pub record: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
}

impl Tracer {
    /// Starts `gpustall trace --pid PID` with a recording and a summary file, plus `extra`
    /// arguments, and returns once it says it is tracing.
    pub fn start(pid: u32, extra: &[&str]) -> Self {
        Self::start_with_env(pid, extra, &[])
    }

    pub fn start_with_env(pid: u32, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::launch(Command::new(crate::gpustall_bin()), pid, extra, env)
    }

    /// As [`Tracer::start`], with gpustall run by `wrapper` (a program and its arguments that
    /// end by exec'ing the path appended after them, e.g. `unshare --cgroup`).
    pub fn start_wrapped(wrapper: &[&str], pid: u32, extra: &[&str]) -> Self {
        let mut cmd = Command::new(wrapper[0]);
        cmd.args(&wrapper[1..]).arg(crate::gpustall_bin());
        Self::launch(cmd, pid, extra, &[])
    }

    /// As [`Tracer::start_with_env`], with gpustall run as `cmd` (its environment set by the
    /// caller: `env_remove("RUST_LOG")` for a trace that must not inherit the test's).
    pub fn launch(mut cmd: Command, pid: u32, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = TempDir::new("trace");
        cmd.arg("trace")
            .arg("--pid")
            .arg(pid.to_string())
            .arg("--record")
            .arg(dir.path("record.jsonl"))
            .arg("--summary-json")
            .arg(dir.path("summary.json"))
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("starting gpustall");
        let err = child.stderr.take().expect("piped stderr");
        let mut out = child.stdout.take().expect("piped stdout");
        let stdout = Some(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        }));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut t = Self { child, stdout, stderr: rx, dir, stderr_seen: Vec::new() };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            match t.stderr.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    let ready = line.starts_with("gpustall: tracing");
                    t.stderr_seen.push(line);
                    if ready {
                        return t;
                    }
                }
                Err(_) => {
                    if let Some(s) = t.child.try_wait().expect("try_wait") {
                        panic!(
                            "gpustall exited ({s}) before tracing:\n{}",
                            t.stderr_seen.join("\n")
                        );
                    }
                    assert!(Instant::now() < end, "gpustall did not start tracing within 60 s");
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn record_path(&self) -> PathBuf {
        self.dir.path("record.jsonl")
    }

    /// Waits for the trace to end by itself (every traced process exited, or --duration).
    pub fn wait(mut self, timeout: Duration) -> TraceResult {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > end {
                // SAFETY: plain kill of our child: ask it to stop and write what it has.
                unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
                let s = self.child.wait().expect("wait");
                panic!("gpustall did not finish within {timeout:?} (stopped it: {s})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.finish(status.code())
    }

    /// Stops the trace with SIGINT (as Ctrl-C) and collects it.
    pub fn stop(self) -> TraceResult {
        self.stop_with(libc::SIGINT)
    }

    /// Stops the trace with `sig` and collects it.
    pub fn stop_with(mut self, sig: i32) -> TraceResult {
        // SAFETY: plain kill of our child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let s = self.child.wait().expect("wait");
        self.finish(s.code())
    }

    fn finish(&mut self, code: Option<i32>) -> TraceResult {
        let stdout = self.stdout.take().and_then(|h| h.join().ok()).unwrap_or_default();
        std::thread::sleep(Duration::from_millis(50));
        self.stderr_seen.extend(self.stderr.try_iter());
        let stderr = self.stderr_seen.join("\n");
        crate::report_kernel_degradations(&stderr);
        let summary = std::fs::read_to_string(self.dir.path("summary.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| {
                panic!("gpustall wrote no summary (exit {code:?}):\n{stderr}\n{stdout}")
            });
        let record = std::fs::read_to_string(self.record_path())
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("recording line does not parse ({e}): {l}"))
            })
            .collect();
        let dir = std::mem::replace(&mut self.dir, TempDir::new("trace-done"));
        TraceResult { dir, code, summary, record, stdout, stderr }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TraceResult {
    /// `gpustall report` on this trace's recording: the summary it writes and its stderr.
    pub fn replayed(&self) -> (Value, String) {
        let out = self.dir.path("replayed.json");
        let o = Command::new(crate::gpustall_bin())
            .arg("report")
            .arg(self.dir.path("record.jsonl"))
            .arg("--summary-json")
            .arg(&out)
            .output()
            .expect("gpustall report");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        let s = std::fs::read_to_string(&out).expect("the replayed summary");
        (serde_json::from_str(&s).expect("json"), stderr)
    }

    pub fn record_path(&self) -> PathBuf {
        self.dir.path("record.jsonl")
    }

    /// The summary's entry for a pid.
    pub fn process(&self, pid: u32) -> &Value {
        self.processes().iter().find(|p| p["pid"] == pid).unwrap_or_else(|| {
            panic!("pid {pid} is not in the summary: {:#}", self.summary["processes"])
        })
    }

    pub fn processes(&self) -> &Vec<Value> {
        self.summary["processes"].as_array().expect("processes is a list")
    }

    pub fn u64_of(&self, pid: u32, field: &str) -> u64 {
        self.process(pid)[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} of {pid} is not a number"))
    }
}

/// Runs a job to its end under `gpustall trace --quiet --no-gpu`, both expected to exit 0:
/// the tracer's result and the trainer's own line (the truth it measured, `"role": "trainer"`).
pub fn trace_trainer_job(program: &Path, args: &[&str]) -> (TraceResult, Value) {
    crate::require_privileged_env();
    let mut w = Workload::start(program, args, None);
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{lines:?}");
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(t.code, Some(0), "{}", t.stderr);
    let trainer = lines.iter().find(|l| l["role"] == "trainer").expect("the trainer's line");
    (t, trainer.clone())
}

/// A number field of a JSON line, or a panic naming it.
pub fn field_u64(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} in {v}"))
}

/// The kernel's own peak of a process's resident memory (VmHWM), kB.
pub fn vm_hwm_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Every descendant of `root` (from /proc/PID/task/TID/children).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten();
        for t in tasks.filter_map(Result::ok) {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
                out.push(k);
                todo.push(k);
            }
        }
    }
    out
}

/// Kills a job's whole tree when dropped (on failure too): 8,000 sleeps must not outlive it.
pub struct KillTree(pub u32);

impl Drop for KillTree {
    fn drop(&mut self) {
        for _ in 0..3 {
            for p in descendants(self.0) {
                // SAFETY: SIGKILL to a process of the job the caller started.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
        }
    }
}
