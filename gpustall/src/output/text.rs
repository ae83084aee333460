//! The final report on the terminal: the answer first, then the evidence, then the table.

use std::fmt::Write as _;

use crate::diagnose::verdict::Severity;
use crate::model::proctree::Role;
use crate::output::summary::Summary;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Prints the report on stdout. A reader that went away (`gpustall report f | head`) is not an
/// error: the files the command writes matter more than the lines nobody reads.
pub fn print(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let text = crate::model::untrusted::lines(text);
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that stopped reading (`| head`) took what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow::anyhow!("cannot print the report: {e}")),
        Ok(()) => Ok(()),
    }
}

/// The report on stdout, or on stderr when stdout carries JSON (`--summary-json -`), its
/// heading coloured by `severity` where that is a terminal. An error when it could not be
/// written (a full disk behind `> file`): the caller fails with it.
pub fn print_beside(text: &str, severity: Severity, json_on_stdout: bool) -> anyhow::Result<()> {
    use std::io::{IsTerminal as _, Write as _};
    // Colour for a terminal only, unless NO_COLOR is set (no-color.org): files and pipes get
    // no escape codes.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    // Shown safely before the colour's own escape codes are added.
    let text = &*crate::model::untrusted::lines(text);
    if json_on_stdout {
        let text = coloured(text, severity, std::io::stderr().is_terminal() && !no_color);
        let _ = std::io::stderr().write_all(text.as_bytes());
        Ok(())
    } else {
        print(&coloured(text, severity, std::io::stdout().is_terminal() && !no_color))
    }
}

/// The report with its heading in red (a failure), yellow (a slowdown) or green (nothing
/// found) when `colour`.
pub fn coloured(text: &str, severity: Severity, colour: bool) -> String {
    let Some(at) = text.find(HEADING).filter(|_| colour) else {
        return text.to_string();
    };
    let end = text[at..].find('\n').map_or(text.len(), |e| at + e);
    let colour = match severity {
        Severity::Failure => anstyle::AnsiColor::Red,
        Severity::Slowdown => anstyle::AnsiColor::Yellow,
        Severity::Clear => anstyle::AnsiColor::Green,
    };
    let style = anstyle::Style::new().bold().fg_color(Some(colour.into()));
    format!("{}{style}{}{style:#}{}", &text[..at], &text[at..end], &text[end..])
}

/// How the verdict's heading starts.
pub const HEADING: &str = "== gpustall: ";

/// The report: verdict, evidence and advice; the table of processes; OOM kills and host lines.
pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    verdict(&mut o, s);
    process_table(&mut o, s);
    footer(&mut o, s);
    o
}

/// "On node-3 (kernel 6.18.0), 2026-12-04 21:30:02.123 UTC for 45.2 s: pid 1234 (python
/// train.py); gpustall 0.1.0".
pub fn where_and_when(origin: &crate::model::origin::Origin, s: &Summary) -> String {
    let when = match origin.wall_clock_at_start_ns {
        0 => String::new(),
        t => format!(", {}", crate::diagnose::job_verdict::date_time(t)),
    };
    let comm = |pid: u32| s.processes.iter().find(|p| p.pid == pid).map(|p| p.comm.clone());
    let what = match origin.targets.first() {
        Some(&pid) => match origin.command.clone().or_else(|| comm(pid)) {
            Some(c) => format!(": pid {pid} ({})", truncate(&c, 80)),
            None => format!(": pid {pid}"),
        },
        None => String::new(),
    };
    let incident = match &origin.incident {
        Some(i) if i.wall_ns > 0 => format!(
            "; incident: {} of pid {} at {}",
            i.kind.as_str(),
            i.pid,
            crate::diagnose::job_verdict::date_time(i.wall_ns)
        ),
        Some(i) => format!("; incident: {} of pid {}", i.kind.as_str(), i.pid),
        None => String::new(),
    };
    format!(
        "On {} (kernel {}){when} for {:.1} s{what}{incident}; {}",
        origin.host, origin.kernel, s.duration_s, origin.tool
    )
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn verdict(o: &mut String, s: &Summary) {
    let v = &s.verdict;
    let _ = writeln!(o, "\n{HEADING}{} ({}) ==", v.cause.title(), v.cause);
    if let Some(origin) = &s.origin {
        let _ = writeln!(o, "{}", where_and_when(origin, s));
    }
    if let Some(job) = s.job.as_ref().and_then(|j| j.label()) {
        let _ = writeln!(o, "Job: {job}");
    }
    let _ = writeln!(o, "{}", v.text);
    if !s.lower_bounds.is_empty() {
        let _ = writeln!(
            o,
            "\nLOWER BOUNDS: {} events were lost, so some figures below are lower bounds:",
            s.lost_events
        );
        for l in &s.lower_bounds {
            let _ = writeln!(o, "  - {l}");
        }
    }
    if !v.culprit_pids.is_empty() {
        let names: Vec<String> = v.culprit_pids.iter().map(|&pid| process_name(s, pid)).collect();
        let label = if names.len() == 1 { "Culprit" } else { "Culprits, most responsible first" };
        let _ = writeln!(o, "{label}: {}", names.join(", "));
    }
    if !v.evidence.is_empty() {
        let _ = writeln!(o, "\nEvidence (in time order):");
    }
    for e in &v.evidence {
        let _ = writeln!(o, "  - {e}");
    }
    if !v.advice.is_empty() {
        let _ = writeln!(o, "\nAdvice:");
    }
    for a in &v.advice {
        let _ = writeln!(o, "  - {a}");
    }
    if !s.gpu_status.is_empty() {
        let _ = writeln!(o, "\nGPU: {}", s.gpu_status);
    }
}

/// "DataLoader worker 0 (pid 28585)", "pt_data_worker (pid 5)", "systemd-oomd (pid 777)" (a
/// process outside the job, named by a signal it sent), or "pid 9".
pub fn process_name(s: &Summary, pid: u32) -> String {
    if let Some(p) = s.processes.iter().find(|p| p.pid == pid) {
        return match (p.role, p.worker_index) {
            (Role::DataloaderWorker, Some(i)) => format!("DataLoader worker {i} (pid {pid})"),
            (Role::Trainer, _) => format!("the trainer {} (pid {pid})", p.comm),
            (Role::Rank, _) => format!("rank {} (pid {pid})", p.comm),
            _ => format!("{} (pid {pid})", p.comm),
        };
    }
    match s.signals.iter().find(|g| g.sender_pid == pid) {
        Some(g) => format!("{} (pid {pid})", g.sender_comm),
        None => format!("pid {pid}"),
    }
}

/// The Python stacks of the summary's processes as `seen` last saw them, in the style of
/// `py-spy dump`: an incident bundle's stacks.txt (`seen` holding the lines up to the
/// incident). Empty when none was sampled.
pub fn stacks(s: &Summary, seen: &crate::model::pystacks::PyStacks) -> String {
    let mut o = String::new();
    let start_ns = s.t_ns.saturating_sub((s.duration_s * 1e9) as u64);
    for p in &s.processes {
        let Some(st) = seen.get(p.pid).map(|st| st.summary()).filter(|st| !st.last_seen.is_empty())
        else {
            continue;
        };
        let _ = writeln!(
            o,
            "Process {} ({}, {}; Python {}), last sampled {:.1} s into the trace:",
            p.pid,
            p.comm,
            role_name(p),
            st.python.as_deref().unwrap_or("?"),
            st.last_seen_ns.saturating_sub(start_ns) as f64 / 1e9
        );
        for t in &st.last_seen {
            let _ = writeln!(
                o,
                "  Thread {} ({}):",
                t.thread,
                if t.on_cpu { "active" } else { "idle" }
            );
            for f in &t.frames {
                let _ = writeln!(o, "    {f}");
            }
        }
        o.push('\n');
    }
    o
}

fn role_name(p: &crate::output::summary::ProcessSummary) -> String {
    let role = p.role.as_str();
    // A pin-memory thread is a thread of the trainer or rank, not a process of its own.
    let pin = if p.thread_roles.is_empty() { "" } else { "+pin" };
    match p.worker_index {
        Some(i) => format!("{role}#{i}{pin}"),
        None => format!("{role}{pin}"),
    }
}

fn process_table(o: &mut String, s: &Summary) {
    let _ = writeln!(
        o,
        "\n{:>7} {:>7} {:<16} {:<17} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9} {:>9} {:>6}",
        "PID",
        "PPID",
        "COMM",
        "ROLE",
        "READ_MiB",
        "WRITE_MiB",
        "RCLM_IO",
        "RECLAIM",
        "STALL_ms",
        "SWAPOUT",
        "HELD_MiB",
        "EXIT"
    );
    let (quiet, rest) = quiet_helpers(s);
    let (rows, left_out) = table_rows(s, &rest);
    for p in rows {
        let role = role_name(p);
        let exit = match (p.alive, p.exit_signal, p.exit_code) {
            (true, _, _) => "alive".to_string(),
            (_, Some(sig), _) => format!("sig{sig}{}", if p.oom_killed { "/oom" } else { "" }),
            (_, _, Some(code)) => format!("{code}"),
            _ => "?".to_string(),
        };
        let _ = writeln!(
            o,
            "{:>7} {:>7} {:<16} {:<17} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>10.1} {:>9} {:>9.1} {:>6}",
            p.pid,
            p.ppid,
            p.comm,
            role,
            mib(p.block_read_bytes),
            mib(p.block_write_bytes),
            mib(p.reclaim_io_bytes),
            p.reclaim_count(),
            p.reclaim_ns() as f64 / 1e6,
            p.swapout_pages,
            p.peak_mem_kb.max(p.peak_rss_kb) as f64 / 1024.0,
            exit
        );
    }
    if !quiet.is_empty() {
        let _ = writeln!(
            o,
            "+ {} short helper {} that exited cleanly and did nothing of note: {} (all in --summary-json)",
            quiet.len(),
            if quiet.len() == 1 { "process" } else { "processes" },
            by_name(&quiet)
        );
    }
    if left_out > 0 {
        let _ = writeln!(
            o,
            "... and {left_out} more processes that exited cleanly with little I/O (all in --summary-json)"
        );
    }
    for f in &s.folded {
        let role = f.role.as_str();
        let _ = writeln!(
            o,
            "folded: {} exited {} processes, {:.1} MiB read, {:.1} MiB written",
            f.totals.processes,
            role,
            mib(f.totals.block_read_bytes),
            mib(f.totals.block_write_bytes)
        );
    }
}

/// Rows a terminal can show: every process when they fit, else the ones that matter (culprits,
/// the job's roles, the killed, the living, the stalled, the heaviest I/O), in table order.
/// The rest is counted; the summary JSON keeps them all.
pub const MAX_ROWS: usize = 50;

pub type Row<'a> = &'a crate::output::summary::ProcessSummary;

/// Launchers' and wrappers' helpers (a pyenv shim's bash, `sleep`, `readlink`) that left no
/// trace worth a row: role `other`, exited 0, no signal, no reclaim, swap or OOM, under 1 MiB
/// of I/O, not a culprit. They are one line under the table; the rest are rows.
pub fn quiet_helpers(s: &Summary) -> (Vec<Row<'_>>, Vec<Row<'_>>) {
    s.processes.iter().partition(|p| {
        p.role == Role::Other
            && !p.alive
            && p.exit_code == Some(0)
            && p.exit_signal.is_none()
            && p.reclaim_count() + p.swapout_pages == 0
            && p.block_read_bytes + p.block_write_bytes < 1 << 20
            && !s.verdict.culprit_pids.contains(&p.pid)
    })
}

/// "bash x40, sleep x5", most first.
pub fn by_name(rows: &[Row<'_>]) -> String {
    let mut n: std::collections::BTreeMap<&str, usize> = Default::default();
    for p in rows {
        *n.entry(p.comm.as_str()).or_default() += 1;
    }
    let mut n: Vec<(&str, usize)> = n.into_iter().collect();
    n.sort_by_key(|(name, k)| (std::cmp::Reverse(*k), *name));
    let named: Vec<String> = n.iter().map(|(name, k)| format!("{name} x{k}")).collect();
    named.join(", ")
}

fn table_rows<'a>(s: &Summary, candidates: &[Row<'a>]) -> (Vec<Row<'a>>, usize) {
    if candidates.len() <= MAX_ROWS {
        return (candidates.to_vec(), 0);
    }
    let culprits = &s.verdict.culprit_pids;
    let rank = |p: Row<'_>| {
        let remarkable = culprits.contains(&p.pid)
            || p.role != Role::Other
            || p.oom_killed
            || p.exit_signal.is_some()
            || p.alive
            || p.reclaim_count() + p.swapout_pages > 0;
        (!remarkable, std::cmp::Reverse(p.block_read_bytes + p.block_write_bytes))
    };
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| rank(candidates[i]));
    order.truncate(MAX_ROWS);
    order.sort_unstable();
    let rows: Vec<_> = order.iter().map(|&i| candidates[i]).collect();
    (rows, candidates.len() - MAX_ROWS)
}

/// The trainer's wait for data beside its log's data_time, where one trainer waited: a user
/// compares the two, and they measure different things. The wait is the time the kernel saw
/// the trainer blocked on its workers (and off CPU before it could use a batch); data_time is
/// the trainer's clock around fetching a batch, which also counts its own work receiving it
/// (unpickling, mapping the tensors) and, in mmengine, the hooks that run between its reads.
fn beside_the_log(s: &Summary, logged_s: f64) -> String {
    let waits: Vec<(u64, u64, Option<u64>)> = s
        .processes
        .iter()
        .filter(|p| p.role == Role::Trainer)
        .filter_map(|p| {
            let o = p.offcpu.as_ref()?;
            Some((
                o.data_wait_ns?,
                o.unended_wait_ns.unwrap_or(0),
                p.receiving_batches.map(|r| r.ns),
            ))
        })
        .collect();
    let [(wait_ns, unended_ns, receiving_ns)] = waits[..] else { return String::new() };
    let waited = wait_ns as f64 / 1e9;
    if logged_s <= 0.0 {
        return String::new();
    }
    // Waits no process of the job ended (a poll's timeout, a signal) are not data waits, but
    // a loop around a timed poll for a batch spends them inside data_time.
    let unended = match unended_ns as f64 / 1e9 {
        u if u >= 0.01 => {
            format!(", and {u:.2} s in waits no process of the job ended (timeouts, signals)")
        }
        _ => String::new(),
    };
    let share = 100.0 * waited / logged_s;
    // Its own CPU receiving the batches, from its Python stacks: what data_time counts besides.
    let (receiving, fetching) = match receiving_ns.map(|ns| ns as f64 / 1e9) {
        Some(r) => (
            format!(", and on CPU receiving batches {r:.2} s (from its Python stacks): {:.2} s, {:.0} % of it together", waited + r, 100.0 * (waited + r) / logged_s),
            waited + r,
        ),
        None => (String::new(), waited),
    };
    let together = 100.0 * fetching / logged_s;
    let why = if together < 95.0 {
        if receiving_ns.is_some() {
            ": the log also counts what its clock's reads hold besides (the framework's hooks)"
        } else {
            ": the log also counts the trainer's own time fetching (receiving each batch, the framework's hooks between its clock's reads)"
        }
    } else if together > 105.0 {
        ": the trace also holds the waits after the log's last iteration"
    } else {
        ""
    };
    format!(
        "; the trainer was blocked on its workers {waited:.2} s over the trace, {share:.0} % of it{receiving}{unended}{why}"
    )
}

/// Each trainer's or rank's time split with its waits for the GPU, or why they were not
/// measured.
fn gpu_waits(o: &mut String, s: &Summary) {
    for p in &s.processes {
        if let (Some(g), Some(t)) = (&p.gpu_wait, &p.time_split) {
            let _ = writeln!(
                o,
                "GPU waits: {} {}: {}; {} calls into {} ({}), {:.2} s",
                role_name(p),
                p.pid,
                t.words(),
                g.calls,
                g.library,
                g.symbols.join(", "),
                g.wait_ns as f64 / 1e9
            );
        } else if let Some(why) = &p.gpu_wait_unmeasured {
            let _ = writeln!(o, "GPU waits: {} {}: not measured: {why}", role_name(p), p.pid);
        }
    }
}

/// "memory limit forecast at +41.0 s, said at +12.0 s (29 s ahead, at 432 MiB/min); the
/// OOM kill came at +43.1 s": the warning the live status line and watch's alert gave.
fn limit_warning(o: &mut String, s: &Summary) {
    let Some(w) = &s.context.limit_warning else { return };
    let start = s.t_ns.saturating_sub((s.duration_s * 1e9) as u64);
    let at = |t: u64| t.saturating_sub(start) as f64 / 1e9;
    let kill = s
        .oom_kills
        .iter()
        .map(|k| k.t_ns)
        .find(|&t| t >= w.said_at_ns)
        .map_or(String::new(), |t| format!("; the OOM kill came at +{:.1} s", at(t)));
    let _ = writeln!(
        o,
        "memory limit forecast at +{:.1} s, said at +{:.1} s ({:.0} s ahead, at {:.0} MiB/min){kill}",
        at(w.limit_at_ns),
        at(w.said_at_ns),
        w.limit_at_ns.saturating_sub(w.said_at_ns) as f64 / 1e9,
        w.rate_bytes_s * 60.0 / 1048576.0
    );
}

/// OOM kills, host reclaim, block latency, events and losses.
fn footer(o: &mut String, s: &Summary) {
    if let Some(l) = &s.context.data_time_logged {
        let _ = writeln!(
            o,
            "training log: data_time {:.2} s over {} iterations ({}){}",
            l.total_s,
            l.iterations,
            l.read_as,
            beside_the_log(s, l.total_s)
        );
    }
    gpu_waits(o, s);
    limit_warning(o, s);
    for k in &s.oom_kills {
        let _ = writeln!(
            o,
            "OOM kill: pid {} ({}) held {} resident, invoked by pid {} ({})",
            k.victim_pid,
            k.victim_comm,
            k.rss.map_or("?".into(), |r| format!(
                "{:.0} MiB anonymous + {:.0} MiB file + {:.0} MiB shared",
                r.anon_rss_kb as f64 / 1024.0,
                r.file_rss_kb as f64 / 1024.0,
                r.shmem_rss_kb as f64 / 1024.0
            )),
            k.trigger_pid,
            k.trigger_comm
        );
    }
    let h = &s.host;
    if h.kswapd_swapout_pages + h.other_swapout_pages + h.kswapd_episodes > 0 {
        let _ = writeln!(
            o,
            "host: kswapd {} episodes ({:.1} ms), swapped out {} pages; other processes' reclaim swapped out {} pages",
            h.kswapd_episodes,
            h.kswapd_ns as f64 / 1e6,
            h.kswapd_swapout_pages,
            h.other_swapout_pages
        );
    }
    for l in &s.block_latency_us {
        let _ = writeln!(
            o,
            "block {} latency: {} {}, p50 <= {} ms, p99 <= {} ms",
            l.op,
            l.requests,
            if l.requests == 1 { "request" } else { "requests" },
            l.p50_us.map_or("?".into(), |v| format!("{:.1}", v / 1e3)),
            l.p99_us.map_or("?".into(), |v| format!("{:.1}", v / 1e3))
        );
    }
    let _ = writeln!(o, "(HELD_MiB: peak of resident + swapped-out memory; RCLM_IO: disk I/O submitted inside reclaim)");
    let _ = writeln!(
        o,
        "events {} | lost {} (critical ring {}, bulk ring {}, map full {}, undecodable {}) | program runs skipped by the kernel {} | {:.1} s",
        s.events,
        s.lost_events,
        s.lost.critical_ring,
        s.lost.bulk_ring,
        s.lost.map_full,
        s.lost.undecodable,
        s.lost.program_skipped,
        s.duration_s
    );
    let oh = &s.overhead;
    if let (Some(now), Some(full)) = (oh.bpf_map_bytes, oh.bpf_map_bytes_at_full_use) {
        let _ = writeln!(
            o,
            "cost: agent {:.2} s CPU, peak RSS {:.1} MiB; BPF maps {:.1} MiB of kernel memory (at most {:.1} MiB on this host)",
            oh.agent_cpu_s,
            oh.agent_peak_rss_kb as f64 / 1024.0,
            mib(now),
            mib(full)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch bundle's report says what the incident was and when, on the wall clock.
    #[test]
    fn a_bundles_report_says_when_its_incident_happened() {
        let header = r#"{"type":"header","version":1,"start_ns":1000000000,"wall_clock_at_start_ns":1796428800000000000,"host":"node-3","kernel":"6.18.0","tool":"gpustall 0.1.0","mode":"watch","incident":{"kind":"oom_kill","t_ns":3500000000,"pid":4242},"gpu":{"enabled":false,"status":"off"}}"#;
        let r = crate::recording::replay::replay(format!("{header}\n").as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        let s = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
        let line = where_and_when(s.origin.as_ref().expect("origin"), &s);
        assert!(
            line.contains("; incident: oom_kill of pid 4242 at 2026-12-05 00:00:02.500 UTC"),
            "{line}"
        );
    }

    /// The committed recording of a DataLoader worker OOM-killed in a 256 MiB cgroup, as a
    /// first-time reader sees it: a heading in words, the culprit by name, MiB and ms, the
    /// kill's own figure in the advice.
    #[test]
    fn the_report_speaks_in_words_and_human_units() {
        let text = include_str!("../recording/testdata/merge-node-a.jsonl");
        let r = crate::recording::replay::replay(text.as_bytes());
        let s = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
        let report = render(&s);
        let has = |want: &str| assert!(report.contains(want), "{want:?} in:\n{report}");
        has("== gpustall: Out of memory: a process was OOM-killed (host_memory_oom) ==");
        has("Culprit: DataLoader worker 0 (pid 28585)\n");
        has("reclaim began; 1 traced process stalled");
        has("held 175 MiB anonymous + 1 MiB file + 0 MiB shared resident");
        has("block read latency: 84 requests, p50 <= 1.0 ms, p99 <= 2.1 ms");
        has("block other latency: 1 request,");
        has("3 workers x up to 176 MiB");
        assert!(!report.contains("up to 0 MiB"), "{report}");
        // Coloured for a terminal only, by severity; files and pipes stay plain.
        let red = coloured(&report, Severity::Failure, true);
        assert!(red.contains("\x1b[1m\x1b[31m== gpustall: Out of memory"), "{red}");
        assert_eq!(coloured(&report, Severity::Failure, false), report);
        let green = coloured(&report, Severity::Clear, true);
        assert!(green.contains("\x1b[32m"), "{green}");
    }

    /// The report says where and when: host, kernel, the wall clock at the start, how long, what
    /// was traced, by which gpustall (from the recording's header).
    #[test]
    fn the_report_says_where_and_when() {
        let text = include_str!("../recording/testdata/trace-v1.jsonl");
        let r = crate::recording::replay::replay(text.as_bytes());
        let s = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
        let report = render(&s);
        let line = report.lines().nth(2).unwrap_or_default();
        assert!(
            line.starts_with("On vm (kernel 6.18.44-fc-v1098), 2026-12-02 18:48:54.945 UTC for 6.0 s: pid 31794 (target/debug/gpustall-workload spawn"),
            "{report}"
        );
        assert!(line.ends_with("; gpustall 0.1.0"), "{line}");
    }
    use crate::model::{
        event::{Event, Header},
        Model,
    };

    #[test]
    fn a_long_table_keeps_what_matters_and_counts_the_rest() {
        let mut m = Model::default();
        m.tree.seed(1, 0, "sh", true, 0);
        let h = |t_ns: u64, pid: u32| Header { t_ns, pid, tid: pid, comm: "sh".into() };
        for pid in 2..202u32 {
            m.apply(&Event::Fork { h: h(u64::from(pid), 1), child_pid: pid, clone_flags: 0 });
            // pid 150 died of SIGSEGV: it is a row whatever else there is. The rest exited 1:
            // not quiet helpers, rows or counted.
            let status = if pid == 150 { 11 } else { 1 << 8 };
            m.apply(&Event::Exit { h: h(u64::from(pid) + 1, pid), exit_code: Some(status) });
        }
        let s = crate::pipeline::conclude::summary(&m, 1_000, true);
        let candidates: Vec<Row<'_>> = s.processes.iter().collect();
        let (rows, left_out) = table_rows(&s, &candidates);
        assert_eq!(rows.len(), MAX_ROWS);
        assert_eq!(left_out, 201 - MAX_ROWS);
        assert!(rows.iter().any(|p| p.pid == 1), "the living root");
        assert!(rows.iter().any(|p| p.pid == 150), "the killed child");
        assert!(rows.windows(2).all(|w| w[0].pid < w[1].pid), "table order kept");
        let text = render(&s);
        assert!(text.contains(&format!("... and {} more processes", 201 - MAX_ROWS)), "{text}");
    }

    /// A launcher's helpers that exited 0 having done nothing (a shim's shells, `sleep`) are one
    /// line, by name; the job's own processes and anything that failed stay rows.
    #[test]
    fn quiet_helpers_are_one_line_by_name() {
        let mut m = Model::default();
        m.tree.seed(1, 0, "python3", true, 0);
        let h = |t_ns: u64, pid: u32, comm: &str| Header { t_ns, pid, tid: pid, comm: comm.into() };
        for (pid, comm, status) in
            [(2, "bash", 0), (3, "bash", 0), (4, "sleep", 0), (5, "readlink", 1 << 8)]
        {
            m.apply(&Event::Fork {
                h: h(u64::from(pid), 1, "python3"),
                child_pid: pid,
                clone_flags: 0,
            });
            m.apply(&Event::Exec {
                h: h(u64::from(pid), pid, comm),
                filename: comm.into(),
                old_pid: pid,
            });
            m.apply(&Event::Exit { h: h(u64::from(pid) + 1, pid, comm), exit_code: Some(status) });
        }
        let s = crate::pipeline::conclude::summary(&m, 1_000, true);
        let text = render(&s);
        assert!(
            text.contains("+ 3 short helper processes that exited cleanly and did nothing of note: bash x2, sleep x1"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.contains("readlink") && l.trim_end().ends_with(" 1")),
            "a failed helper is a row: {text}"
        );
        assert!(text.lines().any(|l| l.contains("python3")), "{text}");
    }
}
