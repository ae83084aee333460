//! The kernel log as evidence, on the real /dev/kmsg: lines written into the kernel's log by
//! the test (root may log there; the kernel gives them the user facility, so gpustall counts
//! them as the kernel's only under `--trust-user-kernel-log`, and shows them as user space's
//! otherwise) during a traced job, and a hung task the kernel's own detector reports about a
//! process blocked for real in uninterruptible sleep (I/O to a suspended device-mapper device).

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tests::procs::{TraceResult, Tracer, Workload};

/// One test at a time: each writes into the one kernel log every reader shares, and the
/// hung-task one changes machine-wide settings.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOG.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `line` into the kernel log (level 3, error; /dev/kmsg gives it the user facility).
fn kmsg(line: &str) {
    let mut f = std::fs::OpenOptions::new().write(true).open("/dev/kmsg").expect("/dev/kmsg");
    f.write_all(format!("<3>{line}\n").as_bytes()).expect("writing /dev/kmsg");
}

/// Counts the lines the test writes into the kernel log as the kernel's.
const TRUST: &str = "--trust-user-kernel-log";

/// Traces a `sleep SECS` job (`trace --no-gpu` with `extra`), running `during` once it is
/// traced; returns the finished trace.
fn traced_sleep(secs: &str, extra: &[&str], during: impl FnOnce(u32)) -> TraceResult {
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["spawn", "sleep", secs], None);
    let args: Vec<&str> = ["--quiet", "--no-gpu"].iter().chain(extra).copied().collect();
    let tracer = Tracer::start(w.pid(), &args);
    w.go();
    during(w.pid());
    let (code, _) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0));
    tracer.wait(Duration::from_secs(30))
}

fn kept(t: &TraceResult) -> Vec<Value> {
    t.record
        .iter()
        .filter(|r| r["type"] == "sample" && r["kind"] == "kernel_log")
        .cloned()
        .collect()
}

/// The verdict `gpustall report` gives on the trace's recording.
fn replayed_verdict(t: &TraceResult) -> Value {
    t.replayed().0["verdict"].clone()
}

#[test]
fn a_gpus_xid_in_the_kernel_log_is_a_gpu_fault_and_other_lines_are_never_kept() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    // A bus id of this test's own, so that no other line is taken for it.
    let bus = format!("0000:{:02x}:00", std::process::id() % 251);
    let private = format!("gpustall-test {} user=alice password=hunter2", std::process::id());
    let t = traced_sleep("3", &[TRUST], |pid| {
        std::thread::sleep(Duration::from_millis(500));
        kmsg(&private);
        kmsg(&format!(
            "NVRM: Xid (PCI:{bus}): 79, pid={pid}, name=sleep, GPU has fallen off the bus."
        ));
    });
    let v = &t.summary["verdict"];
    eprintln!("verdict: {v:#}");
    assert_eq!(v["cause"], "gpu_fault", "{v:#}");
    let text = v["text"].as_str().unwrap_or_default();
    assert!(text.contains(&format!("The GPU at PCI {bus} reported Xid 79")), "{text}");
    assert!(text.contains("fallen off the bus") && text.contains("hardware side"), "{text}");
    assert!(v["advice"][0].as_str().is_some_and(|a| a.contains("drain the node")), "{v:#}");
    // Recorded: the Xid line, with its number, bus and pid; never the other line.
    let lines = kept(&t);
    assert!(
        lines.iter().any(|l| l["what"] == "gpu_xid" && l["xid"] == 79 && l["device"] == bus),
        "{lines:?}"
    );
    let record = serde_json::to_string(&t.record).expect("json");
    assert!(!record.contains("hunter2"), "a line that matters to no verdict was recorded");
    // The recording replays to the same verdict.
    assert_eq!(replayed_verdict(&t)["cause"], "gpu_fault");
}

#[test]
fn a_network_filesystem_that_stopped_answering_is_a_storage_error_with_its_outage() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    let server = format!("nas-{}", std::process::id());
    let t = traced_sleep("4", &[TRUST], |_| {
        std::thread::sleep(Duration::from_millis(500));
        kmsg(&format!("nfs: server {server} not responding, still trying"));
        std::thread::sleep(Duration::from_millis(1500));
        kmsg(&format!("nfs: server {server} OK"));
    });
    let v = &t.summary["verdict"];
    eprintln!("verdict: {v:#}");
    assert_eq!(v["cause"], "storage_error", "{v:#}");
    let text = v["text"].as_str().unwrap_or_default();
    assert!(text.contains(&format!("a server not responding on {server}")), "{text}");
    assert!(text.contains("then answered again"), "{text}");
    // 1.5 s apart, as the kernel's own timestamps say.
    let secs: f64 = text
        .split(" for ")
        .nth(1)
        .and_then(|s| s.split(" s").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    assert!((1.3..=2.5).contains(&secs), "{text}");
}

/// Puts a sysctl back on drop, also on a test's failure.
struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Option<Self> {
        let old = std::fs::read_to_string(path).ok()?;
        std::fs::write(path, value).ok()?;
        Some(Self { path, old })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.old.trim());
    }
}

#[test]
fn a_task_the_kernels_detector_reports_hung_is_the_verdict_with_its_pid() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    // The detector's period follows its timeout (hung_task_check_interval_secs 0); its
    // warnings are limited in number (10 by default) unless -1.
    let Some(_timeout) = Sysctl::set("/proc/sys/kernel/hung_task_timeout_secs", "2") else {
        tests::degraded("no hung-task detector in this kernel (CONFIG_DETECT_HUNG_TASK)");
        return;
    };
    let _warnings = Sysctl::set("/proc/sys/kernel/hung_task_warnings", "-1");
    if !tests::slowfs::SlowFs::available() {
        tests::degraded("no FUSE in this kernel: no server to stop answering");
        return;
    }
    // A filesystem whose server stops answering: the first mkdir waits 8 s for its answer
    // holding the directory's lock; the second waits for that lock, in D state, past the
    // 2 s timeout.
    let source = format!("stalled-{}:/export", std::process::id());
    let fs = tests::slowfs::SlowFs::mount_stalling(
        &source,
        Duration::from_millis(1),
        Some(Duration::from_secs(8)),
    );
    let dir = fs.dir().display().to_string();
    let script =
        format!("mkdir {dir}/a 2>/dev/null & sleep 0.5; mkdir {dir}/b 2>/dev/null; wait; true");
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["spawn", "sh", "-c", &script], None);
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, _) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    let v = &t.summary["verdict"];
    eprintln!("verdict: {v:#}");
    assert_eq!(v["cause"], "hung_task", "{v:#}");
    let pid = v["culprit_pids"][0].as_u64().expect("a culprit") as u32;
    let text = v["text"].as_str().unwrap_or_default();
    assert!(
        text.contains(&format!("mkdir (pid {pid}) blocked in uninterruptible sleep")),
        "{text}"
    );
    let traced = t.summary["processes"].as_array().expect("processes");
    assert!(traced.iter().any(|p| p["pid"] == pid), "the hung task is the job's: {pid}");
    let hung = kept(&t);
    assert!(hung.iter().any(|l| l["what"] == "hung_task" && l["pid"] == pid), "{hung:?}");
}

#[test]
fn watch_makes_an_incident_bundle_and_counts_the_gpu_fault_in_its_metrics() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    let dir = tests::TempDir::new("watch-xid");
    let comm = tests::procs::unique_comm();
    let rule = format!("comm:^{comm}$");
    let (mut w, addr) =
        tests::watcher::bundling_watcher_with(&rule, dir.0.to_str().expect("utf-8"), &[TRUST]);
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut job = Workload::start_named(&comm, bin, &["spawn", "sleep", "30"], None, None);
    w.wait_for(&format!("watching job {comm}-{}", job.pid()), Duration::from_secs(20));
    job.go();
    let bus = format!("0000:{:02x}:00", std::process::id() % 251);
    kmsg(&format!("NVRM: Xid (PCI:{bus}): 48, pid={}, name={comm}, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.", job.pid()));
    let wrote = w.wait_for("wrote incident bundle", Duration::from_secs(30));
    assert!(wrote.contains("gpu_fault"), "{wrote}");
    let metrics = tests::watcher::scrape(&addr);
    let series = format!("gpustall_gpu_xid_errors_total{{pci_bus_id=\"{bus}\",xid=\"48\"}}");
    assert_eq!(tests::watcher::value(&metrics, &series), Some(1.0), "{metrics}");
    let bundle = std::fs::read_dir(&dir.0)
        .expect("bundles")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("gpu_fault"))
        .expect("the bundle");
    let summary = std::fs::read_to_string(bundle.join("summary.json")).expect("summary.json");
    let s: Value = serde_json::from_str(&summary).expect("json");
    assert_eq!(s["verdict"]["cause"], "gpu_fault", "{:#}", s["verdict"]);
    assert!(s["verdict"]["text"].as_str().is_some_and(|t| t.contains("double-bit ECC")));
    // SAFETY: plain kill of the test's own child.
    unsafe { libc::kill(job.pid() as i32, libc::SIGKILL) };
}

/// One real line of each pattern, written into the kernel log during a traced job: each is
/// kept, as what it is (a report naming a process names the job's own).
#[test]
fn every_pattern_is_kept_from_the_real_kernel_log() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    let me = std::process::id();
    // Without --trust-user-kernel-log: kept all the same, as user space's.
    let t = traced_sleep("3", &[], |pid| {
        std::thread::sleep(Duration::from_millis(300));
        for line in [
            format!("NVRM: Xid (PCI:0000:{:02x}:00): 13, pid={pid}, name=sleep, Graphics SM Warp Exception", me % 251),
            format!("INFO: task sleep:{pid} blocked for more than 120 seconds."),
            format!("watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [sleep:{pid}]"),
            format!("I/O error, dev gpustall{me}, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2"),
            format!("Buffer I/O error on dev gpustall{me}, logical block 0, async page read"),
            format!("EXT4-fs error (device gpustall{me}): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0"),
            format!("XFS (gpustall{me}): Corruption of in-memory data (0x8) detected. Shutting down filesystem."),
            format!("BTRFS error (device gpustall{me}): bdev /dev/x errs: wr 0, rd 1, flush 0"),
            format!("nfs: server nas{me} not responding, still trying"),
            format!("nfs: server nas{me} OK"),
            format!("CIFS: VFS: \\\\smb{me} has not responded in 180 seconds. Reconnecting..."),
            "mce: [Hardware Error]: Machine check events logged".to_string(),
            format!("pcieport 0000:00:{:02x}.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0", me % 32),
            format!("Out of memory: Killed process {pid} (sleep) total-vm:4096kB, anon-rss:100kB"),
        ] {
            kmsg(&line);
        }
    });
    let kept = kept(&t);
    let whats: Vec<&str> = kept.iter().filter_map(|l| l["what"].as_str()).collect();
    for want in [
        "gpu_xid",
        "hung_task",
        "soft_lockup",
        "io_error",
        "fs_error",
        "remote_fs_down",
        "remote_fs_up",
        "machine_check",
        "pcie_aer",
        "oom_kill",
    ] {
        assert!(whats.contains(&want), "{want} not kept: {whats:?}");
    }
    assert_eq!(whats.iter().filter(|w| **w == "io_error").count(), 2, "{whats:?}");
    assert_eq!(whats.iter().filter(|w| **w == "fs_error").count(), 3, "{whats:?}");
    assert!(kept.iter().all(|l| l["origin"] == "user_space"), "{kept:?}");
}

/// A fake Xid, written from user space and naming the traced job: without
/// `--trust-user-kernel-log` it is shown as user space's, and no GPU fault.
#[test]
fn an_xid_user_space_wrote_is_no_gpu_fault_and_is_shown_as_user_spaces() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    let bus = format!("0000:{:02x}:00", std::process::id() % 251);
    let t = traced_sleep("3", &[], |pid| {
        std::thread::sleep(Duration::from_millis(500));
        kmsg(&format!(
            "NVRM: Xid (PCI:{bus}): 79, pid={pid}, name=sleep, GPU has fallen off the bus."
        ));
    });
    let v = &t.summary["verdict"];
    eprintln!("verdict: {v:#}");
    assert_ne!(v["cause"], "gpu_fault", "{v:#}");
    let evidence: Vec<&str> =
        v["evidence"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(
        evidence
            .iter()
            .any(|e| e.contains("written into the kernel log by user space (not the kernel's")
                && e.contains(&format!("NVRM: Xid (PCI:{bus}): 79"))),
        "{evidence:#?}"
    );
    let lines = kept(&t);
    assert!(lines.iter().any(|l| l["device"] == bus && l["origin"] == "user_space"), "{lines:?}");
    assert!(t.summary["kernel_log"]["from_user_space"].as_u64() >= Some(1), "{:#}", t.summary);
    assert_ne!(replayed_verdict(&t)["cause"], "gpu_fault");
}

/// Writes `n` lines into the kernel log as fast as it takes them (level 4, under the console's
/// level: not printed on the console, which would slow each write tenfold), one open each
/// (/dev/kmsg limits the rate of writes per open file).
fn kmsg_flood(n: u64, line: impl Fn(u64) -> String) {
    for i in 0..n {
        let mut f = std::fs::OpenOptions::new().write(true).open("/dev/kmsg").expect("/dev/kmsg");
        f.write_all(format!("<4>{}\n", line(i)).as_bytes()).expect("writing /dev/kmsg");
    }
}

/// 20,000 Xid lines naming the traced job (trusted): folded into one line with its count, the
/// report and the summary a few KB, every line counted as kept or as missed (the kernel's
/// buffer overwritten before the reader came to it).
#[test]
fn a_flood_of_xid_lines_is_one_folded_line_and_a_bounded_report() {
    tests::require_privileged_env();
    let _one = one_at_a_time();
    const N: u64 = 20_000;
    let bus = format!("0000:{:02x}:00", std::process::id() % 251);
    let t = traced_sleep("6", &[TRUST], |pid| {
        std::thread::sleep(Duration::from_millis(500));
        kmsg_flood(N, |i| {
            format!("NVRM: Xid (PCI:{bus}): 79, pid={pid}, name=sleep, GPU has fallen off the bus. ({i})")
        });
    });
    let v = &t.summary["verdict"];
    assert_eq!(v["cause"], "gpu_fault", "{v:#}");
    // Every line of the flood the reader read, folded: its count.
    let folded: u64 = kept(&t)
        .iter()
        .filter(|l| l["device"] == bus)
        .map(|l| l["count"].as_u64().unwrap_or(1))
        .sum();
    let k = &t.summary["kernel_log"];
    eprintln!("kernel_log: {k:#}");
    let missed = k["missed"].as_u64().expect("missed");
    assert!(folded > 0 && folded <= N, "{folded} of {N}");
    assert!(folded + missed >= N, "{folded} read and {missed} missed of {N}");
    assert!(k["lines"].as_u64() >= Some(folded), "{k:#}");
    assert!(k["distinct"].as_u64() <= Some(8), "{k:#}");
    let evidence: Vec<&str> =
        v["evidence"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let logged: usize = evidence.iter().filter(|e| e.contains("kernel log")).map(|e| e.len()).sum();
    eprintln!("{evidence:#?}");
    assert!(logged < 20_000, "{logged} bytes of kernel-log evidence");
    if folded > 1 {
        assert!(evidence.iter().any(|e| e.contains("lines like it, the last at")), "{evidence:#?}");
    }
    let summary = serde_json::to_string(&t.summary).expect("json").len();
    eprintln!("report {} bytes, summary {summary} bytes", t.stdout.len() + t.stderr.len());
    assert!(summary < 64_000, "{summary} bytes of summary");
    assert!(t.stdout.len() + t.stderr.len() < 64_000, "{} bytes of report", t.stdout.len());
    // The recording: a line a beat at most, not one per line of the flood.
    assert!(kept(&t).len() < 64, "{} lines recorded", kept(&t).len());
}
