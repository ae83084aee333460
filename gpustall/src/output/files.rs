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
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

/// `/dev/stdout`, `/dev/null`, `/proc/self/fd/N`: a stream the user names on purpose, written
/// as it is (its links followed, its mode left alone), never replaced.
fn is_stream(path: &Path) -> bool {
    path.starts_with("/dev") || path.starts_with("/proc")
}

/// Opens `path` for writing from the start (created or truncated), refusing a symbolic link.
pub fn create_private(path: &Path) -> anyhow::Result<File> {
    if is_stream(path) {
        return OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()));
    }
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| refuse_link(path, e))?;
    // An existing file keeps its mode through O_TRUNC: force the promised one (on files only:
    // a FIFO or device someone named keeps its own).
    if file.metadata().is_ok_and(|m| m.is_file()) {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private", path.display()))?;
    }
    Ok(file)
}

fn refuse_link(path: &Path, e: std::io::Error) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        anyhow::anyhow!(
            "refusing to write {}: it is a symbolic link (remove it or choose another path)",
            path.display()
        )
    } else {
        anyhow::Error::new(e).context(format!("cannot create {}", path.display()))
    }
}

/// Writes `bytes` to `path` whole: a private temporary file beside it, renamed over it.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if is_stream(path) {
        let mut f = create_private(path)?;
        return f.write_all(bytes).with_context(|| format!("writing {}", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    let tmp = dir.join(format!(".{}.gpustall-{}.tmp", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .with_context(|| format!("cannot create a file in {}", dir.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
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
