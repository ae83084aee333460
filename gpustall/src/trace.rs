//! `gpustall trace`: follow a process tree until a duration passes, Ctrl-C, or every traced
//! process has exited; then write what was collected, always.

use std::{
    io::IsTerminal,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use serde_json::json;
use tokio::io::unix::AsyncFd;

use crate::{
    decode::decode, gpu::monotonic_ns, gpuwatch::GpuWatch, live, loader, model::Model, preflight, procscan, record::{event_json, Recorder},
    report, summary::Summary, tracefs::Tracefs, verdict,
};

/// What `trace` was asked to do (from the CLI).
pub struct TraceOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
    pub record: Option<PathBuf>,
    pub summary_json: Option<PathBuf>,
    pub quiet: bool,
    pub summary_every: Duration,
    /// `None`: --no-gpu.
    pub gpu: Option<GpuOptions>,
    /// `--log FILE` and an optional `--log-regex` for data_time.
    pub log: Option<PathBuf>,
    pub log_regex: Option<String>,
}

pub struct GpuOptions {
    pub nvml_lib: Option<PathBuf>,
    pub interval: Duration,
    pub threshold_pct: u32,
    pub window: Duration,
}

struct Session {
    model: Model,
    recorder: Option<Recorder>,
}

impl Session {
    fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(e) => {
                    log::trace!("{} bytes: {e:?}", item.len());
                    if let Some(r) = self.recorder.as_mut() {
                        r.write(&event_json(&e));
                    }
                    self.model.apply(&e);
                    // Roles need command lines (torchrun, forkserver, spawn); read them while
                    // the process is young. Best effort: it may be gone already.
                    let pid = match &e {
                        crate::decode::Event::Fork { child_pid, .. } => Some(*child_pid),
                        crate::decode::Event::Exec { h, .. } => Some(h.tgid),
                        _ => None,
                    };
                    if let Some(c) = pid.and_then(crate::hostctx::cmdline) {
                        self.model.tree.set_cmdline(pid.unwrap_or(0), c.join(" "));
                    }
                }
                Err(err) => {
                    self.model.host.undecodable += 1;
                    log::debug!("undecodable record: {err}");
                }
            }
        }
    }

    /// /proc memory of live processes; processes that vanished without an exit event (lost)
    /// are marked gone so the trace can end.
    fn sample_proc(&mut self, now: u64) {
        for pid in self.model.tree.alive_pids() {
            match procscan::sample_mem(pid) {
                Some(m) => {
                    self.model.proc_mut(pid).record_mem(m, now);
                    if let Some(r) = self.recorder.as_mut() {
                        r.write(&json!({"type": "sample", "kind": "proc_mem", "t_ns": now, "pid": pid,
                            "rss_kb": m.rss_kb, "anon_kb": m.anon_kb, "file_kb": m.file_kb, "shmem_kb": m.shmem_kb,
                            "swap_kb": m.swap_kb, "hwm_kb": m.hwm_kb, "majflt": m.majflt}));
                    }
                }
                None if !procscan::exists(pid) => self.model.tree.mark_vanished(pid, now),
                None => {} // a zombie: its exit event is on its way
            }
        }
    }

    /// New training-log lines: per-step times onto the timeline (stamped when read: the log's
    /// own clock is not ours).
    fn read_log(&mut self, tail: &mut crate::trainlog::LogTail, patterns: &crate::trainlog::LogPatterns, now: u64) {
        for line in tail.poll() {
            if let Some(step) = patterns.parse(&line) {
                if let Some(r) = self.recorder.as_mut() {
                    r.write(&json!({"type": "event", "kind": "train_step", "t_ns": now,
                        "data_time_s": step.data_time_s, "iter_time_s": step.iter_time_s}));
                }
                self.model.steps.push((now, step));
            }
        }
    }

    fn summary(&self, now: u64, is_final: bool) -> Summary {
        Summary::from_model(&self.model, now, is_final, verdict::decide(&crate::facts::from_model(&self.model, now)))
    }
}

pub async fn run(opts: TraceOptions) -> anyhow::Result<()> {
    preflight::check_pid(opts.pid)?;
    preflight::check_privileges()?;
    preflight::protect_self_from_oom_killer();
    preflight::raise_memlock();

    let tracefs = Tracefs::open()?;
    let exit_code_offset = crate::btf::task_exit_code_offset();
    let mut probes = loader::load(&tracefs, exit_code_offset)?;
    for s in &probes.skipped {
        eprintln!("gpustall: warning: tracepoint {s} is not available on this kernel; its data is missing");
    }

    let start = monotonic_ns();
    let mut session = Session { model: Model { start_ns: start, ..Default::default() }, recorder: None };
    if let Some(path) = &opts.record {
        session.recorder = Some(Recorder::create(path)?);
    }

    // Seed after attaching, then look again: a fork between the first scan and the map insert
    // would otherwise be missed (its parent was not tracked yet when it forked).
    for pass in 0..2 {
        let all = procscan::all_processes();
        for p in procscan::descendants_of(opts.pid, &all) {
            if pass == 1 && session.model.tree.contains(p.pid) {
                continue;
            }
            probes.maps.track(p.pid).context("adding a process to the kernel's tracked map")?;
            session.model.tree.seed(p.pid, p.ppid, &p.comm, p.pid == opts.pid, start);
            if let Some(c) = crate::hostctx::cmdline(p.pid) {
                session.model.tree.set_cmdline(p.pid, c.join(" "));
            }
        }
    }
    if !session.model.tree.contains(opts.pid) {
        anyhow::bail!("no such process: {} (it exited before tracing started)", opts.pid);
    }
    session.model.ctx = crate::context::HostContext::begin(opts.pid, start);
    let mut log_tail = match &opts.log {
        Some(path) => Some((
            crate::trainlog::LogTail::open(path, false)?,
            crate::trainlog::LogPatterns::new(opts.log_regex.as_deref())
                .map_err(|e| anyhow::anyhow!("--log-regex is not a valid regular expression: {e}"))?,
        )),
        None => None,
    };
    let mut gpu = match &opts.gpu {
        Some(g) => {
            let detector = crate::gpu::StallDetector::new(g.threshold_pct, g.window.as_nanos() as u64);
            let w = GpuWatch::open(g.nvml_lib.as_deref(), detector, &mut session.model);
            eprintln!("gpustall: {}", session.model.gpu.status);
            w
        }
        None => {
            session.model.gpu.status = "GPU data is off (--no-gpu)".into();
            None
        }
    };
    let gpu_every = opts.gpu.as_ref().map_or(Duration::from_secs(3600), |g| g.interval.max(Duration::from_millis(50)));
    let mut gpu_tick = tokio::time::interval(gpu_every);
    gpu_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    if let Some(r) = session.recorder.as_mut() {
        r.write(&json!({
            "type": "header",
            "version": 1,
            "tool": concat!("gpustall ", env!("CARGO_PKG_VERSION")),
            "host": preflight::hostname(),
            "kernel": preflight::kernel_release(),
            "clock": "CLOCK_MONOTONIC",
            "start_ns": start,
            "wall_clock_at_start_ns": preflight::wall_ns(),
            "targets": [opts.pid],
            "attached": probes.attached,
            "skipped": probes.skipped,
            "gpu_status": session.model.gpu.status,
        }));
        r.flush();
    }
    {
        // Printed even with --quiet: it is the cue that tracing has begun.
        eprintln!(
            "gpustall: tracing pid {} and its descendants ({} processes now, {} tracepoints){}",
            opts.pid,
            session.model.tree.alive_pids().len(),
            probes.attached.len(),
            opts.duration.map_or(String::new(), |d| format!(" for {}", humantime::format_duration(d)))
        );
    }

    // SAFETY: each AsyncFd owns its ring, and with it the map's fd, until both are dropped
    // together: the fd cannot be closed while registered.
    let mut critical = unsafe { AsyncFd::register(probes.critical) }
        .map_err(|e| anyhow::anyhow!("watching the critical ring: {e}"))?;
    let mut bulk = unsafe { AsyncFd::register(probes.bulk) }
        .map_err(|e| anyhow::anyhow!("watching the bulk ring: {e}"))?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let tty = std::io::stderr().is_terminal();
    let mut prev = live::Totals::default();
    let mut prev_at = Instant::now();
    let mut last_summary = Instant::now();

    loop {
        tokio::select! {
            guard = critical.readable_mut() => {
                let mut guard = guard?;
                session.drain(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = bulk.readable_mut() => {
                let mut guard = guard?;
                session.drain(guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = gpu_tick.tick(), if gpu.is_some() => {
                if let Some(g) = gpu.as_mut() {
                    g.tick(&mut session.model, session.recorder.as_mut());
                }
            }
            _ = tick.tick() => {
                let now = monotonic_ns();
                probes.maps.read_into(&mut session.model);
                session.sample_proc(now);
                let alive_now = session.model.tree.alive_pids();
                session.model.ctx.sample(&alive_now, now);
                if let Some((tail, patterns)) = log_tail.as_mut() {
                    session.read_log(tail, patterns, now);
                }
                let cur = live::totals(&session.model);
                let alive = session.model.tree.alive_pids().len();
                if !opts.quiet {
                    let lost = session.summary(now, false).lost_events;
                    let l = live::line(
                        (now - start) as f64 / 1e9, alive, session.model.tree.iter().count(),
                        prev, cur, prev_at.elapsed().as_secs_f64(), lost,
                    ) + &crate::gpuwatch::live_part(&session.model.gpu, now);
                    if tty { eprint!("\r{l}\x1b[K") } else { eprintln!("{l}") }
                }
                prev = cur;
                prev_at = Instant::now();
                if last_summary.elapsed() >= opts.summary_every {
                    let s = session.summary(now, false);
                    if let Some(r) = session.recorder.as_mut() { r.write_serialize(&s); }
                    last_summary = Instant::now();
                }
                if let Some(r) = session.recorder.as_mut() { r.flush(); }
                if alive == 0 {
                    break;
                }
            }
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        }
    }
    if tty && !opts.quiet {
        eprintln!();
    }

    // Whatever ended the trace, take in what the kernel still holds, then write it all.
    session.drain(critical.get_mut());
    session.drain(bulk.get_mut());
    probes.maps.read_into(&mut session.model);
    let (cpu, rss) = crate::overhead::agent_usage();
    session.model.overhead = crate::overhead::Overhead {
        bpf_stats_enabled: crate::overhead::bpf_stats_enabled(),
        programs: loader::program_stats(&probes.ebpf, &probes.attached),
        agent_cpu_s: cpu,
        agent_peak_rss_kb: rss,
    };
    let end = monotonic_ns();
    session.sample_proc(end);
    let alive_end = session.model.tree.alive_pids();
    session.model.ctx.sample(&alive_end, end);
    if let Some((tail, patterns)) = log_tail.as_mut() {
        session.read_log(tail, patterns, end);
    }
    if let Some(g) = gpu.as_mut() {
        g.finish(&mut session.model, end, session.recorder.as_mut());
    }
    let summary = session.summary(end, true);
    if let Some(r) = session.recorder.as_mut() {
        r.write_serialize(&summary);
        r.flush();
    }
    if let Some(path) = &opts.summary_json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing the summary to {}", path.display()))?;
    }
    print!("{}", report::render(&summary));
    Ok(())
}
