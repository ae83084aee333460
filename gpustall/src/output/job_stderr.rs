//! The verdict's first lines in the job's own standard error (`trace --report-to-job`): for a
//! Slurm batch job the file slurmstepd gave its task, `slurm-<id>.out` or the `--error` file,
//! the one the user reads.
//!
//! gpustall runs as root and the file is the user's, so it is reopened with care. Opening
//! `/proc/PID/fd/2` follows no path the user names: the kernel hands over the very file the
//! task holds. But that reopening is checked against root's rights, not the task's, so a task
//! that holds a file it may only read (`exec 2</etc/shadow`) would let root write into it.
//! Hence: the task must hold it open for writing (its fdinfo flags), it must be a regular file
//! (no device, FIFO or terminal is opened behind the user's back: `O_NONBLOCK`, and checked
//! again on the open file) owned by the task's real user, it is opened with that user's
//! filesystem ids (setfsuid: the user's rights, which a root-squashed NFS home also accepts),
//! and the open file must be the one looked at (device and inode). Everything written is shown by
//! [`crate::model::untrusted::lines`]: a process name cannot add a line or a terminal escape.

use std::{
    fs::File,
    io::Write as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// The job's standard error, held open from while its task was alive until the report is
/// written.
pub struct JobStderr {
    file: File,
    /// Where it leads (`/proc/PID/fd/2`'s target), for messages.
    pub path: PathBuf,
}

/// Why the job's standard error is not written to.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("cannot read {what} of pid {pid}: {source}")]
    Proc {
        what: &'static str,
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("pid {0} holds its standard error open only for reading")]
    ReadOnly(u32),
    #[error("the standard error of pid {0} is not a regular file (a terminal, pipe or socket)")]
    NotAFile(u32),
    #[error(
        "the standard error of pid {pid} is owned by uid {owner}, not by the task's user {user}"
    )]
    NotTheUsers { pid: u32, owner: u32, user: u32 },
    #[error("the standard error of pid {0} changed while it was opened")]
    Changed(u32),
}

impl JobStderr {
    /// The standard error (fd 2) of `pid`, opened for appending after the checks above.
    pub fn open(pid: u32) -> Result<Self, Refused> {
        let proc = |what: &'static str| move |source| Refused::Proc { what, pid, source };
        let fdinfo =
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/2")).map_err(proc("its fd 2"))?;
        if !writable(&fdinfo) {
            return Err(Refused::ReadOnly(pid));
        }
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(proc("its status"))?;
        let (Some(user), Some(group)) = (real_id(&status, "Uid:"), real_id(&status, "Gid:")) else {
            let source = std::io::ErrorKind::InvalidData.into();
            return Err(Refused::Proc { what: "its uid and gid", pid, source });
        };
        let link = format!("/proc/{pid}/fd/2");
        let before = std::fs::metadata(&link).map_err(proc("its fd 2"))?;
        check(pid, &before, user)?;
        let open = || {
            std::fs::OpenOptions::new()
                .append(true)
                .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
                .open(&link)
        };
        let file = as_user(user, group, open).map_err(proc("its fd 2"))?;
        let after = file.metadata().map_err(proc("its fd 2"))?;
        check(pid, &after, user)?;
        if (after.dev(), after.ino()) != (before.dev(), before.ino()) {
            return Err(Refused::Changed(pid));
        }
        let path = std::fs::read_link(&link).unwrap_or_else(|_| PathBuf::from(link));
        Ok(JobStderr { file, path })
    }

    /// Appends `text` (escaped), in one write where the kernel allows.
    pub fn append(&mut self, text: &str) -> std::io::Result<()> {
        let text = crate::model::untrusted::lines(text);
        self.file.write_all(text.as_bytes())?;
        self.file.flush()
    }
}

fn check(pid: u32, m: &std::fs::Metadata, user: u32) -> Result<(), Refused> {
    if !m.file_type().is_file() {
        return Err(Refused::NotAFile(pid));
    }
    if m.uid() != user {
        return Err(Refused::NotTheUsers { pid, owner: m.uid(), user });
    }
    Ok(())
}

/// Whether fdinfo's `flags:` (octal) open the file for writing.
fn writable(fdinfo: &str) -> bool {
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| i32::from_str_radix(f.trim(), 8).ok());
    flags.is_some_and(|f| matches!(f & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR))
}

/// The real id on /proc/PID/status's `key` line (`Uid:` or `Gid:`: real, effective, saved, fs).
fn real_id(status: &str, key: &str) -> Option<u32> {
    let ids = status.lines().find_map(|l| l.strip_prefix(key))?;
    ids.split_whitespace().next()?.parse().ok()
}

/// `f` with this thread's filesystem uid and gid those of the task's user: the file is opened
/// with the user's rights, not root's (capabilities such as CAP_DAC_OVERRIDE do not apply to a
/// non-zero fsuid), and a root-squashed NFS directory lets the user's own file be opened.
fn as_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> T) -> T {
    // SAFETY: setfsgid(2) and setfsuid(2) change only the calling thread's filesystem ids, and
    // nothing else runs on this thread before they are restored.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(gid), libc::setfsuid(uid)) };
    let r = f();
    // SAFETY: as above; restores the ids the calls returned.
    unsafe {
        libc::setfsuid(old_uid as u32);
        libc::setfsgid(old_gid as u32);
    }
    r
}

/// What goes into the job's output: the report's verdict (from its heading to the first blank
/// line: cause, where and when, the job, the verdict's text) and where the rest is.
pub fn verdict_lines(report: &str, rest: &[&Path]) -> String {
    let mut out = String::from("\n");
    let lines = report.lines().skip_while(|l| !l.starts_with(super::text::HEADING));
    for l in lines.take_while(|l| !l.trim().is_empty()) {
        out.push_str(l);
        out.push('\n');
    }
    if !rest.is_empty() {
        // One line whatever the paths hold (a job's name in a file name, say).
        let one_line = |s: String| crate::model::untrusted::one_line(&s).into_owned();
        let host = one_line(crate::sources::host::hostname());
        let paths: Vec<String> = rest.iter().map(|p| one_line(p.display().to_string())).collect();
        out.push_str(&format!("gpustall: the whole report on {host}: {}\n", paths.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_block_and_where_the_rest_is() {
        let report = "\n== gpustall: Host memory OOM (host_memory_oom) ==\nOn n1 (kernel 6.18)\n\
                      Job: Slurm job 5 step batch, user ann\nThe kernel killed pid 9.\n\n\
                      Evidence (in time order):\n  - x\n";
        let out = verdict_lines(report, &[Path::new("/var/lib/gpustall/slurm/job-5")]);
        let host = crate::sources::host::hostname();
        assert_eq!(
            out,
            format!(
                "\n== gpustall: Host memory OOM (host_memory_oom) ==\nOn n1 (kernel 6.18)\n\
                 Job: Slurm job 5 step batch, user ann\nThe kernel killed pid 9.\n\
                 gpustall: the whole report on {host}: /var/lib/gpustall/slurm/job-5\n"
            )
        );
    }

    #[test]
    fn fdinfo_flags_and_status_uids() {
        assert!(writable("pos:\t0\nflags:\t0102001\nmnt_id:\t3\n"));
        assert!(writable("flags:\t02\n"));
        assert!(!writable("pos:\t0\nflags:\t0100000\n"), "O_RDONLY");
        assert!(!writable("pos:\t0\n"));
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!((real_id(status, "Uid:"), real_id(status, "Gid:")), (Some(1000), Some(5)));
    }

    #[test]
    fn opened_with_the_users_rights_and_roots_back_after() {
        let path = std::env::temp_dir().join(format!("gpustall-asuser-{}", std::process::id()));
        std::fs::write(&path, "").expect("write");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let open = || std::fs::OpenOptions::new().append(true).open(&path);
        // SAFETY: geteuid(2) and getegid(2) have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert!(as_user(uid, gid, open).is_ok(), "the owner's own file");
        if uid == 0 {
            // Root's 0600 file: root (CAP_DAC_OVERRIDE) may, nobody may not.
            let denied = as_user(65534, 65534, open).map_err(|e| e.kind());
            assert_eq!(denied.err(), Some(std::io::ErrorKind::PermissionDenied));
            assert!(open().is_ok(), "root's rights are back");
        }
        let _ = std::fs::remove_file(&path);
    }

    /// A child whose standard error is `stderr`, and what [`JobStderr::open`] makes of it.
    fn open_stderr_of(stderr: std::process::Stdio) -> (Result<JobStderr, Refused>, u32) {
        let mut child =
            std::process::Command::new("sleep").arg("5").stderr(stderr).spawn().expect("sleep");
        let pid = child.id();
        let r = JobStderr::open(pid);
        let _ = child.kill();
        let _ = child.wait();
        (r, pid)
    }

    #[test]
    fn a_tasks_file_is_appended_to_and_a_terminal_or_pipe_is_not() {
        let path = std::env::temp_dir().join(format!("gpustall-jobstderr-{}", std::process::id()));
        std::fs::write(&path, "job output\n").expect("write");
        let f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
        let (r, _) = open_stderr_of(f.into());
        let mut w = r.expect("a regular file the task writes");
        assert_eq!(w.path, path);
        w.append("a\x1b[2Jb\n").expect("append");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "job output\na\\x1b[2Jb\n");
        let (r, pid) = open_stderr_of(std::process::Stdio::piped());
        assert!(matches!(r, Err(Refused::NotAFile(p)) if p == pid), "a pipe");
        let ro = File::open(&path).expect("open");
        let (r, _) = open_stderr_of(ro.into());
        assert!(matches!(r, Err(Refused::ReadOnly(_))), "held for reading only");
        let _ = std::fs::remove_file(&path);
    }
}
