//! `gpustall trace -- CMD` in a terminal: the job is in gpustall's process group, so a signal
//! sent to the whole group (the terminal's Ctrl-C, `kill -INT -PGID`, systemd's or Slurm's
//! SIGTERM to every process) reaches it directly. gpustall must not pass another one on: a
//! job that saves a checkpoint in `except KeyboardInterrupt` would be cut short by the second.
//! A signal sent to gpustall alone is still passed on, once.
//!
//! gpustall runs as the leader of a new session on a pseudo-terminal of its own, as a shell
//! runs a foreground job; the job is Python with a handler that counts the signals it gets and
//! a one-second checkpoint save after the first.

use std::{
    io::Read as _,
    os::fd::{FromRawFd as _, OwnedFd},
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// Counts each SIGINT, SIGTERM or SIGHUP the job gets (the interpreter's C handler writes each
/// one's number to the wakeup pipe, read into COUNT at the end), and raises KeyboardInterrupt
/// for it as Python's default SIGINT handler does; the first starts a one-second save that a
/// second signal would cut short. READY is made once the job runs (so it is traced), inside
/// the `try` that catches the signal: a signal sent the moment READY appears (a loaded machine
/// once delivered one while `open` was still returning) is the job's to handle.
const JOB: &str = r#"
import os, signal, sys, time
out = sys.argv[1]
r, w = os.pipe()
os.set_blocking(r, False)
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
def on_signal(sig, frame):
    raise KeyboardInterrupt
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, on_signal)
try:
    try:
        open(out + ".ready", "w").close()
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            for _ in range(20):
                f.write("weights\n")
                f.flush()
                time.sleep(0.05)
        os.rename(tmp, out)
finally:
    try:
        got = os.read(r, 64)
    except BlockingIOError:
        got = b""
    with open(out + ".count", "w") as f:
        f.write("".join(f"{b}\n" for b in got))
"#;

fn python() -> &'static str {
    // The interpreter itself, not a pyenv shim (a shell script with helpers of its own).
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// How the signal reaches the job's process group.
#[derive(Clone, Copy, Debug)]
enum Send {
    /// Ctrl-C typed at the terminal: the line discipline signals the foreground group.
    CtrlC,
    /// `kill -SIG -PGID` from outside the group.
    Group(i32),
    /// `kill -SIG PID` to gpustall alone.
    Gpustall(i32),
}

struct Outcome {
    code: Option<i32>,
    /// The signals the job's handler ran for.
    seen: Vec<i32>,
    saved: bool,
    output: String,
}

fn run(send: Send) -> Outcome {
    let dir = tests::TempDir::new("jobsig");
    let out = dir.path("ckpt");
    let (mut master, slave) = pty();
    let mut cmd = Command::new(tests::gpustall_bin());
    cmd.args(["trace", "--quiet", "--no-gpu", "--", python(), "-c", JOB])
        .arg(&out)
        .env_remove("SUDO_UID")
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe; stdin is the pty's slave by now.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("gpustall");
    drop(cmd);
    // The terminal's output, read as it comes (a full pty would block gpustall).
    let mut reader = master.try_clone().expect("master");
    let output = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let ready = out.with_extension("ready");
    let end = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if child.try_wait().expect("try_wait").is_some() || Instant::now() > end {
            let _ = child.kill();
            drop(master);
            panic!("the job never started: {}", output.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pgid = child.id() as i32;
    // SAFETY: plain kills of our own child's process group or of our own child.
    match send {
        Send::CtrlC => std::io::Write::write_all(&mut master, b"\x03").expect("Ctrl-C"),
        Send::Group(sig) => assert_eq!(unsafe { libc::kill(-pgid, sig) }, 0),
        Send::Gpustall(sig) => assert_eq!(unsafe { libc::kill(pgid, sig) }, 0),
    }
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("gpustall did not end after the job ({send:?})");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(master);
    let output = output.join().unwrap_or_default();
    let seen = std::fs::read_to_string(out.with_extension("count"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    Outcome { code: status.code(), seen, saved: out.exists(), output }
}

/// A new pseudo-terminal: (master, slave).
fn pty() -> (std::fs::File, OwnedFd) {
    let (mut m, mut s) = (-1, -1);
    // SAFETY: openpty writes two descriptors; the name, termios and size are left unset.
    let rc = unsafe {
        libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), std::ptr::null())
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both were just opened and are owned by nobody else.
    unsafe { (std::fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

fn check(send: Send, sig: i32) {
    let o = run(send);
    eprintln!("{send:?}: the job saw {:?}, saved: {}, exit {:?}", o.seen, o.saved, o.code);
    assert_eq!(o.seen, vec![sig], "{send:?}: the job got the signal once\n{}", o.output);
    assert!(o.saved, "{send:?}: the checkpoint save finished\n{}", o.output);
    assert_eq!(o.code, Some(0), "{send:?}: the job's own status\n{}", o.output);
}

#[test]
fn ctrl_c_at_the_terminal_reaches_the_job_once() {
    tests::require_privileged_env();
    check(Send::CtrlC, libc::SIGINT);
}

#[test]
fn a_signal_to_the_process_group_reaches_the_job_once() {
    tests::require_privileged_env();
    check(Send::Group(libc::SIGINT), libc::SIGINT);
    check(Send::Group(libc::SIGTERM), libc::SIGTERM);
    check(Send::Group(libc::SIGHUP), libc::SIGHUP);
}

#[test]
fn a_signal_to_gpustall_alone_is_passed_on_once() {
    tests::require_privileged_env();
    check(Send::Gpustall(libc::SIGTERM), libc::SIGTERM);
    check(Send::Gpustall(libc::SIGINT), libc::SIGINT);
}
