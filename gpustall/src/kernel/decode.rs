//! Decoding of ring-buffer records into [`Event`]s. A pure function of the bytes: a length
//! check, `read_unaligned` into the shared `#[repr(C)]` type, `TryFrom` for enums.

use gpustall_common::{
    events::{
        DataWaitEvent, EventHeader, EventKind, ExecEvent, ExitEvent, ForkEvent, OomVictimEvent,
        ReclaimEvent, RenameEvent, SignalEvent, ThrottledEvent,
    },
    reclaim::ReclaimKind,
    syscall::WaitClass,
};

use crate::model::event::{Event, Header, OomRss};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is too short for {what} ({need} bytes)")]
    TooShort { what: &'static str, len: usize, need: usize },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("unknown reclaim kind {0}")]
    UnknownReclaimKind(u32),
}

/// A NUL-terminated kernel string (comm, file name) as text.
pub fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn read<T: Copy>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let need = std::mem::size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::TooShort { what, len: bytes.len(), need });
    }
    // SAFETY: length checked above; read_unaligned has no alignment requirement, and T is one
    // of the shared repr(C) integer-only types, valid for any bit pattern.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn header(h: &EventHeader) -> Header {
    Header { t_ns: h.t_ns, pid: h.pid, tid: h.tid, comm: c_str(&h.comm) }
}

/// One ring record as an [`Event`]: its header says which record it is.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let h: EventHeader = read(bytes, "header")?;
    match EventKind::try_from(h.kind).map_err(DecodeError::UnknownKind)? {
        EventKind::Fork => fork(bytes),
        EventKind::Exit => exit(bytes),
        EventKind::Rename => rename(bytes),
        EventKind::Exec => exec(bytes),
        EventKind::OomVictim => oom_victim(bytes),
        EventKind::Signal => signal(bytes),
        EventKind::Reclaim => reclaim(bytes),
        EventKind::Throttled => throttled(bytes),
        EventKind::DataWait => data_wait(bytes),
    }
}

fn fork(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: ForkEvent = read(bytes, "fork")?;
    Ok(Event::Fork { h: header(&e.header), child_pid: e.child_pid, clone_flags: e.clone_flags })
}

fn exit(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: ExitEvent = read(bytes, "exit")?;
    Ok(Event::Exit {
        h: header(&e.header),
        exit_code: (e.exit_code_known != 0).then_some(e.exit_code),
    })
}

fn rename(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: RenameEvent = read(bytes, "rename")?;
    Ok(Event::Rename {
        h: header(&e.header),
        renamed_tid: e.renamed_tid,
        new_comm: c_str(&e.new_comm),
    })
}

fn exec(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: ExecEvent = read(bytes, "exec")?;
    Ok(Event::Exec { h: header(&e.header), old_pid: e.old_pid, filename: c_str(&e.filename) })
}

fn oom_victim(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: OomVictimEvent = read(bytes, "oom victim")?;
    Ok(Event::OomVictim {
        h: header(&e.header),
        victim_pid: e.victim_pid,
        victim_tid: Some(e.victim_tid),
        victim_comm: c_str(&e.victim_comm),
        rss: (e.has_rss != 0).then_some(OomRss {
            total_vm_kb: e.total_vm_kb,
            anon_rss_kb: e.anon_rss_kb,
            file_rss_kb: e.file_rss_kb,
            shmem_rss_kb: e.shmem_rss_kb,
        }),
        oom_score_adj: e.oom_score_adj,
        uid: e.uid,
    })
}

fn signal(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: SignalEvent = read(bytes, "signal")?;
    Ok(Event::Signal {
        h: header(&e.header),
        sig: e.sig,
        code: e.code,
        target_pid: e.target_pid,
        target_tid: Some(e.target_tid),
        result: e.result,
        target_comm: c_str(&e.target_comm),
    })
}

fn reclaim(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: ReclaimEvent = read(bytes, "reclaim")?;
    Ok(Event::Reclaim {
        h: header(&e.header),
        kind: ReclaimKind::try_from(e.kind).map_err(DecodeError::UnknownReclaimKind)?,
        start_ns: e.start_ns,
        duration_ns: e.duration_ns,
        nr_reclaimed: e.nr_reclaimed,
    })
}

fn throttled(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: ThrottledEvent = read(bytes, "throttled")?;
    Ok(Event::Throttled {
        h: header(&e.header),
        usec_timeout: e.usec_timeout,
        usec_delayed: e.usec_delayed,
        reason: e.reason,
        nid: e.nid,
    })
}

fn data_wait(bytes: &[u8]) -> Result<Event, DecodeError> {
    let e: DataWaitEvent = read(bytes, "data wait")?;
    Ok(Event::DataWait {
        h: header(&e.header),
        wakee_pid: e.wakee_pid,
        wakee_tid: e.wakee_tid,
        start_ns: e.start_ns,
        duration_ns: e.duration_ns,
        wait_class: Some(WaitClass::from_u8(e.wait_class)),
        slices: Some(u32::from(e.slices)),
        job_wakes: Some(u32::from(e.job_wakes)),
        relay_tid: (e.relay_tid != 0).then_some(e.relay_tid),
        co_waker: (e.co_waker != 0).then_some(e.co_waker),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) integer-only value for the test.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    fn hdr(kind: EventKind) -> EventHeader {
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"python");
        EventHeader { kind: kind as u32, pid: 100, tid: 101, _pad: 0, t_ns: 5_000, comm }
    }

    #[test]
    fn decodes_oom_victim_with_rss() {
        let mut victim_comm = [0u8; 16];
        victim_comm[..14].copy_from_slice(b"pt_data_worker");
        let e = OomVictimEvent {
            header: hdr(EventKind::OomVictim),
            victim_pid: 4242,
            has_rss: 1,
            total_vm_kb: 1,
            anon_rss_kb: 204_800,
            file_rss_kb: 3,
            shmem_rss_kb: 4,
            oom_score_adj: 0,
            uid: 0,
            victim_comm,
            victim_tid: 4243,
            _pad2: 0,
        };
        match decode(&as_bytes(&e)).expect("decodes") {
            Event::OomVictim { h, victim_pid, victim_tid, victim_comm, rss, .. } => {
                assert_eq!(victim_tid, Some(4243), "the marked thread, beside its process");
                assert_eq!((h.pid, h.tid, h.comm.as_str()), (100, 101, "python"));
                assert_eq!(victim_pid, 4242);
                assert_eq!(victim_comm, "pt_data_worker");
                assert_eq!(rss.map(|r| r.anon_rss_kb), Some(204_800));
            }
            other => panic!("wrong event {other:?}"),
        }
    }

    #[test]
    fn old_kernel_oom_has_no_rss() {
        let e = OomVictimEvent {
            header: hdr(EventKind::OomVictim),
            victim_pid: 1,
            has_rss: 0,
            total_vm_kb: 0,
            anon_rss_kb: 0,
            file_rss_kb: 0,
            shmem_rss_kb: 0,
            oom_score_adj: 0,
            uid: 0,
            victim_comm: [0; 16],
            victim_tid: 1,
            _pad2: 0,
        };
        assert!(matches!(decode(&as_bytes(&e)), Ok(Event::OomVictim { rss: None, .. })));
    }

    #[test]
    fn short_and_unknown_records_are_errors_not_panics() {
        let e = ExitEvent { header: hdr(EventKind::Exit), exit_code: 9, exit_code_known: 1 };
        let b = as_bytes(&e);
        assert_eq!(
            decode(&b[..44]),
            Err(DecodeError::TooShort { what: "exit", len: 44, need: 48 })
        );
        assert!(matches!(decode(&b[..10]), Err(DecodeError::TooShort { what: "header", .. })));
        let mut bad = hdr(EventKind::Exit);
        bad.kind = 99;
        assert_eq!(decode(&as_bytes(&bad)), Err(DecodeError::UnknownKind(99)));
        assert!(matches!(decode(&b), Ok(Event::Exit { exit_code: Some(9), .. })));
    }

    #[test]
    fn reclaim_kind_is_checked() {
        let mut e = ReclaimEvent {
            header: hdr(EventKind::Reclaim),
            kind: 2,
            _pad: 0,
            start_ns: 1,
            duration_ns: 2,
            nr_reclaimed: 32,
        };
        assert!(matches!(
            decode(&as_bytes(&e)),
            Ok(Event::Reclaim { kind: ReclaimKind::Memcg, .. })
        ));
        e.kind = 7;
        assert_eq!(decode(&as_bytes(&e)), Err(DecodeError::UnknownReclaimKind(7)));
    }
}
