//! `headroom serve`.

/// Flags of `headroom serve`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom serve: not built yet")
}
