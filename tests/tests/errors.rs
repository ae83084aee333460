//! Bad input gives one clear line and a non-zero exit.

use std::process::Command;

fn run(args: &[&str], as_nobody: bool) -> (i32, String) {
    let bin = tests::gpustall_bin();
    let out = if as_nobody {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
            .arg(&bin)
            .args(args)
            .output()
    } else {
        Command::new(&bin).args(args).output()
    }
    .expect("running gpustall");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn no_such_pid_is_one_line() {
    tests::require_privileged_env();
    let (code, err) = run(&["trace", "--pid", "999999999"], false);
    assert_eq!(code, 1);
    assert!(err.contains("no such process: 999999999"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn not_root_says_which_capabilities() {
    tests::require_privileged_env();
    let (code, err) = run(&["trace", "--pid", "1"], true);
    assert_eq!(code, 1);
    assert!(err.contains("needs root"), "{err}");
    assert!(err.contains("CAP_BPF") && err.contains("CAP_PERFMON"), "{err}");
    assert_eq!(err.trim().lines().filter(|l| l.starts_with("gpustall: error")).count(), 1, "{err}");
}

#[test]
fn bad_duration_is_rejected_by_the_cli() {
    let (code, err) = run(&["trace", "--pid", "1", "--duration", "soon"], false);
    assert_eq!(code, 2);
    assert!(err.contains("--duration"), "{err}");
}

#[test]
fn a_bare_number_is_a_duration_in_seconds() {
    // Accepted by the parser: the run then stops at the next check (no such pid), not at the flag.
    let (code, err) = run(&["trace", "--pid", "999999999", "--duration", "30"], false);
    assert_ne!(code, 2, "a bare 30 is 30 seconds, as timeout(1) takes it: {err}");
    assert!(!err.contains("--duration"), "{err}");
    let (code, err) = run(&["trace", "--pid", "1", "--duration", "18446744073709551615s"], false);
    assert_eq!(code, 2, "a duration no trace means is refused, not a panic: {err}");
    assert!(err.contains("longer than"), "{err}");
}

/// A report that could not be printed (stdout on a full disk) fails, with one line that says
/// why; a reader that stopped early (`| head`) is no failure.
#[test]
fn a_report_that_cannot_be_printed_fails() {
    let rec =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../gpustall/src/recording/testdata/trace-v1.jsonl");
    let o = std::process::Command::new(tests::gpustall_bin())
        .args(["report", rec])
        .stdout(std::fs::File::create("/dev/full").expect("/dev/full"))
        .output()
        .expect("gpustall report");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot print the report: No space left on device"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "{err}");
}

/// Too few open files allowed: one line naming the limit and how to raise it, before anything
/// fails with EMFILE under another name; a soft limit below the hard one is raised, and the
/// launched job still starts with the soft limit it was given.
#[test]
fn the_open_files_limit_is_raised_or_named() {
    tests::require_privileged_env();
    let o = std::process::Command::new("prlimit")
        .arg("--nofile=64:64")
        .arg(tests::gpustall_bin())
        .args(["trace", "--no-gpu", "--pid", &std::process::id().to_string(), "--duration", "1"])
        .output()
        .expect("prlimit gpustall");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("RLIMIT_NOFILE allows 64 (hard limit 64): raise it"), "{err}");
    assert!(
        !err.contains("not available on this kernel") && !err.contains("no such process"),
        "{err}"
    );
    let o = std::process::Command::new("prlimit")
        .arg("--nofile=64:4096")
        .arg(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--", "sh", "-c", "ulimit -n"])
        .env_remove("SUDO_UID")
        .output()
        .expect("prlimit gpustall");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.lines().next() == Some("64"), "the job's own soft limit: {out}");
}

/// A kernel thread (kthreadd is pid 2) has no job under it: refused in one line.
#[test]
fn a_kernel_thread_is_refused() {
    tests::require_privileged_env();
    let o = std::process::Command::new(tests::gpustall_bin())
        .args(["trace", "--no-gpu", "--pid", "2"])
        .output()
        .expect("gpustall");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("pid 2 is a kernel thread"), "{err}");
}

/// `trace` takes a process, a command or a Slurm job, one of them, and its usage says so.
#[test]
fn trace_takes_a_pid_or_a_command() {
    let run = |args: &[&str]| {
        let o = std::process::Command::new(tests::gpustall_bin())
            .args(args)
            .output()
            .expect("gpustall");
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = run(&["trace"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("<--pid <PID>|CMD|--slurm-job <ID>>")
            && err.contains("gpustall trace [OPTIONS] -- <CMD>")
            && err.contains("gpustall trace [OPTIONS] --slurm-job <ID>"),
        "{err}"
    );
    let (code, err) = run(&["trace", "--pid", "1", "--", "true"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}
