//! The pipeline causes on hand-built facts: each told apart from the others and from the
//! memory chain, and the worker-count arithmetic.

use super::*;
use crate::diagnose::facts::CgroupFacts;
use crate::diagnose::verdict::decide;
use crate::model::longwait::LongWaitSummary;
use crate::model::offcpu::OffCpuSummary;

const S: u64 = 1_000_000_000;

/// A trainer that waited `wait` of 10 s, and `n` workers each on CPU `cpu` ns of 10 s, in the
/// run queue `runq` ns.
fn job(wait: u64, n: usize, cpu: u64, runq: u64) -> Facts {
    let trainer = ProcFacts {
        pid: 10,
        comm: "python".into(),
        is_trainer: true,
        lifetime_ns: 10 * S,
        cpu_ns: Some(S / 2),
        cpu_span_ns: 10 * S,
        peak_mem_kb: 1024 * 1024,
        offcpu: Some(OffCpuSummary {
            data_wait_ns: Some(wait),
            data_wait_count: Some(100),
            offcpu_wait_ns: wait,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut procs = vec![trainer];
    for i in 0..n {
        procs.push(ProcFacts {
            pid: 11 + i as u32,
            ppid: 10,
            comm: "pt_data_worker".into(),
            is_worker: true,
            worker_index: Some(i),
            dataloader_pid: Some(10),
            lifetime_ns: 10 * S,
            cpu_ns: Some(cpu),
            cpu_span_ns: 10 * S,
            peak_mem_kb: 480 * 1024,
            readings: 10,
            offcpu: Some(OffCpuSummary {
                kept_waiting_ns: wait / n as u64,
                kept_waiting_count: 50,
                runqueue_ns: runq,
                offcpu_wait_ns: (10 * S).saturating_sub(cpu + runq),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    Facts {
        start_ns: 0,
        end_ns: 10 * S,
        procs,
        cgroup: Some(CgroupFacts {
            path: "/job".into(),
            limit_bytes: Some(7 << 30),
            ..Default::default()
        }),
        cpu: Some(CpuFacts { online_cpus: 8, span_ns: 10 * S, ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn busy_workers_and_a_waiting_trainer_are_a_cpu_bound_pipeline_with_a_worker_count() {
    // 2 workers on CPU 95 %, the trainer waited 64 %.
    let v = decide(&job(6_400_000_000, 2, 9_500_000_000, 100_000_000));
    assert_eq!(v.cause, Cause::CpuBoundPipeline, "{v:#?}");
    assert!(v.text.contains("waited for data 64 %"), "{}", v.text);
    assert_eq!(v.culprit_pids, vec![11, 12]);
    let a = v.advice.join("\n");
    // 2 / (1 - 0.64) = 5.6: 6 workers, 6 x 0.95 + 0.5 / 0.36 (at most 1) = 6.7 of 8 CPUs.
    assert!(a.starts_with("num_workers=6 would keep up"), "{a}");
    assert!(a.contains("6 x 480 MiB fits the 7168 MiB limit"), "{a}");
    assert_eq!(v.advice_num_workers, Some(6), "the count, for scripts");
    assert!(
        v.evidence.iter().any(|e| e.contains("was on CPU 9.50 s of its 10.00 s (95 %)")),
        "{:#?}",
        v.evidence
    );
    assert!(!v.evidence.iter().any(|e| e.contains("summed over its threads")), "{:#?}", v.evidence);
    // A worker whose queue feeder thread sat blocked all along: its off-CPU times exceed its life.
    let mut f = job(6_400_000_000, 1, 8_000_000_000, 0);
    f.procs[1].offcpu.as_mut().expect("offcpu").offcpu_wait_ns = 12 * S;
    let v = decide(&f);
    assert!(
        v.evidence.iter().any(|e| e.contains(
            "blocked on events 12.00 s and on I/O 0.00 s (off-CPU times summed over its threads)"
        )),
        "{:#?}",
        v.evidence
    );
}

/// 4 workers, of which worker 2's samples cost 30 times the others': it ends nearly every wait.
#[test]
fn one_worker_that_ends_most_waits_is_a_straggler_not_a_cpu_bound_pipeline() {
    let mut f = job(6_000_000_000, 4, S, 0);
    let kept = [100_000_000, 200_000_000, 5_500_000_000, 100_000_000];
    for (p, k) in f.procs[1..].iter_mut().zip(kept) {
        p.offcpu.as_mut().expect("offcpu").kept_waiting_ns = k;
    }
    f.procs[3].cpu_ns = Some(9 * S);
    f.procs[3].offcpu.as_mut().expect("offcpu").offcpu_wait_ns = S;
    let v = decide(&f);
    assert_eq!(v.cause, Cause::StragglerWorker, "{v:#?}");
    assert_eq!(v.culprit_pids, vec![13]);
    assert!(
        v.text.contains("ended 5.50 s of those waits against 0.40 s for the other 3 workers"),
        "{}",
        v.text
    );
    assert!(v.text.contains("on CPU 90 % of its time against the others' 10 %"), "{}", v.text);
    let a = v.advice.join("\n");
    assert!(a.contains("in_order=False") && a.contains("py-spy dump --pid 13"), "{a}");
    assert_eq!(v.advice_num_workers, None);
    // Shared evenly, the same waits are the pipeline's as a whole.
    for p in f.procs[1..].iter_mut() {
        p.offcpu.as_mut().expect("offcpu").kept_waiting_ns = 1_500_000_000;
        p.cpu_ns = Some(9 * S);
    }
    assert_eq!(decide(&f).cause, Cause::CpuBoundPipeline);
}

const MS: u64 = 1_000_000;

/// Sets each worker's (kept, count, longest wait it ended, its largest share of one wait) and
/// decides.
fn decide_with_waits(f: &mut Facts, waits: [(u64, u64, u64, u64); 4]) -> Verdict {
    for (p, (k, n, max, share)) in f.procs[1..].iter_mut().zip(waits) {
        let o = p.offcpu.as_mut().expect("offcpu");
        (o.kept_waiting_ns, o.kept_waiting_count, o.kept_waiting_max_ns) = (k, n, Some(max));
        o.long_waits = Some(LongWaitSummary { largest_share_ns: share, ..Default::default() });
    }
    decide(f)
}

/// CI's torchrun straggler (forkserver workers, 2 CPUs): workers 0 and 1 delivered their
/// first batches together after 6.2 s of start-up, and the kernel charged that wait half to
/// each; worker 1's half is no wait it ended, so its own longest does not cover it. The
/// straggler is worker 2, whose 25 waits are its steady lead.
#[test]
fn a_start_up_wait_two_workers_shared_is_no_ones_steady_lead() {
    let mut f = job(10_080 * MS, 4, S, 0);
    f.procs[3].cpu_ns = Some(9 * S);
    let v = decide_with_waits(
        &mut f,
        [
            (3_080 * MS, 3, 6_160 * MS, 3_080 * MS),
            (3_080 * MS, 1, 2 * MS, 3_080 * MS),
            (3_520 * MS, 25, 150 * MS, 150 * MS),
            (400 * MS, 10, 60 * MS, 60 * MS),
        ],
    );
    assert_eq!((v.cause, &v.culprit_pids), (Cause::StragglerWorker, &vec![13]), "{v:#?}");
    let start_up = "(6.22 s of it their first batches: the workers' start-up)";
    assert!(v.text.contains(start_up), "{}", v.text);
    // Another run: the straggler itself ended a 6.4 s start-up wait shared with worker 3.
    // Half of it was its part, not the whole wait (its 24 waits kept it 6.59 s).
    let v = decide_with_waits(
        &mut f,
        [
            (212 * MS, 6, 409 * MS, 204 * MS),
            (8 * MS, 4, 4 * MS, 4 * MS),
            (6_590 * MS, 24, 6_400 * MS, 3_200 * MS),
            (3_210 * MS, 8, 3 * MS, 3_200 * MS),
        ],
    );
    assert_eq!((v.cause, &v.culprit_pids), (Cause::StragglerWorker, &vec![13]), "{v:#?}");
}

/// Non-persistent workers: 2 at a time over 3 epochs, 6 processes, each on CPU 80 % of its
/// life. The pipeline had 2 workers at 0.8 CPU each, not 6 at 0.27.
#[test]
fn workers_restarted_every_epoch_count_as_those_alive_at_once() {
    let mut f = job(6_000_000_000, 6, 0, 0);
    let third = 10 * S / 3;
    for (i, p) in f.procs[1..].iter_mut().enumerate() {
        let epoch = (i / 2) as u64;
        p.started_ns = epoch * third;
        p.exit_ns = Some((epoch + 1) * third - 1);
        p.lifetime_ns = third - 1;
        p.cpu_ns = Some(third * 8 / 10);
        p.cpu_span_ns = third - 1;
        p.worker_index = Some(i % 2);
        let o = p.offcpu.as_mut().expect("offcpu");
        o.offcpu_wait_ns = third / 5;
    }
    let v = decide(&f);
    assert_eq!(v.cause, Cause::CpuBoundPipeline, "{v:#?}");
    assert!(
        v.text.contains("2 DataLoader workers at a time (6 worker processes in all"),
        "{}",
        v.text
    );
    assert!(v.text.contains("(1.60 CPUs together)"), "{}", v.text);
    let a = v.advice.join("\n");
    assert!(a.contains("2 workers used 1.60 CPUs (0.80 each)"), "{a}");
}

#[test]
fn saturated_cpus_say_more_workers_cannot_help() {
    let mut f = job(6_400_000_000, 2, 9_500_000_000, 100_000_000);
    f.cpu.as_mut().expect("cpu").online_cpus = 2;
    let v = decide(&f);
    assert_eq!(v.cause, Cause::CpuBoundPipeline);
    let a = v.advice.join("\n");
    assert!(a.starts_with("the 2 CPUs (2 online) are saturated"), "{a}");
    assert!(a.contains("more workers cannot help: make each sample cheaper"), "{a}");
    assert_eq!(v.advice_num_workers, None, "no count when more workers cannot help");
}

/// One worker on CPU all the time beside a trainer that waited 59 % on 2 CPUs: the second CPU
/// sits idle, and a second worker is the answer (measured on the real job: twice the
/// iterations, the wait from 59 % to 21 %).
#[test]
fn a_cpu_left_idle_is_filled_with_a_worker_and_says_what_it_buys() {
    let k = KeepUp {
        workers: 1,
        workers_cpus: 0.98,
        trainer_cpus: 0.12,
        wait_share: 0.59,
        budget_cpus: 2.0,
        budget_by: "2 online".into(),
        others_cpus: 0.0,
        mains_kb: 1 << 20,
        per_worker_kb: 480 << 10,
        limit_kb: None,
        limit_is_host: false,
    };
    let (a, n) = keep_up_advice(&k);
    let a = a.join("\n");
    assert_eq!(n, Some(2), "{a}");
    // 2 / (1 + 0.12 / 0.98) = 1.78 CPUs for the workers, 1.82 x: 1 - 0.41 x 1.82 = 25 %.
    assert!(a.starts_with("num_workers=2 uses the CPUs there are"), "{a}");
    assert!(a.contains("1.82 x the 0.98 CPUs 1 worker used"), "{a}");
    assert!(a.contains("falls from 59 % to about 25 %"), "{a}");
    // The same worker beside a trainer that uses a whole CPU itself: nothing is left idle.
    let (a, n) = keep_up_advice(&KeepUp { trainer_cpus: 0.95, ..k });
    assert_eq!(n, None, "{a:?}");
}

#[test]
fn the_advice_is_bounded_by_cpus_and_memory() {
    let k = KeepUp {
        workers: 2,
        workers_cpus: 1.9,
        trainer_cpus: 0.2,
        wait_share: 0.64,
        budget_cpus: 4.0,
        budget_by: "4 online".into(),
        others_cpus: 0.0,
        mains_kb: 1 << 20,
        per_worker_kb: 480 << 10,
        limit_kb: Some(3 << 20),
        limit_is_host: false,
    };
    let (a, n) = keep_up_advice(&k);
    let a = a.join("\n");
    assert_eq!(n, Some(4));
    // 6 workers would need 6 x 0.95 + 0.56 = 6.26 CPUs. Of the 4 CPUs, the workers can use
    // 4 / (1 + 0.2 / 1.9) = 3.62 beside the trainer (0.38 at that rate): 4 workers (3.81 at
    // 0.95 each), 1.90 x as fast, and the wait falls to 1 - 0.36 x 1.90 = 31 %.
    assert!(a.starts_with("num_workers=4 uses the CPUs there are"), "{a}");
    assert!(a.contains("4 workers can use 3.62 of them beside the trainer's 0.38"), "{a}");
    assert!(a.contains("the trainer's wait falls from 64 % to about 31 %"), "{a}");
    assert!(a.contains("but only 3 x 480 MiB fit the 3072 MiB limit"), "{a}");
    let small = KeepUp { limit_kb: Some(2 << 20), budget_cpus: 16.0, ..k };
    let a = keep_up_advice(&small).0.join("\n");
    assert!(a.starts_with("num_workers=6 would keep up"), "{a}");
    assert!(a.contains("but only 1 x 480 MiB fit the 2048 MiB limit"), "{a}");
}

#[test]
fn without_a_cgroup_limit_the_advice_weighs_host_memory_and_counts_one_worker() {
    // One worker, no memory limit: the host's 24105 MiB bound the job.
    let mut f = job(6_400_000_000, 1, 9_500_000_000, 100_000_000);
    f.cgroup.as_mut().expect("cgroup").limit_bytes = None;
    f.host_mem_total_kb = Some(24105 * 1024);
    let v = decide(&f);
    assert_eq!(v.cause, Cause::CpuBoundPipeline, "{v:#?}");
    let a = v.advice.join("\n");
    assert!(a.starts_with("num_workers=3 would keep up: 1 worker used 0.95 CPUs"), "{a}");
    assert!(
        a.contains("3 x 480 MiB fits host memory (24105 MiB, with the trainer's 1024 MiB and 10 % headroom)"),
        "{a}"
    );
    assert!(!a.contains("MiB limit") && !a.contains("1 workers"), "{a}");
    assert_eq!(v.advice_num_workers, Some(3));
    assert!(
        v.text.contains(
            "(pid 10)'s one DataLoader worker was on CPU 95 % of its time (0.95 CPUs together)"
        ),
        "{}",
        v.text
    );
    // And two, with a limit: the cgroup's.
    let v = decide(&job(6_400_000_000, 2, 9_500_000_000, 100_000_000));
    assert!(v.advice[0].contains("2 workers used 1.90 CPUs"), "{}", v.advice[0]);
    assert!(v.advice[0].contains("fits the 7168 MiB limit (with the trainer's"), "{}", v.advice[0]);
    assert!(
        v.text.contains(
            "(pid 10)'s 2 DataLoader workers were on CPU 95 % of their time (1.90 CPUs together)"
        ),
        "{}",
        v.text
    );
}

#[test]
fn one_network_bound_worker_is_one_worker() {
    let mut f = job(4_900_000_000, 1, 300_000_000, 0);
    for p in f.procs.iter_mut().filter(|p| p.is_worker) {
        p.socket_waits = vec![("10.0.0.5:9000".into(), 9)];
    }
    let v = decide(&f);
    assert_eq!(v.cause, Cause::NetworkBound, "{v:#?}");
    // 1 / (1 - 0.49) = 1.96: 2 workers.
    assert!(
        v.advice[0].starts_with("hide the latency: num_workers=2 (the one worker is idle"),
        "{}",
        v.advice[0]
    );
    assert_eq!(v.advice_num_workers, Some(2));
}

#[test]
fn a_quota_that_throttled_the_job_comes_first_and_names_who_set_it() {
    let mut f = job(6_400_000_000, 2, 2_500_000_000, 6_000_000_000);
    f.cpu.as_mut().expect("cpu").throttling = vec![Throttling {
        path: "/kubepods/burstable/pod1/c1".into(),
        quota_cpus: Some(0.5),
        periods: 100,
        throttled_periods: 90,
        throttled_ns: 8 * S,
    }];
    let v = decide(&f);
    assert_eq!(v.cause, Cause::CpuQuotaThrottled, "{v:#?}");
    assert!(v.text.contains("a Kubernetes CPU limit"), "{}", v.text);
    assert!(v.text.contains("90 % of its scheduling periods"), "{}", v.text);
    assert!(v.advice[0].starts_with("raise the limit to at least"), "{}", v.advice[0]);
    // 8 s summed over the 8 CPUs' run queues: 1 s per CPU of the 10 s trace.
    assert!(
        v.text.contains("throttled 1.00 s per CPU of the 10.0 s trace (8.00 s summed over the run queues of its 8 CPUs)"),
        "{}",
        v.text
    );
    assert_eq!(v.advice_num_workers, None);
    assert_eq!(
        quota_owner("/user.slice/train.service"),
        "systemd's CPUQuota= of train.service (cgroup /user.slice/train.service)"
    );
}

#[test]
fn throttled_time_summed_over_cpus_never_reads_longer_than_the_trace() {
    // v1's throttled_time on 2 CPUs throttled all along a 6 s trace: 12 s summed.
    assert_eq!(
        throttled_time(12 * S, 2, 6 * S),
        "6.00 s per CPU of the 6.0 s trace (12.00 s summed over the run queues of its 2 CPUs)"
    );
    // More than the CPUs could hold (a CPU count read low): capped at the trace.
    assert!(throttled_time(30 * S, 2, 6 * S).starts_with("6.00 s per CPU of the 6.0 s trace"));
    assert_eq!(
        throttled_time(S / 2, 1, 0),
        "0.50 s per CPU (0.50 s summed over the run queues of its 1 CPU)"
    );
}

#[test]
fn workers_queued_behind_other_processes_are_a_busy_host() {
    let mut f = job(6_400_000_000, 1, 4_000_000_000, 5_000_000_000);
    let c = f.cpu.as_mut().expect("cpu");
    c.others = vec![(99, "hog".into(), 15 * S)];
    c.others_ns = 16 * S;
    let v = decide(&f);
    assert_eq!(v.cause, Cause::BusyHost, "{v:#?}");
    assert!(v.text.contains("hog (pid 99"), "{}", v.text);
    assert_eq!(v.culprit_pids, vec![99]);
    // The same run-queue wait with an idle host is the CPU-bound pipeline's (its own workers
    // contend), not a busy host.
    let mut f = job(6_400_000_000, 1, 6_000_000_000, 3_000_000_000);
    f.cpu.as_mut().expect("cpu").others_ns = S;
    assert_eq!(decide(&f).cause, Cause::CpuBoundPipeline);
}

#[test]
fn workers_blocked_on_sockets_are_network_bound() {
    let mut f = job(4_900_000_000, 2, 300_000_000, 0);
    for p in f.procs.iter_mut().filter(|p| p.is_worker) {
        p.socket_waits = vec![("10.0.0.5:9000".into(), 9)];
    }
    let v = decide(&f);
    assert_eq!(v.cause, Cause::NetworkBound, "{v:#?}");
    assert!(v.text.contains("10.0.0.5:9000"), "{}", v.text);
    // Idle workers without socket waits: nothing here explains it.
    let idle = job(4_900_000_000, 2, 300_000_000, 0);
    assert_eq!(decide(&idle).cause, Cause::NoneDetected);
}

#[test]
fn a_busy_trainer_with_an_idle_gpu_is_trainer_bound() {
    let mut f = job(200_000_000, 2, 1_000_000_000, 0);
    f.procs[0].cpu_ns = Some(9 * S);
    f.gpu_util_avg_pct = Some(12.0);
    let v = decide(&f);
    assert_eq!(v.cause, Cause::TrainerBound, "{v:#?}");
    assert!(v.text.contains("on CPU 90 % of its time and waited for data only 2 %"), "{}", v.text);
    f.gpu_util_avg_pct = Some(95.0);
    assert_eq!(decide(&f).cause, Cause::NoneDetected, "a busy GPU: nothing to explain");
    f.gpu_util_avg_pct = None;
    assert_eq!(decide(&f).cause, Cause::NoneDetected, "no GPU figures");
}

#[test]
fn the_memory_chain_and_an_idle_job_keep_their_verdicts() {
    // Memory pressure with busy workers: the memory chain.
    let mut f = job(6_400_000_000, 2, 9_500_000_000, 0);
    f.procs[1].reclaim_ns = S;
    assert_eq!(decide(&f).cause, Cause::HostMemoryPressure);
    // A trainer that never waited, idle workers: nothing.
    assert_eq!(decide(&job(0, 2, 100_000_000, 0)).cause, Cause::NoneDetected);
}

/// The trainer's 10 s with `spun` of it on CPU inside the CUDA driver's synchronising calls,
/// `gpu_wait` in them in all.
fn in_the_driver(f: &mut Facts, gpu_wait: u64, spun: u64) {
    f.procs[0].gpu_wait = Some(crate::model::gpuwait::GpuWaitSummary {
        calls: 250,
        wait_ns: gpu_wait,
        on_cpu_ns: Some(spun),
        off_cpu_ns: Some(gpu_wait - spun),
        longest_ns: 50_000_000,
        library: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        symbols: vec!["cuStreamSynchronize".into()],
        ..Default::default()
    });
}

#[test]
fn a_trainer_spinning_in_the_cuda_driver_is_gpu_bound_not_trainer_bound() {
    // On CPU 9 s of 10, 7 s of them spinning in cuStreamSynchronize; the GPU looks idle to
    // NVML between kernels.
    let mut f = job(200_000_000, 2, 1_000_000_000, 0);
    f.procs[0].cpu_ns = Some(9 * S);
    f.gpu_util_avg_pct = Some(12.0);
    in_the_driver(&mut f, 7 * S, 7 * S);
    let v = decide(&f);
    assert_eq!(v.cause, Cause::GpuBound, "{v:#?}");
    assert_eq!(v.culprit_pids, vec![10]);
    assert!(v.text.contains("waited for the GPU 70 % of its time"), "{}", v.text);
    assert!(
        v.evidence.iter().any(|e| e.contains(
            "70 % waiting for the GPU, 2 % for data, 20 % on its own CPU work, 8 % neither"
        )),
        "{:#?}",
        v.evidence
    );
    // 3 s of its 9 s in the driver: 60 % of its own work is left, and it is trainer-bound.
    in_the_driver(&mut f, 3 * S, 3 * S);
    let v = decide(&f);
    assert_eq!(v.cause, Cause::TrainerBound, "{v:#?}");
    assert!(v.text.contains("on CPU 60 % of its time"), "{}", v.text);
    // 4.5 s spinning leaves 45 %: neither its own work nor half its time on the GPU.
    in_the_driver(&mut f, 4_500_000_000, 4_500_000_000);
    assert_eq!(decide(&f).cause, Cause::NoneDetected);
}

#[test]
fn a_trainer_starved_for_data_keeps_the_pipelines_cause_whatever_its_gpu_waits() {
    let mut f = job(6_400_000_000, 1, 9_000_000_000, 0);
    in_the_driver(&mut f, 3 * S, S);
    assert_eq!(decide(&f).cause, Cause::CpuBoundPipeline);
    // Mostly waiting for the GPU, and 20 % for data: the data wait is the answer's.
    let mut f = job(2 * S, 1, 9_000_000_000, 0);
    in_the_driver(&mut f, 6 * S, 6 * S);
    assert_eq!(decide(&f).cause, Cause::CpuBoundPipeline);
}
