//! `headroom serve`: the memcached-compatible latency-critical service.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use headroom_workloads::serve::{Dispatch, ServeConfig, Server, ServiceTime};
use headroom_workloads::signal;

/// Flags of `headroom serve` (memcached's short flags where memcached has them).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TCP port (0 = any free port; the chosen address is printed on stdout)
    #[arg(short = 'p', long, default_value_t = 11211)]
    pub port: u16,
    /// Address to listen on
    #[arg(short = 'l', long, default_value = "127.0.0.1")]
    pub listen: String,
    /// Worker threads
    #[arg(short = 't', long, default_value_t = 4)]
    pub threads: usize,
    /// Connection dispatch: static (memcached's round-robin) or shared (one epoll set, any idle
    /// thread serves the next ready connection)
    #[arg(long, default_value = "static")]
    pub dispatch: String,
    /// Pin worker thread i to the i-th CPU this process may use
    #[arg(long)]
    pub pin: bool,
    /// Synthetic CPU work per request, µs, in the load generator's distribution syntax
    /// (e.g. fixed:1000, exponential:50)
    #[arg(long, value_name = "DIST")]
    pub service_time: Option<String>,
    /// Working set (MiB) that every request reads 64 cache lines from
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub footprint_mb: usize,
    /// Item memory limit in MiB (LRU eviction beyond it)
    #[arg(
        short = 'm',
        long = "memory-limit",
        default_value_t = 64,
        value_name = "MB"
    )]
    pub memory_mb: usize,
    /// Largest item in bytes (k/m suffixes allowed), like memcached's -I
    #[arg(short = 'I', long = "max-item-size", default_value = "1m")]
    pub max_item_size: String,
    /// Most simultaneous connections
    #[arg(short = 'c', long = "conn-limit", default_value_t = 1024)]
    pub conn_limit: usize,
}

fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1usize << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// Builds the library configuration from the flags (bad values are usage errors).
pub fn config_from_args(args: &Args) -> anyhow::Result<ServeConfig> {
    let listen: IpAddr = args
        .listen
        .parse()
        .map_err(|_| super::usage(format!("--listen {:?} is not an IP address", args.listen)))?;
    let dispatch: Dispatch = args
        .dispatch
        .parse()
        .map_err(|e| super::usage(format!("--dispatch: {e}")))?;
    let service_time = match &args.service_time {
        None => None,
        Some(spec) => Some(
            ServiceTime::parse(spec)
                .map_err(|e| super::usage(format!("--service-time {spec:?}: {e}")))?,
        ),
    };
    let max_item_bytes = parse_size(&args.max_item_size).ok_or_else(|| {
        super::usage(format!(
            "--max-item-size {:?}: expected a byte count like 1048576, 512k or 1m",
            args.max_item_size
        ))
    })?;
    let config = ServeConfig {
        listen,
        port: args.port,
        threads: args.threads,
        dispatch,
        pin: args.pin,
        service_time,
        footprint_mb: args.footprint_mb,
        memory_mb: args.memory_mb,
        max_item_bytes,
        max_connections: args.conn_limit,
    };
    config.validate().map_err(|e| super::usage(e.to_string()))?;
    Ok(config)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = config_from_args(&args)?;
    let stop = signal::install_stop_flag().context("installing SIGTERM/SIGINT handlers")?;
    let (threads, dispatch, pin) = (config.threads, config.dispatch, config.pin);
    let mut handle = Server::start(config)?;
    println!(
        "headroom serve: listening on {} (threads {threads}, dispatch {dispatch}{})",
        handle.addr(),
        if pin { ", pinned" } else { "" }
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        if !handle.is_running() {
            anyhow::bail!("headroom serve: a server thread exited unexpectedly");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = handle.stats();
    handle.stop();
    let get = |name: &str| {
        stats
            .pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    eprintln!(
        "headroom serve: stopped after {} s ({} connections, {} requests)",
        get("uptime"),
        get("total_connections"),
        get("requests")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("512k"), Some(512 << 10));
        assert_eq!(parse_size("2000"), Some(2000));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }
}
