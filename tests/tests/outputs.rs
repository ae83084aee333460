//! `gpustall trace`'s outputs: a bad path is found before the job starts, one that fails at
//! the end costs only itself (the report, the other outputs and the job's status survive),
//! `--summary-json -` is stdout, and a recording's path in a shared sticky directory where
//! another user planted a FIFO or a file of their own is never opened.

use std::{
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

/// `gpustall trace --quiet --no-gpu ARGS -- sh -c SCRIPT`, killed past `limit`.
fn trace(
    args: &[&str],
    script: &str,
    env: &[(&str, &Path)],
    limit: Duration,
) -> (Output, Duration) {
    trace_in(&std::env::temp_dir(), args, script, env, limit)
}

/// [`trace`] run in `cwd` (where a relative path lands).
fn trace_in(
    cwd: &Path,
    args: &[&str],
    script: &str,
    env: &[(&str, &Path)],
    limit: Duration,
) -> (Output, Duration) {
    let started = Instant::now();
    let mut cmd = Command::new(tests::gpustall_bin());
    cmd.args(["trace", "--quiet", "--no-gpu"])
        .args(args)
        .args(["--", "sh", "-c", script])
        .env_remove("SUDO_UID")
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("gpustall");
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().expect("output"), started.elapsed())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Without a terminal (a batch job's error file), the status line comes at most once a
/// `--status-every` and at once for news: a quiet 12 s job gets its first line only, and with
/// a 4 s pace about one each 4 s, never the line a second it once got.
#[test]
fn without_a_terminal_status_lines_come_at_their_pace_not_every_second() {
    tests::require_privileged_env();
    let count = |pace: Option<&str>| {
        let mut cmd = Command::new(tests::gpustall_bin());
        cmd.args(["trace", "--no-gpu", "--py-stacks", "off"]);
        if let Some(p) = pace {
            cmd.args(["--status-every", p]);
        }
        let o = cmd
            .args(["--", "sleep", "12"])
            .env_remove("SUDO_UID")
            .stdin(Stdio::null())
            .output()
            .expect("gpustall trace -- sleep 12");
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let err = stderr(&o);
        let n = err.lines().filter(|l| l.contains("procs alive")).count();
        eprintln!("--status-every {pace:?}: {n} status lines");
        (n, err)
    };
    let (n, err) = count(None);
    assert!((1..=3).contains(&n), "{n} status lines at the default pace:\n{err}");
    let (n, err) = count(Some("4s"));
    assert!((3..=5).contains(&n), "{n} status lines at one each 4 s over 12 s:\n{err}");
}

#[test]
fn a_bad_output_path_is_one_line_before_the_job_starts() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("badout");
    let mark = dir.path("job-ran");
    let script = format!("touch {}", mark.display());
    let file = dir.path("a-file");
    std::fs::write(&file, "").expect("file");
    let missing = "/nonexistent-gpustall/out";
    let under_a_file = format!("{}/out", file.display());
    for flag in ["--record", "--summary-json", "--perfetto"] {
        for path in [missing, under_a_file.as_str()] {
            let (o, took) = trace(&[flag, path], &script, &[], Duration::from_secs(60));
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{flag} {path}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{flag} {path}: one line: {err}");
            assert!(err.contains(flag) || flag == "--record", "{flag} {path}: {err}");
            assert!(err.contains(path), "{flag} {path}: names the path: {err}");
            assert!(!mark.exists(), "{flag} {path}: the job never started");
            eprintln!("{flag} {path}: exit 1 in {took:?}: {}", err.trim());
        }
    }
}

#[test]
fn an_output_that_fails_at_the_end_costs_only_itself() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("endfail");
    let gone = dir.path("gone");
    let tmp = dir.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let perfetto = dir.path("trace.json");
    let summary = gone.join("s.json");
    for (job_status, expected) in [(3, 3), (0, 1)] {
        std::fs::create_dir(&gone).expect("gone");
        // The summary's directory goes away while the job runs.
        let script = format!("rmdir {}; exit {job_status}", gone.display());
        let (o, _) = trace(
            &[
                "--summary-json",
                summary.to_str().expect("utf-8"),
                "--perfetto",
                perfetto.to_str().expect("utf-8"),
            ],
            &script,
            &[("TMPDIR", &tmp)],
            Duration::from_secs(60),
        );
        let err = stderr(&o);
        eprintln!("job exit {job_status}: gpustall exit {:?}; {}", o.status.code(), err.trim());
        assert_eq!(o.status.code(), Some(expected), "job exit {job_status}: {err}");
        assert!(err.contains("gpustall: error:") && err.contains("s.json"), "{err}");
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("PID"), "the report is printed: {stdout}");
        let p: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&perfetto).expect("perfetto written"))
                .expect("perfetto json");
        assert!(p.is_object() || p.is_array());
        std::fs::remove_file(&perfetto).expect("rm");
        let left: Vec<_> = std::fs::read_dir(&tmp).expect("tmp").collect();
        assert!(left.is_empty(), "no scratch recording left: {left:?}");
    }
}

#[test]
fn summary_json_dash_is_stdout() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("dash");
    let (o, _) = trace_in(&dir.0, &["--summary-json", "-"], "exit 0", &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("stdout is the summary alone");
    assert_eq!(s["final"], true);
    assert!(stderr(&o).contains("PID"), "the report went to stderr");
    assert!(!dir.path("-").exists(), "no file named -");
    // `--json` says the same, on trace and on report.
    let (o, _) = trace_in(&dir.0, &["--json"], "exit 0", &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json: the summary");
    assert_eq!(s["final"], true);
    let rec =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../gpustall/src/recording/testdata/trace-v1.jsonl");
    let o = Command::new(tests::gpustall_bin())
        .args(["report", "--json", rec])
        .output()
        .expect("gpustall report");
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("report --json");
    assert_eq!(s["verdict"]["cause"], "host_memory_oom");
}

/// `setpriv` as nobody: `sh -c SCRIPT`.
fn as_nobody(script: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script]);
    c
}

#[test]
fn a_record_path_planted_in_a_sticky_directory_is_never_opened() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("sticky");
    let shared = dir.path("shared");
    std::fs::create_dir(&shared).expect("shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let rec = shared.join("rec.jsonl");
    let r = rec.to_str().expect("utf-8");

    // A FIFO with no reader: the trace must not hang on it.
    assert!(as_nobody(&format!("mkfifo -m 666 {r}")).status().expect("mkfifo").success());
    let (o, took) = trace(&["--record", r], "exit 0", &[], Duration::from_secs(20));
    eprintln!("FIFO, no reader: exit {:?} in {took:?}: {}", o.status.code(), stderr(&o).trim());
    assert!(took < Duration::from_secs(15), "the trace hung on the FIFO");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("FIFO"), "{}", stderr(&o));

    // A FIFO with nobody's reader behind it: nothing reaches the reader.
    let got = shared.join("got");
    let mut reader = as_nobody(&format!("cat {r} > {}", got.display())).spawn().expect("cat");
    let (o, took) = trace(&["--record", r], "exit 0", &[], Duration::from_secs(20));
    eprintln!("FIFO, a reader: exit {:?} in {took:?}", o.status.code());
    // The reader waits for a writer: let it go (one open and close ends it), then look.
    if let Ok(f) = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&rec)
    {
        drop(f);
    }
    let _ = reader.kill();
    let _ = reader.wait();
    let leaked = std::fs::read(&got).unwrap_or_default();
    assert!(leaked.is_empty(), "the FIFO's reader got {} bytes of the recording", leaked.len());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    std::fs::remove_file(&rec).expect("rm fifo");

    // nobody's own file, with a second name of theirs for the same inode.
    let link = shared.join("nobodys-link");
    let ok = as_nobody(&format!("touch {r} && chmod 666 {r} && ln {r} {}", link.display()))
        .status()
        .expect("touch")
        .success();
    assert!(ok);
    let (o, took) = trace(&["--record", r], "exit 0", &[], Duration::from_secs(30));
    eprintln!("nobody's file: exit {:?} in {took:?}", o.status.code());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = std::fs::symlink_metadata(&rec).expect("recording");
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o600), "a fresh private file of root's");
    assert!(m.is_file());
    let first = std::fs::read_to_string(&rec).expect("read");
    let header: serde_json::Value =
        serde_json::from_str(first.lines().next().unwrap_or_default()).expect("header");
    assert_eq!(header["type"], "header", "the recording is there");
    let theirs = std::fs::read(&link).expect("nobody's inode");
    assert!(theirs.is_empty(), "nobody's file got {} bytes of the recording", theirs.len());
}

/// `report --perfetto` writes the trace `export --perfetto` writes (the same output flags on
/// report as on trace and export).
#[test]
fn report_writes_the_perfetto_trace_export_writes() {
    let rec =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../gpustall/src/recording/testdata/trace-v1.jsonl");
    let dir = tests::TempDir::new("report-perfetto");
    let (a, b) = (dir.path("report.json"), dir.path("export.json"));
    let run = |args: &[&std::ffi::OsStr]| {
        let o = std::process::Command::new(tests::gpustall_bin())
            .args(args)
            .output()
            .expect("gpustall");
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run(&["report".as_ref(), rec.as_ref(), "--perfetto".as_ref(), a.as_os_str()]);
    run(&["export".as_ref(), "--perfetto".as_ref(), b.as_os_str(), rec.as_ref()]);
    let (a, b) = (std::fs::read(&a).expect("report's"), std::fs::read(&b).expect("export's"));
    assert!(a.len() > 1000 && a == b, "the same trace");
    // The same flags on report and export: the same page, the same summary.
    let files = ["r.html", "r.json", "e.html", "e.json"].map(|f| dir.path(f));
    let [rh, rj, eh, ej] = files.each_ref().map(|p| p.as_os_str());
    run(&["report".as_ref(), rec.as_ref(), "--html".as_ref(), rh, "--summary-json".as_ref(), rj]);
    run(&["export".as_ref(), rec.as_ref(), "--html".as_ref(), eh, "--summary-json".as_ref(), ej]);
    let read = |i: usize| std::fs::read_to_string(&files[i]).expect("written");
    assert!(read(0).contains("<h2>Processes</h2>") && read(0) == read(2), "the same page");
    assert!(read(1).contains("\"verdict\"") && read(1) == read(3), "the same summary");
}

/// `trace --html` writes the run's page, as `report --html` of its recording does.
#[test]
fn trace_writes_the_html_page_report_writes() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("trace-html");
    let (page, rec) = (dir.path("run.html"), dir.path("run.jsonl"));
    let args = ["--html", page.to_str().expect("utf-8"), "--record", rec.to_str().expect("utf-8")];
    let (o, _) = trace(&args, "sleep 1", &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let traced = std::fs::read_to_string(&page).expect("trace --html wrote the page");
    assert!(traced.contains("<h2>Processes</h2>"), "{traced}");
    let again = dir.path("again.html");
    let o = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(&rec)
        .arg("--html")
        .arg(&again)
        .output()
        .expect("gpustall report");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&again).expect("report's page"), traced);
    // Without --record, the page is drawn from a scratch recording that is removed after.
    let scratch = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(std::env::temp_dir())
            .expect("tmp")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("gpustall-") && n.ends_with(".jsonl"))
            .collect()
    };
    let before = scratch();
    let (o, _) =
        trace(&["--html", page.to_str().expect("utf-8")], "true", &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let left: Vec<String> = scratch().difference(&before).cloned().collect();
    assert!(left.is_empty(), "scratch recordings left: {left:?}");
}

/// Shell completions and the man page come from the CLI's own definitions: the bash script
/// parses and knows the flags, the man page is roff for man(1).
#[test]
fn completions_and_the_man_page_come_from_the_cli() {
    let dir = tests::TempDir::new("completions");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(tests::gpustall_bin())
            .args(args)
            .output()
            .expect("gpustall");
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).expect("utf-8")
    };
    let bash = run(&["completions", "bash"]);
    assert!(bash.contains("--stop-job") && bash.contains("--summary-json"), "the flags");
    let script = dir.path("gpustall.bash");
    std::fs::write(&script, &bash).expect("script");
    let parsed = std::process::Command::new("bash").arg("-n").arg(&script).status().expect("bash");
    assert!(parsed.success(), "the completion script parses");
    for shell in ["zsh", "fish"] {
        assert!(run(&["completions", shell]).contains("trace"), "{shell}");
    }
    let man = run(&["man"]);
    assert!(man.contains(".TH gpustall 1") && man.contains("trace"), "{man}");
}

/// A pseudo-terminal of `rows` x `cols`: (master, slave).
fn sized_pty(rows: u16, cols: u16) -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd as _;
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    let (mut m, mut s) = (-1, -1);
    // SAFETY: openpty writes two descriptors; the size is read from `size`.
    let rc =
        unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both were just opened and are owned by nobody else.
    unsafe { (std::fs::File::from_raw_fd(m), std::os::fd::OwnedFd::from_raw_fd(s)) }
}

/// In a terminal, the live status line keeps the bottom row: the job's own lines, written to
/// the same terminal, scroll above it whole (they once ran into it: `| lost 0^[[Kparent 12450`),
/// the line fits the terminal's 60 columns, and the terminal is given back at the end.
#[test]
fn the_status_line_fits_the_terminal_and_the_jobs_output_scrolls_above_it() {
    tests::require_privileged_env();
    use std::io::Read as _;
    let (rows, cols) = (24u16, 60u16);
    let (mut master, slave) = sized_pty(rows, cols);
    let job = "for i in 1 2 3 4 5; do echo job-line-$i; sleep 0.6; done";
    let mut child = Command::new(tests::gpustall_bin())
        .args(["trace", "--no-gpu", "--", "sh", "-c", job])
        .stdin(Stdio::from(slave.try_clone().expect("pty")))
        .stdout(Stdio::from(slave.try_clone().expect("pty")))
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("gpustall");
    let (r, c) = (rows.try_into().expect("rows"), cols.try_into().expect("cols"));
    let mut screen = vt100::Parser::new(r, c, 0);
    let (mut raw, mut buf, mut status_seen) = (Vec::new(), [0u8; 4096], false);
    let mut job_lines = std::collections::BTreeSet::new();
    // Read until the pty's last writer is gone (EIO), looking at the screen as it is drawn.
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        screen.process(&buf[..n]);
        let shown: Vec<String> = screen.screen().rows(0, cols).collect();
        let (above, bottom) = shown.split_at(usize::from(rows) - 1);
        status_seen |= bottom[0].contains("procs alive");
        for row in above {
            assert!(!row.contains("procs alive"), "the status on the bottom row only: {shown:#?}");
            if row.contains("job-line") {
                let whole = row.trim().strip_prefix("job-line-").is_some_and(|d| d.len() == 1);
                assert!(whole, "a job's line whole on a row of its own: {shown:#?}");
                job_lines.insert(row.trim().to_string());
            }
        }
    }
    let status = child.wait().expect("gpustall");
    assert_eq!(status.code(), Some(0));
    let raw_text = String::from_utf8_lossy(&raw);
    assert!(status_seen, "the status line drawn on the bottom row:\n{raw_text}");
    assert_eq!(job_lines.len(), 5, "every line of the job: {job_lines:?}");
    let text = screen.screen().contents();
    assert!(!text.contains("procs alive"), "the status row is cleared at the end:\n{text}");
    assert!(raw_text.contains("== gpustall:"), "then the report:\n{raw_text}");
    // Every status drawn fits the 60 columns.
    for drawn in raw_text.split("\x1b[2K").skip(1) {
        let line = drawn.split('\x1b').next().unwrap_or_default();
        assert!(line.chars().count() < usize::from(cols), "{line:?} wider than the terminal");
    }
}
