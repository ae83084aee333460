//! Gathers what the verdict needs from the model: a thin, mechanical step, so that the
//! decision itself (`verdict::decide`) stays a pure function of plain facts.

use gpustall_common::counters::IoOp;

use crate::diagnose::verdict::Facts;
use crate::diagnose::verdict::OomFacts;
use crate::diagnose::verdict::ProcFacts;
use crate::model::proctree::Role;
use crate::model::Model;

pub fn from_model(m: &Model, now_ns: u64) -> Facts {
    let empty = crate::model::stats::ProcStats::default();
    let procs = m
        .tree
        .iter()
        .map(|n| {
            let p = m.procs.get(&n.pid).unwrap_or(&empty);
            let c = &p.counters;
            let role = m.tree.role(n.pid);
            let watch = m.ctx.tasks.get(&n.pid);
            ProcFacts {
                pid: n.pid,
                comm: n.comm.clone(),
                is_worker: role == Role::DataloaderWorker,
                is_trainer: role == Role::Trainer,
                worker_index: m.tree.worker_index(n.pid),
                first_mem_kb: p.first_mem_kb.unwrap_or(0),
                first_mem_ns: p.first_rss_ns,
                peak_mem_kb: p.peak_mem_kb.max(p.peak_rss_kb),
                peak_mem_ns: if p.peak_mem_kb >= p.peak_rss_kb {
                    p.peak_mem_ns
                } else {
                    p.peak_rss_ns
                },
                last_mem_ns: m.ctx.last_ns.min(n.exit_ns.unwrap_or(u64::MAX)),
                reclaim_count: c.direct_reclaim_count + c.memcg_reclaim_count,
                reclaim_ns: c.direct_reclaim_ns + c.memcg_reclaim_ns,
                first_reclaim_ns: p.first_reclaim_ns,
                swapout_pages: c.swapout_anon_folios,
                reclaim_io_bytes: p
                    .io
                    .iter()
                    .filter(|(k, _)| k.in_reclaim)
                    .map(|(_, v)| v.bytes)
                    .sum(),
                read_bytes: p.io_bytes(IoOp::Read, None),
                write_bytes: p.io_bytes(IoOp::Write, None),
                io_wait_ns: p.io.values().map(|v| v.latency_ns_sum).sum(),
                lifetime_ns: n
                    .exit_ns
                    .unwrap_or(now_ns)
                    .saturating_sub(n.started_ns.max(m.start_ns)),
                oom_killed: n.oom_killed,
                exit_signal: n.exit_signal(),
                stuck: watch.and_then(|w| {
                    w.stuck_since_ns.map(|s| (w.last.state, w.last.wchan.clone(), s))
                }),
                idle_since_ns: watch.and_then(|w| w.idle_since_ns),
                alive: n.alive(),
            }
        })
        .collect();
    let oom_kills = m
        .oom_kills
        .iter()
        .map(|o| OomFacts {
            t_ns: o.t_ns,
            victim_pid: o.victim_pid,
            victim_comm: o.victim_comm.clone(),
            anon_rss_kb: o.rss.map(|r| r.anon_rss_kb),
            trigger_pid: o.trigger_pid,
            trigger_comm: o.trigger_comm.clone(),
            killer: m
                .tree
                .get(o.victim_pid)
                .and_then(|n| n.killed_by.as_ref())
                .map(|k| (k.sender_pid, k.sender_comm.clone(), k.si_code)),
        })
        .collect();
    let ctx = &m.ctx;
    let vm = ctx.vm_delta();
    let peaks = &ctx.disk_peak_busy;
    let disks = ctx
        .disk_busy_overall()
        .into_iter()
        .map(|d| {
            let peak = peaks.get(&d.name).copied().unwrap_or(d.busy_pct);
            (d.name, d.busy_pct, peak)
        })
        .collect();
    let data_times: Vec<f64> = m.steps.iter().filter_map(|(_, s)| s.data_time_s).collect();
    let data_time = crate::model::steps::data_time_trend(&data_times);
    let data_time_rise_ns = data_time.as_ref().and_then(|t| t.first_rise_index).and_then(|i| {
        m.steps.iter().filter(|(_, s)| s.data_time_s.is_some()).nth(i).map(|(t, _)| *t)
    });
    Facts {
        start_ns: m.start_ns,
        end_ns: now_ns,
        procs,
        oom_kills,
        cgroup: ctx
            .cgroup_last
            .as_ref()
            .map(|c| (c.path.clone(), c.limit_bytes, ctx.cgroup_peak_usage, c.oom_kills)),
        host_mem_total_kb: ctx.host_last.as_ref().map(|h| h.mem_total_kb),
        host_min_available_kb: ctx.host_min_available_kb,
        swap_total_kb: ctx.host_last.as_ref().map(|h| h.swap_total_kb),
        pswpout: vm.pswpout,
        pswpin: vm.pswpin,
        disks,
        filesystems: ctx
            .filesystems
            .iter()
            .map(|f| (f.path.clone(), f.used_pct, f.avail_bytes))
            .collect(),
        gpu_stalls: m.gpu.stalls.clone(),
        gpu_throttled_samples: m.gpu.throttled_samples,
        gpu_samples: m.gpu.samples,
        gpu_throttle_reasons: m.gpu.throttle_reasons.iter().cloned().collect(),
        data_time,
        data_time_rise_ns,
    }
}
