//! The page's tables: who kept the trainer waiting, and the processes.

use std::fmt::Write as _;

use super::esc;
use crate::output::summary::Summary;

/// Who kept the trainer waiting: each trainer's or rank's wait for data (total, share of the
/// trace), then each process that ended those waits with its share of them (a bar), count, p99
/// and longest wait. Nothing without off-CPU accounting or when no one waited for data.
pub fn kept_waiting(o: &mut String, summary: &Summary) {
    let of = |p: &crate::output::summary::ProcessSummary| p.offcpu.clone().unwrap_or_default();
    let waiters: Vec<_> =
        summary.processes.iter().filter(|p| of(p).data_wait_ns.is_some_and(|n| n > 0)).collect();
    let total: u64 = waiters.iter().filter_map(|p| of(p).data_wait_ns).sum();
    if total == 0 {
        return;
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    let role = |p: &crate::output::summary::ProcessSummary| {
        let r = p.role.as_str();
        p.worker_index.map_or(r.to_string(), |i| format!("{r} {i}"))
    };
    o.push_str("<h2>Who kept the trainer waiting</h2><table><tr><th>pid</th><th>comm</th><th>role</th><th>waited for data ms</th><th>waits</th><th>% of the trace</th><th>blocked in (syscall: ms, of it ended by the job)</th></tr>");
    for p in &waiters {
        let w = of(p);
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.1}</td><td>{}</td></tr>",
            p.pid,
            esc(&p.comm),
            esc(&role(p)),
            ms(w.data_wait_ns.unwrap_or(0)),
            w.data_wait_count.unwrap_or(0),
            100.0 * ms(w.data_wait_ns.unwrap_or(0)) / 1e3 / summary.duration_s.max(1e-9),
            by_syscall(&w)
        );
    }
    o.push_str("</table><p></p><table><tr><th>pid</th><th>comm</th><th>role</th><th>kept it waiting ms</th><th>share of the wait</th><th></th><th>waits</th><th>p99 ms</th><th>longest ms</th><th>in reclaim during waits &ge; 10 ms</th></tr>");
    let mut keepers: Vec<_> =
        summary.processes.iter().filter(|p| of(p).kept_waiting_ns > 0).collect();
    keepers.sort_by_key(|p| std::cmp::Reverse(of(p).kept_waiting_ns));
    for p in keepers {
        let k = of(p);
        let share = 100.0 * k.kept_waiting_ns as f64 / total as f64;
        let _ = write!(
            o,
            r##"<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{share:.1} %</td><td style="text-align:left"><svg width="120" height="10"><rect width="{:.1}" height="10" fill="#d62728"/></svg></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"##,
            p.pid,
            esc(&p.comm),
            esc(&role(p)),
            ms(k.kept_waiting_ns),
            1.2 * share.min(100.0),
            k.kept_waiting_count,
            k.kept_waiting_p99_ns.map_or("".into(), |n| format!("{:.1}", ms(n))),
            k.kept_waiting_max_ns.map_or("".into(), |n| format!("{:.1}", ms(n))),
            // Of the long waits it ended, the time it was itself stalled in reclaim.
            k.long_waits.map_or("".into(), |l| format!(
                "{:.1} of {:.1} ms",
                ms(l.in_reclaim_ns),
                ms(l.ns)
            ))
        );
    }
    o.push_str("</table>");
}

/// A waiter's waits by syscall class, e.g. `read 1096.9 (1096.9), sleep 1200.1 (0.0)`: an
/// ioctl is a device driver's wait (the GPU), not a batch.
fn by_syscall(w: &crate::model::offcpu::OffCpuSummary) -> String {
    let Some(m) = &w.wait_by_syscall else { return "not read".into() };
    let parts: Vec<String> = m
        .iter()
        .map(|(c, cw)| {
            let name = serde_json::to_value(c).ok().and_then(|v| v.as_str().map(String::from));
            let (total, data) = (cw.ns as f64 / 1e6, cw.data_ns as f64 / 1e6);
            format!("{} {total:.1} ({data:.1})", name.unwrap_or_default())
        })
        .collect();
    esc(&parts.join(", "))
}

pub fn processes(o: &mut String, summary: &Summary) {
    o.push_str("<h2>Processes</h2><table><tr><th>pid</th><th>ppid</th><th>comm</th><th>role</th><th>peak held MiB</th><th>reclaim ms</th><th>swap-out pages</th><th>read MiB</th><th>write MiB</th><th>exit</th></tr>");
    let (quiet, rows) = crate::output::text::quiet_helpers(summary);
    for p in rows {
        let exit = match (p.alive, p.exit_signal, p.exit_code) {
            (true, _, _) => "alive".to_string(),
            (_, Some(s), _) => format!("signal {s}{}", if p.oom_killed { " (OOM)" } else { "" }),
            (_, _, Some(c)) => c.to_string(),
            _ => "?".into(),
        };
        let role = p.role.as_str();
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.1}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{}</td></tr>",
            p.pid,
            p.ppid,
            esc(&p.comm),
            esc(role),
            p.peak_mem_kb.max(p.peak_rss_kb) as f64 / 1024.0,
            p.reclaim_ns() as f64 / 1e6,
            p.swapout_pages,
            p.block_read_bytes as f64 / 1048576.0,
            p.block_write_bytes as f64 / 1048576.0,
            exit
        );
    }
    o.push_str("</table>");
    if !quiet.is_empty() {
        let _ = write!(
            o,
            "<p><small>And {} short helper processes that exited cleanly and did nothing of note: {}.</small></p>",
            quiet.len(),
            esc(&crate::output::text::by_name(&quiet))
        );
    }
}
