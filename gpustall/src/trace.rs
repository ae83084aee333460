//! `gpustall trace`: follow a process tree until a duration passes, Ctrl-C, or every traced
//! process has exited; then write what was collected, always.
//!
//! Everything the model learns goes through the recording first (events and samples), so
//! `gpustall report` can rebuild the same summary from the file.

use std::{
    io::IsTerminal,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::json;
use tokio::io::unix::AsyncFd;

use crate::{
    context::ContextReader,
    gpuwatch::GpuOptions,
    gpu::monotonic_ns,
        live, loader,
    model::Model,
    observe::Sample,
    preflight, procscan,
    record::Recorder,
    report,
    session::{LogSource, Session},
    summary::Summary,
    tracefs::Tracefs,
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
    /// Also write a Perfetto trace at the end.
    pub perfetto: Option<PathBuf>,
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
    let mut log_source = opts.log.as_deref().map(|p| LogSource::new(p, opts.log_regex.as_deref())).transpose()?;

    let start = monotonic_ns();
    let mut session = Session::new(Model { start_ns: start, last_ns: start, ..Default::default() });
    // A Perfetto trace is drawn from the recording: without --record, record to a scratch file.
    let scratch = (opts.perfetto.is_some() && opts.record.is_none())
        .then(|| std::env::temp_dir().join(format!("gpustall-{}-{}.jsonl", std::process::id(), start)));
    let record_path = opts.record.clone().or_else(|| scratch.clone());
    if let Some(path) = &record_path {
        session.recorder = Some(Box::new(Recorder::create(path)?));
    }

    let (mut gpu, gpu_header) = crate::gpuwatch::open(opts.gpu.as_ref(), &mut session.model.gpu);
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
            "gpu": gpu_header,
        }));
        r.flush();
    }

    // Seed after attaching, then look again: a fork between the first scan and the map insert
    // would otherwise be missed (its parent was not tracked yet when it forked).
    for _pass in 0..2 {
        let all = procscan::all_processes();
        for p in procscan::descendants_of(opts.pid, &all) {
            if session.model.tree.contains(p.pid) {
                continue;
            }
            probes.maps.track(p.pid).context("adding a process to the kernel's tracked map")?;
            session.observe(Sample::Seed { t_ns: start, pid: p.pid, ppid: p.ppid, comm: p.comm.clone(), is_target: p.pid == opts.pid });
            if let Some(c) = crate::hostctx::cmdline(p.pid) {
                session.observe(Sample::Cmdline { t_ns: start, pid: p.pid, cmdline: c.join(" ") });
            }
        }
    }
    if !session.model.tree.contains(opts.pid) {
        anyhow::bail!("no such process: {} (it exited before tracing started)", opts.pid);
    }
    let ctx = ContextReader::new(opts.pid);
    eprintln!(
        "gpustall: tracing pid {} and its descendants ({} processes now, {} tracepoints){}",
        opts.pid,
        session.model.tree.alive_pids().len(),
        probes.attached.len(),
        opts.duration.map_or(String::new(), |d| format!(" for {}", humantime::format_duration(d)))
    );
    let (startup_cpu, _) = crate::overhead::agent_usage();

    // SAFETY: each AsyncFd owns its ring, and with it the map's fd, until both are dropped
    // together: the fd cannot be closed while registered.
    let mut critical = unsafe { AsyncFd::register(probes.critical) }
        .map_err(|e| anyhow::anyhow!("watching the critical ring: {e}"))?;
    let mut bulk = unsafe { AsyncFd::register(probes.bulk) }
        .map_err(|e| anyhow::anyhow!("watching the bulk ring: {e}"))?;
    // The kernel side wakes us only for OOM kills and signals (see emit, emit_bulk): drain both
    // rings on a short timer.
    let mut bulk_tick = tokio::time::interval(Duration::from_millis(100));
    bulk_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let gpu_every = opts.gpu.as_ref().map_or(Duration::from_secs(3600), |g| g.interval.max(Duration::from_millis(50)));
    let mut gpu_tick = tokio::time::interval(gpu_every);
    gpu_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let tty = std::io::stderr().is_terminal();
    let mut prev = live::Totals::default();
    let mut prev_at = Instant::now();
    let mut last_summary = Instant::now();
    let mut last_sync = Instant::now();

    loop {
        tokio::select! {
            guard = critical.readable_mut() => {
                let mut guard = guard?;
                session.drain(guard.get_inner_mut());
                guard.clear_ready();
                session.sync_if_due(&mut last_sync);
            }
            guard = bulk.readable_mut() => {
                let mut guard = guard?;
                session.drain(guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = bulk_tick.tick() => {
                session.drain(critical.get_mut());
                session.drain(bulk.get_mut());
            }
            _ = gpu_tick.tick(), if gpu.is_some() => {
                if let Some(g) = gpu.as_mut() {
                    let gpus = g.sample();
                    let t_ns = gpus.first().map_or_else(monotonic_ns, |s| s.t_ns);
                    session.observe(Sample::Gpu { t_ns, gpus });
                }
            }
            _ = tick.tick() => {
                // Events first: an exit still in a ring must not look like a vanished process.
                session.drain(critical.get_mut());
                session.drain(bulk.get_mut());
                let now = monotonic_ns();
                session.tick(&probes.maps, &ctx, &mut log_source, now);
                let cur = live::totals(&session.model);
                let alive = session.model.tree.alive_pids().len();
                if !opts.quiet {
                    let lost = session.model.host.lost.iter().sum::<u64>() + session.undecodable;
                    let l = live::line(
                        (now - start) as f64 / 1e9, alive, session.model.tree.iter().count(),
                        prev, cur, prev_at.elapsed().as_secs_f64(), lost,
                    ) + &crate::gpuwatch::live_part(&session.model.gpu, now);
                    if tty { eprint!("\r{l}\x1b[K") } else { eprintln!("{l}") }
                }
                prev = cur;
                prev_at = Instant::now();
                if last_summary.elapsed() >= opts.summary_every {
                    let s = summary(&session.model, now, false);
                    if let Some(r) = session.recorder.as_mut() { crate::record::write_serialize(r.as_mut(), &s); }
                    last_summary = Instant::now();
                }
                if let Some(r) = session.recorder.as_mut() { r.flush(); }
                session.sync_if_due(&mut last_sync);
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
    let end = monotonic_ns();
    session.tick(&probes.maps, &ctx, &mut log_source, end);
    let ended = session.model.finish(end);
    session.stalls_ended(&ended);
    let (cpu, rss) = crate::overhead::agent_usage();
    let overhead = crate::overhead::Overhead {
        bpf_stats_enabled: crate::overhead::bpf_stats_enabled(),
        programs: loader::program_stats(&probes.ebpf, &probes.attached),
        agent_startup_cpu_s: startup_cpu,
        agent_cpu_s: cpu,
        agent_peak_rss_kb: rss,
    };
    session.observe(Sample::Overhead { t_ns: end, overhead });
    let summary = summary(&session.model, end, true);
    if let Some(r) = session.recorder.as_mut() {
        crate::record::write_serialize(r.as_mut(), &summary);
        r.sync();
    }
    if let Some(path) = &opts.summary_json {
        crate::summary::write_json(&summary, path)?;
    }
    print!("{}", report::render(&summary));
    if let (Some(out), Some(record)) = (&opts.perfetto, &record_path) {
        drop(session.recorder.take());
        let lines = crate::export::read_lines(record, usize::MAX);
        if let Some(s) = &scratch {
            let _ = std::fs::remove_file(s);
        }
        crate::export::write_perfetto(&lines?, out)?;
    }
    Ok(())
}

pub fn summary(m: &Model, now: u64, is_final: bool) -> Summary {
    Summary::from_model(m, now, is_final, crate::verdict::decide(&crate::facts::from_model(m, now)))
}
