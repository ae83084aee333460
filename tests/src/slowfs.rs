//! A FUSE filesystem whose reads wait on a slow server: one read-only file, `data`, of 1 GiB,
//! each read answered after a fixed delay (opened with direct I/O, so that every read reaches
//! it and none is served from the page cache). It stands for a network filesystem or an object
//! store mounted as files (NFS, s3fs, gcsfuse): the reader blocks in read(2) on a file that no
//! local block device holds. Its first mkdir is answered only after `stall` (a server that
//! stopped answering): the caller holds its directory's lock meanwhile, and a second mkdir
//! there waits for that lock in uninterruptible sleep (D), as tasks behind a dead NFS server
//! do. Mounted by the mount syscall (root, no libfuse), unmounted when the guard drops, also
//! on a test's failure.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen,
    Request,
};

const ROOT: u64 = 1;
const DATA: u64 = 2;
const TTL: Duration = Duration::from_secs(60);

struct Slow {
    delay: Duration,
    /// How long the first mkdir waits for its answer (then every mkdir is refused at once).
    stall: Option<Duration>,
}

fn attr(ino: u64) -> FileAttr {
    let dir = ino == ROOT;
    FileAttr {
        ino,
        size: if dir { 0 } else { 1 << 30 },
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir { FileType::Directory } else { FileType::RegularFile },
        perm: if dir { 0o755 } else { 0o444 },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for Slow {
    fn lookup(&mut self, _: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == "data" {
            reply.entry(&TTL, &attr(DATA), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _: &Request<'_>, ino: u64, _: Option<u64>, reply: ReplyAttr) {
        match ino {
            ROOT | DATA => reply.attr(&TTL, &attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn mkdir(&mut self, _: &Request<'_>, _: u64, _: &OsStr, _: u32, _: u32, reply: ReplyEntry) {
        if let Some(stall) = self.stall.take() {
            std::thread::sleep(stall);
        }
        reply.error(libc::EACCES);
    }

    fn open(&mut self, _: &Request<'_>, _: u64, _: i32, reply: ReplyOpen) {
        reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
    }

    #[allow(clippy::too_many_arguments)] // the trait's signature
    fn read(
        &mut self,
        _: &Request<'_>,
        _: u64,
        _: u64,
        _: i64,
        size: u32,
        _: i32,
        _: Option<u64>,
        reply: ReplyData,
    ) {
        std::thread::sleep(self.delay);
        reply.data(&vec![7u8; size as usize]);
    }
}

/// A mounted slow filesystem; unmounted on drop.
pub struct SlowFs {
    dir: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl SlowFs {
    /// The kernel can mount FUSE filesystems (after loading `fuse` where it is a module).
    pub fn available() -> bool {
        crate::blockdev::modprobe("fuse");
        Path::new("/dev/fuse").exists()
    }

    /// Mounts it on a fresh directory, its source named `source` (as mountinfo shows a
    /// network filesystem's "server:/export"), each read answered after `delay`.
    pub fn mount(source: &str, delay: Duration) -> Self {
        Self::mount_stalling(source, delay, None)
    }

    /// As [`SlowFs::mount`], its first mkdir answered only after `stall`.
    pub fn mount_stalling(source: &str, delay: Duration, stall: Option<Duration>) -> Self {
        let name = format!("gpustall-slowfs-{}-{}", std::process::id(), crate::unique());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("the mount point");
        // Writable: a read-only mount refuses a mkdir before it reaches the server.
        let opts = [MountOption::FSName(source.to_string())];
        let session = fuser::spawn_mount2(Slow { delay, stall }, &dir, &opts)
            .unwrap_or_else(|e| panic!("mounting a FUSE filesystem at {}: {e}", dir.display()));
        Self { dir, session: Some(session) }
    }

    /// The file whose reads wait on the server.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        // Unmounts (and ends the server thread); a reader still inside gets ENOTCONN.
        drop(self.session.take());
        let _ = std::fs::remove_dir(&self.dir);
    }
}
