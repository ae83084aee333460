//! Creating the files gpustall writes, the way a root daemon must: never through a symbolic
//! link planted in a shared directory, always readable by the owner only (they name processes,
//! command lines and pids), and never over the recording being read.
//!
//! A file written whole (summary, HTML, Perfetto, report) goes to a temporary file in the same
//! directory, created exclusively with mode 0600, then renamed over the target: a reader never
//! sees half a file and a symlink at the target is replaced, not followed. A file written as it
//! goes (the recording) is opened with O_NOFOLLOW and its mode forced to 0600.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

/// `/dev/stdout`, `/dev/null`, `/proc/self/fd/N`: a stream the user names on purpose, written
/// as it is (its links followed, its mode left alone), never replaced.
fn is_stream(path: &Path) -> bool {
    path.starts_with("/dev") || path.starts_with("/proc")
}

/// `-`: standard output, for an output written whole.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Creates the recording at `path` fresh, refusing a symbolic link or anything but a regular
/// file there: a private file made exclusively beside it, renamed over it at once. Whatever
/// another user put at the path in a shared directory (a FIFO that would hang the trace or
/// read the recording, a file of theirs they could read it from) is never opened.
pub fn create_private(path: &Path) -> anyhow::Result<File> {
    if is_stream(path) {
        return OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()));
    }
    refuse_non_file(path, false)?;
    let (dir, name) = dir_and_name(path)?;
    let (file, tmp) = create_fresh(&dir, &name)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(anyhow::Error::new(e).context(format!("cannot create {}", path.display())));
    }
    Ok(file)
}

/// Refuses a directory, a FIFO, a socket or a device at `path` (and a symbolic link unless
/// `link_ok`: a file written whole replaces one, never follows it).
fn refuse_non_file(path: &Path, link_ok: bool) -> anyhow::Result<()> {
    let Ok(m) = std::fs::symlink_metadata(path) else { return Ok(()) };
    let t = m.file_type();
    use std::os::unix::fs::FileTypeExt as _;
    let what = if t.is_file() || (t.is_symlink() && link_ok) {
        return Ok(());
    } else if t.is_symlink() {
        anyhow::bail!(
            "refusing to write {}: it is a symbolic link (remove it or choose another path)",
            path.display()
        );
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    anyhow::bail!(
        "refusing to write {}: it is {what}, not a regular file (remove it or choose another path; \
         /dev/stdout or - for a stream)",
        path.display()
    )
}

fn dir_and_name(path: &Path) -> anyhow::Result<(PathBuf, std::ffi::OsString)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    Ok((dir, name.to_owned()))
}

/// The user who ran gpustall under sudo (SUDO_UID and SUDO_GID, both valid), when gpustall
/// runs as root: the files it writes are theirs (`sudo gpustall trace --record run.jsonl`, then
/// `gpustall report run.jsonl` as that user). `None` otherwise.
pub fn sudo_caller() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |k: &str| std::env::var(k).ok()?.parse::<u32>().ok().filter(|&n| n != u32::MAX);
    Some((id("SUDO_UID")?, id("SUDO_GID")?))
}

/// Hands a file gpustall just made to the sudo caller, still readable by its owner only. A
/// failure (a filesystem without owners) leaves it root's, as before.
pub fn give_to_caller(f: &File) {
    use std::os::fd::AsRawFd as _;
    if let Some((uid, gid)) = sudo_caller() {
        // SAFETY: fchown on a descriptor this process holds.
        if unsafe { libc::fchown(f.as_raw_fd(), uid, gid) } != 0 {
            log::debug!("cannot give the file to uid {uid}: {}", std::io::Error::last_os_error());
        }
    }
}

/// A new private file in `dir` under a name nobody else made (O_EXCL, O_NOFOLLOW, 0600):
/// `.NAME.gpustall-PID-N.tmp`, another N where one is taken.
fn create_fresh(dir: &Path, name: &std::ffi::OsStr) -> anyhow::Result<(File, PathBuf)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut last = None;
    for _ in 0..16 {
        let n = N.fetch_add(1, Ordering::Relaxed) ^ crate::sources::clock::monotonic_ns();
        let tmp = dir.join(format!(
            ".{}.gpustall-{}-{n:x}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => {
                give_to_caller(&f);
                return Ok((f, tmp));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot create a file in {}", dir.display())))
            }
        }
    }
    Err(anyhow::Error::new(last.unwrap_or_else(|| std::io::ErrorKind::AlreadyExists.into()))
        .context(format!("cannot create a file in {}", dir.display())))
}

/// Checks, before anything runs, that `flag`'s output `path` can be written: its directory
/// exists and takes a new file (one is made and removed), and nothing but a regular file is
/// there (a symbolic link too when the output is `whole`, written at the end and renamed
/// over it). `-` and streams (/dev, /proc) pass.
pub fn check_writable(flag: &str, path: &Path, whole: bool) -> anyhow::Result<()> {
    if is_stream(path) || (whole && is_stdout(path)) {
        return Ok(());
    }
    let checked = (|| {
        refuse_non_file(path, whole)?;
        let (dir, name) = dir_and_name(path)?;
        let (_, probe) = create_fresh(&dir, &name)?;
        let _ = std::fs::remove_file(probe);
        Ok(())
    })();
    checked.map_err(|e: anyhow::Error| anyhow::anyhow!("{flag} {}: {e:#}", path.display()))
}

/// Writes `bytes` to `path` whole: a private temporary file beside it, renamed over it; to
/// standard output for `-`.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_private_with(path, |w| w.write_all(bytes))
}

/// [`write_private`] of what `write` writes, streamed (buffered) to the file as it comes.
pub fn write_private_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    if is_stdout(path) {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        return write(&mut out).and_then(|()| out.flush()).context("writing to stdout");
    }
    if is_stream(path) {
        let mut f = std::io::BufWriter::new(create_private(path)?);
        return write(&mut f)
            .and_then(|()| f.flush())
            .with_context(|| format!("writing {}", path.display()));
    }
    let (dir, name) = dir_and_name(path)?;
    let (f, tmp) = create_fresh(&dir, &name)?;
    let result = (|| {
        let mut w = std::io::BufWriter::with_capacity(256 * 1024, f);
        write(&mut w)
            .and_then(|()| w.flush())
            .with_context(|| format!("writing {}", path.display()))?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_data().with_context(|| format!("writing {}", path.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Refuses outputs that would overwrite an input or each other: `report f --summary-json f`
/// would destroy the recording it reads.
pub fn refuse_clashes(inputs: &[&Path], outputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (i, (flag, out)) in outputs.iter().enumerate() {
        for input in inputs {
            if same_file(input, out) {
                anyhow::bail!(
                    "{flag} {} is the recording being read: choose another path",
                    out.display()
                );
            }
        }
        for (other_flag, other) in &outputs[..i] {
            if same_file(other, out) {
                anyhow::bail!(
                    "{other_flag} and {flag} name the same file {}: choose two paths",
                    out.display()
                );
            }
        }
    }
    Ok(())
}

/// The same path, or the same existing file (device and inode, through links).
fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Self {
            let p =
                std::env::temp_dir().join(format!("gpustall-files-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("dir");
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
    }

    #[test]
    fn a_symlink_is_replaced_or_refused_never_followed() {
        let d = Dir::new("link");
        let victim = d.0.join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let link = d.0.join("out.json");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        let e = create_private(&link).expect_err("a symlink is refused");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        write_private(&link, b"{}").expect("written beside and renamed");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "precious");
        assert!(!std::fs::symlink_metadata(&link).expect("meta").file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&link).expect("out"), "{}");
    }

    #[test]
    fn outputs_are_private_even_over_an_open_file() {
        let d = Dir::new("mode");
        let p = d.0.join("summary.json");
        std::fs::write(&p, "old").expect("old");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private(&p, b"new").expect("write");
        assert_eq!(mode(&p), 0o600);
        let q = d.0.join("record.jsonl");
        std::fs::write(&q, "old").expect("old");
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(create_private(&q).expect("create"));
        assert_eq!(mode(&q), 0o600);
        assert_eq!(std::fs::read_to_string(&q).expect("read"), "", "truncated");
    }

    #[test]
    fn a_fifo_is_refused_never_opened_and_a_bad_directory_found_at_start() {
        let d = Dir::new("fifo");
        let fifo = d.0.join("rec.jsonl");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("c");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let e = create_private(&fifo).expect_err("a FIFO is refused");
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(check_writable("--summary-json", &fifo, true).is_err());
        let e = check_writable("--perfetto", &d.0.join("no/such/dir/p.json"), true)
            .expect_err("no such directory");
        assert!(format!("{e:#}").starts_with("--perfetto "), "{e:#}");
        check_writable("--record", &d.0.join("new.jsonl"), false).expect("a new file");
        check_writable("--summary-json", Path::new("-"), true).expect("stdout");
        let left: Vec<_> = std::fs::read_dir(&d.0).expect("dir").collect();
        assert_eq!(left.len(), 1, "the probe is removed: {left:?}");
    }

    #[test]
    fn an_output_that_is_the_input_is_refused() {
        let d = Dir::new("clash");
        let rec = d.0.join("rec.jsonl");
        std::fs::write(&rec, "x").expect("rec");
        let e = refuse_clashes(&[&rec], &[("--summary-json", &rec)]).expect_err("clash");
        assert!(e.to_string().contains("is the recording being read"), "{e}");
        let hard = d.0.join("hard");
        std::fs::hard_link(&rec, &hard).expect("link");
        assert!(refuse_clashes(&[&rec], &[("--html", &hard)]).is_err(), "through a hard link");
        let (a, b) = (d.0.join("a"), d.0.join("b"));
        assert!(refuse_clashes(&[&rec], &[("--record", &a), ("--summary-json", &a)]).is_err());
        assert!(refuse_clashes(&[&rec], &[("--record", &a), ("--summary-json", &b)]).is_ok());
    }
}
