//! A kernel event as the model takes it in: decoded from a ring record (`kernel::decode`) live,
//! or read back from a recording.

use gpustall_common::reclaim::ReclaimKind;

/// Who was running when the event fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub t_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Fork {
        h: Header,
        child_pid: u32,
        clone_flags: u64,
    },
    /// `exit_code` is the raw wait status; `None` when the kernel's BTF did not give its offset.
    Exit {
        h: Header,
        exit_code: Option<u32>,
    },
    Rename {
        h: Header,
        pid: u32,
        new_comm: String,
    },
    Exec {
        h: Header,
        old_pid: u32,
        filename: String,
    },
    OomVictim {
        h: Header,
        victim_pid: u32,
        victim_comm: String,
        /// `None` on kernels whose mark_victim has only `pid`.
        rss: Option<OomRss>,
        oom_score_adj: i32,
        uid: u32,
    },
    Signal {
        h: Header,
        sig: i32,
        code: i32,
        target_pid: u32,
        result: i32,
        target_comm: String,
    },
    Reclaim {
        h: Header,
        kind: ReclaimKind,
        start_ns: u64,
        duration_ns: u64,
        nr_reclaimed: u64,
    },
    Throttled {
        h: Header,
        usec_timeout: i32,
        usec_delayed: i32,
        reason: i32,
        nid: i32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomRss {
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
}

impl Event {
    pub fn header(&self) -> &Header {
        match self {
            Event::Fork { h, .. }
            | Event::Exit { h, .. }
            | Event::Rename { h, .. }
            | Event::Exec { h, .. }
            | Event::OomVictim { h, .. }
            | Event::Signal { h, .. }
            | Event::Reclaim { h, .. }
            | Event::Throttled { h, .. } => h,
        }
    }

    /// The name used in records (`"kind"`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Event::Fork { .. } => "fork",
            Event::Exit { .. } => "exit",
            Event::Rename { .. } => "rename",
            Event::Exec { .. } => "exec",
            Event::OomVictim { .. } => "oom_kill",
            Event::Signal { .. } => "signal",
            Event::Reclaim { .. } => "reclaim",
            Event::Throttled { .. } => "reclaim_throttled",
        }
    }
}
