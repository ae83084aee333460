//! Hostile but fair input: symlinks planted by an unprivileged user, an output that is the
//! input, a reader that goes away, a recording that cannot be written. Nothing may be
//! destroyed, nothing may panic, and a loss must reach the exit status.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use tests::procs::Workload;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpustall/src/recording/testdata/trace-v1.jsonl")
}

fn gpustall(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(tests::gpustall_bin()).args(args).output().expect("gpustall");
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A directory owned by `nobody`, where `nobody` plants `name -> target`.
fn planted_link(dir: &Path, name: &str, target: &Path) -> PathBuf {
    std::os::unix::fs::chown(dir, Some(65534), Some(65534)).expect("chown");
    let link = dir.join(name);
    let ok = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "ln", "-s"])
        .arg(target)
        .arg(&link)
        .status()
        .expect("setpriv ln")
        .success();
    assert!(ok, "nobody plants {}", link.display());
    assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
    link
}

#[test]
fn a_symlink_planted_by_another_user_is_never_followed() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("symlink");
    // Root's own private file, which the link points at.
    let victim = dir.path("victim");
    std::fs::write(&victim, "root's secret").expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let shared = dir.path("shared");
    std::fs::create_dir(&shared).expect("shared dir");
    let fx = fixture();
    let fx = fx.to_str().expect("utf-8");
    for flag in ["--summary-json", "--html"] {
        let link = planted_link(&shared, &format!("out{flag}"), &victim);
        let (code, err) = gpustall(&["report", fx, flag, link.to_str().expect("utf-8")]);
        assert_eq!(code, Some(0), "{flag}: {err}");
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "root's secret",
            "{flag} wrote through the link"
        );
        let meta = std::fs::symlink_metadata(&link).expect("out");
        assert!(meta.file_type().is_file(), "{flag}: the link was replaced by the output");
        assert_eq!(meta.mode() & 0o777, 0o600, "{flag}: the output is private");
        assert_eq!(meta.uid(), 0);
    }
    // The recording is written as the trace goes: a link there is refused outright.
    let link = planted_link(&shared, "record.jsonl", &victim);
    let mut w = Workload::start(
        Path::new(env!("CARGO_BIN_EXE_gpustall-workload")),
        &["spawn", "true"],
        None,
    );
    let (code, err) = gpustall(&[
        "trace",
        "--pid",
        &w.pid().to_string(),
        "--no-gpu",
        "--record",
        link.to_str().expect("utf-8"),
    ]);
    w.go();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "root's secret");
}

#[test]
fn an_output_that_is_the_input_is_refused_and_the_recording_kept() {
    let dir = tests::TempDir::new("clash");
    let rec = dir.path("rec.jsonl");
    std::fs::copy(fixture(), &rec).expect("copy");
    let before = std::fs::read(&rec).expect("read");
    let r = rec.to_str().expect("utf-8");
    for args in [
        vec!["report", r, "--summary-json", r],
        vec!["report", r, "--html", r],
        vec!["export", "--perfetto", r, r],
    ] {
        let (code, err) = gpustall(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("is the recording being read"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    assert_eq!(std::fs::read(&rec).expect("read"), before, "the recording is intact");
    let (code, err) = gpustall(&["trace", "--pid", "1", "--record", r, "--summary-json", r]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("name the same file"), "{err}");
    assert_eq!(std::fs::read(&rec).expect("read"), before);
}

#[test]
fn a_reader_that_goes_away_is_no_panic() {
    let mut child = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(fixture())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("report");
    // Close the pipe before gpustall writes: `gpustall report f | head -0`.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn a_recording_that_cannot_be_written_fails_the_trace_after_writing_the_rest() {
    tests::require_privileged_env();
    let mut w = Workload::start(
        Path::new(env!("CARGO_BIN_EXE_gpustall-workload")),
        &["spawn", "sleep", "1"],
        None,
    );
    let dir = tests::TempDir::new("devfull");
    let summary = dir.path("summary.json");
    let mut t = Command::new(tests::gpustall_bin())
        .args([
            "trace",
            "--quiet",
            "--no-gpu",
            "--record",
            "/dev/full",
            "--pid",
            &w.pid().to_string(),
        ])
        .arg("--summary-json")
        .arg(&summary)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trace");
    // Released once gpustall traces it (a fixed wait loses the race on a loaded machine).
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(t.stderr.take().expect("stderr")));
    let mut err = String::new();
    for line in lines.by_ref().map_while(Result::ok) {
        err.push_str(&line);
        err.push('\n');
        if line.starts_with("gpustall: tracing") {
            break;
        }
    }
    w.go();
    let (code, _) = w.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0));
    for line in lines.map_while(Result::ok) {
        err.push_str(&line);
        err.push('\n');
    }
    let status = t.wait().expect("trace ends with the job");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("/dev/full is incomplete"), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&summary).expect("the summary is still written"),
    )
    .expect("json");
    assert_eq!(s["final"], true);
}

/// A child killed and reaped when dropped, on failure too.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sleep 30` whose own child has exited unreaped: a zombie.
fn zombie_parent() -> (Reaped, u32) {
    let parent =
        Reaped(Command::new("sh").args(["-c", "sleep 0 & exec sleep 30"]).spawn().expect("sh"));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", parent.0.id()))
                .unwrap_or_default();
        if let Some(z) =
            children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()).find(|c| {
                std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|s| {
                    s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'))
                })
            })
        {
            return (parent, z);
        }
        assert!(std::time::Instant::now() < end, "no zombie child appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_zombie_is_not_traced_as_alive() {
    tests::require_privileged_env();
    let (parent, zombie) = zombie_parent();
    let (code, err) = gpustall(&["trace", "--pid", &zombie.to_string(), "--no-gpu"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("has exited (a zombie"), "{err}");
    // As a descendant it is left out: the trace holds the parent only.
    let dir = tests::TempDir::new("zombie");
    let summary = dir.path("s.json");
    let o = Command::new(tests::gpustall_bin())
        .args([
            "trace",
            "--quiet",
            "--no-gpu",
            "--duration",
            "2",
            "--pid",
            &parent.0.id().to_string(),
        ])
        .arg("--summary-json")
        .arg(&summary)
        .output()
        .expect("trace");
    let parent_pid = parent.0.id();
    drop(parent);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let pids: Vec<u64> = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert_eq!(
        pids,
        vec![u64::from(parent_pid)],
        "the zombie {zombie} is not a live process of the job"
    );
}

#[test]
fn a_fifo_as_the_training_log_is_refused_not_a_hang() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("fifo");
    let fifo = dir.path("train.log");
    let ok = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success();
    assert!(ok);
    let started = std::time::Instant::now();
    let (code, err) = gpustall(&[
        "trace",
        "--pid",
        "1",
        "--no-gpu",
        "--duration",
        "2",
        "--log",
        fifo.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not a regular file"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "it did not block");
}

#[test]
fn out_of_range_flags_are_refused_by_the_cli() {
    for args in [
        vec!["trace", "--pid", "1", "--stall-threshold", "200"],
        vec!["watch", "--max-bundles", "0"],
        vec!["watch", "--memory-budget", "lots"],
    ] {
        let (code, err) = gpustall(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }
}

/// More processes doing I/O than the kernel's per-process I/O map holds: the loss is counted,
/// the summary and the report say which figures are lower bounds, and the exit status is 3.
#[test]
fn a_full_kernel_map_is_a_counted_loss_that_reaches_the_report_and_the_exit_status() {
    tests::require_privileged_env();
    // O_DIRECT needs a real filesystem (/tmp may be tmpfs); removed on drop, failure too.
    let dir = tests::TempDir::new_in("/var/tmp", "mapfull");
    let scratch = dir.0.clone();
    // 24 children, each one O_DIRECT write of its own: 24+ (pid, dev, op) keys for 8 entries.
    let script = format!(
        "for i in $(seq 24); do dd if=/dev/zero of={}/f$i bs=4k count=1 oflag=direct status=none; done",
        scratch.display()
    );
    let mut w = Workload::start(
        Path::new(env!("CARGO_BIN_EXE_gpustall-workload")),
        &["spawn", "sh", "-c", &script],
        None,
    );
    let t = tests::procs::Tracer::start_with_env(
        w.pid(),
        &["--quiet", "--no-gpu"],
        &[("GPUSTALL_TEST_IO_MAP_ENTRIES", "8")],
    );
    w.go();
    let (code, _) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0));
    let t = t.wait(Duration::from_secs(30));
    let lost = t.summary["lost"]["map_full"].as_u64().expect("map_full");
    eprintln!("map full: {lost} updates lost; lower bounds: {}", t.summary["lower_bounds"]);
    assert!(lost > 0, "the map filled up");
    assert_eq!(t.summary["lost_events"].as_u64(), Some(lost));
    assert!(
        t.summary["lower_bounds"][0].as_str().is_some_and(|l| l.contains("per-process block I/O")),
        "{}",
        t.summary
    );
    assert!(
        t.summary["verdict"]["text"].as_str().is_some_and(|v| v.contains("lower bounds")),
        "{}",
        t.summary["verdict"]
    );
    assert!(t.stdout.contains("LOWER BOUNDS"), "{}", t.stdout);
    assert_eq!(t.code, Some(3), "exit status 3: it ran, but lost events\n{}", t.stderr);
}

/// A fork burst: 6,000 short children, each one 4 KiB O_DIRECT write. Nothing is lost, every
/// byte is counted (listed processes plus the folded ones), the clean exits beyond the newest
/// few thousand are folded, and the agent stays small.
#[test]
fn a_fork_burst_is_counted_whole_and_folded_small() {
    tests::require_privileged_env();
    const N: u64 = 6000;
    // O_DIRECT needs a real filesystem (/tmp may be tmpfs); removed on drop, failure too.
    let dir = tests::TempDir::new_in("/var/tmp", "burst");
    let scratch = dir.0.clone();
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(
        bin,
        &["burst", &N.to_string(), scratch.to_str().expect("utf-8"), "2000"],
        None,
    );
    let t = tests::procs::Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    let agent = t.pid();
    w.go();
    let mut peak_kb = 0u64;
    let end = std::time::Instant::now() + Duration::from_secs(120);
    while w.child.try_wait().expect("try_wait").is_none() {
        assert!(std::time::Instant::now() < end, "the burst did not end");
        peak_kb = peak_kb.max(tests::procs::vm_hwm_kb(agent));
        std::thread::sleep(Duration::from_millis(200));
    }
    peak_kb = peak_kb.max(tests::procs::vm_hwm_kb(agent));
    let (code, _) = w.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0));
    let t = t.wait(Duration::from_secs(60));
    let s = &t.summary;
    assert_eq!(s["lost_events"], 0, "{}", s["lost"]);
    let folded: u64 = s["folded"]
        .as_array()
        .map_or(0, |f| f.iter().filter_map(|r| r["processes"].as_u64()).sum());
    let listed = t.processes().len() as u64;
    eprintln!("fork burst of {N}: {listed} processes listed, {folded} folded, agent peak RSS {peak_kb} kB");
    assert_eq!(listed + folded, N + 1, "every process, listed or folded");
    assert!(folded > 0, "the clean exits beyond the newest were folded");
    let bytes: u64 =
        t.processes().iter().filter_map(|p| p["block_write_bytes"].as_u64()).sum::<u64>()
            + s["folded"]
                .as_array()
                .map_or(0, |f| f.iter().filter_map(|r| r["block_write_bytes"].as_u64()).sum());
    assert_eq!(bytes, N * 4096, "every O_DIRECT byte, once");
    assert!(peak_kb < 128 * 1024, "the agent stayed small: peak RSS {peak_kb} kB");
    assert_eq!(t.code, Some(0), "{}", t.stderr);
}

/// One line with a crafted time (u64::MAX) in a recording: skipped with a warning, the report
/// and its HTML page as without it, not gigabytes of axis ticks.
#[test]
fn one_bad_time_does_not_blow_up_the_report() {
    let dir = tests::TempDir::new("bad-time");
    let good = include_str!("../../gpustall/src/recording/testdata/trace-v1.jsonl");
    let mut lines: Vec<&str> = good.lines().collect();
    let crafted = r#"{"type":"sample","kind":"vanished","t_ns":18446744073709551615,"pid":999999}"#;
    lines.insert(20, crafted);
    let rec = dir.path("bad.jsonl");
    std::fs::write(&rec, lines.join("\n") + "\n").expect("recording");
    let html = dir.path("bad.html");
    let start = std::time::Instant::now();
    let o = std::process::Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(&rec)
        .arg("--html")
        .arg(&html)
        .output()
        .expect("gpustall report");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("1 lines with a time outside the recording's span skipped"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(20), "{:?}", start.elapsed());
    let size = std::fs::metadata(&html).expect("html").len();
    assert!(size < 2 << 20, "a page of {size} bytes");
}

/// A job that names itself with terminal escapes and a newline (`prctl(PR_SET_NAME)`, which
/// the kernel allows), passes them in its argv, and dies by SIGKILL so the verdict names it:
/// the report on the terminal, the status lines, the recording's report and its HTML page show
/// the bytes as `\xNN`, never raw, and no line of theirs starts where the name's newline was.
#[test]
fn terminal_escapes_in_a_jobs_names_are_shown_never_obeyed() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("escapes");
    let record = dir.path("r.jsonl");
    let html = dir.path("r.html");
    // 15 bytes, the kernel's limit: clear screen, BEL, a newline, then what would be a forged line.
    let job = r#"
import ctypes, os, signal, sys, time
ctypes.CDLL(None).prctl(15, b"\x1b[2J\x07\nFORGED:x", 0, 0, 0)
time.sleep(1.5)
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--no-gpu", "--record"])
        .arg(&record)
        .args(["--", "python3", "-c", job, "\x1b]52;c;Y2xpcA==\x07\nFORGED: argv"])
        .output()
        .expect("trace");
    let report = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(&record)
        .arg("--html")
        .arg(&html)
        .output()
        .expect("report");
    let page = std::fs::read_to_string(&html).expect("the page");
    for (what, text) in [
        ("trace's report", String::from_utf8_lossy(&o.stdout).into_owned()),
        ("trace's stderr", String::from_utf8_lossy(&o.stderr).into_owned()),
        ("report", String::from_utf8_lossy(&report.stdout).into_owned()),
        ("the HTML page", page),
    ] {
        assert!(
            !text.contains(['\x1b', '\x07', '\u{9b}']),
            "{what} holds a raw escape:\n{}",
            text.escape_debug()
        );
        assert!(
            !text.lines().any(|l| l.starts_with("FORGED")),
            "{what} has a forged line:\n{text}"
        );
    }
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(shown.contains("\\x1b[2J\\x07\\x0aFORGED:x"), "the name is shown:\n{shown}");
}
