//! `headroom agent`.

/// Flags of `headroom agent`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom agent: not built yet")
}
