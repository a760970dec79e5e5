//! `weir ipam …` (being written with the IPAM issue).

/// `weir ipam` arguments.
#[derive(Debug, clap::Args)]
pub struct IpamArgs {}

/// Runs `weir ipam`.
pub fn run(_args: IpamArgs) -> anyhow::Result<()> {
    anyhow::bail!("weir ipam is not available yet")
}
