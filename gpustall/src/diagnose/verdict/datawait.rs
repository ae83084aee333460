//! The trainer's wait for data, from the kernel's off-CPU accounting: how much of its time the
//! trainer (and the ranks) sat blocked until another process of the job woke it, and which
//! worker delivered late (ended most of those waits), with what that worker was doing itself
//! (reclaim stalls, uninterruptible I/O). Needs no training log. A disk-bound pipeline reads
//! "waited for data ... worker k, which blocked on disk I/O", a memory-starved one "... which
//! stalled in reclaim", a GPU-bound job "rarely waited for data".
//!
//! Where the kernel read the syscall each wait blocked in (`wait_by_syscall`), a wait in an
//! ioctl is a device driver's (a blocking CUDA synchronize sleeps in the NVIDIA driver): not a
//! wait for data even when a process of the job ended it, and said as such.

use gpustall_common::syscall::WaitClass;

use super::evidence::{at, name, Chain};
use crate::diagnose::facts::{Facts, ProcFacts};
use crate::model::offcpu::{ClassWait, OffCpuSummary};

/// A trainer or rank that waited for data this share of its time was starved by its input.
pub(super) const DATA_WAIT_SHARE: f64 = 0.10;
/// A worker that ended at least this share of a trainer's wait is named with it.
const KEEPER_SHARE: f64 = 0.05;

/// A process's waits in an ioctl (a device driver), if the kernel counted any.
fn in_driver(o: &OffCpuSummary) -> ClassWait {
    o.wait_by_syscall.as_ref().and_then(|m| m.get(&WaitClass::Ioctl)).copied().unwrap_or_default()
}

/// The trainers and ranks with their data wait (less its waits in a device driver, plus a wait
/// still in progress at the end), and the share of their time it took: logical waits of the
/// consumer thread, so never above the whole.
pub(super) fn waiters(f: &Facts) -> Vec<(&ProcFacts, u64, f64)> {
    f.procs.iter().filter_map(|p| wait_of(p).map(|(wait, share)| (p, wait, share))).collect()
}

/// A trainer's or rank's wait for data and its share of its life (see [`waiters`]).
pub(super) fn wait_of(p: &ProcFacts) -> Option<(u64, f64)> {
    if !(p.is_trainer || p.is_rank) {
        return None;
    }
    let o = p.offcpu.as_ref()?;
    let open = o.open_data_wait.map_or(0, |w| w.ns);
    let wait = o.data_wait_ns?.saturating_sub(in_driver(o).data_ns) + open;
    let wait = wait.min(p.lifetime_ns.max(1));
    Some((wait, wait as f64 / p.lifetime_ns.max(1) as f64))
}

/// A wait for data still in progress at the end (a trainer hung on its input): "; it was
/// still waiting for data at the end, for 40.0 s (since +12.3s)".
fn still_waiting(f: &Facts, p: &ProcFacts) -> String {
    let Some(w) = p.offcpu.as_ref().and_then(|o| o.open_data_wait) else {
        return String::new();
    };
    if w.ns < super::super::facts::OPEN_WAIT_SHOWN_NS {
        return String::new();
    }
    format!(
        "; it was still waiting for data at the end, for {:.1} s (since {}, {} blocks so far)",
        w.ns as f64 / 1e9,
        at(f, w.since_ns),
        w.blocks
    )
}

/// The trainers and ranks that waited in a device driver (ioctl) a tenth of their time or more,
/// with those waits and their share of its time.
fn driver_waiters(f: &Facts) -> Vec<(&ProcFacts, ClassWait, f64)> {
    f.procs
        .iter()
        .filter(|p| p.is_trainer || p.is_rank)
        .filter_map(|p| {
            let w = in_driver(p.offcpu.as_ref()?);
            let share = w.ns as f64 / p.lifetime_ns.max(1) as f64;
            (share >= DATA_WAIT_SHARE).then_some((p, w, share))
        })
        .collect()
}

/// Whether the waits other processes of the job ended were mostly waits for data, not waits in
/// a driver: only then are the processes that ended them the ones that kept the trainer
/// waiting for data (the kernel sums per waker without the class).
fn mostly_data(f: &Facts) -> bool {
    let (mut data, mut all) = (0, 0);
    for p in f.procs.iter().filter(|p| p.is_trainer || p.is_rank) {
        if let Some(o) = &p.offcpu {
            let total = o.data_wait_ns.unwrap_or(0);
            all += total;
            data += total.saturating_sub(in_driver(o).data_ns);
        }
    }
    data * 2 >= all
}

/// The syscalls a waiter's data wait blocked in, longest first: "a pipe/socket read 1.10 s".
fn data_classes(o: &OffCpuSummary) -> String {
    let Some(m) = &o.wait_by_syscall else { return String::new() };
    let mut v: Vec<_> =
        m.iter().filter(|(c, w)| **c != WaitClass::Ioctl && w.data_ns > 0).collect();
    v.sort_by_key(|(c, w)| (std::cmp::Reverse(w.data_ns), **c));
    let parts: Vec<String> = v
        .iter()
        .map(|(c, w)| format!("{} {:.2} s", c.describe(), w.data_ns as f64 / 1e9))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("; blocked in {}", parts.join(", "))
    }
}

/// A clause for a trainer or rank that waited in a device driver.
fn driver_clause(p: &ProcFacts, share: f64) -> String {
    format!(
        "; {} waited in a device driver (ioctl) {:.0} % of its time: the GPU (a blocking synchronize) or another device, not the input pipeline",
        name(p),
        share * 100.0
    )
}

/// The processes that kept a trainer or rank waiting, longest first.
fn keepers(f: &Facts) -> Vec<(&ProcFacts, u64)> {
    let mut v: Vec<_> = f
        .procs
        .iter()
        .filter_map(|p| Some((p, p.offcpu.as_ref()?.kept_waiting_ns)))
        .filter(|(_, ns)| *ns > 0)
        .collect();
    v.sort_by_key(|(p, ns)| (std::cmp::Reverse(*ns), p.pid));
    v
}

/// What a worker was doing while the trainer waited: its reclaim stalls, its disk waits.
fn doing(p: &ProcFacts) -> String {
    let mut parts = Vec::new();
    if p.reclaim_ns > 0 {
        parts.push(format!("stalled {:.2} s in reclaim", p.reclaim_ns as f64 / 1e9));
    }
    let io = p.offcpu.as_ref().map_or(0, |o| o.offcpu_io_ns);
    if io as f64 >= 0.1 * p.lifetime_ns.max(1) as f64 {
        parts.push(format!("blocked {:.2} s on disk I/O (uninterruptible)", io as f64 / 1e9));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(", which {}", parts.join(" and "))
    }
}

/// The long waits a worker ended, wait by wait against its own reclaim stalls: how much of
/// the time it kept the trainer waiting it was itself stalled in reclaim, and the longest wait.
fn long_waits(f: &Facts, o: &crate::model::offcpu::OffCpuSummary) -> String {
    let Some(l) = o.long_waits.filter(|l| l.in_reclaim_ns > 0) else {
        return String::new();
    };
    format!(
        "; during the {} waits over 10 ms it ended ({:.2} s) it was itself stalled in reclaim {:.2} s, the longest wait {:.0} ms (ended {}) with {:.0} ms of it in reclaim",
        l.count,
        l.ns as f64 / 1e9,
        l.in_reclaim_ns as f64 / 1e9,
        l.longest_ns as f64 / 1e6,
        at(f, l.longest_at_ns),
        l.longest_in_reclaim_ns as f64 / 1e6
    )
}

/// A clause for the verdict's text: who kept the trainer waiting, or that it rarely waited.
pub fn clause(f: &Facts) -> String {
    let driver = driver_waiters(f)
        .into_iter()
        .max_by_key(|(_, w, _)| w.ns)
        .map_or(String::new(), |(p, _, share)| driver_clause(p, share));
    data_clause(f) + &driver
}

/// The clause of the wait for data.
fn data_clause(f: &Facts) -> String {
    let w = waiters(f);
    let Some(&(p, wait, share)) = w.iter().max_by_key(|(_, wait, _)| *wait) else {
        return String::new();
    };
    if share < DATA_WAIT_SHARE {
        if !driver_waiters(f).is_empty() {
            return String::new(); // the driver's clause says what it waited for
        }
        return if f.gpu_stalls.is_empty() {
            String::new()
        } else {
            format!(
                "; {} rarely waited for data ({:.0} % of its time): not the input pipeline",
                name(p),
                share * 100.0
            )
        };
    }
    let site = super::stacks::wait_site(f, p).map_or(String::new(), |s| format!(" at {s}"));
    let mut s = format!("; {} waited for data{site} {:.0} % of its time", name(p), share * 100.0);
    s.push_str(&still_waiting(f, p));
    // A worker that ended a sliver of it (a wait still open at the end is nobody's yet) is
    // not named: "0 % of it for worker 1" reads as the answer.
    let named = |kept: u64| kept as f64 >= KEEPER_SHARE * wait as f64;
    if let Some(&(k, kept)) = keepers(f).first().filter(|(_, kept)| mostly_data(f) && named(*kept))
    {
        s.push_str(&format!(
            ", {:.0} % of it for {}{}",
            kept as f64 * 100.0 / wait.max(1) as f64,
            name(k),
            doing(k)
        ));
    }
    s
}

/// Evidence: each trainer's or rank's wait for data, and each worker that kept one waiting.
pub fn links(f: &Facts, chain: &mut Chain) {
    let w = waiters(f);
    let total: u64 = w.iter().map(|(_, wait, _)| wait).sum();
    for &(p, wait, share) in &w {
        let o = p.offcpu.clone().unwrap_or_default();
        if wait == 0 || (share < 0.01 && in_driver(&o).data_ns > 0) {
            continue; // its waits that others ended were a driver's (said below)
        }
        if share < 0.01 && wait * 100 < total {
            // A launcher's sliver beside its ranks' waits (torchrun traced as `-- torchrun`
            // waits on its ranks' pipes now and then): not the job's wait for data.
            continue;
        }
        let count = o.data_wait_count.unwrap_or(0).saturating_sub(in_driver(&o).data_count);
        // With pin_memory=True the main thread waits on the pin-memory thread, which waits
        // on the workers: the main thread's waits are charged through it to the workers, and
        // its own idle waits are not the trainer's.
        let pin = if p.pin_memory_thread {
            "; its batches come through its pin-memory thread (pt_data_pin), whose waits on the workers are not counted: each wait is charged to the worker whose batch the pin thread passed on"
        } else {
            ""
        };
        let unended = match (o.unended_wait_ns, o.unended_wait_count) {
            (Some(ns), Some(n)) if ns > 0 => format!(
                "; besides, {n} waits ({:.2} s) that no process of the job ended (timeouts, signals, a device) are not counted",
                ns as f64 / 1e9
            ),
            _ => String::new(),
        };
        chain.at(f, p.started_ns.max(f.start_ns), format!("{} waited for data {:.2} s ({:.0} % of its time, {count} waits ended by other processes of the job{pin}{}{unended}{})", name(p), wait as f64 / 1e9, share * 100.0, data_classes(&o), still_waiting(f, p)));
        super::stacks::wait_link(f, p, chain);
    }
    for (p, d, share) in driver_waiters(f) {
        chain.at(f, p.started_ns.max(f.start_ns), format!("{} waited in a device driver (ioctl) {:.2} s ({:.0} % of its time, {} waits, never a wait for data, even when a process of the job ended it): the GPU (a blocking synchronize) or another device, not the input pipeline", name(p), d.ns as f64 / 1e9, share * 100.0, d.count));
    }
    if !mostly_data(f) {
        return; // the waits others ended were mostly a driver's: no one kept it waiting for data
    }
    for (k, kept) in keepers(f) {
        // A tenth of the waits at least; a process outside the job's roles (a launcher's shell
        // that once woke the trainer) a tenth of a second too: it is not news.
        let minor = !(k.is_worker || k.is_trainer || k.is_rank) && kept < 100_000_000;
        if total == 0 || kept * 10 < total || minor {
            continue;
        }
        let o = k.offcpu.clone().unwrap_or_default();
        let p99 = o
            .kept_waiting_p99_ns
            .map(|v| format!(", p99 {:.1} ms", v as f64 / 1e6))
            .unwrap_or_default();
        chain.at(
            f,
            k.started_ns.max(f.start_ns),
            format!(
                "{} kept the trainer waiting {:.2} s ({} waits{p99}){}{}",
                name(k),
                kept as f64 / 1e9,
                o.kept_waiting_count,
                doing(k),
                long_waits(f, &o)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(trainer_wait: u64, worker_reclaim: u64, worker_io: u64) -> Facts {
        let s = 1_000_000_000;
        let trainer = ProcFacts {
            pid: 10,
            comm: "python".into(),
            is_trainer: true,
            lifetime_ns: 10 * s,
            offcpu: Some(OffCpuSummary {
                data_wait_ns: Some(trainer_wait),
                data_wait_count: Some(20),
                ..Default::default()
            }),
            ..Default::default()
        };
        let worker = |pid, i, kept| ProcFacts {
            pid,
            comm: "pt_data_worker".into(),
            is_worker: true,
            worker_index: Some(i),
            lifetime_ns: 10 * s,
            reclaim_ns: if i == 1 { worker_reclaim } else { 0 },
            offcpu: Some(OffCpuSummary {
                kept_waiting_ns: kept,
                kept_waiting_count: 10,
                offcpu_io_ns: if i == 1 { worker_io } else { 0 },
                ..Default::default()
            }),
            ..Default::default()
        };
        Facts {
            end_ns: 10 * s,
            procs: vec![
                trainer,
                worker(11, 0, trainer_wait / 10),
                worker(12, 1, trainer_wait * 9 / 10),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_worker_that_delivered_late_is_named_with_what_held_it() {
        let f = facts(7_400_000_000, 6_000_000_000, 0);
        let c = clause(&f);
        assert!(c.contains("waited for data 74 %"), "{c}");
        assert!(c.contains("90 % of it for DataLoader worker 1 (pid 12)"), "{c}");
        assert!(c.contains("stalled 6.00 s in reclaim"), "{c}");
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        let text = chain.done().join("\n");
        assert!(text.contains("kept the trainer waiting 6.66 s"), "{text}");
        assert!(text.contains("DataLoader worker 0 (pid 11) kept"), "a tenth: {text}");
        assert!(!text.contains("over 10 ms"), "no long waits recorded: {text}");
    }

    /// A launcher's shell that once woke the trainer (20 ms) is not evidence; a worker with as
    /// little is, when it is a tenth of the waits.
    #[test]
    fn a_helper_outside_the_roles_needs_a_tenth_of_a_second_to_be_evidence() {
        let mut f = facts(100_000_000, 0, 0);
        f.procs.push(ProcFacts {
            pid: 13,
            comm: "bash".into(),
            lifetime_ns: 1_000_000_000,
            offcpu: Some(OffCpuSummary {
                kept_waiting_ns: 20_000_000,
                kept_waiting_count: 1,
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        let text = chain.done().join("\n");
        assert!(!text.contains("bash"), "{text}");
        assert!(
            text.contains("DataLoader worker 0 (pid 11) kept the trainer waiting 0.01 s"),
            "{text}"
        );
    }

    #[test]
    fn the_reclaim_inside_each_long_wait_is_told() {
        let mut f = facts(7_400_000_000, 6_000_000_000, 0);
        let worker = f.procs[2].offcpu.as_mut().expect("off-CPU figures");
        worker.long_waits = Some(crate::model::longwait::LongWaitSummary {
            count: 9,
            ns: 6_600_000_000,
            in_reclaim_ns: 5_400_000_000,
            longest_at_ns: 8_300_000_000,
            longest_ns: 740_000_000,
            longest_in_reclaim_ns: 600_000_000,
            largest_share_ns: 740_000_000,
        });
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        let text = chain.done().join("\n");
        assert!(
            text.contains("during the 9 waits over 10 ms it ended (6.60 s) it was itself stalled in reclaim 5.40 s, the longest wait 740 ms (ended +8.3s) with 600 ms of it in reclaim"),
            "{text}"
        );
    }

    #[test]
    fn a_disk_bound_pipeline_and_a_gpu_bound_job_read_differently() {
        let disk = clause(&facts(6_000_000_000, 0, 8_000_000_000));
        assert!(disk.contains("blocked 8.00 s on disk I/O"), "{disk}");
        assert!(!disk.contains("reclaim"), "{disk}");
        let mut gpu_bound = facts(200_000_000, 0, 0);
        gpu_bound.gpu_stalls.push(crate::model::gpu::StallEpisode {
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            start_ns: 0,
            end_ns: 3_000_000_000,
            duration_ns: 3_000_000_000,
            pids: vec![10],
            max_util_gpu_pct: 0,
            max_temperature_c: None,
            throttle_reasons: Vec::new(),
            attribution: crate::model::gpu::stall::Attribution::ProcessList,
        });
        let c = clause(&gpu_bound);
        assert!(c.contains("rarely waited for data (2 % of its time)"), "{c}");
        assert_eq!(clause(&facts(200_000_000, 0, 0)), "", "no stall to explain");
        assert_eq!(clause(&Facts::default()), "", "nothing measured");
    }

    /// The trainer's waits by syscall class: (class, all waits' ns, of them ended by the job).
    fn classes(f: &mut Facts, classes: &[(WaitClass, u64, u64)]) {
        let o = f.procs[0].offcpu.as_mut().expect("the trainer's figures");
        let by = classes
            .iter()
            .map(|&(c, ns, data_ns)| (c, ClassWait { ns, count: 20, data_ns, data_count: 20 }));
        o.wait_by_syscall = Some(by.collect());
    }

    #[test]
    fn a_wait_in_a_driver_that_a_worker_ended_is_no_wait_for_data() {
        let mut f = facts(7_400_000_000, 0, 0);
        classes(&mut f, &[(WaitClass::Ioctl, 7_400_000_000, 7_400_000_000)]);
        let c = clause(&f);
        assert!(
            c.contains(
                "the trainer (pid 10) waited in a device driver (ioctl) 74 % of its time: the GPU"
            ),
            "{c}"
        );
        assert!(!c.contains("waited for data"), "{c}");
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        let text = chain.done().join("\n");
        assert!(text.contains("waited in a device driver (ioctl) 7.40 s (74 % of its time, 20 waits, never a wait for data, even when a process of the job ended it)"), "{text}");
        assert!(!text.contains("waited for data"), "{text}");
        assert!(!text.contains("kept the trainer waiting"), "no worker is blamed: {text}");
    }

    #[test]
    fn a_wait_for_data_says_the_syscalls_it_blocked_in() {
        let mut f = facts(7_400_000_000, 0, 0);
        classes(
            &mut f,
            &[
                (WaitClass::Read, 6_000_000_000, 6_000_000_000),
                (WaitClass::Futex, 1_400_000_000, 1_400_000_000),
            ],
        );
        let c = clause(&f);
        assert!(
            c.contains("waited for data 74 % of its time, 90 % of it for DataLoader worker 1"),
            "{c}"
        );
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        let text = chain.done().join("\n");
        assert!(
            text.contains(
                "; blocked in a pipe/socket read 6.00 s, a futex (lock, queue, condition) 1.40 s)"
            ),
            "{text}"
        );
        assert!(text.contains("DataLoader worker 1 (pid 12) kept the trainer waiting"), "{text}");
    }

    #[test]
    fn a_pin_memory_thread_is_said_to_wait_for_its_trainer() {
        let mut f = facts(7_400_000_000, 0, 0);
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        assert!(!chain.done().join("\n").contains("pin-memory"));
        f.procs[0].pin_memory_thread = true;
        let mut chain = Chain(Vec::new());
        links(&f, &mut chain);
        let text = chain.done().join("\n");
        assert!(text.contains("through its pin-memory thread (pt_data_pin)"), "{text}");
    }

    #[test]
    fn a_wait_still_in_progress_counts_and_is_named() {
        let mut f = facts(500_000_000, 0, 0);
        assert_eq!(clause(&f), "", "5 %: under the share that makes it news");
        let o = f.procs[0].offcpu.as_mut().expect("figures");
        o.open_data_wait = Some(crate::model::offcpu::OpenWaitSummary {
            tid: 10,
            since_ns: 6_000_000_000,
            ns: 4_000_000_000,
            without_batch_ns: 4_000_000_000,
            blocks: 1,
            batches_put_aside: 0,
        });
        let c = clause(&f);
        assert!(c.contains("waited for data 45 %"), "{c}");
        assert!(c.contains("still waiting for data at the end, for 4.0 s"), "{c}");
        // Never above the whole of its time.
        f.procs[0].offcpu.as_mut().expect("figures").data_wait_ns = Some(20_000_000_000);
        assert!(clause(&f).contains("waited for data 100 %"), "{}", clause(&f));
    }
}
