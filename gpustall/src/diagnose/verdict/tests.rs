//! Each cause on hand-built facts, and the advice arithmetic.

use super::*;
use crate::diagnose::facts::{
    CgroupFacts, DiskFacts, FsFacts, KillerFacts, OomFacts, ProcFacts, Stuck,
};
use crate::model::gpu::stall::Attribution;
use crate::model::gpu::StallEpisode;

pub(super) const S: u64 = 1_000_000_000;

fn worker(pid: u32, i: usize, first_kb: u64, peak_kb: u64) -> ProcFacts {
    ProcFacts {
        pid,
        comm: "pt_data_worker".into(),
        is_worker: true,
        worker_index: Some(i),
        first_mem_kb: first_kb,
        first_mem_ns: S,
        peak_mem_kb: peak_kb,
        peak_mem_ns: 50 * S,
        last_mem_ns: 50 * S,
        alive: true,
        ..Default::default()
    }
}

fn trainer(pid: u32) -> ProcFacts {
    ProcFacts {
        pid,
        comm: "python".into(),
        is_trainer: true,
        first_mem_kb: 100_000,
        peak_mem_kb: 102_400,
        alive: true,
        ..Default::default()
    }
}

fn base() -> Facts {
    Facts { start_ns: 0, end_ns: 60 * S, ..Default::default() }
}

fn stall(start: u64, secs: u64, throttle: &[&str]) -> StallEpisode {
    StallEpisode {
        gpu_index: 0,
        gpu_uuid: "GPU-0".into(),
        start_ns: start,
        end_ns: start + secs * S,
        duration_ns: secs * S,
        pids: vec![10],
        max_util_gpu_pct: 0,
        max_temperature_c: Some(60),
        throttle_reasons: throttle.iter().map(|s| s.to_string()).collect(),
        attribution: Attribution::ProcessList,
    }
}

pub(super) fn memory_facts() -> Facts {
    let mut f = base();
    let mut w1 = worker(11, 0, 40_960, 307_200);
    w1.reclaim_count = 500;
    w1.reclaim_ns = 3 * S;
    w1.first_reclaim_ns = Some(30 * S);
    w1.swapout_pages = 40_000;
    w1.reclaim_io_bytes = 160 << 20;
    let mut w2 = worker(12, 1, 40_960, 204_800);
    w2.reclaim_count = 100;
    w2.reclaim_ns = S;
    w2.first_reclaim_ns = Some(31 * S);
    f.procs = vec![trainer(10), w1, w2];
    f.cgroup = Some(CgroupFacts {
        path: "/job".into(),
        limit_bytes: Some(512 << 20),
        peak_usage_bytes: 512 << 20,
        oom_kills: Some(1),
        ..Default::default()
    });
    f.pswpout = 41_000;
    f.gpu_stalls = vec![stall(35 * S, 20, &[])];
    f
}

#[test]
fn oom_kill_is_the_memory_cause_with_the_grower_first_and_evidence_in_time_order() {
    let mut f = memory_facts();
    f.oom_kills = vec![OomFacts {
        t_ns: 55 * S,
        victim_pid: 12,
        victim_comm: "pt_data_worker".into(),
        anon_rss_kb: Some(200_000),
        trigger_pid: 11,
        trigger_comm: "pt_data_worker".into(),
        killer: Some(KillerFacts { pid: 11, comm: "pt_data_worker".into(), si_code: 0x80 }),
    }];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "host_memory_oom");
    // The killer chose 12; 11 grew most (40 -> 300 MiB against 200): the cause comes first.
    assert_eq!(v.culprit_pids, vec![11, 12], "the largest grower, then the victim");
    assert!(v.text.starts_with("Memory cgroup /job (limit 512 MiB) ran out"), "{}", v.text);
    assert!(
        v.text.contains("the process that grew most was DataLoader worker 0 (pid 11)"),
        "{}",
        v.text
    );
    let joined = v.evidence.join("\n");
    assert!(joined.contains("grew from 40 MiB to 300 MiB held"), "{joined}");
    assert!(joined.contains("swapped out 40000 pages"), "{joined}");
    assert!(joined.contains("memory cgroup /job OOM killer chose pid 12"), "{joined}");
    assert!(joined.contains("GPU 0 idle"), "{joined}");
    let pos =
        |needle: &str| v.evidence.iter().position(|e| e.contains(needle)).unwrap_or(usize::MAX);
    assert!(
        pos("reclaim began") < pos("GPU 0 idle") && pos("GPU 0 idle") < pos("OOM killer"),
        "{joined}"
    );
    assert!(v.text.contains("GPU 0 sat idle 20.0 s"), "{}", v.text);
    assert!(v.text.contains("while the trainer (pid 10) held it"), "{}", v.text);
}

/// A GPU's idleness is told by the rank using it, as NVML listed it: "GPU 3 ... while rank 3
/// (pid 13) held it".
#[test]
fn a_stalled_gpu_names_the_rank_that_holds_it() {
    let mut f = memory_facts();
    let rank = ProcFacts {
        pid: 13,
        comm: "python".into(),
        is_rank: true,
        rank: Some(3),
        ..Default::default()
    };
    f.procs.push(rank);
    f.gpu_stalls = vec![StallEpisode { gpu_index: 3, pids: vec![13], ..stall(20 * S, 20, &[]) }];
    let v = decide(&f);
    assert!(
        v.text.contains("GPU 3 sat idle 20.0 s from +20.0s while rank 3 (pid 13) held it"),
        "{}",
        v.text
    );
    let joined = v.evidence.join("\n");
    assert!(
        joined.contains("GPU 3 idle (<= threshold) for 20.0 s while rank 3 (pid 13) held it"),
        "{joined}"
    );
}

/// A job that moved itself into a memory cgroup and was killed before gpustall read it: the
/// kernel's OOM report names the cgroup, and the verdict says so instead of "Host memory".
#[test]
fn the_kernels_oom_report_names_a_cgroup_gpustall_did_not_read_in_time() {
    let mut f = memory_facts();
    f.cgroup = None;
    f.oom_kills = vec![OomFacts {
        t_ns: 55 * S,
        victim_pid: 12,
        victim_comm: "pt_data_worker".into(),
        anon_rss_kb: Some(200_000),
        trigger_pid: 12,
        trigger_comm: "pt_data_worker".into(),
        killer: None,
    }];
    assert!(decide(&f).text.starts_with("Host memory ran out"), "{}", decide(&f).text);
    // As the kernel log's reader keeps `oom-kill:constraint=CONSTRAINT_MEMCG,...` (kmsg.rs).
    f.kernel_log = vec![crate::model::kernlog::KernelLogLine {
        t_ns: 55 * S,
        seq: 1,
        what: crate::model::kernlog::LogWhat::OomCgroup,
        pid: Some(12),
        comm: Some("pt_data_worker".into()),
        device: Some("/slurm_n/uid_0/job_7".into()),
        xid: None,
        text: "oom-kill:constraint=CONSTRAINT_MEMCG,...".into(),
        origin: crate::model::kernlog::LogOrigin::Kernel,
        count: 1,
        last_t_ns: None,
    }];
    let v = decide(&f);
    assert!(
        v.text.starts_with("Memory cgroup /slurm_n/uid_0/job_7 (named by the kernel's OOM report"),
        "{}",
        v.text
    );
}

/// `n` workers of `parent`, alive from `from` to `to` seconds.
#[test]
fn a_parents_limit_and_the_kernels_memory_events_are_named() {
    // A Slurm step in /job/step_0 with no limit of its own; /job has 512 MiB.
    let mut f = memory_facts();
    f.oom_kills = vec![OomFacts {
        t_ns: 55 * S,
        victim_pid: 11,
        victim_comm: "pt_data_worker".into(),
        anon_rss_kb: Some(300_000),
        trigger_pid: 11,
        trigger_comm: "pt_data_worker".into(),
        killer: None,
    }];
    let c = f.cgroup.as_mut().expect("fixture");
    c.path = "/job/step_0".into();
    c.limit_set_by = Some("/job".into());
    c.events = Some(crate::model::host::MemEvents {
        max: 1234,
        oom: 3,
        oom_kill: 3,
        ..Default::default()
    });
    c.pressure = Some(crate::model::host::PsiDelta {
        some_us: 2_500_000,
        full_us: 1_000_000,
        peak_some_avg10: 40.0,
        peak_full_avg10: 12.0,
    });
    let v = decide(&f);
    assert!(
        v.text.starts_with("Memory cgroup /job/step_0 (limit 512 MiB, set by /job) ran out"),
        "{}",
        v.text
    );
    let joined = v.evidence.join("\n");
    assert!(joined.contains("of the 512 MiB limit set by its ancestor /job"), "{joined}");
    assert!(
        joined.contains("memory cgroup /job hit its limit 1,234 times (memory.events max), 3 OOM (reclaim could not make room), 3 OOM kills"),
        "{joined}"
    );
    assert!(
        joined.contains("in memory cgroup /job/step_0: some task waited for memory 2.50 s"),
        "{joined}"
    );
    let advice = v.advice.join("\n");
    assert!(advice.contains("against the 512 MiB limit set by /job"), "{advice}");
    assert!(advice.contains("the limit is /job's: raise it there"), "{advice}");
}

fn generation(
    parent: u32,
    first_pid: u32,
    n: u32,
    from: u64,
    to: u64,
    peak_kb: u64,
) -> Vec<ProcFacts> {
    (0..n)
        .map(|i| ProcFacts {
            ppid: parent,
            started_ns: from * S,
            exit_ns: Some(to * S),
            alive: false,
            // Each stalled in reclaim and swapped: memory pressure.
            reclaim_count: 10,
            reclaim_ns: S,
            swapout_pages: 10_000,
            ..worker(first_pid + i, i as usize, 40_000, peak_kb)
        })
        .collect()
}

#[test]
fn three_epochs_of_three_non_persistent_workers_are_num_workers_3() {
    let mut f = memory_facts();
    let mut procs = vec![trainer(10)];
    for (e, first_pid) in [(0u64, 20u32), (1, 30), (2, 40)] {
        procs.extend(generation(10, first_pid, 3, 10 * e, 10 * e + 9, 100_000));
    }
    f.procs = procs;
    let a = decide(&f).advice.join("\n");
    assert!(a.contains("num_workers=3 (workers restarted: 9 worker processes"), "{a}");
    assert!(!a.contains("num_workers=9"), "{a}");
}

#[test]
fn two_ranks_each_with_three_workers_get_advice_per_rank_and_for_the_job() {
    let mut f = memory_facts();
    let rank = |pid| ProcFacts { is_trainer: false, is_rank: true, ppid: 5, ..trainer(pid) };
    let mut procs = vec![rank(10), rank(11)];
    procs.extend(generation(10, 20, 3, 0, 60, 60_000));
    procs.extend(generation(11, 30, 3, 0, 60, 50_000));
    f.procs = procs;
    let v = decide(&f);
    let a = v.advice.join("\n");
    assert!(a.contains("pid 10's DataLoader: num_workers=3"), "{a}");
    assert!(a.contains("pid 11's DataLoader: num_workers=3"), "{a}");
    // Both ranks' memory counts: 2 x 100 + 3 x 58.6 + 3 x 48.8 MiB.
    assert!(a.contains("the job: 2 ranks 200 MiB + 2 DataLoaders' workers = 522 MiB"), "{a}");
    // (460.8 - 200) MiB left / (58.6 + 48.8) MiB per worker pair: 2 per DataLoader.
    assert!(a.contains("per DataLoader num_workers <= 2 fits"), "{a}");
    assert_eq!(v.advice_num_workers, Some(2), "the count, for scripts");
}

#[test]
fn forkserver_started_workers_are_advised_as_their_owners_dataloader() {
    // Two ranks, each with a forkserver (pids 15, 16) that started its workers: the workers'
    // parent is the forkserver, their DataLoader the rank's.
    let mut f = memory_facts();
    let rank = |pid| ProcFacts { is_trainer: false, is_rank: true, ppid: 5, ..trainer(pid) };
    let mut procs = vec![rank(10), rank(11)];
    for (owner, forkserver, first) in [(10, 15, 20), (11, 16, 30)] {
        procs.extend(
            generation(forkserver, first, 3, 0, 60, 60_000)
                .into_iter()
                .map(|w| ProcFacts { dataloader_pid: Some(owner), ..w }),
        );
    }
    f.procs = procs;
    let a = decide(&f).advice.join("\n");
    assert!(a.contains("pid 10's DataLoader: num_workers=3"), "{a}");
    assert!(a.contains("pid 11's DataLoader: num_workers=3"), "{a}");
    assert!(!a.contains("pid 15"), "the forkserver is no DataLoader: {a}");
}

#[test]
fn advice_computes_the_worker_count_that_fits() {
    let v = decide(&memory_facts());
    assert_eq!(v.cause.as_str(), "host_memory_pressure");
    // 512 MiB x 0.9 = 460.8 MiB budget; trainer 100 MiB; 300 MiB per worker: 1 fits.
    let a = v.advice.join("\n");
    assert!(a.contains("num_workers=2"), "{a}");
    assert!(a.contains("num_workers <= 1 fits"), "{a}");
    // A helper with a little memory and no reclaim is not a culprit.
    let mut f = memory_facts();
    f.procs.push(ProcFacts {
        pid: 99,
        comm: "python3".into(),
        first_mem_kb: 10_000,
        peak_mem_kb: 12_000,
        alive: true,
        ..Default::default()
    });
    assert!(!decide(&f).culprit_pids.contains(&99));
    assert!(a.contains("kept growing"), "{a}");
}

#[test]
fn without_a_cgroup_limit_the_memory_advice_names_host_memory_and_one_worker() {
    // One worker, the host's 1024 MiB and no cgroup limit.
    let mut f = memory_facts();
    f.procs.truncate(2);
    f.cgroup.as_mut().expect("cgroup").limit_bytes = None;
    f.host_mem_total_kb = Some(1024 * 1024);
    let a = decide(&f).advice.join("\n");
    assert!(a.contains("+ 1 worker x up to 300 MiB"), "{a}");
    assert!(a.contains("against host memory (1024 MiB)"), "{a}");
    assert!(a.contains("the one worker kept growing until its last sample"), "{a}");
    assert!(!a.contains("MiB limit") && !a.contains("1 workers"), "{a}");
}

#[test]
fn full_filesystem_is_disk_full() {
    let mut f = base();
    f.procs = vec![trainer(10)];
    f.filesystems = vec![FsFacts {
        path: "/dev/shm".into(),
        used_pct: 99.5,
        avail_bytes: 1 << 20,
        total_bytes: 64 << 20,
    }];
    assert_eq!(decide(&f).cause.as_str(), "disk_full");
}

#[test]
fn stopped_trainer_is_hung() {
    let mut f = base();
    let mut t = trainer(10);
    t.stuck = Some(Stuck { state: 'T', wchan: "do_signal_stop".into(), since_ns: 40 * S });
    f.procs = vec![t];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "process_hung");
    assert!(v.evidence[0].contains("stopped (T) in do_signal_stop for 20.0 s"), "{:?}", v.evidence);
    // A short stop is not a hang.
    f.procs[0].stuck = Some(Stuck { state: 'T', wchan: String::new(), since_ns: 59 * S });
    assert_eq!(decide(&f).cause.as_str(), "none_detected");
}

#[test]
fn throttled_gpu_without_host_cause() {
    let mut f = base();
    f.procs = vec![trainer(10)];
    f.gpu_stalls = vec![stall(5 * S, 10, &["hw_thermal_slowdown"])];
    f.gpu_throttle_reasons = vec!["hw_thermal_slowdown".into()];
    f.gpu_throttled_samples = 50;
    f.gpu_samples = 120;
    assert_eq!(decide(&f).cause.as_str(), "gpu_throttling");
}

#[test]
fn waiting_on_own_reads_is_disk_bound_not_memory() {
    let mut f = base();
    let mut t = trainer(10);
    t.read_bytes = 2 << 30;
    t.io_wait_ns = 45 * S;
    t.lifetime_ns = 60 * S;
    f.procs = vec![t];
    f.disks = vec![DiskFacts { name: "vda".into(), busy_pct: 95.0, peak_busy_pct: 100.0 }];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "disk_io_bound");
    assert!(v.evidence.iter().any(|e| e.contains("no memory pressure")), "{:?}", v.evidence);
}

#[test]
fn idle_job_during_a_gpu_stall_is_a_deadlock_but_idle_without_a_stall_is_nothing() {
    let mut f = base();
    let mut t = trainer(10);
    t.idle_since_ns = Some(20 * S);
    f.procs = vec![t];
    assert_eq!(decide(&f).cause.as_str(), "none_detected");
    f.gpu_stalls = vec![stall(21 * S, 30, &[])];
    assert_eq!(decide(&f).cause.as_str(), "deadlock");
}

#[test]
fn a_sigkill_from_user_space_is_its_own_cause_naming_the_sender() {
    let mut f = base();
    let mut w = worker(11, 0, 40_960, 51_200);
    w.alive = false;
    w.exit_signal = Some(9);
    w.killed_by = Some(KillerFacts { pid: 777, comm: "systemd-oomd".into(), si_code: 0 });
    w.killed_ns = Some(30 * S);
    f.procs = vec![trainer(10), w.clone()];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "process_killed");
    assert_eq!(v.culprit_pids, vec![777], "the sender, not the victim");
    assert!(v.text.contains("killed by SIGKILL from pid 777 (systemd-oomd)"), "{}", v.text);
    assert!(v.evidence.iter().any(|e| e.contains("+30.0s")), "{:?}", v.evidence);
    // The kernel's own SIGKILL of an OOM victim stays an OOM kill, not this.
    w.killed_by = Some(KillerFacts { pid: 11, comm: "pt_data_worker".into(), si_code: 0x80 });
    f.procs = vec![trainer(10), w];
    assert_ne!(decide(&f).cause.as_str(), "process_killed");
}

#[test]
fn swap_ins_without_own_reclaim_are_memory_pressure_not_disk() {
    let mut f = base();
    let job = ProcFacts {
        major_faults: 2_500,
        read_bytes: 90 << 20,
        io_wait_ns: 40 * S,
        lifetime_ns: 60 * S,
        ..trainer(10)
    };
    f.procs = vec![job.clone()];
    f.pswpin = 21_000;
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "host_memory_pressure", "{}", v.text);
    assert!(v.text.contains("faults back in (2500 major faults, about 78 MiB"), "{}", v.text);
    // The same reads with no swap-in on the host: the job's own data, disk-bound.
    f.pswpin = 0;
    assert_eq!(decide(&f).cause.as_str(), "disk_io_bound");
}

#[test]
fn a_worker_dead_of_sigbus_with_a_small_dev_shm_is_a_bus_error_not_oom() {
    let mut f = base();
    let mut w = worker(11, 0, 40_000, 60_000);
    w.exit_signal = Some(7);
    w.exit_ns = Some(20 * S);
    w.alive = false;
    f.procs = vec![trainer(10), w];
    f.filesystems = vec![FsFacts {
        path: "/dev/shm".into(),
        used_pct: 12.0,
        avail_bytes: 7 << 20,
        total_bytes: 8 << 20,
    }];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "bus_error");
    assert_eq!(v.culprit_pids, vec![11]);
    assert!(
        v.text.contains("/dev/shm, where DataLoader workers put their batches, is only 8 MiB"),
        "{}",
        v.text
    );
    assert!(v.advice.join(" ").contains("--shm-size"), "{:?}", v.advice);
    // Never read (the job ended first): said so, not guessed from another mount.
    f.filesystems.clear();
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "bus_error");
    assert!(v.text.contains("/dev/shm of the job's mount namespace was not read"), "{}", v.text);
}

/// A kept kernel-log line, as `sources::kmsg` classifies the real line `text`.
pub(super) fn log_line(t: u64, text: &str) -> crate::model::kernlog::KernelLogLine {
    use crate::model::kernlog::{KernelLogLine, LogWhat};
    let (what, pid, comm, device, xid) = match text {
        t if t.contains("): 45,") => {
            (LogWhat::GpuXid, Some(11), Some("python3"), Some("0000:3b:00"), Some(45))
        }
        t if t.contains("): 79,") => {
            (LogWhat::GpuXid, Some(11), Some("python3"), Some("0000:3b:00"), Some(79))
        }
        t if t.starts_with("INFO: task") => {
            (LogWhat::HungTask, Some(11), Some("pt_data_worker"), None, None)
        }
        t if t.ends_with(" OK") => (LogWhat::RemoteFsUp, None, None, Some("nas1"), None),
        _ => (LogWhat::RemoteFsDown, None, None, Some("nas1"), None),
    };
    KernelLogLine {
        t_ns: t,
        seq: t,
        what,
        pid,
        comm: comm.map(Into::into),
        device: device.map(Into::into),
        xid,
        text: text.into(),
        origin: crate::model::kernlog::LogOrigin::Kernel,
        count: 1,
        last_t_ns: None,
    }
}

#[test]
fn a_gpu_xid_is_the_cause_before_the_memory_chain_and_a_cleanup_xid_is_only_evidence() {
    let mut f = memory_facts();
    let first = decide(&f).cause;
    f.kernel_log =
        vec![log_line(20 * S, "NVRM: Xid (PCI:0000:3b:00): 45, pid=11, name=python3, Ch 00000010")];
    let v = decide(&f);
    assert_eq!(v.cause, first, "Xid 45 follows another fault: no verdict of its own");
    assert!(v.evidence.iter().any(|e| e.contains("Xid (PCI:0000:3b:00): 45")), "{v:#?}");
    f.kernel_log.push(log_line(
        30 * S,
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=11, name=python3, GPU has fallen off the bus.",
    ));
    let v = decide(&f);
    assert_eq!(v.cause, Cause::GpuFault, "{v:#?}");
    assert!(
        v.text.contains("Xid 79 in the kernel log at +30.0s") && v.text.contains("fallen off"),
        "{}",
        v.text
    );
    assert!(v.advice[0].contains("drain the node"), "{:?}", v.advice);
    // Without the kernel log (a container without /dev/kmsg): NVML's own event.
    f.kernel_log.clear();
    f.gpu_xids = vec![crate::model::gpu::GpuXid {
        t_ns: 12 * S,
        index: 1,
        uuid: "GPU-1".into(),
        pci_bus_id: Some("0000:ca:00".into()),
        xid: 119,
    }];
    let v = decide(&f);
    assert_eq!(v.cause, Cause::GpuFault, "{v:#?}");
    assert!(
        v.text
            .contains("The GPU 1 (GPU-1, PCI 0000:ca:00) reported Xid 119 through NVML at +12.0s"),
        "{}",
        v.text
    );
    assert!(v.text.contains("driver side") && v.advice[0].contains("reset the GPU"), "{v:#?}");
}

#[test]
fn a_hung_task_report_names_the_process_and_the_storage_the_kernel_blamed() {
    let mut f = base();
    f.procs = vec![trainer(10), worker(11, 0, 1000, 1000)];
    f.kernel_log = vec![
        log_line(5 * S, "nfs: server nas1 not responding, still trying"),
        log_line(9 * S, "INFO: task pt_data_worker:11 blocked for more than 2 seconds."),
    ];
    // The storage error comes first: it explains the hung task.
    let v = decide(&f);
    assert_eq!(v.cause, Cause::StorageError, "{v:#?}");
    assert!(
        v.text.contains(
            "a server not responding on nas1 from +5.0s and had not answered 55.0 s later"
        ),
        "{}",
        v.text
    );
    f.kernel_log.push(log_line(20 * S, "nfs: server nas1 OK"));
    assert!(decide(&f).text.contains("for 15.0 s, then answered again"));
    f.kernel_log.retain(|l| l.what == crate::model::kernlog::LogWhat::HungTask);
    let v = decide(&f);
    assert_eq!(v.cause, Cause::HungTask, "{v:#?}");
    assert_eq!(v.culprit_pids, vec![11]);
    assert!(
        v.text.contains("DataLoader worker 0 (pid 11) blocked in uninterruptible sleep"),
        "{}",
        v.text
    );
}

/// A trainer waiting for data for the last 12 s of 20, and of its 4 workers worker 2 not run
/// since 1 s before that wait began; the others woke on their queues' timeouts.
#[test]
fn the_worker_a_hung_trainer_waits_for_is_named_from_its_open_wait() {
    use crate::diagnose::facts::Asleep;
    use crate::model::offcpu::{OffCpuSummary, OpenWaitSummary};
    let mut f = Facts { start_ns: 0, end_ns: 20 * S, ..Default::default() };
    let mut t = trainer(10);
    t.lifetime_ns = 20 * S;
    t.offcpu = Some(OffCpuSummary {
        data_wait_ns: Some(S / 10),
        open_data_wait: Some(OpenWaitSummary {
            tid: 10,
            since_ns: 8 * S,
            ns: 12 * S,
            without_batch_ns: 12 * S,
            blocks: 3,
            batches_put_aside: 0,
        }),
        ..Default::default()
    });
    f.procs = vec![t];
    for i in 0..4 {
        let mut w = worker(11 + i as u32, i, 1000, 1000);
        w.ppid = 10;
        w.lifetime_ns = 19 * S;
        if i == 2 {
            w.asleep = Some(Asleep { wchan: "futex_wait_queue".into(), since_ns: 7 * S });
        }
        f.procs.push(w);
    }
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "deadlock", "{}", v.text);
    assert_eq!(v.culprit_pids, vec![13]);
    assert!(v.text.contains("has waited for data 12.0 s (since +8.0s)"), "{}", v.text);
    assert!(v.text.contains("has not run since +7.0s (asleep in futex_wait_queue)"), "{}", v.text);
    assert!(v.advice.join(" ").contains("py-spy dump --pid 13"), "{:?}", v.advice);
    // Asleep only since well after the wait began: it stopped because no index came, not
    // the other way round.
    f.procs[3].asleep = Some(Asleep { wchan: String::new(), since_ns: 15 * S });
    assert_ne!(decide(&f).cause.as_str(), "deadlock");
}

/// A worker blocked on I/O 90 % of its time under a cgroup read limit: the limit is the cause.
/// Without the limit the same waits are not "no disk wait".
#[test]
fn reads_held_by_a_cgroup_limit_are_io_throttled_and_never_called_no_disk_wait() {
    use crate::model::host::IoLimit;
    use crate::model::offcpu::OffCpuSummary;
    let mut f = Facts { start_ns: 0, end_ns: 10 * S, ..Default::default() };
    let mut w = worker(11, 0, 1000, 1000);
    w.lifetime_ns = 10 * S;
    w.read_bytes = 80 << 20;
    w.read_bytes_from_proc = true;
    w.offcpu = Some(OffCpuSummary { offcpu_io_ns: 9 * S, ..Default::default() });
    f.procs = vec![trainer(10), w];
    f.io_limits = vec![IoLimit {
        path: "/system.slice/train.service".into(),
        dev: "7:0".into(),
        device: Some("loop0".into()),
        rbps: Some(8 << 20),
        ..Default::default()
    }];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "io_throttled", "{}", v.text);
    assert!(v.text.contains("IOReadIOPSMax= of train.service"), "{}", v.text);
    assert!(v.text.contains("limits loop0 to 8.0 MiB/s of reads"), "{}", v.text);
    assert!(v.text.contains("read 80 MiB at 8.0 MiB/s, 100 % of the limit"), "{}", v.text);
    f.io_limits.clear();
    let v = decide(&f);
    assert!(!v.text.contains("disk wait"), "{}", v.text);
}

#[test]
fn a_trainer_slow_to_receive_its_batches_is_advised_smaller_ones_not_more_workers() {
    use crate::model::offcpu::OffCpuSummary;
    use crate::model::pystacks::Receiving;
    let mut f = Facts { procs: vec![trainer(10)], ..base() };
    let receiving = Receiving {
        ns: 3_000_000_000,
        samples_inside: 30,
        samples_on_cpu: 100,
        wall_time_weighted: false,
    };
    f.procs[0].receiving = Some(receiving);
    f.procs[0].offcpu =
        Some(OffCpuSummary { data_wait_ns: Some(2_000_000_000), ..Default::default() });
    let v = decide(&f);
    let advice = v.advice.join("\n");
    assert!(advice.contains("receiving its batches took"), "{v:#?}");
    assert!(advice.contains("60 % of its time fetching data"), "{advice}");
    f.procs[0].receiving = Some(Receiving { ns: 200_000_000, ..receiving });
    assert!(!decide(&f).advice.join("\n").contains("receiving its batches"));
}

#[test]
fn nothing_found_names_a_process_that_waited_on_io_but_not_a_short_helper() {
    let mut f = base();
    // ldconfig, blocked on I/O for most of its 5 ms: no news.
    let helper = ProcFacts {
        pid: 12,
        comm: "ldconfig".into(),
        lifetime_ns: 5_000_000,
        io_wait_ns: 4_000_000,
        ..Default::default()
    };
    f.procs = vec![ProcFacts { lifetime_ns: 60 * S, ..trainer(10) }, helper];
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "none_detected");
    assert!(v.text.contains("hung process, disk wait or GPU"), "{}", v.text);
    // The trainer blocked on I/O 20 % of its minute: said, with its name, and no "no disk wait".
    f.procs[0].io_wait_ns = 12 * S;
    let v = decide(&f);
    assert!(!v.text.contains("disk wait"), "{}", v.text);
    assert!(v.text.contains("(pid 10) was blocked on I/O 20 % of its time"), "{}", v.text);
    assert!(v.text.contains("short of the half"), "{}", v.text);
    // 90 % with no block request of its own counted (NFS, a throttle unknown): not "short".
    f.procs[0].io_wait_ns = 54 * S;
    let v = decide(&f);
    assert_eq!(v.cause.as_str(), "none_detected");
    assert!(v.text.contains("90 % of its time, yet no block I/O of the job's"), "{}", v.text);
}

/// The findings apart from their wording: /dev/shm's state from its fullest sample, each
/// sender of a user-space SIGKILL once, and the swap-in bound (the least of three).
#[test]
fn the_findings_are_figures_before_they_are_words() {
    use super::rules::{bus_errors, swap_ins, user_kills, Shm};
    let mut f = base();
    let mut w = worker(11, 0, 1, 1);
    (w.exit_signal, w.exit_ns, w.alive) = (Some(7), Some(20 * S), false);
    f.procs = vec![trainer(10), w];
    let shm = |used_pct: f64, total_mib: u64| FsFacts {
        path: "/dev/shm".into(),
        used_pct,
        avail_bytes: (total_mib << 20) / 10,
        total_bytes: total_mib << 20,
    };
    let cases = [
        (Some(shm(95.0, 8192)), "full"),
        (Some(shm(12.0, 64)), "small"),
        (Some(shm(12.0, 8192)), "room"),
        (None, "unread"),
    ];
    for (fs, want) in cases {
        f.filesystems = fs.into_iter().collect();
        let b = bus_errors(&f).expect("a SIGBUS");
        let got = match b.shm {
            Shm::Full(_) => "full",
            Shm::Small(_) => "small",
            Shm::Room(_) => "room",
            Shm::Unread { ended_ns } => {
                assert_eq!(ended_ns, 20 * S, "the job's last exit");
                "unread"
            }
        };
        assert_eq!((got, b.t_ns, b.hit.len()), (want, 20 * S, 1));
    }

    let killed = |pid, by| ProcFacts {
        exit_signal: Some(9),
        killed_by: Some(KillerFacts { pid: by, comm: "oomd".into(), si_code: 0 }),
        killed_ns: Some(5 * S),
        ..worker(pid, 0, 1, 1)
    };
    f.procs = vec![trainer(10), killed(11, 500), killed(12, 600), killed(13, 500)];
    assert_eq!(user_kills(&f).expect("killed").senders, vec![500, 600]);

    let mut t = trainer(10);
    (t.major_faults, t.read_bytes) = (10_000, 200 << 20);
    f.procs = vec![t];
    // 10,000 faults x 8 pages of readahead, 51,200 pages read, 30,000 the host swapped in.
    f.pswpin = 30_000;
    assert_eq!(swap_ins(&f).expect("swap-ins").bytes, 30_000 * 4096);
    // 40 MiB: under the 64 MiB that makes pressure.
    f.pswpin = 10_000;
    assert!(swap_ins(&f).is_none());
}
