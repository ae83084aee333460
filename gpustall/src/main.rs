//! gpustall: explains why a GPU training job stalls.
//!
//! It follows the job's process tree in the kernel (eBPF on tracepoints) and measures the chain
//! that usually starves a GPU: DataLoader workers grow host memory, the kernel reclaims and
//! swaps, swap I/O saturates the disk, the OOM killer kills a worker.

/// `eprintln!` that cannot panic: with stderr closed (`gpustall trace 2>&1 | head`) a trace
/// must go on and still write its files.
/// One line to stderr (the daemon's journal): a name in it with a newline or an escape
/// sequence is shown, never obeyed (`model::untrusted`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", $crate::model::untrusted::one_line(&line));
    }};
}

mod cmd;
mod diagnose;
mod kernel;
mod model;
mod output;
mod pipeline;
mod recording;
mod sources;

#[cfg(test)]
mod layering;

use clap::{CommandFactory as _, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gpustall",
    version,
    about = "Explain why a GPU training job stalls: memory pressure, reclaim, swap, disk and OOM kills, per process",
    long_about = "gpustall traces a training job's process tree in the kernel with eBPF and ties what it \
finds to each process: reclaim stalls, swap-out, block I/O (swap caused by memory pressure split \
out), OOM kills and who sent which fatal signal. It ends with a verdict: the most likely cause of \
the stall, the processes behind it and the measured evidence.\n\n\
It needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE) and a kernel with BTF and tracefs.",
    after_help = "EXAMPLES:\n    sudo gpustall trace --pid $(pgrep -f train.py | head -1)\n    \
sudo gpustall trace --pid 4242 --duration 10m --record incident.jsonl --summary-json summary.json\n\n\
See docs/FORMATS.md for the record and summary formats."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rebuild the summary and verdict of a recording (`trace --record FILE`), offline.
    #[command(
        long_about = "Replay a recording made with `gpustall trace --record FILE` and print the same \
report the live run printed (and, with --summary-json, the same summary). Needs no privileges. A \
truncated or corrupt file is read up to the bad line: the error names the line and the report covers \
what came before it.",
        after_help = "EXIT STATUS:\n    0 when the whole file was read; 1 when it stopped at a bad line (the \
report is still printed) or is not a recording."
    )]
    Report(cmd::report::ReportArgs),
    /// Run as a daemon: find jobs, keep a flight recorder, write incident bundles, serve metrics.
    #[command(
        long_about = "Watch a node. Jobs are found by themselves: processes NVML lists on a GPU and \
processes matching --match rules (for machines without a GPU, or jobs that have not touched it \
yet), each with all its descendants; jobs that start later are picked up, jobs that end are \
forgotten. The last --window of events and samples is kept in memory (at most --memory-budget \
bytes). When an incident happens (an OOM kill or a SIGKILL in a watched tree, a GPU stall, a \
reclaim storm) a bundle is written to --bundle-dir: the recording of the window around it \
(replayable with `gpustall report`), summary.json with the verdict, report.txt and a Perfetto \
trace.json. Prometheus metrics are served on --listen (/metrics); with --otlp-endpoint the \
metrics and each incident (a log record) also go to an OpenTelemetry collector.\n\n\
The daemon sets its own oom_score_adj to -1000 (with CAP_SYS_RESOURCE), keeps its memory bounded \
and keeps running when jobs die or the kernel lacks a tracepoint. See deploy/ for a systemd unit \
and a Kubernetes DaemonSet.",
        after_help = "DURATIONS:\n    Every D takes a bare number as seconds (30, 1.5), as timeout(1) and sleep(1) \
do, or a number with units: 500ms, 90s, 10m, 1h30m.\n\n\
SIZES:\n    Bytes, or with a unit: 64MiB, 512M (K, M, G, T and KiB, MiB.. are 1024-based; KB, MB, GB \
are 1000-based).\n\n\
EXAMPLES:\n    sudo gpustall watch --match 'comm:^python' --bundle-dir /var/lib/gpustall/incidents\n    \
sudo gpustall watch --match 'cgroup:kubepods' --listen 0.0.0.0:9464\n    \
sudo gpustall watch --match 'comm:^python' --otlp-endpoint http://otel-collector:4318"
    )]
    Watch(cmd::watch::WatchArgs),
    /// Convert a recording for a trace viewer.
    #[command(
        long_about = "Convert a recording made with `gpustall trace --record FILE` into the Chrome \
trace-event JSON format, which ui.perfetto.dev and chrome://tracing open: a track per process \
(reclaim stalls as slices; fork, exit, OOM kill and signals as instants) and counter tracks (RSS \
and swap per process, GPU utilisation and temperature, job disk and swap-out rates, host swap, \
data_time)."
    )]
    Export(cmd::export::ExportArgs),
    /// Merge recordings or incident bundles of several nodes onto one timeline, with the job's verdict.
    #[command(
        long_about = "Put the recordings of several nodes or ranks (`trace --record` files, or the \
incident bundle directories `watch` writes) on one timeline, aligned on each recording's wall clock \
(its header's wall_clock_at_start_ns), and say which node stalled first, by how long it preceded \
the others, and that node's own verdict as the cause. Recordings of one host that disagree (its \
clock stepped between them, two kernels at once, one OOM kill at two times) and recordings too far \
apart to be one incident are warned about. Needs no privileges.",
        after_help = "CLOCK SKEW:\n    Nodes' clocks disagree by their NTP error (milliseconds on a LAN). A node \
that led the next one by less than --max-skew (default 1s) is not called first for sure.\n\n\
EXAMPLES:\n    gpustall merge node-a/incident-*/ node-b/incident-*/ --html job.html\n    \
gpustall merge rank0.jsonl rank1.jsonl --perfetto job.json --summary-json job.summary.json\n\n\
EXIT STATUS:\n    0 when every file was read whole; 1 when one stopped at a bad line (the merge covers \
what came before it) or is not a recording."
    )]
    Merge(cmd::merge::MergeArgs),
    /// Trace a process and all its descendants, then report.
    #[command(
        override_usage = "gpustall trace [OPTIONS] --pid <PID>\n       gpustall trace [OPTIONS] -- <CMD> [ARGS]...\n       gpustall trace [OPTIONS] --slurm-job <ID>",
        long_about = "Trace PID and every process it forks (and those processes' children) until \
DURATION passes, Ctrl-C or SIGTERM arrives, or every traced process has exited. A status line is \
printed each second; at the end a report (verdict, evidence, a table per process) is printed and \
the summary written. Whatever ends the trace, everything collected is written.\n\n\
With `-- CMD [ARGS...]` instead of --pid, gpustall starts CMD itself and traces it from its first \
instruction, as perf record and strace do: under sudo it runs as the invoking user (SUDO_UID, \
SUDO_GID and that user's groups) with gpustall's environment; Ctrl-C, SIGTERM and SIGHUP reach \
it once (passed on only when it did not get them itself, as it does when they are sent to the \
whole process group), and the trace ends when it has exited.",
        after_help = "DURATIONS:\n    Every D takes a bare number as seconds (30, 1.5), as timeout(1) and sleep(1) \
do, or a number with units: 500ms, 90s, 10m, 1h30m.\n\n\
EXIT STATUS:\n    With -- CMD, the job's status (its exit code, or 128 + the signal that killed it); \
when an output could not be written at the end, the job's status if it failed, else 1. \
Otherwise 0 when the trace ran; 3 when it ran but lost events (everything is written; the \
report marks the figures that are lower bounds); 1 with a one-line error otherwise (no such \
process, not root, BPF unavailable, a required tracepoint missing, a recording that could not be \
written)."
    )]
    Trace(cmd::trace::TraceArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(
        after_help = "EXAMPLES:\n    gpustall completions bash > /etc/bash_completion.d/gpustall\n    \
gpustall completions zsh > \"${fpath[1]}/_gpustall\""
    )]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print gpustall's man page (roff) to stdout: `gpustall man > /usr/share/man/man1/gpustall.1`.
    Man,
}

/// Warnings read like gpustall's other notes (`gpustall: warning: ...`); the module path is
/// shown only at the levels a developer asks for with RUST_LOG (info and below).
fn init_log() {
    use gpustall_common::names::LOG_TARGET;
    use std::io::Write as _;
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    env_logger::Builder::new()
        .parse_filters(&log_filters(&asked))
        .format(|f, r| {
            // A message naming a process or path is one line, whatever the name holds.
            let text = r.args().to_string();
            let text = model::untrusted::one_line(&text);
            match r.level() {
                log::Level::Error => writeln!(f, "gpustall: error: {text}"),
                log::Level::Warn if r.target() == LOG_TARGET => {
                    writeln!(f, "gpustall: warning [{LOG_TARGET}]: {text}")
                }
                log::Level::Warn => writeln!(f, "gpustall: warning: {text}"),
                level => writeln!(f, "gpustall: {level} [{}]: {text}", r.target()),
            }
        })
        .init();
}

/// The log filter for RUST_LOG `asked`: by default warnings, without the kernel side's own
/// lines (`kernel::klog`), which only RUST_LOG turns on. The HTTP client's own logs stay at
/// info unless asked for by name (`RUST_LOG=trace,ureq_proto=trace`): at debug and trace it
/// dumps each request's bytes, and with them the OTLP headers' tokens.
fn log_filters(asked: &str) -> String {
    let mut filters = if asked.trim().is_empty() {
        format!("warn,{}=off", gpustall_common::names::LOG_TARGET)
    } else {
        asked.to_string()
    };
    // The HTTP client logs headers (a token) at debug; py-spy warns of each stack it could
    // not read (a process exiting mid-read), which the report counts instead.
    for (quiet, level) in
        [("ureq", "info"), ("ureq_proto", "info"), ("py_spy", "error"), ("remoteprocess", "error")]
    {
        let named = filters.split(',').any(|d| d.trim().split('=').next() == Some(quiet));
        if !named {
            filters.push_str(&format!(",{quiet}={level}"));
        }
    }
    filters
}

fn main() {
    init_log();
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            rt.block_on(async {
                match cli.command {
                    Command::Report(args) => cmd::report::run(&args),
                    Command::Export(args) => cmd::export::run(&args),
                    Command::Merge(args) => cmd::merge::run(&args),
                    Command::Watch(args) => cmd::watch::run(args.into_options()?).await,
                    Command::Trace(args) => cmd::trace::run(args.into_options()).await,
                    Command::Completions { shell } => {
                        // Into memory first: the generator panics on a closed stdout (`| head`).
                        let mut out = Vec::new();
                        clap_complete::generate(shell, &mut Cli::command(), "gpustall", &mut out);
                        output::text::print(&String::from_utf8_lossy(&out))
                    }
                    Command::Man => {
                        let mut out = Vec::new();
                        clap_mangen::Man::new(Cli::command()).render(&mut out)?;
                        output::text::print(&String::from_utf8_lossy(&out))
                    }
                }
            })
        });
    if let Err(e) = result {
        if let Some(cmd::JobExit(code)) = e.downcast_ref::<cmd::JobExit>() {
            std::process::exit(*code);
        }
        if let Some(lost) = e.downcast_ref::<cmd::LostEvents>() {
            say!("gpustall: warning: {lost}");
            std::process::exit(3);
        }
        // One line: the error and its causes.
        let mut msg = e.to_string();
        for cause in e.chain().skip(1) {
            msg.push_str(&format!(": {cause}"));
        }
        say!("gpustall: error: {msg}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod log_tests {
    /// The HTTP client's wire dumps are off at any level unless named.
    #[test]
    fn wire_dumps_need_their_crate_named() {
        let quiet = "py_spy=error,remoteprocess=error";
        assert_eq!(
            super::log_filters(""),
            format!("warn,gpustall::ebpf=off,ureq=info,ureq_proto=info,{quiet}")
        );
        assert_eq!(super::log_filters("trace"), format!("trace,ureq=info,ureq_proto=info,{quiet}"));
        assert_eq!(
            super::log_filters("trace,ureq_proto=trace"),
            format!("trace,ureq_proto=trace,ureq=info,{quiet}")
        );
    }
}
