//! `cargo xtask demo`: the main job on a machine with no training job at hand. Traces a bundled
//! workload shaped like a DataLoader memory blow-up inside a memory-limited cgroup.

pub fn run() -> anyhow::Result<()> {
    crate::setup::run_setup(true)?;
    anyhow::bail!("the demo workload is not built yet")
}
