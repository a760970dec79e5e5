//! `cargo xtask bench datapath` (being written with its issue).

pub(crate) fn run(_workspace: &std::path::Path, _smoke: bool) -> anyhow::Result<()> {
    anyhow::bail!("the datapath benchmark is not written yet")
}
