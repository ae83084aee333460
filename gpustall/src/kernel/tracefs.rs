//! tracefs: where tracepoints live, and their field layouts. aya has no CO-RE, so the byte
//! offset of every field the programs read comes from
//! `/sys/kernel/tracing/events/<sys>/<event>/format` of the running kernel.

use std::path::{Path, PathBuf};

use gpustall_common::offsets::{TracepointOffsets, MISSING};

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u16,
    pub size: u16,
}

/// Parses the `field:` lines of a format file, e.g.
/// `field:unsigned long anon_rss;<TAB>offset:24;<TAB>size:8;<TAB>signed:0;`.
/// The name is the last word of the declaration, without an array suffix.
pub fn parse_format(text: &str) -> Vec<Field> {
    text.lines()
        .filter_map(|line| {
            let mut decl = None;
            let mut offset = None;
            let mut size = None;
            for part in line.trim().split(';') {
                let part = part.trim();
                if let Some(d) = part.strip_prefix("field:") {
                    decl = Some(d.trim());
                } else if let Some(o) = part.strip_prefix("offset:") {
                    offset = o.trim().parse().ok();
                } else if let Some(s) = part.strip_prefix("size:") {
                    size = s.trim().parse().ok();
                }
            }
            let last = decl?.split_whitespace().last()?;
            let name = last.split('[').next()?.to_string();
            Some(Field { name, offset: offset?, size: size? })
        })
        .collect()
}

pub const DEFAULT_ROOT: &str = "/sys/kernel/tracing";

/// A tracefs mount.
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Opens tracefs at its usual place, mounting it there first if the kernel has not.
    pub fn open() -> anyhow::Result<Self> {
        let root = PathBuf::from(DEFAULT_ROOT);
        match std::fs::metadata(root.join("events")) {
            Ok(m) if m.is_dir() => {}
            // Mounted, but 0700 and we are not root: mounting again would not help.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => anyhow::bail!(
                "tracefs at {} is not readable by this user: run as root, or add CAP_DAC_READ_SEARCH to CAP_BPF and CAP_PERFMON",
                root.display()
            ),
            _ => mount_tracefs(&root)?,
        }
        Ok(Self { root })
    }

    #[cfg(test)]
    pub fn at(root: &Path) -> Self {
        Self { root: root.to_path_buf() }
    }

    pub fn exists(&self, category: &str, name: &str) -> bool {
        self.root.join("events").join(category).join(name).join("format").is_file()
    }

    pub fn fields(&self, category: &str, name: &str) -> Option<Vec<Field>> {
        let path = self.root.join("events").join(category).join(name).join("format");
        std::fs::read_to_string(path).ok().map(|t| parse_format(&t))
    }

    /// Offsets of every field the programs read; fields this kernel lacks stay [`MISSING`].
    /// `write_folio_event` and `io_done_event` are the names this kernel has for swap-out
    /// writeback and request completion (see the loader's probe table).
    pub fn offsets(&self, write_folio_event: &str, io_done_event: &str) -> TracepointOffsets {
        let mut o = TracepointOffsets::missing();
        let find = |cat: &str, ev: &str, field: &str| -> u16 {
            self.fields(cat, ev)
                .and_then(|f| f.into_iter().find(|f| f.name == field))
                .map_or(MISSING, |f| f.offset)
        };
        o.newtask_pid = find("task", "task_newtask", "pid");
        o.newtask_clone_flags = find("task", "task_newtask", "clone_flags");
        o.exit_group_dead = find("sched", "sched_process_exit", "group_dead");
        o.rename_pid = find("task", "task_rename", "pid");
        o.rename_newcomm = find("task", "task_rename", "newcomm");
        o.exec_filename = find("sched", "sched_process_exec", "filename");
        o.exec_old_pid = find("sched", "sched_process_exec", "old_pid");
        o.oom_pid = find("oom", "mark_victim", "pid");
        o.oom_comm = find("oom", "mark_victim", "comm");
        o.oom_total_vm = find("oom", "mark_victim", "total_vm");
        o.oom_anon_rss = find("oom", "mark_victim", "anon_rss");
        o.oom_file_rss = find("oom", "mark_victim", "file_rss");
        o.oom_shmem_rss = find("oom", "mark_victim", "shmem_rss");
        o.oom_uid = find("oom", "mark_victim", "uid");
        o.oom_score_adj = find("oom", "mark_victim", "oom_score_adj");
        o.sig_sig = find("signal", "signal_generate", "sig");
        o.sig_code = find("signal", "signal_generate", "code");
        o.sig_comm = find("signal", "signal_generate", "comm");
        o.sig_pid = find("signal", "signal_generate", "pid");
        o.sig_result = find("signal", "signal_generate", "result");
        o.reclaim_end_nr_reclaimed = find("vmscan", "mm_vmscan_direct_reclaim_end", "nr_reclaimed");
        o.write_folio_flags = find("vmscan", write_folio_event, "reclaim_flags");
        o.throttled_usec_timeout = find("vmscan", "mm_vmscan_throttled", "usec_timeout");
        o.throttled_usec_delayed = find("vmscan", "mm_vmscan_throttled", "usec_delayed");
        o.throttled_reason = find("vmscan", "mm_vmscan_throttled", "reason");
        o.throttled_nid = find("vmscan", "mm_vmscan_throttled", "nid");
        o.bio_dev = find("block", "block_bio_queue", "dev");
        o.bio_nr_sector = find("block", "block_bio_queue", "nr_sector");
        o.bio_rwbs = find("block", "block_bio_queue", "rwbs");
        o.bio_sector = find("block", "block_bio_queue", "sector");
        o.rq_dev = find("block", "block_io_start", "dev");
        o.rq_sector = find("block", "block_io_start", "sector");
        o.rq_rwbs = find("block", "block_io_start", "rwbs");
        o.done_dev = find("block", io_done_event, "dev");
        o.done_sector = find("block", io_done_event, "sector");
        o.bio_starts_io = u16::from(!self.exists("block", "block_io_start"));
        o.remap_dev = find("block", "block_bio_remap", "dev");
        o.remap_sector = find("block", "block_bio_remap", "sector");
        o.remap_old_dev = find("block", "block_bio_remap", "old_dev");
        o.remap_old_sector = find("block", "block_bio_remap", "old_sector");
        o
    }
}

fn mount_tracefs(root: &Path) -> anyhow::Result<()> {
    use std::ffi::CString;
    let target = CString::new(root.as_os_str().as_encoded_bytes())?;
    let fstype = CString::new("tracefs")?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        anyhow::bail!(
            "tracefs is not mounted at {} and mounting it failed ({}): run `mount -t tracefs nodev {}` as root",
            root.display(),
            std::io::Error::last_os_error(),
            root.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM: &str = "name: mark_victim\nID: 600\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n\
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;\n\
\nprint fmt: \"pid=%d\", REC->pid\n";

    #[test]
    fn parses_fields_with_types_arrays_and_data_loc() {
        let f = parse_format(MARK_VICTIM);
        assert_eq!(f.len(), 4);
        assert_eq!(f[1], Field { name: "pid".into(), offset: 8, size: 4 });
        assert_eq!(f[2], Field { name: "comm".into(), offset: 12, size: 4 });
        assert_eq!(f[3].name, "anon_rss");
        let rename = "\tfield:char newcomm[16];\toffset:28;\tsize:16;\tsigned:0;";
        assert_eq!(parse_format(rename)[0], Field { name: "newcomm".into(), offset: 28, size: 16 });
    }

    #[test]
    fn old_format_with_only_pid_leaves_rss_missing() {
        let dir = std::env::temp_dir().join(format!("gpustall-tracefs-{}", std::process::id()));
        let ev = dir.join("events/oom/mark_victim");
        std::fs::create_dir_all(&ev).expect("mkdir");
        std::fs::write(ev.join("format"), "\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n")
            .expect("write");
        let o = Tracefs::at(&dir).offsets("mm_vmscan_write_folio", "block_io_done");
        assert_eq!(o.oom_pid, 8);
        assert_eq!(o.oom_anon_rss, MISSING);
        assert_eq!(o.bio_nr_sector, MISSING);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
