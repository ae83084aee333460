//! The floor of a typed program, for `cargo xtask bench --only peer`: a raw tracepoint program
//! that returns at once (`r0 = 0; exit`), loaded and attached by this process with bpf(2), one
//! per event. gpustall's typed programs (`tp_btf`) run from the same place as a raw tracepoint
//! program (the tracepoint calls `bpf_trace_run`, no record is built), so this program's ns per
//! run is what any typed program pays on that event before doing any work; bpftrace's
//! `floor.bt` gives the same for classic tracepoint programs (the peer's kind).

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::Context as _;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// One do-nothing program attached to one event; detached when dropped.
pub struct Floor {
    pub event: &'static str,
    prog: OwnedFd,
    _link: OwnedFd,
}

impl Floor {
    /// Loads `r0 = 0; exit` and attaches it to the raw tracepoint `event`.
    pub fn attach(event: &'static str) -> anyhow::Result<Self> {
        let prog = load().context("loading the floor program")?;
        let name = CString::new(event)?;
        let mut attr = [0u64; 16];
        attr[0] = name.as_ptr() as u64;
        attr[1] = prog.as_raw_fd() as u64;
        // SAFETY: bpf(2) with a zeroed attr holding a live C string and a program fd.
        let fd = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_RAW_TRACEPOINT_OPEN, attr.as_mut_ptr(), 128usize)
        };
        if fd < 0 {
            anyhow::bail!("attaching to {event}: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        let link = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Self { event, prog, _link: link })
    }

    /// Its runs and run time so far (kernel.bpf_stats_enabled), from our own fdinfo.
    pub fn stats(&self) -> (u64, u64) {
        let path = format!("/proc/self/fdinfo/{}", self.prog.as_raw_fd());
        let info = std::fs::read_to_string(path).unwrap_or_default();
        let field = |k: &str| {
            info.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        (field("run_cnt:"), field("run_time_ns:"))
    }
}

/// `r0 = 0; exit` as a raw tracepoint program.
fn load() -> anyhow::Result<OwnedFd> {
    // BPF_ALU64 | BPF_MOV | BPF_K into r0, imm 0; BPF_JMP | BPF_EXIT.
    let insns: [u64; 2] = [0xb7, 0x95];
    let license = c"GPL";
    let mut attr = [0u8; 128];
    let put32 =
        |a: &mut [u8; 128], at: usize, v: u32| a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    let put64 =
        |a: &mut [u8; 128], at: usize, v: u64| a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    put32(&mut attr, 0, BPF_PROG_TYPE_RAW_TRACEPOINT);
    put32(&mut attr, 4, insns.len() as u32);
    put64(&mut attr, 8, insns.as_ptr() as u64);
    put64(&mut attr, 16, license.as_ptr() as u64);
    attr[48..53].copy_from_slice(b"floor");
    // SAFETY: bpf(2) with a PROG_LOAD attr pointing at live instructions and license.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, attr.as_mut_ptr(), 128usize) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
