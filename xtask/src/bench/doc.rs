//! docs/BENCHMARKS.md, written by the bench: a header (date, machine, kernel), then one section
//! per case, each between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`. A run replaces only
//! the sections of the cases it ran, so `--only X` leaves the others as they were. The
//! formatting functions take the figures the cases return (as in target/bench/overhead.json)
//! and return Markdown; they read nothing else.

use serde::Deserialize as _;
use serde_json::Value;

use super::{
    ctx::CtxReport,
    cuda::CudaReport,
    fork::ForkReport,
    incident::IncidentReport,
    peer::{FloorReport, OutsideReport, PeerProgram, PeerReport},
    stacks::StacksReport,
    swap::SwapReport,
    watch::{DaemonCost, WatchReport},
};

/// The sections in the order of the document.
pub const SECTIONS: [&str; 10] = [
    "header",
    "swap-heavy",
    "watch",
    "fork-burst",
    "incident",
    "peer",
    "outside",
    "ctxswitch",
    "py-stacks",
    "cuda-uprobes",
];

/// The machine a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// UTC, YYYY-MM-DD.
    pub date: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub mem_kib: u64,
    /// `uname -r`.
    pub kernel: String,
}

impl Machine {
    /// This machine, now.
    pub fn read() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let (cpus, cpu_model) = parse_cpuinfo(&read("/proc/cpuinfo"));
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            date: date_of(secs),
            cpus: std::thread::available_parallelism().map_or(cpus, |n| n.get().max(cpus)),
            cpu_model,
            mem_kib: parse_meminfo(&read("/proc/meminfo")),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        }
    }

    /// "2 x Intel Xeon ..., 7.8 GiB, kernel 6.18.0".
    pub fn describe(&self) -> String {
        format!(
            "{} x {}, {:.1} GiB memory, kernel {}",
            self.cpus,
            self.cpu_model,
            self.mem_kib as f64 / 1048576.0,
            self.kernel
        )
    }
}

/// The number of processors and the first model name in /proc/cpuinfo.
pub fn parse_cpuinfo(text: &str) -> (usize, String) {
    let cpus = text.lines().filter(|l| l.starts_with("processor")).count();
    let model = text
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown CPU".into());
    (cpus, model)
}

/// MemTotal in KiB from /proc/meminfo.
pub fn parse_meminfo(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The UTC date (YYYY-MM-DD) of seconds since the epoch.
pub fn date_of(secs: u64) -> String {
    // Days to a civil date (proleptic Gregorian), after Howard Hinnant's days_from_civil.
    let z = (secs / 86400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A number with `decimals` decimals and thousands separated by commas.
pub fn num(x: f64, decimals: usize) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let s = format!("{:.*}", decimals, x.abs());
    let (int, frac) = s.split_once('.').map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if x < 0.0 && s.chars().any(|c| c.is_ascii_digit() && c != '0') { "-" } else { "" };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// A ratio as `x0.93`; "-" when it cannot be computed.
pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 || !a.is_finite() || !b.is_finite() {
        "-".into()
    } else {
        format!("x{:.2}", a / b)
    }
}

/// `v` with `decimals`, or "-" when absent.
fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |x| num(x, decimals))
}

/// `text` as lines of at most `width` characters (longer words stay whole), words kept in order.
pub fn wrap(text: &str, width: usize) -> String {
    // A code span (`cargo xtask bench --only peer`) stays on one line.
    let mut units: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match units.last_mut() {
            Some(u) if u.matches('`').count() % 2 == 1 => {
                u.push(' ');
                u.push_str(word);
            }
            _ => units.push(word.to_string()),
        }
    }
    let mut out = String::new();
    let mut line = String::new();
    for word in &units {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// Prose lines' width in the document.
const WIDTH: usize = 100;

/// A Markdown table: the first column left-aligned, the others right-aligned.
pub fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n|", head.join(" | "));
    for i in 0..head.len() {
        out.push_str(if i == 0 { "---|" } else { "---:|" });
    }
    out.push('\n');
    for r in rows {
        out.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    out
}

/// The header: where and when the latest run measured, and which cases it ran.
pub fn header(m: &Machine, cases: &[&str]) -> String {
    let cases: Vec<String> = cases.iter().map(|c| format!("`{c}`")).collect();
    wrap(
        &format!("Latest run: {}, cases {}, on {}.", m.date, cases.join(", "), m.describe()),
        WIDTH,
    )
}

/// One section's text (heading, what it measures, when and where, the tables), or None for a
/// name that has no section.
pub fn section(name: &str, v: &Value, m: &Machine) -> Option<String> {
    let (title, prose, tables) = match name {
        "swap-heavy" => ("Swap-heavy workload, untraced and traced", SWAP_PROSE, swap_heavy(v)),
        "watch" => ("`gpustall watch`: the daemon's cost", WATCH_PROSE, watch(v)),
        "fork-burst" => ("`gpustall watch` through a fork burst", FORK_PROSE, fork_burst(v)),
        "incident" => (
            "`gpustall watch` at a big incident, in its shipped limit",
            INCIDENT_PROSE,
            incident(v),
        ),
        "peer" => ("Against a bpftrace peer, and the floor", PEER_PROSE, peer(v)),
        "outside" => ("Cost to processes outside the traced job", OUTSIDE_PROSE, outside(v)),
        "ctxswitch" => ("Context-switch-heavy job", CTX_PROSE, ctxswitch(v)),
        "py-stacks" => ("Python stacks: what sampling them costs", STACKS_PROSE, py_stacks(v)),
        "cuda-uprobes" => {
            ("Waits for the GPU: what the CUDA uprobes add to a call", CUDA_PROSE, cuda_uprobes(v))
        }
        _ => return None,
    };
    let when =
        format!("Measured {} on {} (`cargo xtask bench --only {name}`).", m.date, m.describe());
    Some(format!("## {title}\n\n{}\n{}\n{tables}", wrap(prose, WIDTH), wrap(&when, WIDTH)))
}

const SWAP_PROSE: &str = "Three workers allocate 300 MiB each in a 128 MiB memory cgroup with \
swap, untraced and traced, alternating, five rounds each (medians). The kernel counts \
write_folio and block_bio_queue hits in place; ring records are what reaches the agent, so their \
ratio is the aggregation done in the kernel. Each program's runs and ns per run are the kernel's \
BPF stats (`kernel.bpf_stats_enabled`) in the median traced run; the agent's CPU leaves out its \
start-up (loading and verifying the programs).";

const WATCH_PROSE: &str = "The `gpustall watch` daemon's CPU and memory while it watches an \
idle job for 20 s, then while it watches the swap-heavy workload.";

const FORK_PROSE: &str = "A job forks 18,000 short children (each one 4 KiB O_DIRECT write), \
then idles while they age out of the daemon's 30 s window. Sampled every second: the daemon's \
RSS against its memory budget, its CPU, and how long `/metrics` takes to answer (it must answer \
throughout, pruning included); the job's block writes as `/metrics` counted them.";

const INCIDENT_PROSE: &str = "The daemon runs in a 256 MiB memory cgroup (the DaemonSet's limit \
and the systemd unit's MemoryMax=) with a 64 MiB `--memory-budget`; a watched job of 8,000 \
processes is SIGKILLed at once. The daemon's peak RSS is the kernel's VmHWM; the bundle must be \
whole (recording, summary, report, a Perfetto trace that parses) and the daemon alive.";

/// The big-incident case's table.
pub fn incident(v: &Value) -> String {
    let r = match IncidentReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let mib = |kb: u64| num(kb as f64 / 1024.0, 1);
    let yes = if r.bundle_complete_daemon_alive { "yes" } else { "no" };
    table(
        &["figure", "value"],
        &[
            vec!["processes killed at once".into(), num(r.processes as f64, 0)],
            vec!["memory limit, MiB".into(), num(r.limit_mib as f64, 0)],
            vec!["memory budget, MiB".into(), num(r.memory_budget_mib as f64, 0)],
            vec!["peak RSS before the incident, MiB".into(), mib(r.peak_rss_before_kb)],
            vec!["peak RSS, MiB".into(), mib(r.peak_rss_kb)],
            vec!["bundle written in, s".into(), num(r.bundle_s, 1)],
            vec!["OOM kills of the daemon".into(), num(r.oom_kills_of_the_daemon as f64, 0)],
            vec!["bundle whole, daemon alive".into(), yes.into()],
        ],
    )
}

const PEER_PROSE: &str = "gpustall against `xtask/bench/peer.bt`, the bpftrace script a user \
would write for the same questions (per-pid block bytes, reclaim stall time, anonymous \
write_folio, OOM victims), on one workload: 40,000 4 KiB O_DIRECT reads, then three 200 MiB \
workers in a 200 MiB memory cgroup with swap. Wall times: one run untraced, under each tracer \
alone, and under both. Per program: both tracers attached at once, runs and run time summed \
over the rounds, from the kernel's BPF stats (a typed program is shown on its tracepoint). In \
those runs a program that does nothing is attached to each event too, classic (bpftrace, \
`xtask/bench/floor.bt`, the peer's kind) and raw (`r0 = 0; exit`, loaded by xtask; gpustall's \
typed programs run from the same place): its ns per run is what the kernel charges any program \
on that event before it does any work. gpustall runs more programs than the peer because it \
answers more (bytes per bio, each request's latency, off-CPU time); \"at the floor\" is what its \
runs would cost if every program did nothing.";

const OUTSIDE_PROSE: &str = "gpustall traces an idle job while processes it does not trace \
run a fork-heavy loop, O_DIRECT reads and a pipe ping-pong: what each program costs every other \
process on the host (runs and ns per run, kernel BPF stats).";

const CTX_PROSE: &str = "A process and a child named like a DataLoader worker pass a byte back \
and forth over two pipes (two wakeups and four switches per round trip): untraced, while \
gpustall traces an unrelated idle job (every switch runs the sched programs, which find nothing \
to count), and as the traced job (trainer and worker accounted). Medians of the rounds; \
sched_switch runs per second are machine-wide. \"Accounted\" is the time the worker kept the \
trainer waiting per ns of ping-pong (near 1: the trainer does nothing between its reads, so its \
run is one logical wait).";

/// The swap-heavy case's section, from its figures ([`SwapReport`]).
pub fn swap_heavy(v: &Value) -> String {
    match SwapReport::deserialize(v) {
        Ok(r) => swap_heavy_tables(&r),
        Err(e) => unreadable(&e),
    }
}

/// A section whose figures could not be read as its case writes them: said, never drawn as
/// zeros.
fn unreadable(e: &serde_json::Error) -> String {
    format!("The case's figures could not be read ({e}): run it again.\n")
}

fn swap_heavy_tables(r: &SwapReport) -> String {
    let wall = table(
        &["", "untraced", "traced", "traced / untraced"],
        &[vec![
            format!("workload wall time, s (median of {})", r.rounds),
            num(r.untraced_median_s, 2),
            num(r.traced_median_s, 2),
            format!("x{:.3}", r.slowdown_ratio),
        ]],
    );
    let figures = table(
        &["figure", "value"],
        &[
            vec![
                "write_folio hits per second, counted in the kernel".into(),
                num(r.write_folio_hits_per_s, 0),
            ],
            vec![
                "block_bio_queue hits per second, counted in the kernel".into(),
                num(r.block_bio_queue_hits_per_s, 0),
            ],
            vec!["ring records per second reaching the agent".into(), num(r.ring_records_per_s, 0)],
            vec![
                "ring records / write_folio hits".into(),
                ratio(r.ring_records_per_s, r.write_folio_hits_per_s),
            ],
            vec![
                "agent CPU while tracing, % of one core".into(),
                num(r.agent_cpu_pct_of_one_core, 2),
            ],
            vec!["agent peak RSS, MiB".into(), num(r.agent_peak_rss_kb as f64 / 1024.0, 1)],
            vec!["lost events".into(), num(r.lost_events as f64, 0)],
        ],
    );
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .filter(|p| p.run_count > 0)
        .map(|p| vec![p.name.clone(), num(p.run_count as f64, 0), opt(p.ns_per_run(), 0)])
        .collect();
    let programs = table(&["program", "runs", "ns per run"], &rows);
    format!("{wall}\n{figures}\nEach program in the median traced run:\n\n{programs}")
}

pub fn watch(v: &Value) -> String {
    let r = match WatchReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let mib = |kb: u64| kb as f64 / 1024.0;
    let row = |label: &str, c: &DaemonCost| {
        vec![
            label.to_string(),
            num(c.cpu_pct_of_one_core, 2),
            num(mib(c.rss_kb), 1),
            opt(c.peak_rss_kb.map(mib), 1),
            num(c.seconds, 0),
        ]
    };
    table(
        &["job watched", "CPU, % of one core", "RSS, MiB", "peak RSS, MiB", "over, s"],
        &[row("idle", &r.idle), row("swap-heavy workload", &r.busy_swap_heavy)],
    )
}

pub fn fork_burst(v: &Value) -> String {
    let r = match ForkReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let Ok(children) = r.children.parse::<f64>() else {
        return format!("The case's children ({:?}) are not a count: run it again.\n", r.children);
    };
    let expected = children * 4096.0;
    let written = r.block_write_bytes_by_metrics as f64;
    let mib = |kb: u64| num(kb as f64 / 1024.0, 1);
    table(
        &["figure", "value"],
        &[
            vec!["children".into(), num(children, 0)],
            vec!["burst, s".into(), opt(r.burst_s, 1)],
            vec!["peak RSS, MiB".into(), mib(r.peak_rss_kb)],
            vec!["memory budget, MiB".into(), num(r.memory_budget_mib as f64, 0)],
            vec!["RSS at the end, MiB".into(), mib(r.end_rss_kb)],
            vec!["CPU, % of one core".into(), num(r.cpu_pct_of_one_core, 2)],
            vec!["`/metrics` slowest answer, ms".into(), num(r.metrics_slowest_ms, 1)],
            vec!["`/metrics` unanswered seconds".into(), num(r.metrics_unanswered as f64, 0)],
            vec![
                "block writes counted / written".into(),
                format!(
                    "{} / {} ({})",
                    num(written, 0),
                    num(expected, 0),
                    ratio(written, expected)
                ),
            ],
        ],
    )
}

pub fn peer(v: &Value) -> String {
    let r = match PeerReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let runs = |p: &Option<PeerProgram>| opt(p.as_ref().map(|p| p.runs as f64), 0);
    let ns = |p: &Option<PeerProgram>| p.as_ref().map(|p| p.ns_per_run);
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|row| {
            let (gns, pns) = (ns(&row.gpustall), ns(&row.peer));
            let both = gns.zip(pns).map_or("-".into(), |(a, b)| ratio(a, b));
            vec![
                row.tracepoint.clone(),
                runs(&row.gpustall),
                opt(gns, 0),
                runs(&row.peer),
                opt(pns, 0),
                both,
            ]
        })
        .collect();
    let programs = table(
        &[
            "tracepoint",
            "gpustall runs",
            "ns per run",
            "peer runs",
            "ns per run",
            "gpustall / peer, per run",
        ],
        &rows,
    );
    let pair = |label: &str, x: f64, y: f64, d: usize| {
        vec![label.to_string(), num(x, d), num(y, d), ratio(x, y)]
    };
    let totals = table(
        &["both attached, summed", "gpustall", "peer", "gpustall / peer"],
        &[
            pair("program runs", r.gpustall_runs as f64, r.peer_runs as f64, 0),
            pair("in the kernel, ms", r.gpustall_kernel_ms, r.peer_kernel_ms, 1),
            pair("agent CPU while tracing, ms", r.gpustall_agent_cpu_ms, r.peer_agent_cpu_ms, 1),
            pair("**total, ms**", r.gpustall_total_ms, r.peer_total_ms, 1),
        ],
    );
    let wall =
        |label: &str, s: f64| vec![label.to_string(), num(s, 2), ratio(s, r.wall_untraced_s)];
    let walls = table(
        &["workload under", "wall, s", "to untraced"],
        &[
            wall("nothing", r.wall_untraced_s),
            wall("gpustall", r.wall_gpustall_s),
            wall("the peer", r.wall_peer_s),
            wall(&format!("both (mean of {})", r.both_rounds), r.wall_both_s),
        ],
    );
    let (floor, at_floor) = peer_floor(&r.floor);
    format!("{programs}\n{totals}\n{walls}\nThe floor, in the same runs:\n\n{floor}\n{at_floor}")
}

fn peer_floor(fl: &FloorReport) -> (String, String) {
    let frows: Vec<Vec<String>> = fl
        .programs
        .iter()
        .map(|r| {
            vec![
                r.tracepoint.clone(),
                opt(r.classic_floor_ns_per_run, 0),
                opt(r.typed_floor_ns_per_run, 0),
                num(r.gpustall_ns_per_run, 0),
                opt(r.peer_ns_per_run, 0),
            ]
        })
        .collect();
    let floor = table(
        &[
            "tracepoint",
            "classic floor, ns",
            "typed floor, ns",
            "gpustall ns per run",
            "peer ns per run",
        ],
        &frows,
    );
    let at_floor = table(
        &["at the floor of their kind", "value"],
        &[
            vec![
                "gpustall's runs on these events, ms".into(),
                format!(
                    "{} ({} runs; {} runs elsewhere not counted)",
                    num(fl.gpustall_runs_at_floor_ms, 1),
                    num(fl.gpustall_runs_counted as f64, 0),
                    num(fl.gpustall_runs_elsewhere as f64, 0)
                ),
            ],
            vec!["the peer's runs, ms".into(), num(fl.peer_runs_at_floor_ms, 1)],
            vec![
                "gpustall's runs at the floor / the peer's whole cost".into(),
                format!("x{:.2}", fl.floor_to_peer_total),
            ],
        ],
    );
    (floor, at_floor)
}

pub fn outside(v: &Value) -> String {
    let r = match OutsideReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let loads = [
        (&r.fork_heavy, "fork-heavy"),
        (&r.io_heavy, "I/O-heavy"),
        (&r.context_switch_heavy, "context-switch-heavy"),
    ];
    let mut names: Vec<&str> =
        loads.iter().flat_map(|(c, _)| c.programs.iter().map(|p| p.program.as_str())).collect();
    names.sort();
    names.dedup();
    let rows: Vec<Vec<String>> = names
        .iter()
        .map(|n| {
            let mut row = vec![n.to_string()];
            for (c, _) in loads {
                let p = c.programs.iter().find(|p| p.program == *n);
                row.push(opt(p.map(|p| p.runs as f64), 0));
                row.push(opt(p.map(|p| p.ns_per_run), 0));
            }
            row
        })
        .collect();
    let mut head = vec!["program".to_string()];
    for (_, label) in loads {
        head.push(format!("{label} runs"));
        head.push("ns per run".into());
    }
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let what: String = loads.iter().map(|(c, label)| format!("- {label}: {}\n", c.load)).collect();
    format!("{what}\n{}", table(&head, &rows))
}

pub fn ctxswitch(v: &Value) -> String {
    let r = match CtxReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let cases = [
        ("untraced", &r.untraced),
        ("outside the traced job", &r.outside_traced_job),
        ("inside the traced job", &r.inside_traced_job),
    ];
    let rows: Vec<Vec<String>> = cases
        .iter()
        .map(|(label, c)| {
            vec![
                label.to_string(),
                num(c.median_round_trips_per_s, 0),
                format!("x{:.2}", c.ratio_to_untraced),
                opt(c.sched_switch.as_ref().map(|p| p.median_runs_per_s), 0),
                opt(c.sched_switch.as_ref().map(|p| p.median_ns_per_run), 0),
                opt(c.sched_waking.as_ref().map(|p| p.median_ns_per_run), 0),
                opt(c.accounting.as_ref().map(|a| a.accounted_per_ns), 2),
            ]
        })
        .collect();
    let how = format!("{} rounds of {} s each.\n\n", r.rounds, num(r.run_ms as f64 / 1000.0, 0));
    let t = table(
        &[
            "case",
            "round trips per s",
            "to untraced",
            "sched_switch runs per s",
            "sched_switch ns per run",
            "sched_waking ns per run",
            "accounted",
        ],
        &rows,
    );
    format!("{how}{t}")
}

const STACKS_PROSE: &str = "A real torch DataLoader with 8 workers on this machine's CPUs \
(tests/py/stacks.py big: 300 batches of 80 MiB) traced with `--py-stacks off`, `auto` (the \
default) and 10 samples a second per process, alternating. The agent's CPU leaves out its \
start-up; the job's time is its whole run under the tracer. The samples are what the cost \
bought: the trainer's and the workers' (summed), and those that could not be read. `auto` keeps \
the samples themselves within 0.5 % of one CPU; opening each process once (reading its \
interpreter's symbols, nine processes here) and recording the stacks come on top.";

/// The Python stacks case's table.
pub fn py_stacks(v: &Value) -> String {
    let r = match StacksReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let rows: Vec<Vec<String>> = ["off", "auto", "10 Hz"]
        .iter()
        .filter_map(|k| r.cases.get(*k))
        .map(|c| {
            vec![
                format!("`--py-stacks {}`", c.py_stacks),
                num(c.median_agent_cpu_pct, 2),
                num(c.median_duration_s, 1),
                format!("x{:.2}", c.duration_to_off),
                num(c.median_trainer_samples, 0),
                num(c.median_worker_samples, 0),
                num(c.median_failed_samples, 0),
            ]
        })
        .collect();
    table(
        &[
            "stacks",
            "agent CPU, % of one CPU",
            "job, s",
            "to off",
            "trainer samples",
            "worker samples",
            "failed samples",
        ],
        &rows,
    )
}

const CUDA_PROSE: &str = "A Python loop calls the stand-in CUDA driver's `cuStreamSynchronize` \
(crate cuda-stub, returning at once) 200,000 times through ctypes, untraced and under `gpustall \
trace`, alternating: the difference per call is what the uprobe at its entry and the uretprobe \
at its return add (two traps into the kernel, two short programs). A real synchronisation waits \
for the GPU for microseconds to milliseconds, and a training step makes a few. The programs' \
own run time is the kernel's BPF stats'.";

/// The CUDA uprobes case's table.
pub fn cuda_uprobes(v: &Value) -> String {
    let r = match CudaReport::deserialize(v) {
        Ok(r) => r,
        Err(e) => return unreadable(&e),
    };
    let row = vec![
        num(r.calls as f64, 0),
        num(r.median_untraced_ns_per_call, 0),
        num(r.median_traced_ns_per_call, 0),
        num(r.median_added_ns_per_call, 0),
        opt(r.enter_program_avg_ns, 0),
        opt(r.exit_program_avg_ns, 0),
    ];
    table(
        &[
            "calls",
            "untraced, ns a call (median)",
            "traced, ns a call (median)",
            "added, ns a call (median)",
            "entry program, ns",
            "return program, ns",
        ],
        &[row],
    )
}

/// The text a document has for a section before any run measured it.
fn placeholder(name: &str) -> String {
    match name {
        "header" => "No run yet.\n".into(),
        _ => format!("Not measured yet: `cargo xtask bench --only {name}`.\n"),
    }
}

fn open(name: &str) -> String {
    format!("<!-- bench:{name} -->")
}

fn close(name: &str) -> String {
    format!("<!-- /bench:{name} -->")
}

/// The title and the fixed introduction, everything before the first section.
fn intro() -> String {
    format!("# Benchmarks\n\n{}", wrap(INTRO, WIDTH))
}

/// The document before any run: the fixed introduction and every section's markers.
pub fn skeleton() -> String {
    let mut doc = intro();
    for name in SECTIONS {
        doc.push_str(&format!("\n{}\n{}{}\n", open(name), placeholder(name), close(name)));
    }
    doc
}

const INTRO: &str = "Written by `cargo xtask bench` (every case) or `cargo \
xtask bench --only CASE` (one section; the others stay as they were); do not edit between the \
`bench:` markers. Each case runs its variants side by side, alternating, in one run on the same \
machine: on a shared machine only the ratios between them mean something. Every figure is also \
in `target/bench/overhead.json`. Per-program figures are the kernel's BPF stats \
(`kernel.bpf_stats_enabled=1` during the run): a program's runs and its run time, the stats' own \
clock reads included.";

/// `doc` with section `name`'s text replaced by `body`; a document without that section gets it
/// at the end.
pub fn replace_section(doc: &str, name: &str, body: &str) -> String {
    let (o, c) = (open(name), close(name));
    let body = if body.ends_with('\n') { body.to_string() } else { format!("{body}\n") };
    if let Some(start) = doc.find(&o) {
        if let Some(len) = doc[start..].find(&c) {
            let end = start + len;
            return format!("{}{o}\n{body}{}", &doc[..start], &doc[end..]);
        }
    }
    let sep = if doc.ends_with('\n') { "" } else { "\n" };
    format!("{doc}{sep}\n{o}\n{body}{c}\n")
}

/// The document after a run: `old` (or the skeleton when it has no section markers) with the
/// introduction, the header and the sections of `results` (section name, figures) replaced.
pub fn updated(old: &str, results: &[(&str, &Value)], m: &Machine) -> String {
    let mut doc = match old.find("<!-- bench:") {
        Some(first) => format!("{}\n{}", intro(), &old[first..]),
        None => skeleton(),
    };
    let names: Vec<&str> = results.iter().map(|r| r.0).collect();
    doc = replace_section(&doc, "header", &header(m, &names));
    for (name, v) in results {
        if let Some(text) = section(name, v, m) {
            doc = replace_section(&doc, name, &text);
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn machine() -> Machine {
        Machine {
            date: "2026-12-05".into(),
            cpus: 2,
            cpu_model: "Test CPU".into(),
            mem_kib: 8 * 1048576,
            kernel: "6.18.0".into(),
        }
    }

    #[test]
    fn numbers_dates_and_proc_files() {
        assert_eq!(num(1234567.891, 1), "1,234,567.9");
        assert_eq!(num(999.0, 0), "999");
        assert_eq!(num(-1500.0, 0), "-1,500");
        assert_eq!(num(f64::NAN, 0), "-");
        assert_eq!(ratio(1.0, 4.0), "x0.25");
        assert_eq!(ratio(1.0, 0.0), "-");
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(951_782_400), "2000-02-29");
        assert_eq!(date_of(1_798_675_200), "2026-12-31");
        let cpuinfo = "processor\t: 0\nmodel name\t: Test  CPU @ 2GHz\n\nprocessor\t: 1\nmodel name\t: Test  CPU @ 2GHz\n";
        assert_eq!(parse_cpuinfo(cpuinfo), (2, "Test CPU @ 2GHz".into()));
        assert_eq!(parse_meminfo("MemTotal:        8048576 kB\nMemFree: 1 kB\n"), 8_048_576);
        assert_eq!(machine().describe(), "2 x Test CPU, 8.0 GiB memory, kernel 6.18.0");
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap("aa bb cc", 5), "aa bb\ncc\n");
        assert_eq!(wrap("a verylongword b", 4), "a\nverylongword\nb\n");
        assert_eq!(wrap("", 10), "\n");
        assert_eq!(wrap("run `cargo xtask bench` now", 12), "run\n`cargo xtask bench`\nnow\n");
    }

    #[test]
    fn a_table() {
        let t = table(&["a", "b"], &[vec!["x".into(), "1".into()]]);
        assert_eq!(t, "| a | b |\n|---|---:|\n| x | 1 |\n");
    }

    #[test]
    fn ctxswitch_side_by_side() {
        use super::super::ctx::{Accounting, CtxCase, CtxReport, ProgFigures};
        let prog = |ns: f64, per_s: f64| {
            Some(ProgFigures {
                median_ns_per_run: ns,
                median_runs_per_s: per_s,
                ..Default::default()
            })
        };
        let case = |rate: f64, ratio: f64| CtxCase {
            median_round_trips_per_s: rate,
            ratio_to_untraced: ratio,
            ..Default::default()
        };
        let r = CtxReport {
            untraced: case(100000.0, 1.0),
            outside_traced_job: CtxCase {
                sched_switch: prog(144.4, 400000.0),
                sched_waking: prog(102.0, 0.0),
                ..case(93000.0, 0.93)
            },
            inside_traced_job: CtxCase {
                sched_switch: prog(311.0, 350000.0),
                sched_waking: prog(280.0, 0.0),
                accounting: Some(Accounting { accounted_per_ns: 0.987, ..Default::default() }),
                ..case(84000.0, 0.84)
            },
            rounds: 3,
            run_ms: 5000,
        };
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["inside_traced_job"]["accounted_per_ns"], 0.987, "flattened: {v}");
        let t = ctxswitch(&v);
        assert!(t.starts_with("3 rounds of 5 s each.\n\n| case |"), "{t}");
        assert!(t.contains("| untraced | 100,000 | x1.00 | - | - | - | - |"), "{t}");
        assert!(
            t.contains("| outside the traced job | 93,000 | x0.93 | 400,000 | 144 | 102 | - |"),
            "{t}"
        );
        assert!(
            t.contains("| inside the traced job | 84,000 | x0.84 | 350,000 | 311 | 280 | 0.99 |"),
            "{t}"
        );
    }

    #[test]
    fn py_stacks_settings_side_by_side() {
        use super::super::stacks::{StacksCase, StacksReport};
        let case = |rate: &str, cpu: f64, to_off: f64| StacksCase {
            py_stacks: rate.into(),
            agent_cpu_pct: vec![cpu],
            median_agent_cpu_pct: cpu,
            median_duration_s: 30.0 * to_off,
            duration_to_off: to_off,
            median_trainer_samples: 40.0,
            median_worker_samples: 300.0,
            median_failed_samples: 1.0,
        };
        let cases = [("off", case("off", 0.9, 1.0)), ("10 Hz", case("10", 4.2, 1.03))];
        let r = StacksReport {
            cases: cases.into_iter().map(|(k, c)| (k.to_string(), c)).collect(),
            rounds: 3,
            steps: "300".into(),
        };
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["rounds"], 3, "the settings beside how it ran: {v}");
        let t = py_stacks(&v);
        assert!(t.contains("| `--py-stacks off` | 0.90 | 30.0 | x1.00 | 40 | 300 | 1 |"), "{t}");
        assert!(t.contains("| `--py-stacks 10` | 4.20 | 30.9 | x1.03 |"), "{t}");
        assert!(!t.contains("auto"), "{t}");
        assert!(py_stacks(&json!({"off": {"py_stacks": "off"}})).contains("could not be read"));
    }

    #[test]
    fn cuda_uprobes_figures() {
        use super::super::cuda::CudaReport;
        let r = CudaReport {
            calls: 200_000,
            rounds: 3,
            median_untraced_ns_per_call: 410.0,
            median_traced_ns_per_call: 2_210.0,
            median_added_ns_per_call: 1_800.0,
            enter_program_avg_ns: Some(95.4),
            ..CudaReport::default()
        };
        let t = cuda_uprobes(&serde_json::to_value(&r).expect("json"));
        assert!(t.contains("| 200,000 | 410 | 2,210 | 1,800 | 95 | - |"), "{t}");
    }

    #[test]
    fn swap_heavy_figures() {
        let mut v = json!({
            "case": "swap-heavy", "untraced_s": [2.5], "traced_s": [2.6], "trace_duration_s": 3.0,
            "ring_records": 3900, "write_folio_hits": 174000, "agent_cpu_s_while_tracing": 0.05,
            "agent_startup_cpu_s": 0.3,
            "rounds": 5, "untraced_median_s": 2.5, "traced_median_s": 2.6, "slowdown_ratio": 1.04,
            "ring_records_per_s": 1300.0, "write_folio_hits_per_s": 58000.0,
            "block_bio_queue_hits_per_s": 58100.0, "agent_cpu_pct_of_one_core": 1.6,
            "agent_peak_rss_kb": 95232, "lost_events": 0,
            "programs": [
                {"name": "mm_vmscan_write_folio_btf", "run_count": 1000, "run_time_ns": 200000},
                {"name": "idle", "run_count": 0, "run_time_ns": 0},
            ],
        });
        let t = swap_heavy(&v);
        assert!(
            t.contains("| workload wall time, s (median of 5) | 2.50 | 2.60 | x1.040 |"),
            "{t}"
        );
        assert!(t.contains("| ring records / write_folio hits | x0.02 |"), "{t}");
        assert!(t.contains("| agent peak RSS, MiB | 93.0 |"), "{t}");
        assert!(t.contains("| mm_vmscan_write_folio_btf | 1,000 | 200 |"), "{t}");
        assert!(!t.contains("| idle |"), "{t}");
        // A figure missing is said, not drawn as a zero.
        v.as_object_mut().expect("an object").remove("lost_events");
        let t = swap_heavy(&v);
        assert!(t.contains("could not be read") && t.contains("lost_events"), "{t}");
    }

    #[test]
    fn peer_and_floor() {
        let v = json!({
            "programs": [
                {"tracepoint": "block_io_start",
                 "gpustall": {"runs": 1000, "run_time_ns": 400000, "ns_per_run": 400.0},
                 "peer": {"runs": 1000, "run_time_ns": 320000, "ns_per_run": 320.0}},
                {"tracepoint": "sched_switch",
                 "gpustall": {"runs": 5000, "run_time_ns": 800000, "ns_per_run": 160.0}, "peer": null},
            ],
            "gpustall_runs": 6000, "peer_runs": 1000, "gpustall_kernel_ms": 1.2, "peer_kernel_ms": 0.32,
            "gpustall_agent_cpu_ms": 10.0, "peer_agent_cpu_ms": 0.0,
            "gpustall_total_ms": 11.2, "peer_total_ms": 0.32, "ratio_gpustall_to_peer": 35.0,
            "wall_untraced_s": 10.0, "wall_gpustall_s": 10.5, "wall_peer_s": 10.2, "wall_both_s": 11.0,
            "both_rounds": 3,
            "floor": {"programs": [{"tracepoint": "block_io_start", "typed": true,
                "classic_floor_ns_per_run": 60.0,
                "typed_floor_ns_per_run": 65.0, "gpustall_ns_per_run": 400.0, "peer_ns_per_run": 320.0}],
                "gpustall_runs_at_floor_ms": 0.065, "peer_runs_at_floor_ms": 0.06,
                "gpustall_runs_counted": 1000, "gpustall_runs_elsewhere": 5000, "floor_to_peer_total": 0.2},
        });
        let t = peer(&v);
        assert!(t.contains("| block_io_start | 1,000 | 400 | 1,000 | 320 | x1.25 |"), "{t}");
        assert!(t.contains("| sched_switch | 5,000 | 160 | - | - | - |"), "{t}");
        assert!(t.contains("| **total, ms** | 11.2 | 0.3 | x35.00 |"), "{t}");
        assert!(t.contains("| gpustall | 10.50 | x1.05 |"), "{t}");
        assert!(t.contains("| both (mean of 3) | 11.00 | x1.10 |"), "{t}");
        assert!(t.contains("| block_io_start | 60 | 65 | 400 | 320 |"), "{t}");
        assert!(
            t.contains("| gpustall's runs at the floor / the peer's whole cost | x0.20 |"),
            "{t}"
        );
    }

    #[test]
    fn watch_fork_and_outside() {
        let w = json!({"idle": {"cpu_pct_of_one_core": 0.3, "rss_kb": 41984, "seconds": 20.0},
            "busy_swap_heavy": {"cpu_pct_of_one_core": 0.54, "rss_kb": 51200, "peak_rss_kb": 58368, "seconds": 9.0}});
        let t = watch(&w);
        assert!(t.contains("| idle | 0.30 | 41.0 | - | 20 |"), "{t}");
        assert!(t.contains("| swap-heavy workload | 0.54 | 50.0 | 57.0 | 9 |"), "{t}");
        let b = json!({"children": "18000", "burst_s": 30.2, "peak_rss_kb": 47000, "end_rss_kb": 30000,
            "memory_budget_mib": 64, "cpu_pct_of_one_core": 1.5, "metrics_slowest_ms": 12.0,
            "metrics_unanswered": 0, "block_write_bytes_by_metrics": 73728000,
            "rss_kb_each_second": [30000, 47000]});
        let i = json!({"processes": 8000, "limit_mib": 256, "memory_budget_mib": 64,
            "peak_rss_before_kb": 40960, "peak_rss_kb": 92160, "bundle_s": 6.5,
            "oom_kills_of_the_daemon": 0, "bundle_complete_daemon_alive": true});
        let t = incident(&i);
        assert!(t.contains("| peak RSS, MiB | 90.0 |"), "{t}");
        assert!(t.contains("| bundle whole, daemon alive | yes |"), "{t}");
        let t = fork_burst(&b);
        assert!(
            t.contains("| block writes counted / written | 73,728,000 / 73,728,000 (x1.00) |"),
            "{t}"
        );
        let o = json!({
            "fork_heavy": {"load": "3,000 /bin/true in 4.0 s",
                "programs": [{"program": "task_newtask", "runs": 3000, "ns_per_run": 301.0}]},
            "io_heavy": {"load": "reads", "programs": [{"program": "block_io_start", "runs": 20000, "ns_per_run": 90.0}]},
            "context_switch_heavy": {"load": "pings", "programs": []},
        });
        let t = outside(&o);
        assert!(t.starts_with("- fork-heavy: 3,000 /bin/true in 4.0 s\n"), "{t}");
        assert!(t.contains("| block_io_start | - | - | 20,000 | 90 | - | - |"), "{t}");
        assert!(t.contains("| task_newtask | 3,000 | 301 | - | - | - | - |"), "{t}");
    }

    #[test]
    fn a_partial_run_replaces_only_its_sections() {
        let m = machine();
        let first = updated("# old narrative\n", &[], &m);
        assert!(!first.contains("old narrative"));
        for name in SECTIONS {
            assert!(first.contains(&open(name)) && first.contains(&close(name)), "{name}");
        }
        // Someone's earlier figures in another section stay.
        let doc = replace_section(&first, "peer", "PEER FIGURES");
        let v = json!({"untraced": {"median_round_trips_per_s": 1.0, "ratio_to_untraced": 1.0}});
        let after = updated(&doc, &[("ctxswitch", &v)], &m);
        assert!(after.contains("<!-- bench:peer -->\nPEER FIGURES\n<!-- /bench:peer -->"));
        assert!(after.contains("## Context-switch-heavy job"));
        assert!(after.contains("Measured 2026-12-05 on 2 x Test CPU"));
        assert!(after.contains("Latest run: 2026-12-05, cases `ctxswitch`"));
        assert!(after.contains("Not measured yet: `cargo xtask bench --only watch`"));
        // Running it again replaces the section rather than adding one.
        let again = updated(&after, &[("ctxswitch", &v)], &m);
        assert_eq!(again, after);
        assert_eq!(again.matches("<!-- bench:ctxswitch -->").count(), 1);
        // A document missing a section gets it at the end.
        let added = replace_section("# x\n", "watch", "W");
        assert_eq!(added, "# x\n\n<!-- bench:watch -->\nW\n<!-- /bench:watch -->\n");
    }
}
