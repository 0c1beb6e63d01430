//! `headroom bench host`.

pub fn run(_out: Option<std::path::PathBuf>, _rest: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("headroom bench host: not built yet")
}
