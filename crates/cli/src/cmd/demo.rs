//! `headroom demo`.

/// Flags of `headroom demo`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom demo: not built yet")
}
