//! Block I/O attributed to the submitting process: a traced child's O_DIRECT writes are
//! counted once, to it; a dd outside the traced tree at the same time is not counted anywhere.

use std::time::Duration;

use tests::procs::{Tracer, Workload};

const MIB: u64 = 1 << 20;

#[test]
fn direct_writes_are_counted_for_the_writer_only() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("blockio");
    // On the root disk (not tmpfs): /var/tmp.
    let scratch =
        std::path::PathBuf::from(format!("/var/tmp/gpustall-blockio-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(scratch.clone());
    let traced_out = format!("of={}", scratch.join("traced").display());
    let other_out = format!("of={}", scratch.join("other").display());
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let dd = ["dd", "if=/dev/zero", "bs=1M", "count=64", "oflag=direct", "status=none"];
    let mut args = vec!["spawn"];
    args.extend(dd.iter().take(2));
    args.push(&traced_out);
    args.extend(dd.iter().skip(2));
    let mut w = Workload::start(bin, &args, None);
    let tracer = Tracer::start(w.pid(), &["--quiet"]);
    // The outsider runs at the same time, from outside the traced tree.
    let mut other_args: Vec<&str> = dd.iter().skip(1).copied().collect();
    other_args.insert(1, &other_out);
    let mut other = std::process::Command::new("dd").args(&other_args).spawn().expect("dd");
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0));
    assert!(other.wait().expect("dd").success());
    let t = tracer.wait(Duration::from_secs(30));
    drop(dir);

    let parent = lines.iter().find(|l| l["role"] == "parent").expect("parent line")["pid"]
        .as_u64()
        .expect("pid") as u32;
    let children: Vec<&serde_json::Value> =
        t.processes().iter().filter(|p| p["ppid"] == parent).collect();
    assert_eq!(children.len(), 1, "one child (dd): {children:?}");
    let child = children[0];
    assert_eq!(child["comm"], "dd");
    let written = child["block_write_bytes"].as_u64().expect("bytes");
    eprintln!(
        "traced dd wrote {written} bytes ({:.2} MiB) by gpustall's count",
        written as f64 / MIB as f64
    );
    assert!(
        (64 * MIB..=68 * MIB).contains(&written),
        "dd's block_write_bytes {written} not in [64, 68] MiB"
    );
    assert_eq!(t.u64_of(parent, "block_write_bytes"), 0, "the parent wrote nothing itself");
    let total: u64 =
        t.processes().iter().map(|p| p["block_write_bytes"].as_u64().unwrap_or(0)).sum();
    assert!(total <= 68 * MIB, "the outsider's 64 MiB leaked into the summary: total {total}");
    assert_eq!(t.processes().len(), 2, "only the traced parent and its dd: {:#?}", t.processes());
    let dev = &child["io_by_device"][0];
    assert!(
        dev["avg_latency_us"].as_f64().is_some_and(|v| v > 0.0),
        "request latency measured: {dev}"
    );
    maps_are_counted_and_bounded(&t.summary["overhead"]);
}

/// The kernel memory of the maps, from their fdinfo: each counter map shared by all CPUs,
/// the whole well under the 16 MiB bound (which holds at 256 CPUs too: kernel::mapmem).
fn maps_are_counted_and_bounded(oh: &serde_json::Value) {
    // Which programs ran, typed (`_btf`, `_raw`) or classic: the kernel matrix's logs show it.
    let programs: Vec<&str> = oh["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str())
        .collect();
    eprintln!("programs attached: {}", programs.join(" "));
    let maps = oh["bpf_maps"].as_array().expect("bpf_maps");
    let bytes: u64 = maps.iter().filter_map(|m| m["bytes"].as_u64()).sum();
    eprintln!(
        "BPF maps: {bytes} bytes now, at most {} on this host",
        oh["bpf_map_bytes_at_full_use"]
    );
    assert_eq!(oh["bpf_map_bytes"].as_u64(), Some(bytes));
    for name in ["TRACKED", "PROC_COUNTERS", "IO_COUNTERS", "BULK", "CRITICAL"] {
        assert!(maps.iter().any(|m| m["name"] == name), "{name} in {maps:?}");
    }
    let full = oh["bpf_map_bytes_at_full_use"].as_u64().expect("bound");
    assert!(bytes > 0 && bytes <= full, "{bytes} now, {full} at full use");
    // Before 6.4 (no map_mem_usage) fdinfo's memlock is the kernel's up-front charge estimate,
    // not the memory in use, and gpustall's bound (6.18's accounting) does not apply.
    if tests::kernel::at_least(6, 4) {
        assert!(full <= 16 << 20, "{bytes} now, {full} at full use");
    } else {
        tests::degraded(&format!("BPF map memory before 6.4 is the up-front charge: {full} bytes"));
    }
}
