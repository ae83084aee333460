//! `gpustall trace [OPTIONS] -- CMD...`: start the job under the tracer, as `perf record --
//! CMD` and `strace CMD` do. The job is forked and held before its exec until the kernel side
//! tracks it, so it is traced from its first instruction and its first fork (no seeding race).
//! Under sudo it runs as the invoking user (SUDO_UID, SUDO_GID and that user's groups), with
//! the environment gpustall was given; signals sent to gpustall are passed to it unless it got
//! them itself ([`Relay`]), and gpustall exits with its status after the report.

use std::{
    ffi::CString,
    io::Read as _,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
};

use anyhow::Context as _;

use crate::{cmd::signals::Received, model::SignalRecord};

/// The job, started and held until [`Launched::release`].
pub struct Launched {
    pid: libc::pid_t,
    /// Writing `g` to it lets the child exec.
    go: Option<OwnedFd>,
    reaped: Option<i32>,
}

/// Processes held by pidfd (Linux 5.3): signalled without the risk of a pid reused after
/// they exited. A process already gone is not held.
pub struct Held(Vec<OwnedFd>);

impl Held {
    pub fn new(pids: impl IntoIterator<Item = u32>) -> Self {
        use std::os::fd::FromRawFd as _;
        let fds = pids
            .into_iter()
            .filter_map(|pid| {
                // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
                let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
                // SAFETY: a descriptor the kernel just opened for us alone.
                (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
            })
            .collect();
        Self(fds)
    }

    fn signal(&self, sig: i32) {
        for fd in &self.0 {
            // SAFETY: pidfd_send_signal on a pidfd we hold, no siginfo, no flags. A process
            // that has exited answers ESRCH, which is fine.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }

    /// Whether every held process has exited (its pidfd reads as ready).
    fn all_exited(&self) -> bool {
        let mut polls: Vec<libc::pollfd> = self
            .0
            .iter()
            .map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: a valid array of pollfds, its length, no wait.
        let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 0) };
        ready >= 0 && polls.iter().all(|p| p.revents & libc::POLLIN != 0)
    }
}

/// Who the job runs as: the invoking user under sudo, else gpustall's own user.
struct Credentials {
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
}

impl Credentials {
    /// From SUDO_UID / SUDO_GID / SUDO_USER, when gpustall runs as root under sudo.
    fn of_sudo_caller() -> anyhow::Result<Option<Self>> {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            return Ok(None);
        }
        let var = |k: &str| std::env::var(k).ok();
        let (uid, gid) = match (var("SUDO_UID"), var("SUDO_GID")) {
            (None, None) => return Ok(None),
            (Some(uid), Some(gid)) => (uid, gid),
            _ => anyhow::bail!(
                "SUDO_UID and SUDO_GID must be set together (sudo sets both): set both to run the job as that user, or neither to run it as root"
            ),
        };
        let id = |v: &str, k: &str| match v.parse::<u32>() {
            Ok(n) if n != u32::MAX => Ok(n),
            _ => Err(anyhow::anyhow!("{k}={v} is not a user or group id")),
        };
        let (uid, gid) = (id(&uid, "SUDO_UID")?, id(&gid, "SUDO_GID")?);
        let name =
            user_name(uid).with_context(|| format!("SUDO_UID={uid} is no user of this machine"))?;
        if let Some(user) = var("SUDO_USER").filter(|u| *u != name) {
            anyhow::bail!("SUDO_USER={user} is not the user SUDO_UID={uid} names ({name})");
        }
        Ok(Some(Self { uid, gid, groups: group_list(&name, gid) }))
    }
}

/// The name of user `uid` in the password database (getpwuid_r); `None` when there is none.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: an all-zero passwd is a valid value to be overwritten.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: valid buffers of the given length; `found` is set to `pw` or null.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r set pw_name to a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// The user's supplementary groups (getgrouplist), read here: after fork only
/// async-signal-safe calls are allowed, and reading /etc/group is not one.
fn group_list(user: &str, gid: u32) -> Vec<libc::gid_t> {
    let Ok(name) = CString::new(user) else { return vec![gid] };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        // SAFETY: `groups` has room for `n` entries; getgrouplist writes at most that many
        // and sets `n` to the count (or the count needed, returning -1).
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n as usize);
            return groups;
        }
        if n as usize <= groups.len() {
            return vec![gid];
        }
    }
}

impl Launched {
    /// Forks `argv`, held before its exec. Forked by hand: std's spawn waits for the exec,
    /// which here only happens once gpustall lets it.
    pub fn spawn(argv: &[String]) -> anyhow::Result<Self> {
        let program = argv.first().context("no command after --")?;
        let path = resolve(program)?;
        let creds = Credentials::of_sudo_caller()?;
        // Everything the child needs is made here: between fork and exec it may not allocate.
        let c_path = CString::new(path.as_os_str().as_bytes()).context("a NUL in the command")?;
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .context("a NUL in the command's arguments")?;
        let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        c_argv.push(std::ptr::null());
        let (read, write) = pipe()?;
        // SAFETY: fork; the child only makes async-signal-safe calls (read, setgroups, setgid,
        // setuid, execv, _exit) on data prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // Its copy of the write end closed: if gpustall dies, the read sees the end.
            // SAFETY: closing a descriptor this child owns a copy of.
            unsafe { libc::close(write.as_raw_fd()) };
            let ok = wait_for_go(read.as_raw_fd()).is_ok()
                && creds.as_ref().is_none_or(|c| drop_to(c).is_ok());
            if ok {
                default_signals();
                crate::kernel::preflight::restore_open_files();
                // SAFETY: NUL-terminated path and argv, made before the fork.
                unsafe { libc::execv(c_path.as_ptr(), c_argv.as_ptr()) };
            }
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(127) };
        }
        drop(read);
        Ok(Self { pid, go: Some(write), reaped: None })
    }

    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the job exec: it is tracked by now.
    pub fn release(&mut self) -> anyhow::Result<()> {
        if let Some(fd) = self.go.take() {
            let mut f = std::fs::File::from(fd);
            std::io::Write::write_all(&mut f, b"g").context("releasing the job")?;
        }
        Ok(())
    }

    /// Passes a signal on to the job.
    pub fn forward(&self, sig: i32) {
        // SAFETY: a plain kill of our own child.
        unsafe { libc::kill(self.pid, sig) };
    }

    /// The job's status as a shell reports it: its exit code, or 128 + the signal that
    /// killed it. Reaps it (it has exited: the trace ends when every traced process has).
    pub fn exit_code(&mut self) -> i32 {
        if let Some(code) = self.reaped {
            return code;
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let code = if unsafe { libc::waitpid(self.pid, &mut status, 0) } == self.pid {
            if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            }
        } else {
            1
        };
        self.reaped = Some(code);
        code
    }

    /// The job's status if it has exited, without waiting.
    pub fn try_exit_code(&mut self) -> Option<i32> {
        if self.reaped.is_none() {
            let mut status = 0;
            // SAFETY: a non-blocking wait for our own child.
            if unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } == self.pid {
                self.reaped = Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                });
            }
        }
        self.reaped
    }

    /// Stops the whole job: SIGTERM to it and to every other process of the job (`rest`), as
    /// timeout(1) signals its process group; SIGKILL to whatever is left after `grace`. A
    /// DataLoader worker stuck in a lock never notices its trainer's exit, and a job is not
    /// stopped while one of its processes lives on. Returns the job's status.
    pub fn stop_all(&mut self, grace: std::time::Duration, rest: &Held) -> i32 {
        self.forward(libc::SIGTERM);
        rest.signal(libc::SIGTERM);
        let end = std::time::Instant::now() + grace;
        while std::time::Instant::now() < end {
            if self.try_exit_code().is_some() && rest.all_exited() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if self.try_exit_code().is_none() {
            self.forward(libc::SIGKILL);
        }
        rest.signal(libc::SIGKILL);
        self.exit_code()
    }

    /// Stops a job that never ran (tracing could not start).
    pub fn abandon(mut self) {
        self.forward(libc::SIGKILL);
        let _ = self.exit_code();
    }
}

/// In the child, before its exec: every signal's default disposition and none blocked, as a
/// job started from a shell has them. Rust's runtime ignores SIGPIPE (and SIGXFSZ is ignored
/// where gpustall's parent ignored it): ignored stays ignored across exec, so a pipeline's
/// writer would never die of its closed pipe (`while :; do echo x; done | head -1` looped
/// for ever). Only async-signal-safe calls.
fn default_signals() {
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: signal(2) with SIG_DFL; an invalid number only returns an error.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    // SAFETY: an empty set, initialised by sigemptyset before use.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// The program's path: as given when it has a `/`, else the first executable of that name on
/// PATH (as execvp would find it; resolved here so that a typo is an error, not exit 127).
fn resolve(program: &str) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &std::path::Path| {
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        let p = std::path::PathBuf::from(program);
        anyhow::ensure!(executable(&p), "{program}: no such executable file");
        p
    } else {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|p| executable(p))
            .with_context(|| format!("{program}: command not found on PATH"))?
    };
    anyhow::ensure!(
        runnable(&found),
        "{program}: neither a program nor a script with a #! line: run it through its interpreter (e.g. `-- sh {program}`)"
    );
    Ok(found)
}

/// Whether exec can run the file itself: an ELF binary or a `#!` script (a script without the
/// line fails exec with ENOEXEC: the job would exit 127 without a word).
fn runnable(path: &std::path::Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut head));
    matches!(read, Ok(n) if (n >= 4 && head == *b"\x7fELF") || (n >= 2 && head[..2] == *b"#!"))
}

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe {
        use std::os::fd::FromRawFd as _;
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    })
}

/// In the child: blocks until gpustall writes `g`. End of file without it means gpustall
/// died before tracing: the job must not run untraced.
fn wait_for_go(fd: i32) -> std::io::Result<()> {
    // SAFETY: `fd` is the pipe's read end, open in this child until exec (O_CLOEXEC).
    let mut f = std::mem::ManuallyDrop::new(unsafe {
        use std::os::fd::FromRawFd as _;
        std::fs::File::from_raw_fd(fd)
    });
    let mut b = [0u8; 1];
    match f.read(&mut b) {
        Ok(1) if b[0] == b'g' => Ok(()),
        // gpustall stopped before the job was traced (no allocation here: after fork).
        Ok(_) => Err(std::io::Error::from_raw_os_error(libc::ECANCELED)),
        Err(e) => Err(e),
    }
}

/// In the child: becomes the invoking user (groups first, then gid, then uid).
fn drop_to(c: &Credentials) -> std::io::Result<()> {
    // SAFETY: plain syscalls on plain values; `groups` outlives the call.
    let ok = unsafe {
        // Capabilities gpustall was given as ambient ones (a unit's AmbientCapabilities) are
        // gpustall's, not the job's.
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        libc::setgroups(c.groups.len(), c.groups.as_ptr()) == 0
            && libc::setgid(c.gid) == 0
            && libc::setuid(c.uid) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How long after a signal reaches gpustall the kernel's record of the job's own copy may still
/// come: a process group is signalled in one kill(2), but systemd and Slurm signal every
/// process of a unit or a step one by one.
pub const RELAY_WAIT: std::time::Duration = std::time::Duration::from_millis(250);
/// How long before gpustall's copy the job's may have been sent.
const RELAY_LOOKBACK_NS: u64 = 2_000_000_000;

/// The signals gpustall received while the job runs. The job is in gpustall's process group:
/// a terminal's Ctrl-C or hangup, `kill -INT -PGID`, systemd's or Slurm's SIGTERM to every
/// process reach the job directly, and a second copy from gpustall would cut its own shutdown
/// short (a checkpoint saved in `except KeyboardInterrupt`). A signal is passed on only when
/// the kernel's records (signal_generate, which covers SIGHUP, SIGINT and SIGTERM to a tracked
/// process) show no copy of it sent to the job by the same sender about then: a signal sent to
/// gpustall alone still reaches the job, once, at most [`RELAY_WAIT`] later.
#[derive(Default)]
pub struct Relay {
    /// Received, not yet decided: the signal and when it came (monotonic ns).
    held: Vec<(Received, u64)>,
    /// The job's records already matched to a signal of gpustall's.
    matched: std::collections::HashSet<usize>,
}

impl Relay {
    /// A signal came at `now_ns`.
    pub fn hold(&mut self, r: Received, now_ns: u64) {
        self.held.push((r, now_ns));
    }

    /// When the oldest held signal must be decided.
    pub fn due(&self) -> Option<u64> {
        self.held.iter().map(|(_, at)| at + RELAY_WAIT.as_nanos() as u64).min()
    }

    /// Decides what can be decided at `now_ns` from `records` (the kernel's, every drain
    /// taken in): the signals to pass on now. A signal the job got itself is dropped as soon
    /// as its record is there; one whose record has not come by [`RELAY_WAIT`] is passed on.
    pub fn decide(
        &mut self,
        now_ns: u64,
        records: &[SignalRecord],
        job: u32,
        me: u32,
    ) -> Vec<Received> {
        let mut pass = Vec::new();
        let held = std::mem::take(&mut self.held);
        for (r, at) in held {
            if let Some(i) = self.job_copy(&r, at, records, job, me) {
                self.matched.insert(i);
            } else if now_ns >= at + RELAY_WAIT.as_nanos() as u64 {
                pass.push(r);
            } else {
                self.held.push((r, at));
            }
        }
        pass
    }

    /// The job's record of the same signal from the same sender (the kernel, for a terminal's
    /// signal) near `at`, not matched before.
    fn job_copy(
        &self,
        r: &Received,
        at: u64,
        records: &[SignalRecord],
        job: u32,
        me: u32,
    ) -> Option<usize> {
        let from = at.saturating_sub(RELAY_LOOKBACK_NS);
        let to = at + RELAY_WAIT.as_nanos() as u64;
        records.iter().enumerate().rev().find_map(|(i, s)| {
            let same_sender = if r.sent_by_a_process() {
                s.si_code == r.code && s.sender_pid as i32 == r.pid
            } else {
                s.si_code == r.code
            };
            (s.target_pid == job
                && s.sig == r.sig
                && s.sender_pid != me
                && same_sender
                && (from..=to).contains(&s.t_ns)
                && !self.matched.contains(&i))
            .then_some(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: u32 = 200;
    const ME: u32 = 100;
    const MS: u64 = 1_000_000;

    fn record(t_ns: u64, sig: i32, si_code: i32, sender_pid: u32) -> SignalRecord {
        SignalRecord {
            t_ns,
            sig,
            si_code,
            sender_pid,
            sender_comm: String::new(),
            target_pid: JOB,
            target_comm: String::new(),
        }
    }

    #[test]
    fn a_signal_the_job_got_too_is_not_passed_on() {
        let mut relay = Relay::default();
        let ctrl_c = Received { sig: libc::SIGINT, code: libc::SI_KERNEL, pid: 0 };
        relay.hold(ctrl_c, 1000 * MS);
        // Not yet on record: held, not passed on.
        assert!(relay.decide(1001 * MS, &[], JOB, ME).is_empty());
        assert_eq!(relay.due(), Some(1000 * MS + RELAY_WAIT.as_nanos() as u64));
        let records = [record(1000 * MS, libc::SIGINT, libc::SI_KERNEL, 7)];
        assert!(relay.decide(1002 * MS, &records, JOB, ME).is_empty());
        assert_eq!(relay.due(), None, "decided: the job had its own");
        // A second Ctrl-C matches a second record, not the first again.
        relay.hold(ctrl_c, 1500 * MS);
        assert_eq!(relay.decide(2000 * MS, &records, JOB, ME), vec![ctrl_c]);
    }

    #[test]
    fn a_signal_to_gpustall_alone_is_passed_on_once_after_the_wait() {
        let mut relay = Relay::default();
        let term = Received { sig: libc::SIGTERM, code: libc::SI_USER, pid: 42 };
        relay.hold(term, 1000 * MS);
        // gpustall's own forward of an earlier signal, another sender's, another signal.
        let records = [
            record(999 * MS, libc::SIGTERM, libc::SI_USER, ME),
            record(999 * MS, libc::SIGTERM, libc::SI_USER, 43),
            record(999 * MS, libc::SIGINT, libc::SI_USER, 42),
        ];
        assert!(relay.decide(1100 * MS, &records, JOB, ME).is_empty());
        assert_eq!(relay.decide(1300 * MS, &records, JOB, ME), vec![term]);
        assert_eq!(relay.due(), None);
        // The same sender's copy to the job, long before: another signal.
        relay.hold(term, 9000 * MS);
        let old = [record(6000 * MS, libc::SIGTERM, libc::SI_USER, 42)];
        assert_eq!(relay.decide(9300 * MS, &old, JOB, ME), vec![term]);
        // Its copy sent just after gpustall's (systemd signals one process at a time).
        relay.hold(term, 10_000 * MS);
        let late = [record(10_030 * MS, libc::SIGTERM, libc::SI_USER, 42)];
        assert!(relay.decide(10_300 * MS, &late, JOB, ME).is_empty());
    }
}
