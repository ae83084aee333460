//! `gpustall trace`: follow a process tree until a duration passes, a signal arrives, or every
//! traced process has exited; then write what was collected, always.
//!
//! Everything the model learns goes through the recording first (events and samples), so
//! `gpustall report` can rebuild the same summary from the file.

use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::pipeline::session::{Moment, Session};
use crate::{
    cmd::{
        event_loop::{self, Beat, GpuTicks, Rings, Stop},
        gpu::{GpuArgs, GpuOptions, GpuWatch},
        job_target::JobTarget,
        launch::{Held, Launched, Relay},
        seed,
        signals::Received,
    },
    kernel::{
        loader::{self, KernelMaps, Probes},
        preflight,
    },
    model::{overhead::Overhead, samples::Sample, Model},
    output::status_line,
    recording::{header::Header, record::Line, writer::Recorder},
    sources::{agent, clock::monotonic_ns, context::ContextReader, trainlog::LogSource},
};

/// `gpustall trace`'s flags: a process to follow (`--pid`), a command to start (`-- CMD`) or a
/// Slurm job to wait for (`--slurm-job`), one of the three.
#[derive(clap::Args)]
#[group(id = "target", required = true, multiple = false, args = ["pid", "command", "slurm_job"])]
pub struct TraceArgs {
    /// The process to trace (the trainer); its existing descendants are traced too.
    #[arg(long, short = 'p', value_name = "PID")]
    pid: Option<u32>,
    /// Start CMD under the tracer instead (`gpustall trace [OPTIONS] -- torchrun ...`): traced
    /// from its first instruction, run as the invoking user under sudo (SUDO_UID/SUDO_GID)
    /// with gpustall's environment, signals passed on; gpustall exits with its status.
    #[arg(last = true, value_name = "CMD", conflicts_with = "pid")]
    command: Vec<String>,
    /// Trace Slurm job ID on this node, started by the node's Prolog before the job runs: wait
    /// for its first task in slurmd's cgroups, trace it, its descendants and the tasks of later
    /// steps as they appear, until none is left (deploy/slurm/README.md).
    #[arg(long, value_name = "ID")]
    slurm_job: Option<u64>,
    /// Also append the verdict's first lines to the job's standard error when it is a regular
    /// file of the job's user: `slurm-<id>.out` (or the `--error` file) with --slurm-job, the
    /// target's with --pid.
    #[arg(long, conflicts_with = "command")]
    report_to_job: bool,
    /// Stop after this long (30 is seconds, as for timeout(1); or 90s, 10m, 1h30m); default: until
    /// the job exits or Ctrl-C.
    #[arg(long, short = 'd', value_name = "D", value_parser = crate::cmd::units::parse_positive_duration)]
    duration: Option<Duration>,
    /// With `-- CMD`: when --duration ends the trace, stop the job too, every process of it
    /// (SIGTERM, then SIGKILL after 10 s, as timeout(1) -k 10s does to its process group) and
    /// exit with its status. Without it the job
    /// keeps running on its own and gpustall exits 0 once its report is written.
    #[arg(long, requires = "duration", requires = "command")]
    stop_job: bool,
    /// Write every event as JSON Lines to FILE (header, events, samples, summaries).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Write the final summary (per-process figures, OOM kills, verdict) as JSON to FILE (`-`:
    /// stdout, the report then on stderr).
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    /// The final summary as JSON on stdout (`--summary-json -`), the report on stderr.
    #[arg(long, conflicts_with = "summary_json")]
    json: bool,
    /// No status line (the report is still printed).
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Without a terminal (a batch job's error file, a pod's log), a status line at most this
    /// often, and at once whenever a GPU stall begins or ends, a process of the job is killed,
    /// its memory passes 90 % of its cgroup's limit or is forecast to reach it within 10
    /// minutes, or a wait for data goes on with no batch; on a terminal the status row is
    /// redrawn every second.
    #[arg(long, value_name = "D", default_value = "60s", value_parser = crate::cmd::units::parse_duration)]
    status_every: Duration,
    /// How often a periodic summary goes into the recording.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = crate::cmd::units::parse_duration)]
    summary_every: Duration,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    kernel_log: crate::cmd::KernelLogArgs,
    /// Tail this training log for per-step data_time (mmengine style `data_time: 0.7384`).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// A regular expression with one capture group, the seconds, for other log formats.
    #[arg(long, value_name = "REGEX", requires = "log")]
    log_regex: Option<String>,
    /// Also write a Perfetto / Chrome trace (ui.perfetto.dev) of the run to OUT.
    #[arg(long, value_name = "OUT")]
    perfetto: Option<PathBuf>,
    /// Also write a self-contained HTML page of the run (verdict, charts, tables) to OUT.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
    #[command(flatten)]
    stacks: crate::cmd::StacksArgs,
}

impl TraceArgs {
    pub fn into_options(self) -> TraceOptions {
        TraceOptions {
            pid: self.pid.unwrap_or(0),
            launch: self.command,
            slurm_job: self.slurm_job,
            report_to_job: self.report_to_job,
            duration: self.duration,
            stop_job: self.stop_job,
            record: self.record,
            summary_json: self.summary_json.or_else(|| self.json.then(|| PathBuf::from("-"))),
            quiet: self.quiet,
            status_every: self.status_every,
            summary_every: self.summary_every,
            gpu: self.gpu.options(Duration::from_millis(500), Duration::from_secs(3)),
            trust_user_kernel_log: self.kernel_log.trust_user_kernel_log,
            log: self.log,
            log_regex: self.log_regex,
            perfetto: self.perfetto,
            html: self.html,
            py_stacks: self.stacks.py_stacks,
        }
    }
}

/// What `trace` was asked to do (from the CLI).
pub struct TraceOptions {
    pub pid: u32,
    /// `-- CMD`: start it under the tracer (its pid becomes `pid`).
    pub launch: Vec<String>,
    /// `--slurm-job`: wait for the job's first task (its pid becomes `pid`).
    pub slurm_job: Option<u64>,
    /// `--report-to-job`.
    pub report_to_job: bool,
    pub duration: Option<Duration>,
    /// `--stop-job`: the end of `duration` stops the launched job too.
    pub stop_job: bool,
    pub record: Option<PathBuf>,
    pub summary_json: Option<PathBuf>,
    pub quiet: bool,
    /// `--status-every`: the status line's pace without a terminal.
    pub status_every: Duration,
    pub summary_every: Duration,
    /// `None`: --no-gpu.
    pub gpu: Option<GpuOptions>,
    /// `--trust-user-kernel-log`.
    pub trust_user_kernel_log: bool,
    /// `--log FILE` and an optional `--log-regex` for data_time.
    pub log: Option<PathBuf>,
    pub log_regex: Option<String>,
    /// Also write a Perfetto trace and an HTML page at the end.
    pub perfetto: Option<PathBuf>,
    pub html: Option<PathBuf>,
    /// `--py-stacks`.
    pub py_stacks: crate::sources::pyspy::Rate,
}

pub async fn run(mut opts: TraceOptions) -> anyhow::Result<()> {
    // A bad output path is found now, not after the run: the job has not started yet.
    check_outputs(&opts)?;
    let mut launched = None;
    if !opts.launch.is_empty() {
        let l = Launched::spawn(&opts.launch)?;
        opts.pid = l.pid();
        launched = Some(l);
    }
    let (mut t, mut probes, mut rings, gpu) = match setup(&mut opts) {
        Ok(s) => s,
        Err(e) => {
            if let Some(job) = launched {
                job.abandon();
            }
            return Err(e);
        }
    };
    if let Some(l) = launched.as_mut() {
        // Its cmdline is gpustall's until the exec: name it by what it will run.
        let cmdline = opts.launch.join(" ");
        t.session.observe(Sample::Cmdline { t_ns: monotonic_ns(), pid: opts.pid, cmdline });
        l.release()?;
    }
    t.launched = launched;
    let gpu =
        GpuTicks { watch: gpu, every: opts.gpu.as_ref().map_or(Duration::MAX, |g| g.interval) };
    let stop = event_loop::run(&mut t, &mut rings, &mut probes, gpu, opts.duration).await?;
    t.beat.bar.finish();
    log::debug!("trace ended: {stop:?}");
    let launched = t.launched.take();
    // Held before the report is written: `--stop-job` stops every process of the job, and a
    // pid may be reused by then.
    let top = launched.as_ref().map(Launched::pid);
    let alive = if opts.stop_job { t.session.model.tree.alive_pids() } else { Vec::new() };
    let rest = Held::new(alive.into_iter().filter(|&p| Some(p) != top));
    let result = finish(&opts, t, &probes);
    let Some(mut job) = launched else { return result };
    let code = match job_at_end(&opts, &stop, &mut job, &rest) {
        Some(code) => code,
        None => return result,
    };
    match result {
        Err(e) if e.downcast_ref::<crate::cmd::LostEvents>().is_some() => {
            say!("gpustall: warning: {e}");
        }
        // An output that could not be written: said, and the status is the job's, or 1 when
        // the job succeeded (a run whose outputs are lost is no success).
        Err(e) => {
            say!("gpustall: error: {e:#}");
            return Err(crate::cmd::JobExit(if code == 0 { 1 } else { code }).into());
        }
        Ok(()) => {}
    }
    Err(crate::cmd::JobExit(code).into())
}

/// The launched job's status once the trace is over: it has exited (the trace ended with it, or
/// with a signal passed on to it), or --duration ended the trace and `--stop-job` stops it.
/// `None`: --duration ended the trace of a job that keeps running on its own (said); gpustall
/// never waits for it there, so it cannot hang behind a job that outlives the trace.
fn job_at_end(opts: &TraceOptions, stop: &Stop, job: &mut Launched, rest: &Held) -> Option<i32> {
    if !matches!(stop, Stop::Deadline) {
        return Some(job.exit_code());
    }
    if let Some(code) = job.try_exit_code() {
        return Some(code);
    }
    if opts.stop_job {
        return Some(job.stop_all(Duration::from_secs(10), rest));
    }
    say!(
        "gpustall: the job (pid {}) keeps running: --duration ended the trace, not the job (--stop-job stops it too)",
        job.pid()
    );
    None
}

/// What a running trace holds besides the kernel side.
struct Trace {
    session: Session,
    beat: BeatState,
    /// The recording's path: `--record`, or a scratch file for `--perfetto` or `--html` alone.
    record_path: Option<PathBuf>,
    scratch: Option<PathBuf>,
    startup_cpu_s: f64,
    /// `-- CMD`: the job gpustall started.
    launched: Option<Launched>,
    /// `-- CMD`: the signals received, passed on unless the job got them itself.
    relay: Relay,
    /// `--slurm-job`'s later tasks; `--report-to-job`'s file.
    job: JobTarget,
}

/// State of the once-a-second work.
struct BeatState {
    ctx: ContextReader,
    log: Option<LogSource>,
    start: u64,
    quiet: bool,
    summary_every: Duration,
    bar: status_line::StatusBar,
    pacer: status_line::Pacer,
    prev: status_line::TreeTotals,
    prev_at: Instant,
    last_summary: Instant,
    periodic: crate::output::summary::PeriodicState,
}

/// Checks, loads and attaches, opens the outputs, seeds the tree from /proc.
fn setup(opts: &mut TraceOptions) -> anyhow::Result<(Trace, Probes, Rings, Option<GpuWatch>)> {
    preflight::raise_open_files()?;
    if opts.slurm_job.is_none() {
        preflight::check_pid(opts.pid)?;
    }
    preflight::check_privileges()?;
    preflight::protect_self_from_oom_killer();
    preflight::raise_memlock();
    let mut probes = loader::load_and_warn()?;
    // Attached first: the job's first task is tracked as soon as it is found.
    let mut job = JobTarget::new(opts.slurm_job, opts.report_to_job);
    if let Some(pid) = job.wait_for_first_task()? {
        opts.pid = pid;
    }
    let log =
        opts.log.as_deref().map(|p| LogSource::new(p, opts.log_regex.as_deref())).transpose()?;

    let start = monotonic_ns();
    let mut session = Session::new(Model { start_ns: start, last_ns: start, ..Default::default() });
    // A Perfetto trace and an HTML page are drawn from the recording: without --record, record
    // to a scratch file.
    let drawn = opts.perfetto.is_some() || opts.html.is_some();
    let scratch = (drawn && opts.record.is_none()).then(|| {
        std::env::temp_dir().join(format!("gpustall-{}-{}.jsonl", std::process::id(), start))
    });
    let record_path = opts.record.clone().or_else(|| scratch.clone());
    if let Some(path) = &record_path {
        session.recorder = Some(Box::new(Recorder::create(path)?));
    }
    let (gpu, gpu_header) = crate::cmd::gpu::open(opts.gpu.as_ref(), &mut session.model.gpu);
    let header = Header {
        targets: Some(vec![opts.pid]),
        ..Header::new(start, &probes.attached, &probes.skipped, gpu_header)
    };
    session.model.origin = Some(header.origin());
    if let Some(r) = session.recorder.as_mut() {
        r.write(Line::Header(&header));
        r.flush();
    }
    seed::seed(&mut session, &mut probes.maps, opts.pid, start)?;
    job.hold_stderr_of(opts.pid);
    session.follow_kernel_log(opts.trust_user_kernel_log);
    session.sample_stacks(opts.py_stacks);
    // The trainer's waits count from the start, not from the first beat: a job's first batch
    // (the workers' start-up) is often its longest wait.
    probes.maps.account_offcpu(&session.model.tree);
    say!(
        "gpustall: tracing pid {} and its descendants ({} now, {} tracepoints){}",
        opts.pid,
        match session.model.tree.alive_pids().len() {
            1 => "1 process".to_string(),
            n => format!("{n} processes"),
        },
        probes.attached.len(),
        opts.duration.map_or(String::new(), |d| format!(" for {}", humantime::format_duration(d)))
    );
    let (startup_cpu_s, _) = agent::agent_usage();
    let (critical, bulk) = probes.take_rings()?;
    let rings = Rings::register(critical, bulk)?;
    let beat = BeatState {
        ctx: ContextReader::new(opts.pid),
        log,
        start,
        quiet: opts.quiet,
        summary_every: opts.summary_every,
        bar: status_line::StatusBar::new(std::io::stderr().is_terminal()),
        pacer: status_line::Pacer::new(opts.status_every),
        prev: status_line::TreeTotals::default(),
        prev_at: Instant::now(),
        last_summary: Instant::now(),
        periodic: Default::default(),
    };
    let t = Trace {
        session,
        beat,
        record_path,
        scratch,
        startup_cpu_s,
        launched: None,
        relay: Relay::default(),
        job,
    };
    Ok((t, probes, rings, gpu))
}

/// `--record x --summary-json x` or `--log f --record f` would destroy one file with the other;
/// an output in a directory that does not exist (or takes no file) would lose the run at its end.
fn check_outputs(opts: &TraceOptions) -> anyhow::Result<()> {
    let outputs: Vec<(&str, &Path)> = [
        ("--record", &opts.record),
        ("--summary-json", &opts.summary_json),
        ("--perfetto", &opts.perfetto),
        ("--html", &opts.html),
    ]
    .into_iter()
    .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
    .collect();
    let inputs: Vec<&Path> = opts.log.as_deref().into_iter().collect();
    crate::recording::files::refuse_clashes(&inputs, &outputs)?;
    for (flag, path) in outputs {
        // The recording is written as it goes; the others whole, at the end.
        crate::recording::files::check_writable(flag, path, flag != "--record")?;
    }
    Ok(())
}

impl Beat for Trace {
    fn session(&mut self) -> &mut Session {
        &mut self.session
    }

    fn catch_up(&mut self, _why: Moment) {
        self.beat.ctx.job_changed(self.session.tree_changed_ns);
        self.beat.ctx.catch_up(&self.session.model.tree.alive_pids());
    }

    fn may_have_ended(&mut self) -> bool {
        self.session.model.tree.alive_pids().is_empty()
    }

    /// A job gpustall started gets the signal once: from gpustall only when it did not get
    /// it itself (see [`Relay`]); the trace goes on until it has exited.
    fn on_signal(&mut self, r: Received) -> bool {
        if self.launched.is_none() {
            return true;
        }
        self.relay.hold(r, monotonic_ns());
        self.settle();
        false
    }

    fn settle_at(&self) -> Option<tokio::time::Instant> {
        let due = self.relay.due()?;
        Some(tokio::time::Instant::now() + Duration::from_nanos(due.saturating_sub(monotonic_ns())))
    }

    fn settle(&mut self) {
        let Some(job) = self.launched.as_mut() else { return };
        let now = monotonic_ns();
        let me = std::process::id();
        for r in self.relay.decide(now, &self.session.model.signals, job.pid(), me) {
            if job.try_exit_code().is_none() {
                log::debug!("passing {} on to the job", r.name());
                job.forward(r.sig);
                continue;
            }
            // The command has exited and left processes behind (it daemonized them: `setsid
            // cmd &`): the signal goes to them, the job that is still traced.
            let left = self.session.model.tree.alive_pids();
            log::debug!("passing {} on to the job's {} processes left", r.name(), left.len());
            for pid in left.into_iter().filter(|&p| p != me && p > 1) {
                // SAFETY: kill(2) of a process of the traced job.
                unsafe { libc::kill(pid as i32, r.sig) };
            }
        }
    }

    /// Counters, /proc, context and log; the status line; the periodic summary.
    fn beat(&mut self, maps: &mut KernelMaps, now: u64) -> Option<Stop> {
        let (session, b) = (&mut self.session, &mut self.beat);
        for pid in self.job.new_tasks(&session.model.tree) {
            if let Err(e) = seed::seed(session, maps, pid, now) {
                log::warn!("a task of the Slurm job, pid {pid}: {e:#}");
            }
            self.job.hold_stderr_of(pid);
        }
        session.tick(maps, &mut b.ctx, b.log.as_mut(), now);
        session.settle_exited(maps, now);
        let cur = status_line::totals(&session.model);
        let alive = session.model.tree.alive_pids().len();
        let notable = status_line::Notable::of(&session.model);
        if !b.quiet && b.pacer.due(b.bar.is_tty(), Instant::now(), notable) {
            let lost = session.model.host.lost.iter().sum::<u64>() + session.undecodable;
            let elapsed_s = (now - b.start) as f64 / 1e9;
            let procs = session.model.tree.iter().count();
            let l = status_line::line(
                elapsed_s,
                alive,
                procs,
                b.prev,
                cur,
                b.prev_at.elapsed().as_secs_f64(),
                lost,
            ) + &status_line::live_part(&session.model.gpu, now)
                + &status_line::waiting_part(&session.model)
                + &status_line::limit_part(&session.model);
            b.bar.show(&l);
        }
        b.prev = cur;
        b.prev_at = Instant::now();
        if b.last_summary.elapsed() >= b.summary_every {
            let mut s = crate::pipeline::conclude::summary(&session.model, now, false);
            b.periodic.only_changed(&mut s);
            if let (Some(r), Ok(v)) = (session.recorder.as_mut(), serde_json::to_value(&s)) {
                r.write(Line::Summary(&v));
            }
            b.last_summary = Instant::now();
        }
        if let Some(r) = session.recorder.as_mut() {
            r.flush();
        }
        (alive == 0).then_some(Stop::JobEnded)
    }
}

/// Whatever ended the trace: take in what the kernel still holds, then write it all.
fn finish(opts: &TraceOptions, mut t: Trace, probes: &Probes) -> anyhow::Result<()> {
    let end = monotonic_ns();
    t.session.tick(&probes.maps, &mut t.beat.ctx, t.beat.log.as_mut(), end);
    t.session.finish_stacks();
    // The programs' own lines still in their ring (the reader's task may not run again).
    if let Some(k) = &probes.klog {
        k.drain();
    }
    let ended = t.session.model.finish(end);
    t.session.stalls_ended(&ended);
    let (cpu, rss) = agent::agent_usage();
    let maps = crate::kernel::mapmem::held_maps();
    let overhead = Overhead {
        bpf_stats_enabled: agent::bpf_stats_enabled(),
        programs: loader::program_stats(&probes.ebpf, &probes.programs),
        agent_startup_cpu_s: t.startup_cpu_s,
        agent_cpu_s: cpu,
        agent_peak_rss_kb: rss,
        bpf_map_bytes: Some(maps.iter().map(|m| m.bytes).sum()),
        bpf_map_bytes_at_full_use: Some(maps.iter().map(|m| m.at_full_use_bytes).sum()),
        bpf_maps: maps,
    };
    t.session.observe(Sample::Overhead { t_ns: end, overhead });
    let summary = crate::pipeline::conclude::summary(&t.session.model, end, true);
    // Each output is written whatever became of the others; what failed is said at the end.
    let mut failures = Vec::new();
    if let Some(r) = t.session.recorder.as_mut() {
        match serde_json::to_value(&summary) {
            Ok(v) => r.write(Line::Summary(&v)),
            Err(e) => failures.push(format!("the final summary does not serialize: {e}")),
        }
        r.sync();
        failures.extend(r.failure());
    }
    let mut json_on_stdout = false;
    if let Some(path) = &opts.summary_json {
        json_on_stdout = crate::recording::files::is_stdout(path);
        if let Err(e) = crate::output::summary::write_json(&summary, path) {
            failures.push(format!("{e:#}"));
        }
    }
    let report = crate::output::text::render(&summary);
    // Where the rest is, for the job's output (a summary on stdout is in gpustall's log).
    let bundle = [&opts.summary_json, &opts.record, &opts.html, &opts.perfetto];
    let bundle = bundle.into_iter().flatten().map(PathBuf::as_path);
    let bundle: Vec<&Path> = bundle.filter(|p| !crate::recording::files::is_stdout(p)).collect();
    t.job.write_verdict(&report, &bundle);
    if let Err(e) =
        crate::output::text::print_beside(&report, summary.verdict.cause.severity(), json_on_stdout)
    {
        failures.push(format!("{e:#}"));
    }
    if let Some(record) = &t.record_path {
        drop(t.session.recorder.take());
        failures.extend(write_drawn(opts, &summary, record));
        if let Some(s) = &t.scratch {
            let _ = std::fs::remove_file(s);
        }
    }
    // Everything else is written: now say what could not be, and fail.
    if !failures.is_empty() {
        anyhow::bail!(failures.join("; "));
    }
    if summary.lost_events > 0 {
        return Err(crate::cmd::LostEvents(summary.lost_events).into());
    }
    Ok(())
}

/// The outputs drawn from the recording (`--perfetto`, `--html`); what could not be written.
fn write_drawn(
    opts: &TraceOptions,
    summary: &crate::output::summary::Summary,
    record: &Path,
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(out) = &opts.perfetto {
        if let Err(e) = crate::output::perfetto::write_recording_file(record, usize::MAX, out) {
            failures.push(format!("{e:#}"));
        }
    }
    if let Some(out) = &opts.html {
        let page = crate::output::timeline::from_file(record, usize::MAX)
            .map(|t| crate::output::html::render(summary, &t))
            .and_then(|page| crate::recording::files::write_private(out, page.as_bytes()));
        match page {
            Ok(()) => say!("gpustall: wrote {}", out.display()),
            Err(e) => failures.push(format!("--html {}: {e:#}", out.display())),
        }
    }
    failures
}
