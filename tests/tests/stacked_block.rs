//! Stacked block devices: a traced process's O_DIRECT writes and reads through dm-linear over a
//! loop device are counted once, on the device it used (the dm device), although the kernel
//! queues each bio twice in its context (on dm-N, then the remapped clone on loopN). Checked
//! against the dm device's own sector counts in /sys/block/dm-N/stat.

use std::time::Duration;

use serde_json::Value;
use tests::{
    blockdev::{dev_of, stat_bytes, DmDevice, LoopDevice, TraceInstance},
    procs::{Tracer, Workload},
};

const MIB: u64 = 1 << 20;

/// The sum of a byte field over every traced process.
fn total(t: &tests::procs::TraceResult, field: &str) -> u64 {
    t.processes().iter().map(|p| p[field].as_u64().unwrap_or(0)).sum()
}

/// The io_by_device rows of every traced process.
fn device_rows(t: &tests::procs::TraceResult) -> Vec<Value> {
    t.processes()
        .iter()
        .flat_map(|p| p["io_by_device"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// A line on the test's stderr that libtest does not capture: the matrix's log keeps it.
fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "stacked_block: {line}");
}

/// (dev, sectors) of a tracefs `block_bio_queue` line: `... block_bio_queue: 254,0 WS 0 + 2048 [dd]`.
fn queued_sectors(line: &str) -> Option<(String, u64)> {
    let rest = line.split("block_bio_queue: ").nth(1)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let plus = f.iter().position(|x| *x == "+")?;
    Some((f.first()?.to_string(), f.get(plus + 1)?.parse().ok()?))
}

#[test]
fn dm_linear_bytes_are_counted_once_on_the_dm_device() {
    tests::require_privileged_env();
    if !DmDevice::available() {
        tests::degraded("no device-mapper in this kernel");
        return;
    }
    let _lock = tests::pressure_lock();
    let dir = tests::TempDir::new_in("/var/tmp", "stacked");
    let img = dir.path("lower.img");
    let size_mib = 48u64;
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(size_mib * MIB))
        .expect("backing file for the loop device");
    let lower = LoopDevice::attach(&img).expect("losetup");
    let dm = DmDevice::linear("linear", &lower.path, size_mib * MIB / 512).expect("dmsetup create");
    let dm_name = dm.kernel_name();
    let (dm_dev, loop_dev) = (dev_of(&dm_name), dev_of(lower.name()));
    eprintln!("{} is {dm_name} ({dm_dev}) over {} ({loop_dev})", dm.path(), lower.path);

    let n_mib = 16u64;
    let n = n_mib * MIB;
    let script = format!(
        "dd if=/dev/zero of={p} bs=1M count={n_mib} oflag=direct status=none && \
         dd if={p} of=/dev/null bs=1M count={n_mib} iflag=direct status=none",
        p = dm.path()
    );
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["spawn", "sh", "-c", &script], None);
    let tracer = Tracer::start(w.pid(), &["--quiet"]);
    let events = ["block/block_bio_queue", "block/block_bio_remap", "block/block_split"];
    let kernel_trace = TraceInstance::new("stacked", &events);
    let (dm_before, loop_before) = (stat_bytes(&dm_name), stat_bytes(lower.name()));
    w.go();
    let (code, _) = w.wait(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the dd pair failed");
    let (dm_after, loop_after) = (stat_bytes(&dm_name), stat_bytes(lower.name()));
    let t = tracer.wait(Duration::from_secs(30));

    // What the kernel fired for dd: the evidence for how each kernel stacks, and what counting
    // every block_bio_queue would have given. Written past libtest's capture (to the VM's log).
    if let Some(k) = &kernel_trace {
        // The task column (remap lines print no comm of their own).
        let dd: Vec<String> =
            k.lines().into_iter().filter(|l| l.trim_start().starts_with("dd-")).collect();
        let mut queued = std::collections::BTreeMap::<String, u64>::new();
        for (dev, sectors) in dd.iter().filter_map(|l| queued_sectors(l)) {
            *queued.entry(dev).or_default() += sectors * 512;
        }
        let count = |ev: &str| dd.iter().filter(|l| l.contains(ev)).count();
        report(&format!(
            "kernel: dd's block_bio_queue bytes per device {queued:?} (all of them: {}), \
             {} block_bio_remap, {} block_split; the first lines:",
            queued.values().sum::<u64>(),
            count("block_bio_remap:"),
            count("block_split:")
        ));
        for l in dd.iter().take(6) {
            report(&format!("  {}", l.trim()));
        }
    }
    let dm_written = dm_after.1 - dm_before.1;
    let dm_read = dm_after.0 - dm_before.0;
    let loop_written = loop_after.1 - loop_before.1;
    let (written, read) = (total(&t, "block_write_bytes"), total(&t, "block_read_bytes"));
    report(&format!(
        "{dm_name}: {dm_written} bytes written, {dm_read} read; {}: {loop_written} written; \
         gpustall: {written} written, {read} read (dd: {n} each way)",
        lower.name()
    ));
    assert_eq!(dm_written, n, "the dm device's own count of the writes");
    assert!(dm_read >= n, "the dm device's own count of the reads: {dm_read}");
    assert!(loop_written >= n, "the clones reached the loop device: {loop_written}");
    assert_eq!(written, n, "each byte written counted once, not per level of the stack");
    assert_eq!(read, n, "each byte read counted once, not per level of the stack");

    let rows = device_rows(&t);
    report(&format!("io_by_device: {rows:?}"));
    assert!(!rows.is_empty(), "dd's I/O has a device");
    for r in &rows {
        assert_eq!(r["dev"], dm_dev.as_str(), "I/O named on the device dd used: {r}");
        assert_eq!(r["name"], dm_name.as_str(), "{r}");
        assert!(
            r["lower"].as_array().is_some_and(|l| l.iter().any(|x| x == lower.name())),
            "the stack under {dm_name} is named: {r}"
        );
    }
    let rw: Vec<&Value> = rows.iter().filter(|r| r["bios"].as_u64().unwrap_or(0) > 0).collect();
    assert!(
        rw.iter().any(|r| r["avg_latency_us"].as_f64().is_some_and(|v| v > 0.0)),
        "the clones' request latency lands on {dm_name}'s row: {rows:?}"
    );
    drop(dm);
    drop(lower);
}
