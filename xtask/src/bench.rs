//! `cargo xtask bench`: overhead, measured side by side in one run.

pub fn run() -> anyhow::Result<()> {
    crate::setup::run_setup(true)?;
    anyhow::bail!("no benchmark yet")
}
