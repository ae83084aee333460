//! Swap-out of large folios: a 2 MiB THP or a 64 KiB mTHP that reclaim writes to swap whole is
//! one mm_vmscan_write_folio hit for 512 or 16 pages. gpustall counts the pages (the folio's
//! order, read through the BTF-typed tracepoint), and its total must match the kernel's pswpout
//! as it does for 4 KiB folios. Swap on zram (or a non-rotational disk): the swap allocator
//! hands out whole clusters for large folios only there.

use std::time::Duration;

use tests::{
    cgroup::MemCgroup,
    kernel::vmstat,
    mm::{mthp_sizes_kb, selected, swpout_of_size, thp_path, FastSwap, SysfsSetting},
    procs::{Tracer, Workload},
};

fn vmstat_or_zero(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// The host's swap-out counters: pages written (pswpout), zero-filled pages not written but
/// counted by gpustall's write_folio as swap-out (swpout_zero, 6.12+), and folios of `size_kb`
/// swapped whole.
#[derive(Debug, Clone, Copy)]
struct SwapCounters {
    pswpout: u64,
    zero: u64,
    large: u64,
}

fn swap_counters(size_kb: u64) -> SwapCounters {
    let pmd_kb = std::fs::read_to_string(thp_path("hpage_pmd_size"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(2048, |b| b / 1024);
    let large = swpout_of_size(size_kb)
        .or_else(|| (size_kb == pmd_kb).then(|| vmstat_or_zero("thp_swpout")))
        .unwrap_or(0);
    SwapCounters { pswpout: vmstat("pswpout"), zero: vmstat_or_zero("swpout_zero"), large }
}

/// Two workers of 100 MiB in a 128 MiB memory cgroup, their memory in large folios of
/// `size_kb`: compares gpustall's swap-out pages with the kernel's.
fn swap_large_folios(size_kb: u64) {
    let cg = MemCgroup::new("folios", 128, true);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["hog", "100,100", "8", "1500", "huge"], Some(&cg));
    let tracer = Tracer::start(w.pid(), &["--quiet"]);
    // Beside it, the path of a kernel without BTF: the classic tracepoint, one per folio.
    let classic =
        Tracer::start_with_env(w.pid(), &["--quiet"], &[("GPUSTALL_TEST_CLASSIC_ONLY", "1")]);
    let before = swap_counters(size_kb);
    w.go();
    let (code, _lines) = w.wait(Duration::from_secs(180));
    let after = swap_counters(size_kb);
    let t = tracer.wait(Duration::from_secs(30));
    let c = classic.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "the workers exit normally (swap, no OOM)");

    let pswpout = after.pswpout - before.pswpout;
    let zero = after.zero - before.zero;
    let large = after.large - before.large;
    let large_pages = large * size_kb * 1024 / page_size();
    let swapout = |r: &tests::procs::TraceResult| {
        let traced: u64 =
            r.processes().iter().map(|p| p["swapout_pages"].as_u64().unwrap_or(0)).sum();
        let host = &r.summary["host"];
        let host_swap = host["kswapd_swapout_pages"].as_u64().unwrap_or(0)
            + host["other_swapout_pages"].as_u64().unwrap_or(0);
        (traced, host_swap)
    };
    let (traced, host_swap) = swapout(&t);
    let total = traced + host_swap;
    let (c_traced, c_host) = swapout(&c);
    let per_folio = c_traced + c_host;
    let kernel = pswpout + zero;
    let error = (total as f64 - kernel as f64).abs() / kernel.max(1) as f64;
    eprintln!(
        "{size_kb} kB folios: pswpout {pswpout} + swpout_zero {zero} pages; {large} folios of {size_kb} kB swapped whole ({large_pages} pages, {:.0}% of pswpout); gpustall: traced {traced} + host {host_swap} = {total} ({:.2}% off); the classic fallback (one per folio): {per_folio}",
        100.0 * large_pages as f64 / pswpout.max(1) as f64,
        100.0 * error,
    );
    assert!(
        c.stderr.contains("swap-out counted per folio"),
        "the fallback says what it cannot count: {}",
        c.stderr
    );
    // The same hits, each large folio counted once instead of its pages. Two runs of the
    // workload, not one: their swap-out differs by a few percent (2.6 % once on 7.2 under
    // emulation), so 5 %; the per-folio count is 4x off and fails it plainly.
    let expected = total.saturating_sub(large_pages) + large;
    assert!(
        per_folio.abs_diff(expected) <= expected / 20,
        "the classic fallback counts folios: {per_folio}, expected about {expected}"
    );
    assert_eq!(t.summary["context"]["page_size"].as_u64(), Some(page_size()), "the page size");
    assert!(pswpout > 10_000, "the workload must really swap (pswpout delta {pswpout})");
    if large == 0 {
        tests::degraded(&format!("the kernel swapped no {size_kb} kB folio whole"));
    } else {
        // Enough for a per-folio count to miss by more than the 5 % allowed above (it misses
        // by nearly the whole share: 10 % of the pages is a 9.9 % miss); the share varies
        // from run to run with what the kernel could keep whole (24 % in one run here).
        assert!(
            large_pages * 10 >= pswpout,
            "large folios are a good share of the swap-out ({large_pages} of {pswpout} pages): a per-folio count would be far off"
        );
    }
    assert!(
        error <= 0.02,
        "gpustall's swap-out total {total} pages is not within 2% of the kernel's {kernel} (pswpout + swpout_zero)"
    );
    assert!(
        traced * 2 >= pswpout,
        "most of the swap-out is the job's own reclaim ({traced} of {pswpout} pages)"
    );
}

#[test]
fn large_folios_swapped_whole_count_as_their_pages() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let swap = FastSwap::new(1024);
    eprintln!("swap on {}", swap.describe());
    let enabled = std::fs::read_to_string(thp_path("enabled")).unwrap_or_default();
    assert!(!enabled.is_empty(), "the kernel has no transparent huge pages");
    // MADV_HUGEPAGE gets THPs under `always` and `madvise`; `never` is set aside for the test.
    let _thp =
        (selected(&enabled) == "never").then(|| SysfsSetting::set(thp_path("enabled"), "madvise"));

    // PMD-sized THPs (their size inherits the top-level setting).
    swap_large_folios(2048);

    // A multi-size THP (6.8+): 64 KiB folios only, the PMD size off for the while.
    if mthp_sizes_kb().contains(&64) {
        let _m = SysfsSetting::set(thp_path("hugepages-64kB/enabled"), "madvise");
        let _pmd = SysfsSetting::set(thp_path("hugepages-2048kB/enabled"), "never");
        swap_large_folios(64);
    } else {
        tests::degraded("no multi-size THP before 6.8: only PMD-sized THPs swapped");
    }
}
