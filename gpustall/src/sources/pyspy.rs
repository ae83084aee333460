//! The job's Python stacks, read from outside with py-spy (as a library, non-blocking: the
//! process is never paused) on a thread of their own, at a rate chosen from what sampling costs.
//!
//! Whom it samples (the session's [`Target`]s, given each beat), each on its own clock:
//! - trainers and ranks, on CPU or not: where they wait for data, and what they run on CPU;
//! - DataLoader workers when they are on CPU (state R): where the pipeline's CPU goes;
//! - any of them, on CPU or not, at least every [`IDLE_EVERY`]: the line a stuck process
//!   blocks on.
//!
//! Under `--py-stacks auto` sampling takes at most [`BUDGET`] of one CPU whatever the job's
//! size: half of it for the trainers and ranks, half for the workers, shared equally within
//! each; a process's period is the CPU its last sample cost divided by its share. Opening a
//! process (reading its interpreter's symbols, once) is not a sample's cost. `--py-stacks HZ`
//! samples each at that rate. What was seen is sent every [`FLUSH_EVERY`] as one
//! [`PyStacksRec`] per process, counts since its last one.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::pystacks::{PyFrame, PyStacksRec, StackCount};
use crate::model::samples::Sample;
use crate::sources::clock::monotonic_ns;

/// The share of one CPU sampling may take under `--py-stacks auto`.
pub const BUDGET: f64 = 0.005;
/// The shortest and longest period of one process's samples.
const MIN_PERIOD: Duration = Duration::from_millis(50);
const MAX_PERIOD: Duration = Duration::from_secs(2);
/// A process off CPU is still sampled this often (a stuck one's line).
const IDLE_EVERY: Duration = Duration::from_secs(3);
/// How often counts are sent.
const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Opening a process that is not (yet) Python is retried this often, this many times: a
/// `sh` that execs python, a launcher that becomes the trainer.
const RETRY_EVERY: Duration = Duration::from_secs(2);
const OPEN_TRIES: u32 = 3;
/// The most time one sample stands for.
const STANDS_FOR_AT_MOST: Duration = Duration::from_secs(4);
/// Samples that fail in a row before the process is opened again (an exec).
const FAILED_IN_A_ROW: u32 = 10;

/// `--py-stacks`: off, within [`BUDGET`], or a fixed rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    Off,
    Auto,
    Hz(f64),
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "0" => Ok(Rate::Off),
            "auto" => Ok(Rate::Auto),
            _ => match s.parse::<f64>() {
                Ok(hz) if hz > 0.0 && hz <= 100.0 => Ok(Rate::Hz(hz)),
                _ => Err(format!(
                    "`{s}` is not a rate: give `auto` (at most {:.1} % of one CPU), `off`, or samples a second (up to 100)",
                    BUDGET * 100.0
                )),
            },
        }
    }
}

/// One process to sample and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub pid: u32,
    /// A trainer or rank: sampled on CPU or not.
    pub every_round: bool,
}

/// The period of a process's samples when one costs `cost` of CPU and it is one of `peers`
/// sharing half the budget.
pub fn period(rate: Rate, cost: Duration, peers: usize) -> Duration {
    match rate {
        Rate::Hz(hz) => Duration::from_secs_f64(1.0 / hz),
        _ => cost.div_f64(BUDGET / 2.0 / peers.max(1) as f64).clamp(MIN_PERIOD, MAX_PERIOD),
    }
}

/// The sampler's thread, its targets and what it found.
pub struct StackSampler {
    targets: Arc<Mutex<Vec<Target>>>,
    found: Receiver<Sample>,
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl StackSampler {
    pub fn start(rate: Rate) -> Option<Self> {
        if rate == Rate::Off {
            return None;
        }
        let targets = Arc::new(Mutex::new(Vec::new()));
        let (found_tx, found) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel();
        let shared = Arc::clone(&targets);
        let thread = std::thread::Builder::new()
            .name("py-stacks".into())
            .spawn(move || Sampling::new(rate, shared, found_tx).run(stop_rx))
            .ok()?;
        Some(Self { targets, found, stop, thread: Some(thread) })
    }

    /// Whom to sample from now on.
    pub fn set_targets(&self, targets: Vec<Target>) {
        if let Ok(mut t) = self.targets.lock() {
            *t = targets;
        }
    }

    /// What the thread found since the last call.
    pub fn take(&self) -> Vec<Sample> {
        self.found.try_iter().collect()
    }

    /// Stops the thread after a last flush; returns what it had not yet handed over.
    pub fn finish(mut self) -> Vec<Sample> {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.take()
    }
}

/// One process as the thread sees it.
#[derive(Default)]
struct Proc {
    spy: Option<py_spy::PythonSpy>,
    tries: u32,
    next_try: Option<Instant>,
    /// When it is next looked at, and when it was last sampled.
    due: Option<Instant>,
    last_sample: Option<Instant>,
    gave_up: bool,
    failed_in_a_row: u32,
    /// Counts since the last flush.
    pending: PyStacksRec,
    /// (thread, stack) -> (on CPU, off CPU, the time the on-CPU samples stand for).
    counts: HashMap<(String, Vec<PyFrame>), (u64, u64, u64)>,
    /// Its main thread's schedstat at the last sample.
    last_sched: Option<Sched>,
}

struct Sampling {
    rate: Rate,
    targets: Arc<Mutex<Vec<Target>>>,
    out: Sender<Sample>,
    procs: HashMap<u32, Proc>,
    last_flush: Instant,
    /// A cheap generator for the periods' jitter: samples in step with a job's own period
    /// would see one phase of it only.
    seed: u64,
}

impl Sampling {
    fn new(rate: Rate, targets: Arc<Mutex<Vec<Target>>>, out: Sender<Sample>) -> Self {
        let seed = monotonic_ns() | 1;
        Self { rate, targets, out, procs: HashMap::new(), last_flush: Instant::now(), seed }
    }

    fn targets(&self) -> Vec<Target> {
        self.targets.lock().map(|t| t.clone()).unwrap_or_default()
    }

    fn run(mut self, stop: Receiver<()>) {
        loop {
            let targets = self.targets();
            let trainers = targets.iter().filter(|t| t.every_round).count();
            let others = targets.len() - trainers;
            let now = Instant::now();
            for t in &targets {
                let peers = if t.every_round { trainers } else { others };
                self.visit(*t, now, peers);
            }
            if self.last_flush.elapsed() >= FLUSH_EVERY {
                self.flush(&targets);
            }
            // Until the first process due, looked at again at least at each flush (new targets).
            let next = targets
                .iter()
                .filter_map(|t| self.procs.get(&t.pid).and_then(|p| p.due))
                .min()
                .map_or(MIN_PERIOD, |d| d.saturating_duration_since(Instant::now()));
            match stop.recv_timeout(next.clamp(Duration::from_millis(5), FLUSH_EVERY)) {
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                _ => break,
            }
        }
        let targets = self.targets();
        self.flush(&targets);
    }

    /// ±25 % around `d`.
    fn jitter(&mut self, d: Duration) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        d.mul_f64(0.75 + (self.seed % 1000) as f64 / 2000.0)
    }

    /// Samples `t` if it is due, and sets when it is next.
    fn visit(&mut self, t: Target, now: Instant, peers: usize) {
        let p = self.procs.entry(t.pid).or_default();
        if p.gave_up || p.due.is_some_and(|d| now < d) {
            return;
        }
        let wanted = t.every_round
            || on_cpu(t.pid)
            || p.last_sample.is_none_or(|l| now.duration_since(l) >= IDLE_EVERY);
        let cost = if wanted { sample(t.pid, p, now) } else { None };
        log::debug!("pid {}: sample cost {cost:?} ({peers} peers)", t.pid);
        // Not sampled (off CPU, not Python yet): looked at again after the least period.
        let next = period(self.rate, cost.unwrap_or_default(), peers);
        let next = self.jitter(next);
        if let Some(p) = self.procs.get_mut(&t.pid) {
            p.due = Some(now + next);
        }
    }

    /// Sends each process's counts since its last line, and forgets the processes no longer
    /// targets (exited, or no longer the job's).
    fn flush(&mut self, targets: &[Target]) {
        let t_ns = monotonic_ns();
        for (pid, p) in &mut self.procs {
            let counts = std::mem::take(&mut p.counts);
            let mut rec = std::mem::take(&mut p.pending);
            rec.stacks = counts
                .into_iter()
                .map(|((thread, frames), (on_cpu, off_cpu, on_cpu_ns))| StackCount {
                    thread,
                    frames,
                    on_cpu,
                    off_cpu,
                    on_cpu_ns,
                })
                .collect();
            if rec == PyStacksRec::default() {
                continue;
            }
            rec.stacks.sort_by(|a, b| (&a.thread, &a.frames).cmp(&(&b.thread, &b.frames)));
            rec.t_ns = t_ns;
            rec.pid = *pid;
            let _ = self.out.send(Sample::PyStacks(rec));
        }
        let wanted: HashSet<u32> = targets.iter().map(|t| t.pid).collect();
        self.procs.retain(|pid, _| wanted.contains(pid));
        self.last_flush = Instant::now();
    }
}

/// One sample of `pid`'s threads into its counts; the CPU it cost, or `None` when it could not
/// be taken (not open yet, not Python, gone).
fn sample(pid: u32, p: &mut Proc, now: Instant) -> Option<Duration> {
    if p.spy.is_none() && !open(pid, p, now) {
        return None;
    }
    let spy = p.spy.as_mut()?;
    let cpu0 = thread_cpu();
    match stack_traces(spy) {
        Ok(traces) => {
            // py-spy reads the threads' states before their stacks: a main thread that blocked
            // meanwhile is shown running in the stack it blocked in. Read again after.
            let main_still_running = on_cpu(pid);
            p.failed_in_a_row = 0;
            // The time this sample stands for: since the one before (none for the first; a
            // gap, the process off CPU and not looked at, counts at most STANDS_FOR_AT_MOST).
            let stands_for = p
                .last_sample
                .map_or(Duration::ZERO, |l| now.duration_since(l).min(STANDS_FOR_AT_MOST));
            // The main thread's, its time runnable since then (the kernel's schedstat): a sample
            // after a long block stands for the moments it ran, not for the block (its wait).
            let sched = main_schedstat(pid);
            // A process that exited since its stack was read has none either: only a kernel
            // that keeps none for this process too is said to.
            p.pending.no_schedstat |=
                sched.is_none() && main_schedstat(std::process::id()).is_none();
            let main_stands_for = match (p.last_sched, sched) {
                (Some(a), Some(b)) if p.last_sample.is_some() => {
                    b.runnable_since(a).min(STANDS_FOR_AT_MOST)
                }
                _ => stands_for,
            };
            p.last_sched = sched;
            p.last_sample = Some(now);
            p.pending.rounds += 1;
            for tr in traces {
                let frames: Vec<PyFrame> = tr
                    .frames
                    .iter()
                    .map(|f| PyFrame {
                        name: f.name.clone(),
                        file: f.filename.clone(),
                        line: f.line.max(0) as u32,
                    })
                    .collect();
                let thread = tr.thread_name.unwrap_or_else(|| format!("{:#x}", tr.thread_id));
                let c = p.counts.entry((thread, frames)).or_default();
                let main = tr.os_thread_id == Some(u64::from(pid));
                if tr.active && (!main || main_still_running) {
                    c.0 += 1;
                    c.2 += if main { main_stands_for } else { stands_for }.as_nanos() as u64;
                } else {
                    c.1 += 1;
                }
            }
            Some(thread_cpu().saturating_sub(cpu0))
        }
        // Read while the interpreter changed it (non-blocking reads race with the process):
        // counted, and the next one taken as usual. Many in a row: it exited, or exec'd into
        // something else, and is opened again if it is still a target.
        Err(e) => {
            log::debug!("pid {pid}: no stack: {e}");
            p.pending.failed += 1;
            p.failed_in_a_row += 1;
            if p.failed_in_a_row >= FAILED_IN_A_ROW || !crate::sources::procfs::exists(pid) {
                p.spy = None;
                p.failed_in_a_row = 0;
                p.next_try = Some(now + RETRY_EVERY);
            }
            None
        }
    }
}

/// `spy`'s stacks now. py-spy's reads race with the process: a pointer read while the
/// interpreter rewrote it (a thread starting or ending) is garbage, and py-spy's arithmetic on
/// it panics where overflow is checked. Such a read is one failed sample, like the errors py-spy
/// returns, not the end of sampling for every process.
fn stack_traces(spy: &mut py_spy::PythonSpy) -> anyhow::Result<Vec<py_spy::StackTrace>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| spy.get_stack_traces()))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("py-spy panicked on what it read")))
}

/// Opens `pid` for sampling; after [`OPEN_TRIES`] failures says why once and gives up. A
/// process that maps no interpreter is not opened at all (py-spy would read its binaries).
fn open(pid: u32, p: &mut Proc, now: Instant) -> bool {
    if p.next_try.is_some_and(|t| now < t) {
        return false;
    }
    if !runs_python(pid) {
        p.tries += 1;
        p.next_try = Some(now + RETRY_EVERY);
        if p.tries >= OPEN_TRIES && crate::sources::procfs::exists(pid) {
            p.gave_up = true;
            p.pending.not_python = true;
        }
        return false;
    }
    let config = py_spy::Config {
        blocking: py_spy::config::LockingStrategy::NonBlocking,
        native: false,
        // Blocked threads too: a stuck process is one.
        include_idle: true,
        ..Default::default()
    };
    match py_spy::PythonSpy::new(pid as py_spy::Pid, &config) {
        Ok(spy) => {
            p.pending.python = Some(spy.version.to_string());
            p.spy = Some(spy);
            true
        }
        Err(e) => {
            p.tries += 1;
            p.next_try = Some(now + RETRY_EVERY);
            if p.tries >= OPEN_TRIES && crate::sources::procfs::exists(pid) {
                p.gave_up = true;
                p.pending.unreadable = Some(first_line(&e.to_string()));
            }
            false
        }
    }
}

/// Its executable is a Python interpreter, or it maps libpython (an embedding program).
fn runs_python(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let named = |path: &str| {
        let file = path.rsplit('/').next().unwrap_or(path);
        file.starts_with("python") || file.starts_with("libpython")
    };
    if exe.to_str().is_some_and(named) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.lines().any(|l| l.split_whitespace().nth(5).is_some_and(named)))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).chars().take(200).collect()
}

/// The process's main thread is running or runnable.
fn on_cpu(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| is_running(&s))
}

/// A stat line's state is R. The name before it is the job's and may hold ") ": the state
/// follows the last one.
fn is_running(stat: &str) -> bool {
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('R'))
}

/// A main thread's time on CPU and waiting for one since it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sched {
    ran_ns: u64,
    runq_ns: u64,
}

/// The main thread's [`Sched`] from the kernel's /proc/PID/schedstat (ns on CPU, ns in the
/// run queue, slices); `None` where the kernel keeps none (CONFIG_SCHED_INFO off) or the
/// process is gone.
fn main_schedstat(pid: u32) -> Option<Sched> {
    parse_schedstat(&std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?)
}

fn parse_schedstat(text: &str) -> Option<Sched> {
    let mut f = text.split_whitespace().map(|n| n.parse::<u64>().ok());
    Some(Sched { ran_ns: f.next()??, runq_ns: f.next()?? })
}

impl Sched {
    /// On CPU or waiting for one since `before`.
    fn runnable_since(self, before: Sched) -> Duration {
        let ran = self.ran_ns.saturating_sub(before.ran_ns);
        Duration::from_nanos(ran + self.runq_ns.saturating_sub(before.runq_ns))
    }
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_stands_for_the_main_threads_time_runnable_since_the_one_before() {
        let before = parse_schedstat("1000 200 5\n").expect("schedstat");
        let after = parse_schedstat("4000 700 9\n").expect("schedstat");
        // 3 us on CPU and 0.5 us waiting for one; the block between is no part of it.
        assert_eq!(after.runnable_since(before), Duration::from_nanos(3_500));
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn each_process_is_sampled_within_its_share_of_the_budget() {
        // A sample of 0.5 ms, one trainer with half of 0.5 % of a CPU: every 200 ms.
        assert_eq!(period(Rate::Auto, Duration::from_micros(500), 1), Duration::from_millis(200));
        // Eight workers share the other half: a 100 us sample each every 320 ms.
        assert_eq!(period(Rate::Auto, Duration::from_micros(100), 8), Duration::from_millis(320));
        assert_eq!(period(Rate::Auto, Duration::from_micros(10), 1), MIN_PERIOD);
        assert_eq!(period(Rate::Auto, Duration::from_millis(50), 1), MAX_PERIOD);
        assert_eq!(period(Rate::Hz(20.0), Duration::from_millis(50), 9), Duration::from_millis(50));
    }

    #[test]
    fn rates_parse_with_a_line_that_says_what_to_give() {
        assert_eq!("auto".parse::<Rate>(), Ok(Rate::Auto));
        assert_eq!("off".parse::<Rate>(), Ok(Rate::Off));
        assert_eq!("10".parse::<Rate>(), Ok(Rate::Hz(10.0)));
        let e = "-3".parse::<Rate>().expect_err("negative");
        assert!(e.contains("auto") && e.contains("off"), "{e}");
    }

    #[test]
    fn a_stat_line_with_a_bracket_in_its_name_still_gives_the_state() {
        assert!(is_running("42 (a) S b) R 1 42 42 0"));
        assert!(!is_running("42 (worker) S 1 42"));
        assert!(!on_cpu(u32::MAX));
    }
}
