//! A kernel event as the model takes it in: decoded from a ring record (`kernel::decode`) live,
//! or read back from a recording.
//!
//! The recording's event line is this type's serde form: `{"type":"event","kind":..}` with the
//! header's fields (`t_ns`, `pid`, `tid`, `comm`) beside the event's own. The few
//! fields whose recorded form differs from the Rust one (the exit status split into code and
//! signal, the OOM victim's RSS as four nullable numbers) have their own small serde modules.

use gpustall_common::reclaim::ReclaimKind;
use serde::{Deserialize, Serialize};

/// Who was running when the event fired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub t_ns: u64,
    /// The process the event ran in (the kernel's tgid).
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Fork {
        #[serde(flatten)]
        h: Header,
        child_pid: u32,
        clone_flags: u64,
    },
    /// `exit_code` is the raw wait status; `None` when the kernel's BTF did not give its offset.
    Exit {
        #[serde(flatten)]
        h: Header,
        #[serde(flatten, with = "wait_status")]
        exit_code: Option<u32>,
    },
    Rename {
        #[serde(flatten)]
        h: Header,
        /// The thread that was renamed.
        renamed_tid: u32,
        new_comm: String,
    },
    Exec {
        #[serde(flatten)]
        h: Header,
        old_pid: u32,
        filename: String,
    },
    #[serde(rename = "oom_kill")]
    OomVictim {
        /// The task that invoked the OOM killer.
        #[serde(flatten)]
        h: Header,
        victim_pid: u32,
        /// The thread the killer marked, where the kernel said (older recordings lack it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        victim_tid: Option<u32>,
        victim_comm: String,
        /// `None` on kernels whose mark_victim has only `pid`.
        #[serde(flatten, with = "oom_rss")]
        rss: Option<OomRss>,
        oom_score_adj: i32,
        uid: u32,
    },
    Signal {
        /// The sender.
        #[serde(flatten)]
        h: Header,
        sig: i32,
        #[serde(rename = "si_code")]
        code: i32,
        target_pid: u32,
        /// The thread it was aimed at (tgkill, a fault in a thread), where the kernel said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target_tid: Option<u32>,
        result: i32,
        target_comm: String,
    },
    Reclaim {
        #[serde(flatten)]
        h: Header,
        #[serde(rename = "reclaim")]
        kind: ReclaimKind,
        start_ns: u64,
        duration_ns: u64,
        nr_reclaimed: u64,
    },
    #[serde(rename = "reclaim_throttled")]
    Throttled {
        #[serde(flatten)]
        h: Header,
        usec_timeout: i32,
        usec_delayed: i32,
        reason: i32,
        nid: i32,
    },
    /// A trainer's or rank's long wait for data (`sched::LONG_WAIT_NS` or more, one logical
    /// wait across timeouts, batches put aside and a relay thread) that another process of the
    /// job ended. The header is the waker (its comm empty); the wait ends at its `t_ns`.
    DataWait {
        #[serde(flatten)]
        h: Header,
        wakee_pid: u32,
        wakee_tid: u32,
        start_ns: u64,
        duration_ns: u64,
        /// The syscall the wakee blocked in (recordings before it have none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_class: Option<gpustall_common::syscall::WaitClass>,
        /// The wait's blocks up to its data, and how many a process of the job ended (the rest
        /// ran out: timeouts). Recordings before logical waits have neither (one block each).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slices: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_wakes: Option<u32>,
        /// The thread of the wakee's process that passed the batch on (a relay: PyTorch's
        /// pin-memory thread).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        relay_tid: Option<u32>,
        /// Another process that shares the wait with the waker, half each: its batch came at
        /// nearly the same time (`sched::co_arrival`), or it was busy producing its next one
        /// when the waker's came (`sched::wait_woken`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        co_waker: Option<u32>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
            | Event::Throttled { h, .. }
            | Event::DataWait { h, .. } => h,
        }
    }

    /// The process the event is about: an OOM kill's victim and a signal's target (not the
    /// task that triggered or sent it, which may belong to another job), the trainer a batch
    /// woke, else the process it ran in.
    pub fn subject_pid(&self) -> u32 {
        match self {
            Event::OomVictim { victim_pid, .. } => *victim_pid,
            Event::Signal { target_pid, .. } => *target_pid,
            Event::DataWait { wakee_pid, .. } => *wakee_pid,
            e => e.header().pid,
        }
    }
}

/// `Exit.exit_code` (the raw wait status) as recorded: `wait_status` itself, and for people
/// `exit_code` (when it exited) and `exit_signal` (when a signal ended it). Read back from
/// `wait_status` alone.
mod wait_status {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    struct Out {
        exit_code: Option<u32>,
        exit_signal: Option<u32>,
        wait_status: Option<u32>,
    }

    #[derive(Deserialize)]
    struct In {
        #[serde(default)]
        wait_status: Option<u32>,
    }

    pub fn serialize<S: Serializer>(status: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
        Out {
            exit_code: status.filter(|c| c & 0x7f == 0).map(|c| (c >> 8) & 0xff),
            exit_signal: status.map(|c| c & 0x7f).filter(|&sig| sig != 0),
            wait_status: *status,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        Ok(In::deserialize(d)?.wait_status)
    }
}

/// `OomVictim.rss` as recorded: four numbers, all null on kernels that do not give them.
pub(crate) mod oom_rss {
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    use super::OomRss;

    #[derive(Serialize, Deserialize)]
    struct Fields {
        #[serde(default)]
        anon_rss_kb: Option<u64>,
        #[serde(default)]
        file_rss_kb: Option<u64>,
        #[serde(default)]
        shmem_rss_kb: Option<u64>,
        #[serde(default)]
        total_vm_kb: Option<u64>,
    }

    pub fn serialize<S: Serializer>(rss: &Option<OomRss>, s: S) -> Result<S::Ok, S::Error> {
        Fields {
            anon_rss_kb: rss.map(|r| r.anon_rss_kb),
            file_rss_kb: rss.map(|r| r.file_rss_kb),
            shmem_rss_kb: rss.map(|r| r.shmem_rss_kb),
            total_vm_kb: rss.map(|r| r.total_vm_kb),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OomRss>, D::Error> {
        let f = Fields::deserialize(d)?;
        let Some(anon_rss_kb) = f.anon_rss_kb else { return Ok(None) };
        let need = |v: Option<u64>, name| v.ok_or_else(|| D::Error::missing_field(name));
        Ok(Some(OomRss {
            anon_rss_kb,
            file_rss_kb: need(f.file_rss_kb, "file_rss_kb")?,
            shmem_rss_kb: need(f.shmem_rss_kb, "shmem_rss_kb")?,
            total_vm_kb: need(f.total_vm_kb, "total_vm_kb")?,
        }))
    }
}
