//! Stacked block devices: a traced process's O_DIRECT writes and reads through dm-linear over a
//! loop device, and through an md RAID1 of two loop devices, are counted once, on the device it
//! used, although the kernel queues each bio again in its context for each device below (dm:
//! the clone on loopN; RAID1: a clone per mirror for a write). Checked against the top device's
//! own sector counts in /sys/block/NAME/stat.

use std::time::Duration;

use serde_json::Value;
use tests::{
    blockdev::{dev_of, stat_bytes, DmDevice, LoopDevice, MdArray, TraceInstance},
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

/// A loop device over a fresh file of `mib` MiB in `dir`.
fn loop_over_file(dir: &tests::TempDir, name: &str, mib: u64) -> LoopDevice {
    let img = dir.path(name);
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(mib * MIB))
        .expect("backing file for the loop device");
    LoopDevice::attach(&img).expect("losetup")
}

/// What the kernel fired for dd: the evidence for how each kernel stacks, and what counting
/// every block_bio_queue would have given. Written past libtest's capture (to the VM's log).
fn report_kernel_trace(k: &TraceInstance) {
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

/// A traced `sh` writes `n_mib` MiB to `path` (kernel name `top`, stacked on `lower`) with
/// O_DIRECT and reads them back; gpustall must count each byte once, on `top`.
fn dd_through_the_stack(path: &str, top: &str, lower: &[&str], n_mib: u64) {
    let n = n_mib * MIB;
    let top_dev = dev_of(top);
    report(&format!("{path} is {top} ({top_dev}) over {lower:?}"));
    let script = format!(
        "dd if=/dev/zero of={path} bs=1M count={n_mib} oflag=direct status=none && \
         dd if={path} of=/dev/null bs=1M count={n_mib} iflag=direct status=none"
    );
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["spawn", "sh", "-c", &script], None);
    let tracer = Tracer::start(w.pid(), &["--quiet"]);
    let events = ["block/block_bio_queue", "block/block_bio_remap", "block/block_split"];
    let kernel_trace = TraceInstance::new("stacked", &events);
    let top_before = stat_bytes(top);
    let lower_before: Vec<(u64, u64)> = lower.iter().map(|l| stat_bytes(l)).collect();
    w.go();
    let (code, _) = w.wait(Duration::from_secs(120));
    assert_eq!(code, Some(0), "the dd pair failed");
    let top_after = stat_bytes(top);
    let lower_written: Vec<u64> =
        lower.iter().zip(&lower_before).map(|(l, b)| stat_bytes(l).1 - b.1).collect();
    let t = tracer.wait(Duration::from_secs(30));

    if let Some(k) = &kernel_trace {
        report_kernel_trace(k);
    }
    let (top_read, top_written) = (top_after.0 - top_before.0, top_after.1 - top_before.1);
    let (written, read) = (total(&t, "block_write_bytes"), total(&t, "block_read_bytes"));
    report(&format!(
        "{top}: {top_written} bytes written, {top_read} read; below: {lower_written:?} written; \
         gpustall: {written} written, {read} read (dd: {n} each way)"
    ));
    assert!(lower_written.iter().sum::<u64>() >= n, "the clones reached {lower:?}");
    assert_eq!(written, n, "each byte written counted once, not per level of the stack");
    if top_written == 0 && top_read == 0 {
        tests::degraded(&format!("{top} keeps no I/O statistics on this kernel"));
        assert_eq!(read, n, "each byte read counted once, not per level of the stack");
    } else {
        assert_eq!(top_written, n, "{top}'s own count of the writes");
        // The first open of an md device rescans its partition table in the opener (dd): a few
        // 4 KiB reads more than dd's own, which the device's count has too.
        assert!(top_read >= n, "{top}'s own count of the reads: {top_read}");
        // The clones announced on one CPU are matched on that CPU, and the last one announced
        // anywhere in a shared mark: a reader preempted and moved between a clone's remap and
        // its queue (seen once in 32 RAID1 read parts on 7.2, a preemptible kernel under
        // emulation) is found there unless another clone was announced meanwhile. At most one
        // 1 MiB bio's worth counted again, and said.
        assert!(
            (top_read..=top_read + MIB).contains(&read),
            "each byte read counted once, as {top} counts it: {read} vs {top_read}"
        );
        if read != top_read {
            tests::degraded(&format!(
                "{} bytes of {top}'s reads counted twice (a clone queued on another CPU)",
                read - top_read
            ));
        }
    }

    let rows = device_rows(&t);
    report(&format!("io_by_device: {rows:?}"));
    assert!(!rows.is_empty(), "dd's I/O has a device");
    for r in &rows {
        assert_eq!(r["dev"], top_dev.as_str(), "I/O named on the device dd used: {r}");
        assert_eq!(r["name"], top, "{r}");
        for l in lower {
            assert!(
                r["lower"].as_array().is_some_and(|x| x.iter().any(|x| x == l)),
                "the stack under {top} is named: {r}"
            );
        }
    }
    assert!(
        rows.iter().any(|r| r["avg_latency_us"].as_f64().is_some_and(|v| v > 0.0)),
        "the clones' request latency lands on {top}'s row: {rows:?}"
    );
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
    let size_mib = 48u64;
    let lower = loop_over_file(&dir, "lower.img", size_mib);
    let dm = DmDevice::linear("linear", &lower.path, size_mib * MIB / 512).expect("dmsetup create");
    dd_through_the_stack(&dm.path(), &dm.kernel_name(), &[lower.name()], 16);
    drop(dm);
}

#[test]
fn md_raid1_bytes_are_counted_once_on_the_md_device() {
    tests::require_privileged_env();
    if !MdArray::available() {
        tests::degraded("no md RAID1 in this kernel (or no mdadm)");
        return;
    }
    let _lock = tests::pressure_lock();
    let dir = tests::TempDir::new_in("/var/tmp", "raid1");
    let a = loop_over_file(&dir, "a.img", 48);
    let b = loop_over_file(&dir, "b.img", 48);
    let md = MdArray::raid1(&[&a.path, &b.path]).expect("mdadm --create");
    dd_through_the_stack(&md.path(), md.name(), &[a.name(), b.name()], 16);
    drop(md);
}
