//! `headroom bench loadgen`.

pub fn run(_out: Option<std::path::PathBuf>, _rest: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("headroom bench loadgen: not built yet")
}
