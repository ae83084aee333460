//! Threads of a traced process: what the kernel does to one thread is the process's.
//!
//! - A fatal signal aimed at a thread other than the main one (tgkill: `pthread_kill`, abort()
//!   or a fault in a DataLoader pin-memory thread, NCCL's watchdog) names the thread, not the
//!   process: it must still be reported as what killed the process, with its sender.
//! - A thread other than the main one that calls execve kills the others, the main thread
//!   included (de_thread), and takes over the process's pid: tracking must go on through it.
//!   Kernels before 6.16 have no `group_dead` in sched_process_exit; the test runs that path
//!   on any kernel too (GPUSTALL_TEST_NO_GROUP_DEAD).
//! - The OOM killer marks a thread that still has the memory: not the main thread once that one
//!   has exited (pthread_exit). The kill must be the process's, whoever triggered it.

use std::{os::unix::process::ExitStatusExt, path::Path, time::Duration};

use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    kernel::{oom_kills_among, Kmsg},
    procs::{TraceResult, Tracer, Workload},
};

/// A Python process whose second thread (named pin_memory) prints its ids and sleeps; with
/// `self`, the main thread then sends that thread SIGABRT (pthread_kill: tgkill).
const THREAD_JOB: &str = r#"
import json, os, resource, signal, sys, threading, time
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.stdin.readline()
ready = threading.Event()
def worker():
    line = {"role": "thread", "pid": os.getpid(), "tid": threading.get_native_id()}
    print(json.dumps(line), flush=True)
    ready.set()
    time.sleep(60)
t = threading.Thread(target=worker, name="pin_memory", daemon=True)
t.start()
ready.wait()
if sys.argv[1] == "self":
    signal.pthread_kill(t.ident, signal.SIGABRT)
time.sleep(60)
"#;

fn start_thread_job(how: &str, env: &[(&str, &str)]) -> (Workload, Tracer) {
    tests::require_privileged_env();
    let mut w = Workload::start(Path::new("python3"), &["-c", THREAD_JOB, how], None);
    let tracer = Tracer::start_with_env(w.pid(), &["--quiet", "--no-gpu"], env);
    w.go();
    (w, tracer)
}

/// The signal events aimed at `pid` in the recording.
fn signals_to(t: &TraceResult, pid: u32) -> Vec<&Value> {
    t.record
        .iter()
        .filter(|e| e["type"] == "event" && e["kind"] == "signal" && e["target_pid"] == pid)
        .collect()
}

fn n(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("no {field} in {v}"))
}

/// Where the kernel gives signal_generate's target thread only (no BTF), gpustall says so at
/// start-up; the signal is then not seen, the exit status still is.
fn thread_signals_unseen(t: &TraceResult) -> bool {
    t.stderr.contains("gpustall: note: signal:signal_generate: ")
}

/// Waits for the workload's end and returns the signal that ended it, as wait(2) reports it.
fn death_signal(w: &mut Workload) -> Option<i32> {
    let status = w.child.wait().expect("waiting for the workload");
    status.signal()
}

#[test]
fn abort_in_a_thread_is_the_process_s_death_by_sigabrt_from_itself() {
    let (mut w, tracer) = start_thread_job("self", &[]);
    let thread = w.wait_for_role("thread", Duration::from_secs(30));
    let (pid, tid) = (n(&thread, "pid") as u32, n(&thread, "tid") as u32);
    assert_ne!(pid, tid, "the signal goes to a thread other than the main one");
    assert_eq!(death_signal(&mut w), Some(libc::SIGABRT), "the kernel's own word");
    let t = tracer.wait(Duration::from_secs(30));
    let p = t.process(pid);
    assert_eq!(p["exit_signal"], libc::SIGABRT, "{p}");
    if thread_signals_unseen(&t) {
        return;
    }
    assert_eq!(p["killed_by"]["sig"], libc::SIGABRT, "{p}");
    assert_eq!(p["killed_by"]["sender_pid"], pid, "it sent the signal itself: {p}");
    let sent = signals_to(&t, pid);
    assert_eq!(sent.len(), 1, "one fatal signal: {sent:?}");
    assert_eq!(sent[0]["target_tid"], tid, "the thread it was aimed at: {sent:?}");
    assert_eq!(sent[0]["si_code"], -6, "SI_TKILL: {sent:?}");
}

#[test]
fn a_sigsegv_sent_to_a_thread_from_outside_names_the_sender() {
    let (mut w, tracer) = start_thread_job("wait", &[]);
    let thread = w.wait_for_role("thread", Duration::from_secs(30));
    let (pid, tid) = (n(&thread, "pid") as u32, n(&thread, "tid") as u32);
    // SAFETY: a plain system call on the workload's own thread.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGSEGV) };
    assert_eq!(rc, 0, "tgkill: {}", std::io::Error::last_os_error());
    assert_eq!(death_signal(&mut w), Some(libc::SIGSEGV), "the kernel's own word");
    let t = tracer.wait(Duration::from_secs(30));
    let p = t.process(pid);
    assert_eq!(p["exit_signal"], libc::SIGSEGV, "{p}");
    if thread_signals_unseen(&t) {
        return;
    }
    assert_eq!(p["killed_by"]["sig"], libc::SIGSEGV, "{p}");
    assert_eq!(p["killed_by"]["sender_pid"], std::process::id(), "this test sent it: {p}");
    let sent = signals_to(&t, pid);
    assert_eq!(sent.len(), 1, "one fatal signal: {sent:?}");
    assert_eq!(sent[0]["target_tid"], tid, "{sent:?}");
}

/// Without BTF (forced here) signal_generate's classic record names only the thread: gpustall
/// says at start-up that such a signal is not seen, and the exit status still tells the signal.
#[test]
fn without_btf_a_thread_s_signal_is_said_to_be_unseen() {
    let (mut w, tracer) = start_thread_job("self", &[("GPUSTALL_TEST_CLASSIC_ONLY", "1")]);
    let thread = w.wait_for_role("thread", Duration::from_secs(30));
    let pid = n(&thread, "pid") as u32;
    assert_eq!(death_signal(&mut w), Some(libc::SIGABRT));
    let t = tracer.wait(Duration::from_secs(30));
    assert!(thread_signals_unseen(&t), "the start-up note: {}", t.stderr);
    assert_eq!(t.process(pid)["exit_signal"], libc::SIGABRT);
    assert!(signals_to(&t, pid).is_empty(), "the classic program cannot see it");
}

/// A Python process whose second thread execs `python3 -c CHILD`: that forks a child (which
/// prints its pid) and exits with 7 once the child is done.
const EXEC_JOB: &str = r#"
import json, os, sys, threading
sys.stdin.readline()
CHILD = """
import json, os, sys, time
pid = os.fork()
if pid == 0:
    print(json.dumps({"role": "child", "pid": os.getpid(), "ppid": os.getppid()}), flush=True)
    time.sleep(0.5)
    os._exit(0)
os.waitpid(pid, 0)
sys.exit(7)
"""
def execer():
    line = {"role": "execer", "pid": os.getpid(), "tid": threading.get_native_id()}
    print(json.dumps(line), flush=True)
    os.execv(sys.executable, [sys.executable, "-c", CHILD])
t = threading.Thread(target=execer)
t.start()
t.join()
"#;

fn exec_from_a_thread(env: &[(&str, &str)]) {
    tests::require_privileged_env();
    let mut w = Workload::start(Path::new("python3"), &["-c", EXEC_JOB], None);
    let pid = w.pid();
    let tracer = Tracer::start_with_env(pid, &["--quiet", "--no-gpu"], env);
    w.go();
    let execer = w.wait_for_role("execer", Duration::from_secs(30));
    let child = w.wait_for_role("child", Duration::from_secs(30));
    let (code, _) = w.wait(Duration::from_secs(60));
    let t = tracer.wait(Duration::from_secs(30));
    let tid = n(&execer, "tid") as u32;
    let child_pid = n(&child, "pid") as u32;
    assert_ne!(tid, pid, "the exec came from a thread other than the main one");
    assert_eq!(code, Some(7), "the kernel's own word: the exec'd program's exit status");
    assert_eq!(n(&child, "ppid") as u32, pid, "the exec'd program kept the pid");

    let events = |kind: &str| -> Vec<&Value> {
        t.record
            .iter()
            .filter(|e| e["type"] == "event" && e["kind"] == kind && e["pid"] == pid)
            .collect()
    };
    let exits = events("exit");
    assert_eq!(exits.len(), 1, "one exit, at the end, none at the exec: {exits:?}");
    assert_eq!(exits[0]["exit_code"], 7, "{exits:?}");
    let execs = events("exec");
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert_eq!(execs[0]["old_pid"], tid, "the exec'ing thread took over the pid: {execs:?}");
    let p = t.process(pid);
    assert_eq!(p["exit_code"], 7, "{p}");
    let c = t.process(child_pid);
    assert_eq!(c["ppid"], pid, "the child forked after the exec is tracked: {c}");
}

#[test]
fn an_exec_from_a_thread_keeps_the_process_tracked() {
    exec_from_a_thread(&[]);
}

/// The same on the path of kernels without sched_process_exit's group_dead (5.10 to 6.15):
/// whether the exiting main thread was the process's last comes from the task.
#[test]
fn an_exec_from_a_thread_keeps_the_process_tracked_without_group_dead() {
    exec_from_a_thread(&[("GPUSTALL_TEST_NO_GROUP_DEAD", "1")]);
}

/// A Python process that forks a trigger, then its main thread exits (pthread_exit) while a
/// second thread holds 170 MiB (oom_score_adj 1000: the victim). Once the holder has it (a byte
/// on a pipe), the trigger allocates 40 MiB in the 200 MiB cgroup: the OOM killer marks the
/// holding thread, not the main one.
const OOM_JOB: &str = r#"
import ctypes, json, os, sys, threading, time
sys.stdin.readline()
r, w = os.pipe()
trigger = os.fork()
if trigger == 0:
    os.close(w)
    os.read(r, 1)
    print(json.dumps({"role": "trigger", "pid": os.getpid()}), flush=True)
    held = [b"t" * (8 << 20) for _ in range(5)]
    os._exit(0)
os.close(r)
def holder():
    time.sleep(0.3)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    held = b"h" * (170 << 20)
    line = {"role": "holder", "pid": os.getpid(), "tid": threading.get_native_id()}
    print(json.dumps(line), flush=True)
    os.write(w, b"x")
    os.waitpid(trigger, 0)
    time.sleep(30)
threading.Thread(target=holder).start()
ctypes.CDLL(None).pthread_exit(None)
"#;

#[test]
fn an_oom_kill_of_a_thread_whose_main_thread_exited_is_the_process_s() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let cg = MemCgroup::new("threads-oom", 200, false);
    let mut kmsg = Kmsg::open_at_end();
    let mut w = Workload::start(Path::new("python3"), &["-c", OOM_JOB], Some(&cg));
    let pid = w.pid();
    let tracer = Tracer::start(pid, &["--quiet", "--no-gpu"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(120));
    let t = tracer.wait(Duration::from_secs(30));
    let role = |r: &str| lines.iter().find(|l| l["role"] == r).cloned();
    let holder = role("holder").unwrap_or_else(|| panic!("no holder line: {lines:?}"));
    let trigger = role("trigger").unwrap_or_else(|| panic!("no trigger line: {lines:?}"));
    let tid = n(&holder, "tid") as u32;
    let trigger = n(&trigger, "pid") as u32;
    assert_eq!(code, None, "killed by a signal");
    // The kernel's own word: its log names the thread it killed first. Under emulation it may
    // kill the trigger too, before the first victim's memory is back (the cgroup counts both).
    let killed = oom_kills_among(&kmsg.read_new(), &[pid, tid, trigger]);
    assert_eq!(killed.first().map(|k| k.pid), Some(tid), "the holding thread: {killed:?}");
    let kills = t.summary["oom_kills"].as_array().expect("oom_kills");
    assert_eq!(kills.len() as u64, cg.oom_kills(), "every kill, as the cgroup counts them");
    assert_eq!(kills.len(), killed.len(), "as the kernel log names them: {kills:?}");
    assert_eq!(kills[0]["trigger_pid"], trigger, "{kills:?}");
    if thread_signals_unseen(&t) {
        // Without the SIGKILL seen, mark_victim's thread id is all there is.
        assert_eq!(kills[0]["victim_pid"], tid, "{kills:?}");
        return;
    }
    assert_eq!(kills[0]["victim_pid"], pid, "the process, not its thread: {kills:?}");
    let p = t.process(pid);
    assert_eq!(p["oom_killed"], true, "{p}");
    assert_eq!(p["exit_signal"], libc::SIGKILL, "{p}");
    assert_eq!(p["killed_by"]["sender_pid"], trigger, "{p}");
    let marked = t.record.iter().find(|e| e["type"] == "event" && e["kind"] == "oom_kill");
    let marked = marked.expect("an oom_kill event line");
    assert_eq!(marked["victim_tid"], tid, "the thread beside the process: {marked}");
}
