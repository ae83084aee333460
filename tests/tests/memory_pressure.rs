//! The memory-pressure chain, per process: workers in a memory-limited cgroup with swap reclaim
//! and swap out; gpustall's counts are compared with the kernel's own pswpout, and a twin
//! workload outside the traced tree must add nothing to the traced processes.

use std::time::Duration;

use tests::{
    cgroup::MemCgroup,
    kernel::{vmstat, SwapFile},
    procs::{Tracer, Workload},
};

fn pids_of(lines: &[serde_json::Value], role: &str) -> Vec<u32> {
    lines
        .iter()
        .filter(|l| l["role"] == role)
        .map(|l| l["pid"].as_u64().expect("pid") as u32)
        .collect()
}

#[test]
fn reclaim_and_swapout_per_worker_match_the_kernel() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    let traced_cg = MemCgroup::new("swap-traced", 128, true);
    let other_cg = MemCgroup::new("swap-other", 128, true);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // Three workers of 100 MiB each against a 128 MiB limit: about 170 MiB must go to swap.
    let args = ["hog", "100,100,100", "8", "1500"];
    let mut traced = Workload::start(bin, &args, Some(&traced_cg));
    let mut other = Workload::start(bin, &args, Some(&other_cg));
    let tracer = Tracer::start(traced.pid(), &["--quiet"]);
    let pswpout_before = vmstat("pswpout");
    traced.go();
    other.go();
    let (code, lines) = traced.wait(Duration::from_secs(180));
    let (other_code, other_lines) = other.wait(Duration::from_secs(180));
    let pswpout_delta = vmstat("pswpout") - pswpout_before;
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!((code, other_code), (Some(0), Some(0)), "the workers exit normally (swap, no OOM)");

    let workers = pids_of(&lines, "worker");
    assert_eq!(workers.len(), 3);
    for &w in &workers {
        let p = t.process(w);
        assert!(p["memcg_reclaim_count"].as_u64() > Some(0), "worker {w} had memcg reclaim: {p}");
        assert!(p["memcg_reclaim_ns"].as_u64() > Some(0), "worker {w} stalled in reclaim: {p}");
        assert!(p["reclaim_stall_p99_ns"].as_u64() > Some(0), "stall distribution of {w}: {p}");
        assert_eq!(p["exit_code"], 0);
    }
    let traced_swap: u64 =
        t.processes().iter().map(|p| p["swapout_pages"].as_u64().unwrap_or(0)).sum();
    let host = &t.summary["host"];
    let host_swap = host["kswapd_swapout_pages"].as_u64().unwrap_or(0)
        + host["other_swapout_pages"].as_u64().unwrap_or(0);
    let total = traced_swap + host_swap;
    let error = (total as f64 - pswpout_delta as f64).abs() / pswpout_delta.max(1) as f64;
    eprintln!(
        "pswpout delta {pswpout_delta} pages; gpustall: traced {traced_swap} + host {host_swap} (kswapd {}, other processes {}) = {total} ({:.1}% off); traced share {:.1}%",
        host["kswapd_swapout_pages"],
        host["other_swapout_pages"],
        100.0 * error,
        100.0 * traced_swap as f64 / total.max(1) as f64
    );
    assert!(
        pswpout_delta > 10_000,
        "the workload must really swap (pswpout delta {pswpout_delta})"
    );
    assert!(
        error <= 0.10,
        "gpustall's swap-out total {total} is not within 10% of pswpout's {pswpout_delta}"
    );

    // The twin outside the tree: none of its processes in the summary; its swap is host-level.
    for pid in pids_of(&other_lines, "worker").into_iter().chain(pids_of(&other_lines, "parent")) {
        assert!(t.processes().iter().all(|p| p["pid"] != pid), "untraced pid {pid} in the summary");
    }
    assert!(
        host["other_swapout_pages"].as_u64() > Some(0),
        "the twin's swap-out is reported as host-level: {host}"
    );
    assert!(traced_swap < total, "the twin's swap-out is not blamed on the traced tree");
    let reclaim_io: u64 = workers.iter().map(|&w| t.u64_of(w, "reclaim_io_bytes")).sum();
    eprintln!("traced workers' reclaim I/O: {:.1} MiB", reclaim_io as f64 / 1048576.0);
    assert!(reclaim_io > 0, "swap writes submitted inside reclaim are marked as reclaim I/O");
    // Every page a worker wrote out in its reclaim was a bio of its own, submitted while it was
    // reclaiming: the bytes marked as reclaim I/O are those pages (4 KiB here: no THP asked).
    let written: u64 = workers
        .iter()
        .map(|&w| t.u64_of(w, "swapout_pages") + t.u64_of(w, "file_writeback_pages"))
        .sum::<u64>()
        * 4096;
    assert!(
        reclaim_io.abs_diff(written) <= written / 20,
        "reclaim I/O {reclaim_io} bytes, pages written out in reclaim {written} bytes"
    );
    assert!(
        matches!(t.summary["verdict"]["cause"].as_str(), Some("host_memory_pressure")),
        "{}",
        t.summary["verdict"]
    );
}
