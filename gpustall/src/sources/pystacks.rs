//! The job's Python stacks, read from outside with py-spy (as a library, non-blocking: the
//! process is never paused) on a thread of their own, at a rate chosen from what sampling costs.
//!
//! Who is sampled each round (the session's [`Target`]s, given each beat):
//! - trainers and ranks every round: where they wait for data, and what they run on CPU;
//! - DataLoader workers when they are on CPU (state R): where the pipeline's CPU goes;
//! - any of them, on CPU or not, at least every [`IDLE_EVERY`]: the line a stuck process
//!   blocks on.
//!
//! Each round's cost (the thread's own CPU time) sets the pause before the next, so that
//! sampling takes at most [`BUDGET`] of one CPU whatever the job's size (`--py-stacks auto`),
//! or a fixed rate (`--py-stacks HZ`). What was seen is sent every [`FLUSH_EVERY`] as one
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
/// The shortest and longest pause between rounds.
const MIN_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// A process off CPU is still sampled this often (a stuck one's line).
const IDLE_EVERY: Duration = Duration::from_secs(3);
/// How often counts are sent.
const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Opening a process that is not (yet) Python is retried this often, this many times: a
/// `sh` that execs python, a launcher that becomes the trainer.
const RETRY_EVERY: Duration = Duration::from_secs(2);
const OPEN_TRIES: u32 = 3;

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
    /// A trainer or rank: every round, on CPU or not.
    pub every_round: bool,
}

/// The pause after a round that cost `cost` of CPU.
pub fn pause_after(rate: Rate, cost: Duration) -> Duration {
    match rate {
        Rate::Hz(hz) => Duration::from_secs_f64(1.0 / hz),
        _ => cost.div_f64(BUDGET).saturating_sub(cost).clamp(MIN_PAUSE, MAX_PAUSE),
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
    last_sample: Option<Instant>,
    gave_up: bool,
    /// Counts since the last flush.
    pending: PyStacksRec,
    counts: HashMap<(String, Vec<PyFrame>), (u64, u64)>,
}

struct Sampling {
    rate: Rate,
    targets: Arc<Mutex<Vec<Target>>>,
    out: Sender<Sample>,
    procs: HashMap<u32, Proc>,
    last_flush: Instant,
    /// A cheap generator for the pauses' jitter: a round in step with a job's own period
    /// would see one phase of it only.
    seed: u64,
}

impl Sampling {
    fn new(rate: Rate, targets: Arc<Mutex<Vec<Target>>>, out: Sender<Sample>) -> Self {
        let seed = monotonic_ns() | 1;
        Self { rate, targets, out, procs: HashMap::new(), last_flush: Instant::now(), seed }
    }

    fn run(mut self, stop: Receiver<()>) {
        loop {
            let cpu0 = thread_cpu();
            let targets = self.targets.lock().map(|t| t.clone()).unwrap_or_default();
            for t in &targets {
                self.sample(*t);
            }
            if self.last_flush.elapsed() >= FLUSH_EVERY {
                self.flush(&targets);
            }
            let pause = self.jitter(pause_after(self.rate, thread_cpu().saturating_sub(cpu0)));
            match stop.recv_timeout(pause) {
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                _ => break,
            }
        }
        let targets = self.targets.lock().map(|t| t.clone()).unwrap_or_default();
        self.flush(&targets);
    }

    /// ±25 % around `d`.
    fn jitter(&mut self, d: Duration) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        d.mul_f64(0.75 + (self.seed % 1000) as f64 / 2000.0)
    }

    fn sample(&mut self, t: Target) {
        let now = Instant::now();
        let p = self.procs.entry(t.pid).or_default();
        if p.gave_up {
            return;
        }
        let due = t.every_round
            || on_cpu(t.pid)
            || p.last_sample.is_none_or(|l| now.duration_since(l) >= IDLE_EVERY);
        if !due {
            return;
        }
        if p.spy.is_none() && !open(t.pid, p, now) {
            return;
        }
        let Some(spy) = p.spy.as_mut() else { return };
        match spy.get_stack_traces() {
            Ok(traces) => {
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
                    if tr.active {
                        c.0 += 1;
                    } else {
                        c.1 += 1;
                    }
                }
            }
            // Exited, or exec'd into something else: open it again if it is still a target.
            Err(_) => {
                p.spy = None;
                p.next_try = Some(now + RETRY_EVERY);
            }
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
                .map(|((thread, frames), (on_cpu, off_cpu))| StackCount {
                    thread,
                    frames,
                    on_cpu,
                    off_cpu,
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
    fn the_pause_keeps_sampling_within_its_budget() {
        // A round of 2 ms at 0.5 % of a CPU: 398 ms of pause.
        assert_eq!(pause_after(Rate::Auto, Duration::from_millis(2)), Duration::from_millis(398));
        assert_eq!(pause_after(Rate::Auto, Duration::from_micros(10)), MIN_PAUSE);
        assert_eq!(pause_after(Rate::Auto, Duration::from_millis(50)), MAX_PAUSE);
        assert_eq!(
            pause_after(Rate::Hz(20.0), Duration::from_millis(50)),
            Duration::from_millis(50)
        );
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
