//! `headroom antagonist`.

/// Flags of `headroom antagonist`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom antagonist: not built yet")
}
