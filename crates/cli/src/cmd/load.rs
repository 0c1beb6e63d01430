//! `headroom load`.

/// Flags of `headroom load`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom load: not built yet")
}
