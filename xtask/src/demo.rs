//! `cargo xtask demo`: the main job on a machine with no training job at hand. Traces a bundled
//! workload shaped like a DataLoader memory blow-up (demo/dataloader_blowup.py) inside a
//! memory-limited cgroup with swap, and prints gpustall's report on it.
//!
//! The parameters are tuned so that on a small machine (2 cores) the job shows the whole chain
//! in a little over a minute: a healthy phase, memcg reclaim and swap-out once the cgroup is full,
//! data_time rising as workers wait for swap-in, and an OOM kill of a worker once its swap is full
//! too (cgroup memory + 1 GiB of swap = 1.5 GiB, the workers' caches grow past it). The job's
//! swap is bounded in its cgroup, so the story is the same on a host with more swap.
//!
//! gpustall runs as users run it: the release build.

use std::{
    io::{BufRead, BufReader, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

use crate::util::{cargo, is_root, run_cmd, target_dir, workspace_root};

const LIMIT_MIB: u64 = 512;
const SWAP_MIB: u64 = 1024;
const WORKERS: u32 = 3;
/// Each worker's cache grows by this much per batch and is never freed (the bug).
const CACHE_MIB_PER_BATCH: u32 = 4;
/// Earlier cached samples each batch reads again (mosaic augmentation): swap-in once swapped out.
const MOSAIC: u32 = 8;
/// More steps than fit: the caches fill memory + swap (1.5 GiB) near step 350.
const STEPS: u32 = 1000;
/// The stand-in for the GPU's time per step.
const STEP_MS: u32 = 50;
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// A scratch directory under /var/tmp (on disk, not in tmpfs: its page cache is the job's),
/// removed on drop, also when the demo fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        let p = PathBuf::from(format!("/var/tmp/gpustall-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Points this process's stderr at a file until dropped, so that the workload, spawned meanwhile
/// with an inherited stderr, writes its errors where the demo can quote them.
struct StderrTo(i32);

impl StderrTo {
    fn file(f: &std::fs::File) -> anyhow::Result<Self> {
        // SAFETY: dup/dup2 on valid descriptors; the saved copy is restored and closed on drop.
        let saved = unsafe { libc::dup(2) };
        anyhow::ensure!(saved >= 0, "dup(2): {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        if unsafe { libc::dup2(f.as_raw_fd(), 2) } < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: closing the copy made above.
            unsafe { libc::close(saved) };
            anyhow::bail!("dup2: {e}");
        }
        Ok(Self(saved))
    }
}

impl Drop for StderrTo {
    fn drop(&mut self) {
        // SAFETY: restores the saved descriptor made in `file`, then closes the copy.
        unsafe {
            libc::dup2(self.0, 2);
            libc::close(self.0);
        }
    }
}

/// The cgroup's memory in use and swapped out, in MiB (v1 or v2 files).
fn cgroup_mem(cg: &Path) -> (u64, u64) {
    let num = |f: &str| {
        std::fs::read_to_string(cg.join(f)).ok().and_then(|s| s.trim().parse::<u64>().ok())
    };
    let stat_swap = || {
        std::fs::read_to_string(cg.join("memory.stat"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("swap ").and_then(|v| v.trim().parse::<u64>().ok()))
    };
    let used = num("memory.current").or_else(|| num("memory.usage_in_bytes")).unwrap_or(0);
    let swap = num("memory.swap.current").or_else(stat_swap).unwrap_or(0);
    (used >> 20, swap >> 20)
}

/// The training log's steps: (data_time, time) per line, and the last line's "step/total".
fn log_steps(log: &Path) -> (Vec<(f64, f64)>, String) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut steps = Vec::new();
    let mut last = String::from("0");
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let value = |key: &str| {
            words.windows(2).find(|w| w[0] == key).and_then(|w| w[1].parse::<f64>().ok())
        };
        if let (Some(d), Some(t)) = (value("data_time:"), value("time:")) {
            steps.push((d, t));
            if let Some(s) = line.split('[').nth(2).and_then(|r| r.split(']').next()) {
                last = s.trim().to_string();
            }
        }
    }
    (steps, last)
}

/// Mean data_time and mean step time over some steps.
fn means(steps: &[(f64, f64)]) -> (f64, f64) {
    let n = steps.len().max(1) as f64;
    (steps.iter().map(|s| s.0).sum::<f64>() / n, steps.iter().map(|s| s.1).sum::<f64>() / n)
}

/// Every few seconds until `done`: the cgroup's memory and swap, the training step and its
/// data_time; and the workload's stderr as it comes.
fn progress(cg: &Path, log: &Path, stderr: &Path, t0: Instant, done: &AtomicBool) {
    let mut err = std::fs::File::open(stderr).ok().map(BufReader::new);
    let mut line = String::new(); // a partial line stays here until it is complete
    let mut next = Instant::now() + Duration::from_secs(5);
    let mut seen = 0;
    loop {
        let finished = done.load(Ordering::Relaxed);
        if let Some(r) = err.as_mut() {
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) && line.ends_with('\n') {
                print!("  workload: {line}");
                line.clear();
            }
        }
        if finished {
            return;
        }
        if Instant::now() >= next {
            next += Duration::from_secs(5);
            let (used, swap) = cgroup_mem(cg);
            let (steps, last) = log_steps(log);
            let (data_time, time) = means(&steps[seen.min(steps.len())..]);
            println!(
                "  {:>4.0} s  cgroup {used:>4}/{LIMIT_MIB} MiB, swapped out {swap:>4} MiB  |  step {last}: \
                 {} steps in 5 s, mean time {time:.3} s, data_time {data_time:.3} s",
                t0.elapsed().as_secs_f64(),
                steps.len().saturating_sub(seen)
            );
            seen = steps.len();
        }
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The scratch files of one demo run.
struct Paths {
    root: PathBuf,
    script: PathBuf,
    data: PathBuf,
    log: PathBuf,
    stderr: PathBuf,
}

fn utf8(p: &Path) -> anyhow::Result<String> {
    p.to_str().map(str::to_owned).context("a non-UTF-8 path")
}

/// The demo workload's command line.
fn workload_args(p: &Paths) -> anyhow::Result<Vec<String>> {
    Ok(vec![
        utf8(&p.script)?,
        "--wait-go".into(),
        "--data-dir".into(),
        utf8(&p.data)?,
        "--log".into(),
        utf8(&p.log)?,
        "--workers".into(),
        WORKERS.to_string(),
        "--cache-mib-per-batch".into(),
        CACHE_MIB_PER_BATCH.to_string(),
        "--mosaic".into(),
        MOSAIC.to_string(),
        "--steps".into(),
        STEPS.to_string(),
        "--step-ms".into(),
        STEP_MS.to_string(),
    ])
}

fn swap_total_mib() -> u64 {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum::<u64>()
        .div_ceil(1024)
}

fn intro(p: &Paths, swap_mib: u64) {
    println!("\n== gpustall demo ==");
    println!(
        "A training job shaped like a PyTorch DataLoader memory blow-up ({}):",
        p.script.strip_prefix(&p.root).unwrap_or(&p.script).display()
    );
    println!("  a trainer and {WORKERS} forked workers named pt_data_worker; each worker reads its batch's files,");
    println!("  hands the batch over in shared memory and keeps {CACHE_MIB_PER_BATCH} MiB per batch in a cache it never frees,");
    println!("  re-reading {MOSAIC} earlier entries per batch (mosaic augmentation); {STEP_MS} ms per step stands in for the GPU.");
    println!("It runs in a {LIMIT_MIB} MiB memory cgroup with {SWAP_MIB} MiB of swap at most ({swap_mib} MiB on the machine).");
    println!("gpustall traces it from its first instruction and tails its training log.\n");
}

/// The job's memory cgroup: [`LIMIT_MIB`] of memory and at most [`SWAP_MIB`] of swap, where the
/// kernel accounts swap per cgroup (v2; v1 with memsw). Without a bound, a host with more swap
/// lets the caches swap for minutes (205 s and 16 GB with 3 GiB more swap, against 47 s).
fn job_cgroup() -> MemCgroup {
    if MemCgroup::can_limit_swap() {
        return MemCgroup::with_swap_limit("demo", LIMIT_MIB, SWAP_MIB);
    }
    println!("note: this kernel does not account swap per memory cgroup (v1 without swapaccount=1): the job may use all of the machine's swap");
    MemCgroup::new("demo", LIMIT_MIB, true)
}

/// Waits for the workload with a progress line, killing what is left in its cgroup after
/// [`WORKLOAD_TIMEOUT`]. Returns how long it ran.
fn drive(workload: &mut Workload, cg: &MemCgroup, p: &Paths) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    workload.go();
    let done = AtomicBool::new(false);
    let status = std::thread::scope(|sc| {
        sc.spawn(|| progress(&cg.path, &p.log, &p.stderr, t0, &done));
        let status = loop {
            match workload.child.try_wait() {
                Ok(Some(st)) => break Ok(Some(st)),
                Ok(None) if t0.elapsed() > WORKLOAD_TIMEOUT => break Ok(None),
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => break Err(e),
            }
        };
        // Let the progress thread echo the workload's last words.
        std::thread::sleep(Duration::from_millis(300));
        done.store(true, Ordering::Relaxed);
        status
    })
    .context("waiting for the workload")?;
    if status.is_none() {
        println!("  the workload did not end within {WORKLOAD_TIMEOUT:?}: stopping it");
        for pid in std::fs::read_to_string(cg.path.join("cgroup.procs")).unwrap_or_default().lines()
        {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: plain kill of the demo's own processes (they are in its cgroup).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    Ok(t0.elapsed())
}

/// A worker's line in the workload's own output: its index and pid.
#[derive(serde::Deserialize)]
struct WorkerLine {
    role: String,
    index: u64,
    pid: u64,
}

/// How the workload ended, by its own account: exit, error line, OOM count, training log.
fn outcome(
    p: &Paths,
    trainer_pid: u32,
    wall: Duration,
    code: Option<i32>,
    lines: &[serde_json::Value],
    cgroup_ooms: u64,
    swap_mib: u64,
) {
    let stderr_text = std::fs::read_to_string(&p.stderr).unwrap_or_default();
    let failure = stderr_text.lines().rfind(|l| l.starts_with("RuntimeError"));
    let mut workers: Vec<(u64, u64)> = lines
        .iter()
        .filter_map(|l| serde_json::from_value::<WorkerLine>(l.clone()).ok())
        .filter(|l| l.role == "worker")
        .map(|l| (l.index, l.pid))
        .collect();
    workers.sort_unstable();
    let workers: Vec<String> =
        workers.iter().map(|(i, pid)| format!("{pid} (worker {i})")).collect();
    let (steps, steps_done) = log_steps(&p.log);
    let window = steps.len().min(50);
    let (first, last) = (means(&steps[..window]), means(&steps[steps.len() - window..]));

    println!("\n== how the workload ended ==");
    println!("trainer pid {trainer_pid}, workers {}", workers.join(", "));
    let how = if code.is_some() { "exit status" } else { "killed by a signal" };
    let status = code.map_or(String::new(), |c| format!(" {c}"));
    println!("{how}{status} after {:.1} s, at step {steps_done}", wall.as_secs_f64());
    match failure {
        Some(l) => println!("its error: {l}"),
        None if code == Some(0) => println!(
            "it finished all {STEPS} steps without an OOM kill (swap, {swap_mib} MiB on the machine, held the caches)"
        ),
        None => {}
    }
    println!("the cgroup's own count of OOM kills: {cgroup_ooms}");
    println!(
        "its training log, means over the first and the last {window} steps: time {:.3} s -> {:.3} s per step, \
         data_time {:.3} s -> {:.3} s (the stand-in GPU work is {STEP_MS} ms of each step)",
        first.1, last.1, first.0, last.0
    );
}

/// The recording, summary, log and status lines, left in `<target dir>/demo/`.
fn save(
    out: &Path,
    record_linked: bool,
    trace: &tests::procs::TraceResult,
    log: &Path,
) -> anyhow::Result<()> {
    let record_out = out.join("record.jsonl");
    if !record_linked {
        // Another file system: write the parsed lines back (same content, keys sorted).
        let lines: Vec<String> = trace.record.iter().map(|v| v.to_string()).collect();
        std::fs::write(&record_out, lines.join("\n") + "\n").context("writing the recording")?;
    }
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&trace.summary)? + "\n")?;
    std::fs::copy(log, out.join("train.log")).context("copying the training log")?;
    std::fs::write(out.join("gpustall.stderr"), trace.stderr.clone() + "\n")?;
    println!("\n== files ==");
    let d = out.display();
    println!("recording:               {d}/record.jsonl ({} lines)", trace.record.len());
    println!("summary:                 {d}/summary.json");
    println!("training log:            {d}/train.log");
    println!("gpustall's status lines: {d}/gpustall.stderr");
    Ok(())
}

pub fn run() -> anyhow::Result<()> {
    anyhow::ensure!(
        is_root(),
        "the demo loads eBPF programs and makes a memory cgroup and a swap file: run it as root (sudo -E cargo xtask demo)"
    );
    crate::setup::run_setup(true)?;
    crate::setup::ensure_demo_tools()?;
    // The release build, as users run it (its CPU and memory are the ones the report gives).
    run_cmd(cargo().args(["build", "--release", "-p", "gpustall"]))?;
    let root = workspace_root().canonicalize().context("the workspace root")?;
    let target = target_dir().canonicalize().context("the target directory")?;
    std::env::set_var("GPUSTALL_BIN", target.join("release/gpustall"));
    tests::require_privileged_env();

    let scratch = Scratch::new()?;
    let p = Paths {
        script: root.join("demo/dataloader_blowup.py"),
        data: scratch.0.join("data"),
        log: scratch.0.join("train.log"),
        stderr: scratch.0.join("workload.stderr"),
        root: root.clone(),
    };
    let args = workload_args(&p)?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    // One memory-pressure scenario at a time on this machine (tests and bench take it too).
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(SWAP_MIB);
    let swap_mib = swap_total_mib();
    let cg = job_cgroup();
    intro(&p, swap_mib);

    // The tracer opens the training log at start, as with a job that is already running.
    std::fs::write(&p.log, "").context("creating the training log")?;
    let err_file =
        std::fs::File::create(&p.stderr).context("creating the workload's stderr file")?;
    let mut workload = {
        let _redirect = StderrTo::file(&err_file)?;
        Workload::start(Path::new("python3"), &args, Some(&cg))
    };
    let trainer_pid = workload.pid();
    let tracer = Tracer::start(trainer_pid, &["--log", utf8(&p.log)?.as_str()]);
    // The tracer's files go with it when it is done: keep a second name for the recording.
    let out = target.join("demo");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let _ = std::fs::remove_file(out.join("record.jsonl"));
    let record_linked = std::fs::hard_link(tracer.record_path(), out.join("record.jsonl")).is_ok();

    let wall = drive(&mut workload, &cg, &p)?;
    let (code, lines) = workload.wait(Duration::from_secs(30));
    let cgroup_ooms = cg.oom_kills();
    let trace = tracer.wait(Duration::from_secs(120));
    outcome(&p, trainer_pid, wall, code, &lines, cgroup_ooms, swap_mib);

    println!("\n== gpustall's report ==");
    print!("{}", trace.stdout);
    if trace.code != Some(0) {
        println!("(gpustall exited with {:?}; its stderr:)\n{}", trace.code, trace.stderr);
    }
    save(&out, record_linked, &trace, &p.log)
}
