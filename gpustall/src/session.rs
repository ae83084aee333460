//! A tracing session: the model and where its observations are written. Shared by `trace`
//! (a recording file) and `watch` (an in-memory flight recorder).

use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};

use crate::{
    context::ContextReader,
    decode::{decode, Event},
    gpu::StallEpisode,
    loader,
    model::Model,
    observe::{CountersSample, Sample},
    procscan,
    record::{event_json, stall_json, Sink},
};

/// fsync the recording at least this often (and at once after an incident).
const SYNC_EVERY: Duration = Duration::from_secs(5);

/// `--log FILE`: followed from its end; a file that does not exist yet (a job that has just
/// started) is waited for, with one notice.
pub struct LogSource {
    path: std::path::PathBuf,
    patterns: crate::trainlog::LogPatterns,
    tail: Option<crate::trainlog::LogTail>,
}

impl LogSource {
    pub fn new(path: &std::path::Path, regex: Option<&str>) -> anyhow::Result<Self> {
        let patterns = crate::trainlog::LogPatterns::new(regex)
            .map_err(|e| anyhow::anyhow!("--log-regex is not a valid regular expression: {e}"))?;
        let tail = if path.exists() {
            Some(crate::trainlog::LogTail::open(path, false)?)
        } else {
            eprintln!("gpustall: waiting for the training log {} to appear", path.display());
            None
        };
        Ok(Self { path: path.to_path_buf(), patterns, tail })
    }

    /// New complete lines (all of a file that appeared after the start: it is this run's).
    fn poll(&mut self) -> Vec<String> {
        if self.tail.is_none() && self.path.exists() {
            self.tail = crate::trainlog::LogTail::open(&self.path, true).ok();
        }
        self.tail.as_mut().map(|t| t.poll()).unwrap_or_default()
    }
}

/// Something that happened to the job that deserves a bundle (watch) or an immediate fsync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    /// `oom_kill`, `sigkill`, `gpu_stall`, `reclaim_storm`.
    pub kind: &'static str,
    pub t_ns: u64,
    pub pid: u32,
}

pub struct Session {
    pub model: Model,
    pub recorder: Option<Box<dyn Sink>>,
    /// The last full read of the kernel counters: only changes are recorded, unless
    /// `full_counters` (the flight recorder needs a whole baseline in any window).
    last_counters: CountersSample,
    pub full_counters: bool,
    pub undecodable: u64,
    /// Incidents since the caller last took them.
    pub incidents: Vec<Incident>,
    /// An incident arrived: sync the recording now.
    incident: bool,
}

impl Session {
    pub fn new(model: Model) -> Self {
        Self {
            model,
            recorder: None,
            last_counters: CountersSample::default(),
            full_counters: false,
            undecodable: 0,
            incidents: Vec::new(),
            incident: false,
        }
    }

    pub fn observe(&mut self, s: Sample) {
        if let Some(r) = self.recorder.as_mut() {
            r.write(&s.to_json());
        }
        let ended = self.model.observe(&s);
        self.stalls_ended(&ended);
    }

    pub fn stalls_ended(&mut self, ended: &[StallEpisode]) {
        if ended.is_empty() {
            return;
        }
        self.incident = true;
        for e in ended {
            self.incidents.push(Incident { kind: "gpu_stall", t_ns: e.start_ns, pid: e.pids.first().copied().unwrap_or(0) });
            if let Some(r) = self.recorder.as_mut() {
                r.write(&stall_json(e));
            }
        }
    }

    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            let e = match decode(&item) {
                Ok(e) => e,
                Err(err) => {
                    self.undecodable += 1;
                    log::debug!("undecodable record: {err}");
                    continue;
                }
            };
            if let Some(r) = self.recorder.as_mut() {
                r.write(&event_json(&e));
            }
            self.model.apply(&e);
            match &e {
                Event::OomVictim { h, victim_pid, .. } => {
                    self.incident = true;
                    self.incidents.push(Incident { kind: "oom_kill", t_ns: h.t_ns, pid: *victim_pid });
                }
                Event::Signal { h, sig: 9, target_pid, .. } => {
                    self.incident = true;
                    self.incidents.push(Incident { kind: "sigkill", t_ns: h.t_ns, pid: *target_pid });
                }
                Event::Signal { .. } => self.incident = true,
                _ => {}
            }
            // Roles need command lines (torchrun, forkserver, spawn): read them while the
            // process is young. Best effort: it may be gone already.
            let pid = match &e {
                Event::Fork { child_pid, .. } => Some(*child_pid),
                Event::Exec { h, .. } => Some(h.tgid),
                _ => None,
            };
            if let Some(pid) = pid {
                if let Some(c) = crate::hostctx::cmdline(pid) {
                    let t_ns = e.header().t_ns;
                    self.observe(Sample::Cmdline { t_ns, pid, cmdline: c.join(" ") });
                }
            }
        }
    }

    fn counters(&mut self, maps: &loader::KernelMaps, now: u64) {
        let full = maps.read(now, self.undecodable);
        let changes = if self.full_counters { full.clone() } else { full.changes_since(&self.last_counters) };
        if !changes.is_empty() {
            self.observe(Sample::Counters(changes));
        }
        self.last_counters = full;
    }

    /// /proc memory of live processes; processes that vanished without an exit event (lost)
    /// are marked gone so the trace can end.
    fn sample_proc(&mut self, now: u64) {
        for pid in self.model.tree.alive_pids() {
            match procscan::sample_mem(pid) {
                Some(mem) => self.observe(Sample::ProcMem { t_ns: now, pid, mem }),
                None if !procscan::exists(pid) => self.observe(Sample::Vanished { t_ns: now, pid }),
                None => {} // a zombie: its exit event is on its way
            }
        }
    }

    /// New training-log lines: per-step times onto the timeline (stamped when read: the log's
    /// own clock is not ours).
    fn read_log(&mut self, log: &mut LogSource, now: u64) {
        for line in log.poll() {
            if let Some(step) = log.patterns.parse(&line) {
                self.observe(Sample::TrainStep { t_ns: now, data_time_s: step.data_time_s, iter_time_s: step.iter_time_s });
            }
        }
    }

    /// Everything a tick looks at.
    pub fn tick(&mut self, maps: &loader::KernelMaps, ctx: &ContextReader, log: &mut Option<LogSource>, now: u64) {
        self.counters(maps, now);
        self.sample_proc(now);
        let alive = self.model.tree.alive_pids();
        self.observe(Sample::Context(ctx.read(&alive, now)));
        if let Some(log) = log.as_mut() {
            self.read_log(log, now);
        }
    }

    pub fn sync_if_due(&mut self, last_sync: &mut Instant) {
        if self.incident || last_sync.elapsed() >= SYNC_EVERY {
            if let Some(r) = self.recorder.as_mut() {
                r.sync();
            }
            self.incident = false;
            *last_sync = Instant::now();
        }
    }
}

