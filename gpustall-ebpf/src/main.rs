//! gpustall's kernel side: tracepoint programs that follow a process tree and measure the host
//! memory-pressure chain (reclaim, swap-out, block I/O, OOM kills) for it.
//!
//! Only tasks of tracked processes (the `TRACKED` map, seeded by the agent with `--pid` and its
//! descendants, grown here at fork) produce per-process data; everything else is at most a
//! host-level counter. Field offsets come from the agent (`OFFSETS`), read from tracefs format
//! files: aya has no CO-RE.
#![no_std]
#![no_main]
// `atomic_xadd`: the BPF target has no `AtomicU64::fetch_add`, but LLVM lowers this intrinsic
// to BPF's atomic add (an unused result needs no BPF_FETCH, so 5.10 runs it too).
#![feature(core_intrinsics)]
// `common::at_most`: a clamp the verifier sees on the register the access uses.
#![feature(asm_experimental_arch)]
#![allow(internal_features)]

mod block;
mod common;
mod diag;
mod gpu;
mod process;
mod reclaim;
mod sched;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
