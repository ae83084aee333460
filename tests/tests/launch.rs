//! `gpustall trace -- CMD`: the job started under the tracer, as `perf record -- CMD` does.
//! Traced from its first fork (every byte of a child's I/O counted, no seeding race), run as
//! the invoking user under sudo, signals passed on, and gpustall exits with the job's status.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

fn summary(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("summary")).expect("json")
}

#[test]
fn a_launched_job_is_traced_from_its_first_fork_and_its_status_is_gpustalls() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new_in("/var/tmp", "launch");
    let out = dir.path("summary.json");
    let data = dir.path("data");
    // A child that writes at once, before any /proc scan could have found it.
    let script = format!(
        "dd if=/dev/zero of={} bs=1M count=16 oflag=direct status=none; exit 3",
        data.display()
    );
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--summary-json"])
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .env_remove("SUDO_UID")
        .output()
        .expect("gpustall");
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    let dd = s["processes"].as_array().expect("processes").iter().find(|p| p["comm"] == "dd");
    let dd = dd.unwrap_or_else(|| panic!("dd traced: {}", s["processes"]));
    assert_eq!(dd["block_write_bytes"].as_u64(), Some(16 << 20), "{dd}");
}

#[test]
fn under_sudo_the_job_runs_as_the_caller_and_gets_the_signals() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("launch-sudo");
    let out = dir.path("summary.json");
    // nobody's id, then a loop that leaves with 42 on SIGTERM.
    let script = "id -u; trap 'exit 42' TERM; while :; do sleep 0.1; done";
    let mut child = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--summary-json"])
        .arg(&out)
        .args(["--", "sh", "-c", script])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .env("SUDO_USER", "nobody")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpustall");
    // Once the job runs (its first line), gpustall is tracing and passes signals on; a fixed
    // sleep raced gpustall's start on a loaded machine, and SIGTERM killed gpustall itself.
    let mut job_out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::{BufRead as _, Read as _};
        let mut first = String::new();
        let _ = job_out.read_line(&mut first);
        let _ = tx.send(first);
        let _ = job_out.read_to_string(&mut String::new());
    });
    let first = rx.recv_timeout(Duration::from_secs(120)).expect("the job started");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: a plain kill of our own child (gpustall), which passes it on.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(std::time::Instant::now() < end, "gpustall did not end after the job");
        std::thread::sleep(Duration::from_millis(50));
    };
    let o = child.wait_with_output().expect("output");
    assert_eq!(status.code(), Some(42), "the job's status: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(first.trim_end(), "65534", "runs as the caller");
    let s = summary(&out);
    assert_eq!(s["final"], true, "everything written");
}

/// The job gets the signal dispositions a shell gives it: SIGPIPE kills a pipeline's writer
/// (gpustall's runtime ignores SIGPIPE, and an ignored signal stays ignored across exec: this
/// loop used to print "I/O error" for ever).
#[test]
fn a_pipelines_writer_dies_of_its_closed_pipe() {
    tests::require_privileged_env();
    let start = std::time::Instant::now();
    let o = Command::new("timeout")
        .arg("60")
        .arg(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--", "sh", "-c"])
        .arg("while :; do echo x; done | head -1")
        .env_remove("SUDO_UID")
        .output()
        .expect("gpustall");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(0),
        "the pipeline ended: {}",
        &stderr[..stderr.len().min(2000)]
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(30), "{:?}", start.elapsed());
    assert!(!stderr.contains("I/O error"), "the writer died of SIGPIPE at once");
}

/// `--duration` ends the trace, never waits for a job that outlives it: the job keeps running
/// (said), or `--stop-job` stops it as timeout(1) would and gpustall exits with its status.
#[test]
fn the_end_of_a_duration_does_not_wait_for_the_job() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("launch-duration");
    // To files, not pipes: a job left running holds the pipes it inherited open.
    let run = |extra: &[&str]| {
        let err = dir.path("stderr");
        let start = std::time::Instant::now();
        let status = Command::new("timeout")
            .arg("60")
            .arg(tests::gpustall_bin())
            .args(["trace", "--quiet", "--no-gpu", "--duration", "2"])
            .args(extra)
            .args(["--", "sleep", "40"])
            .env_remove("SUDO_UID")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .status()
            .expect("gpustall");
        let stderr = std::fs::read_to_string(&err).expect("stderr");
        (status.code(), stderr, start.elapsed())
    };
    let (code, stderr, took) = run(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(took < std::time::Duration::from_secs(20), "did not wait for the job: {took:?}");
    let pid: i32 = stderr
        .split("the job (pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("says the job keeps running: {stderr}"));
    // SAFETY: signal 0 checks the process exists; then it is ended, the test's own job.
    assert_eq!(unsafe { libc::kill(pid, 0) }, 0, "the job {pid} is still running");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let (code, stderr, took) = run(&["--stop-job"]);
    assert_eq!(code, Some(128 + libc::SIGTERM), "stopped by SIGTERM: {stderr}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

/// What would run the job wrongly or fail it without a word is refused in one line before
/// anything starts: half of sudo's variables, an id that is no user, a SUDO_USER that is not
/// SUDO_UID's, a script exec cannot run (no #! line: it exited 127 silently).
#[test]
fn bad_sudo_variables_and_a_script_without_its_interpreter_line_are_one_line_each() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("launch-refused");
    let script = dir.path("no-interpreter.sh");
    std::fs::write(&script, "echo hi\n").expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let script = script.to_str().expect("utf-8");
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case; 4] = [
        (&[("SUDO_UID", "65534")], "true", "SUDO_UID and SUDO_GID must be set together"),
        (&[("SUDO_UID", "4294967295"), ("SUDO_GID", "0")], "true", "is not a user or group id"),
        (
            &[("SUDO_UID", "65534"), ("SUDO_GID", "65534"), ("SUDO_USER", "root")],
            "true",
            "SUDO_USER=root is not the user SUDO_UID=65534 names",
        ),
        (&[], script, "neither a program nor a script with a #! line"),
    ];
    for (env, cmd, says) in cases {
        let o = Command::new(tests::gpustall_bin())
            .args(["trace", "--quiet", "--no-gpu", "--", cmd])
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .env_remove("SUDO_USER")
            .envs(env.iter().copied())
            .output()
            .expect("gpustall");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{env:?}: {err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
        assert!(errors.len() == 1 && errors[0].contains(says), "{env:?} {cmd}: {err}");
    }
}

/// A launched job that moves itself into a memory cgroup before its real work (as a wrapper
/// script does): the verdict reads that cgroup, not the host's memory it started in.
#[test]
fn a_job_that_moves_into_a_memory_cgroup_is_followed_there() {
    tests::require_privileged_env();
    let cg = tests::cgroup::MemCgroup::new("launch-moves", 256, false);
    let procs = cg.path.join("cgroup.procs");
    let workload = env!("CARGO_BIN_EXE_gpustall-workload");
    let script = format!("echo $$ > {}; sleep 2; exec {workload} hog 40 8 1500", procs.display());
    let dir = tests::TempDir::new("launch-moves");
    let out = dir.path("summary.json");
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--summary-json"])
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .env_remove("SUDO_UID")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gpustall");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    let path = &s["context"]["cgroup"]["path"];
    assert_eq!(path.as_str(), Some(cg.cgroup_path().as_str()), "{}", s["context"]);
}

/// A command that daemonizes its work (`setsid cmd &`) and exits: a signal to gpustall still
/// reaches the job, the processes it left behind, and the trace ends (it used to run on until
/// they ended by themselves).
#[test]
fn a_job_that_daemonized_still_gets_the_signal() {
    tests::require_privileged_env();
    let secs = format!("40.{}", tests::unique() % 1000 + 1000);
    let script = format!("setsid sleep {secs} & exit 0");
    let mut g = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--", "sh", "-c", &script])
        .env_remove("SUDO_UID")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("gpustall");
    std::thread::sleep(std::time::Duration::from_secs(3));
    // SAFETY: a signal to the gpustall this test started.
    unsafe { libc::kill(g.id() as i32, libc::SIGTERM) };
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = g.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > std::time::Duration::from_secs(20) {
            let _ = g.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let left =
        Command::new("pgrep").args(["-f", &format!("sleep {secs}")]).output().expect("pgrep");
    let left = String::from_utf8_lossy(&left.stdout).into_owned();
    for pid in left.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        // SAFETY: ends what this test started, whatever the outcome.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(status.is_some(), "gpustall still running 20 s after SIGTERM");
    assert!(left.trim().is_empty(), "the daemonized sleep got the signal: {left}");
}

/// Under sudo the files a trace writes are the caller's (still 0600), so `gpustall report`
/// run as that user reads them.
#[test]
fn under_sudo_the_outputs_belong_to_the_caller() {
    use std::os::unix::fs::MetadataExt as _;
    tests::require_privileged_env();
    let dir = tests::TempDir::new_in("/var/tmp", "launch-owner");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let (rec, sum, trace) = (dir.path("run.jsonl"), dir.path("s.json"), dir.path("t.json"));
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--record"])
        .arg(&rec)
        .arg("--summary-json")
        .arg(&sum)
        .arg("--perfetto")
        .arg(&trace)
        .args(["--", "true"])
        .envs([("SUDO_UID", "65534"), ("SUDO_GID", "65534"), ("SUDO_USER", "nobody")])
        .output()
        .expect("gpustall");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    for f in [&rec, &sum, &trace] {
        let m = std::fs::metadata(f).expect("written");
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (65534, 65534, 0o600), "{}", f.display());
    }
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(tests::gpustall_bin())
        .arg("report")
        .arg(&rec)
        .output()
        .expect("setpriv gpustall report");
    assert_eq!(
        o.status.code(),
        Some(0),
        "the caller reads it: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
