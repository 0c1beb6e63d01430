//! `headroom doctor`.

/// Flags of `headroom doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("headroom doctor: not built yet")
}
