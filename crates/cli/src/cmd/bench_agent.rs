//! `headroom bench agent`.

pub fn run(_out: Option<std::path::PathBuf>, _rest: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("headroom bench agent: not built yet")
}
