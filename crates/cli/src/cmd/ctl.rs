//! `headroom ctl`.

/// Flags of `headroom ctl`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom ctl: not built yet")
}
