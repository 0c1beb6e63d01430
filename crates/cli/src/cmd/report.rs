//! `headroom report`.

/// Flags of `headroom report`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom report: not built yet")
}
