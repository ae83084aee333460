//! gpustall: explains why a GPU training job stalls.
//!
//! It follows the job's process tree in the kernel (eBPF on tracepoints) and measures the chain
//! that usually starves a GPU: DataLoader workers grow host memory, the kernel reclaims and
//! swaps, swap I/O saturates the disk, the OOM killer kills a worker.

mod btf;
mod context;
mod decode;
mod facts;
mod gpu;
mod gpuwatch;
mod hostctx;
mod live;
mod loader;
mod model;
mod overhead;
mod preflight;
mod proctree;
mod procscan;
mod record;
mod report;
mod stats;
mod summary;
mod trace;
mod tracefs;
mod trainlog;
mod verdict;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

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
See README.md for the record and summary formats."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace a process and all its descendants, then report.
    #[command(
        long_about = "Trace PID and every process it forks (and those processes' children) until \
DURATION passes, Ctrl-C or SIGTERM arrives, or every traced process has exited. A status line is \
printed each second; at the end a report (verdict, evidence, a table per process) is printed and \
the summary written. Whatever ends the trace, everything collected is written.",
        after_help = "EXIT STATUS:\n    0 when the trace ran; 1 with a one-line error otherwise (no such \
process, not root, BPF unavailable, a required tracepoint missing)."
    )]
    Trace {
        /// The process to trace (the trainer); its existing descendants are traced too.
        #[arg(long, short = 'p', value_name = "PID")]
        pid: u32,
        /// Stop after this long (e.g. 90s, 10m, 1h30m); default: until the job exits or Ctrl-C.
        #[arg(long, short = 'd', value_name = "D", value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
        /// Write every event as JSON Lines to FILE (header, events, samples, summaries).
        #[arg(long, value_name = "FILE")]
        record: Option<PathBuf>,
        /// Write the final summary (per-process figures, OOM kills, verdict) as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        summary_json: Option<PathBuf>,
        /// No status line (the report is still printed).
        #[arg(long, short = 'q')]
        quiet: bool,
        /// How often a periodic summary goes into the recording.
        #[arg(long, value_name = "D", default_value = "10s", value_parser = humantime::parse_duration)]
        summary_every: Duration,
        /// The NVML library to load (default: $GPUSTALL_NVML_LIB, else the driver's libnvidia-ml.so.1).
        #[arg(long, value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
        /// How often the GPUs are sampled.
        #[arg(long, value_name = "D", default_value = "500ms", value_parser = humantime::parse_duration)]
        gpu_interval: Duration,
        /// A GPU at or under this utilisation (%) is idle.
        #[arg(long, value_name = "PCT", default_value_t = 5)]
        stall_threshold: u32,
        /// An idle GPU of the job is a stall once it has been idle this long.
        #[arg(long, value_name = "D", default_value = "3s", value_parser = humantime::parse_duration)]
        stall_window: Duration,
        /// Do not load NVML at all.
        #[arg(long)]
        no_gpu: bool,
        /// Tail this training log for per-step data_time (mmengine style `data_time: 0.7384`).
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
        /// A regular expression with one capture group, the seconds, for other log formats.
        #[arg(long, value_name = "REGEX", requires = "log")]
        log_regex: Option<String>,
    },
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            rt.block_on(async {
                match cli.command {
                    Command::Trace {
                        pid,
                        duration,
                        record,
                        summary_json,
                        quiet,
                        summary_every,
                        nvml_lib,
                        gpu_interval,
                        stall_threshold,
                        stall_window,
                        no_gpu,
                        log,
                        log_regex,
                    } => {
                        let gpu = (!no_gpu).then_some(trace::GpuOptions {
                            nvml_lib,
                            interval: gpu_interval,
                            threshold_pct: stall_threshold,
                            window: stall_window,
                        });
                        trace::run(trace::TraceOptions { pid, duration, record, summary_json, quiet, summary_every, gpu, log, log_regex })
                            .await
                    }
                }
            })
        });
    if let Err(e) = result {
        // One line: the error and its causes.
        let mut msg = e.to_string();
        for cause in e.chain().skip(1) {
            msg.push_str(&format!(": {cause}"));
        }
        eprintln!("gpustall: error: {msg}");
        std::process::exit(1);
    }
}
