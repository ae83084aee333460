//! The target and its descendants into the kernel's tracked set and the model: at the start of
//! `trace`, and for each task of a Slurm job found later.

use anyhow::Context as _;

use crate::{
    kernel::loader::KernelMaps,
    model::samples::Sample,
    pipeline::session::Session,
    sources::{host, procfs},
};

/// The target and its descendants into the kernel's tracked set and the model. Seeded after
/// attaching, and scanned again until a scan finds nobody new: a process forked by a parent
/// between that parent's scan and its insert was not tracked by the kernel (its parent was not
/// yet), and may itself have forked before being found. A tree forking faster than /proc can
/// be read would never settle: at most [`SEED_PASSES`] scans.
pub fn seed(
    session: &mut Session,
    maps: &mut KernelMaps,
    target: u32,
    t_ns: u64,
) -> anyhow::Result<()> {
    for _pass in 0..SEED_PASSES {
        let before = session.model.tree.iter().count();
        seed_pass(session, maps, target, t_ns)?;
        if session.model.tree.iter().count() == before {
            break;
        }
    }
    if !session.model.tree.contains(target) {
        anyhow::bail!("no such process: {target} (it exited before tracing started)");
    }
    Ok(())
}

const SEED_PASSES: usize = 16;

fn seed_pass(
    session: &mut Session,
    maps: &mut KernelMaps,
    target: u32,
    t_ns: u64,
) -> anyhow::Result<()> {
    let all = procfs::all_processes();
    for p in procfs::descendants_of(target, &all) {
        // Tracing pid 1 covers gpustall too: it must not trace its own reads and writes.
        if session.model.tree.contains(p.pid) || p.pid == std::process::id() {
            continue;
        }
        maps.track(p.pid).context("adding a process to the kernel's tracked map")?;
        session.observe(Sample::Seed {
            t_ns,
            pid: p.pid,
            ppid: p.ppid,
            comm: p.comm.clone(),
            is_target: p.pid == target,
        });
        if let Some(c) = host::cmdline(p.pid) {
            session.observe(Sample::Cmdline { t_ns, pid: p.pid, cmdline: c.join(" ") });
        }
        session.note_identity(p.pid, t_ns);
    }
    Ok(())
}
