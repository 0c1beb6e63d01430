//! `headroom load`'s flags, declared once: mutilate's (same names, same meaning) plus headroom's
//! extensions. The CLI flattens [`LoadArgs`] into its `load` subcommand; [`LoadArgs::to_options`]
//! turns the run settings into [`LoadOptions`], and the other methods check the flags that steer
//! the run around it (`-W`, `--scan`, `--search`, the SASL flags). Errors name the flag and value.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::LoadError;
use crate::keys::Popularity;
use crate::options::{LoadOptions, ProtocolKind, ScanSpec, SearchSpec, DEFAULT_AGENT_PORT};

/// Default exit status of a run (or a scan with a row, or a search whose answer) that failed its
/// self-checks: distinct from 1 (error) and 2 (usage) so scripts notice.
pub const CHECKS_FAILED_EXIT: i32 = 3;

/// Flags of `headroom load` (mutilate-compatible).
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// Memcached server hostname[:port]; repeat for several servers
    #[arg(short = 's', long = "server", value_name = "H[:P]")]
    pub server: Vec<String>,
    /// Use the binary memcached protocol instead of ASCII (same as --protocol binary)
    #[arg(long)]
    pub binary: bool,
    /// Wire protocol: memcache | binary | redis
    #[arg(long, value_name = "P")]
    pub protocol: Option<String>,
    /// Target aggregate QPS; 0 = peak
    #[arg(short = 'q', long, default_value_t = 0)]
    pub qps: u64,
    /// Seconds to measure (after the warmup)
    #[arg(short = 't', long, default_value_t = 5.0)]
    pub time: f64,
    /// Length of memcached keys (distribution)
    #[arg(short = 'K', long, default_value = "30")]
    pub keysize: String,
    /// Length of memcached values (distribution)
    #[arg(short = 'V', long, default_value = "200")]
    pub valuesize: String,
    /// Number of records (divided among the servers)
    #[arg(short = 'r', long, default_value_t = 10000)]
    pub records: u64,
    /// Ratio of set:get commands
    #[arg(short = 'u', long, default_value_t = 0.0)]
    pub update: f64,
    /// Number of load threads
    #[arg(short = 'T', long, default_value_t = 1)]
    pub threads: usize,
    /// Pin threads to CPUs round-robin
    #[arg(long)]
    pub affinity: bool,
    /// Connections per server per thread, or `auto`: sized from the round trip measured before
    /// the run and the rate, grown during the run when every connection is at its depth cap
    #[arg(short = 'c', long, default_value = "1", value_name = "N|auto")]
    pub connections: String,
    /// Maximum requests in flight per connection
    #[arg(short = 'd', long, default_value_t = 1)]
    pub depth: usize,
    /// Inter-arrival distribution (its mean follows --qps)
    #[arg(short = 'i', long, default_value = "exponential")]
    pub iadist: String,
    /// Skip loading the keys
    #[arg(long)]
    pub noload: bool,
    /// Load the keys and exit
    #[arg(long)]
    pub loadonly: bool,
    /// Seconds of load before measuring
    #[arg(short = 'w', long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Scan latency across QPS: MIN:MAX:STEP
    #[arg(long, value_name = "MIN:MAX:STEP")]
    pub scan: Option<String>,
    /// Highest QPS whose P-th percentile stays under TARGET_US (P may be fractional: 99.9:500)
    #[arg(long, value_name = "P:TARGET_US")]
    pub search: Option<String>,
    /// Measurement connections per server (dedicated, low-rate; their latency is reported)
    #[arg(
        short = 'C',
        long = "measure_connections",
        alias = "measure-connections"
    )]
    pub measure_connections: Option<usize>,
    /// QPS of the measurement connections together
    #[arg(short = 'Q', long = "measure_qps", alias = "measure-qps")]
    pub measure_qps: Option<u64>,
    /// Depth of each measurement connection
    #[arg(short = 'D', long = "measure_depth", alias = "measure-depth")]
    pub measure_depth: Option<usize>,
    /// Run as a load agent (same as `headroom load agent`)
    #[arg(short = 'A', long = "agentmode")]
    pub agentmode: bool,
    /// Enlist a remote agent (HOST or HOST:PORT); repeatable
    #[arg(short = 'a', long = "agent", value_name = "HOST")]
    pub agent: Vec<String>,
    /// Agent port
    #[arg(short = 'p', long = "agent_port", alias = "agent-port", default_value_t = DEFAULT_AGENT_PORT)]
    pub agent_port: u16,
    /// mutilate's remaining flags (boxed: keeps the CLI's command enum small).
    #[command(flatten)]
    pub compat: Box<Compat>,
    /// More output (one progress line per second even when stderr is not a terminal)
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// No progress output
    #[arg(long)]
    pub quiet: bool,
    /// Outputs and headroom's own extensions (boxed: keeps the CLI's command enum small).
    #[command(flatten)]
    pub extra: Box<Extra>,
}
/// mutilate's scheduling, socket and agent flags beyond the basic ones.
#[derive(clap::Args, Clone, Debug)]
pub struct Compat {
    /// Assign threads to servers round-robin (thread t: servers t, t+T, …) instead of every
    /// thread to every server
    #[arg(short = 'R', long)]
    pub roundrobin: bool,
    /// Skip sends on a connection more than 5 ms behind at its depth cap (counted, and the rate
    /// check says so)
    #[arg(short = 'S', long)]
    pub skip: bool,
    /// Keep at least 250 µs between a connection's last reply and its next send
    #[arg(long)]
    pub moderate: bool,
    /// Blocking epoll (mutilate's -B): headroom's loop always blocks in epoll, so this changes
    /// nothing; accepted for mutilate command lines
    #[arg(short = 'B', long)]
    pub blocking: bool,
    /// Leave Nagle's algorithm on (no TCP_NODELAY)
    #[arg(long = "no_nodelay", alias = "no-nodelay")]
    pub no_nodelay: bool,
    /// Seconds after startup before the run starts (mutilate's -W)
    #[arg(short = 'W', long = "wait", value_name = "S")]
    pub wait: Option<f64>,
    /// This client's weight in the split of the rate among clients (agents send theirs)
    #[arg(
        short = 'l',
        long = "lambda_mul",
        alias = "lambda-mul",
        default_value_t = 1
    )]
    pub lambda_mul: u64,
    /// SASL username (mutilate's -U): not supported
    #[arg(short = 'U', long)]
    pub username: Option<String>,
    /// SASL password (mutilate's -P): not supported
    #[arg(short = 'P', long)]
    pub password: Option<String>,
}

/// `headroom load` flags beyond mutilate's run settings: outputs and extensions.
#[derive(clap::Args, Clone, Debug)]
pub struct Extra {
    /// Write every measured request's scheduled time and latency to F
    #[arg(long, value_name = "F")]
    pub save: Option<PathBuf>,
    /// Write the result JSON to F (docs/architecture.md "The JSON contracts"; an array for --scan)
    #[arg(long, value_name = "F")]
    pub json: Option<PathBuf>,
    /// Write the figures as CSV to F (one row per run)
    #[arg(long, value_name = "F")]
    pub csv: Option<PathBuf>,
    /// Write the per-second histograms as an HdrHistogram interval log to F
    #[arg(long, value_name = "F")]
    pub hdr: Option<PathBuf>,
    /// Send one JSON line per second to this Unix socket (the agent's live feed)
    #[arg(long, value_name = "SOCKET")]
    pub feed: Option<PathBuf>,
    /// Seed for keys, sizes and send schedules
    #[arg(long)]
    pub seed: Option<u64>,
    /// Key popularity: uniform | zipf:S
    #[arg(long, default_value = "uniform")]
    pub popularity: String,
    /// Busy-poll at least this many µs before each send (the default lead is the timer's
    /// measured wake-up lateness)
    #[arg(long = "spin-us", default_value_t = 0)]
    pub spin_us: u64,
    /// Never wake early to busy-poll: sleep on the timer until each send (least CPU; sends late
    /// by the timer's wake-up, tens of µs on a VM); a wait shorter than a sleep's own CPU cost
    /// (measured at start) is polled instead
    #[arg(long = "sleep-only")]
    pub sleep_only: bool,
    /// Event loop: auto (io_uring where the kernel allows it, else epoll with the reason
    /// printed), io_uring, or epoll
    #[arg(long, value_name = "auto|io_uring|epoll", default_value = "auto")]
    pub engine: String,
    /// Address the agent listens on (with -A)
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Exit status when a self-check failed (the result is still printed and written); 0 makes
    /// invalid runs exit like valid ones
    #[arg(long = "invalid-exit-code", value_name = "N", default_value_t = CHECKS_FAILED_EXIT)]
    pub invalid_exit_code: i32,
    /// Ask for SCHED_FIFO at this priority for the load threads; where it is refused they run
    /// SCHED_OTHER (the output and the JSON say which class ran and why)
    #[arg(long, value_name = "PRIO")]
    pub fifo: Option<u32>,
}

/// What the run is: one run, a scan across rates, or a search for the highest rate under a
/// percentile target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sweep {
    Single,
    Scan(ScanSpec),
    Search(SearchSpec),
}

impl LoadArgs {
    /// The run settings as [`LoadOptions`]: `--protocol`/`--binary`, `--popularity`,
    /// `-c N|auto` and `--engine` parsed, every other flag copied.
    pub fn to_options(&self) -> Result<LoadOptions, LoadError> {
        let protocol = match (&self.protocol, self.binary) {
            (Some(p), false) => p.parse::<ProtocolKind>()?,
            (Some(p), true) if p == "binary" => ProtocolKind::Binary,
            (Some(p), true) => {
                return Err(LoadError::Conflict {
                    flag: "--binary".into(),
                    other: format!("--protocol {p}"),
                })
            }
            (None, true) => ProtocolKind::Binary,
            (None, false) => ProtocolKind::Memcache,
        };
        let popularity: Popularity = self.extra.popularity.parse()?;
        let (connections, connections_auto) = match self.connections.as_str() {
            "auto" => (1, true),
            n => (
                n.parse::<usize>().map_err(|_| {
                    LoadError::invalid("-c/--connections", n, "expected a whole number or auto")
                })?,
                false,
            ),
        };
        Ok(LoadOptions {
            servers: self.server.clone(),
            protocol,
            qps: self.qps,
            time_s: self.time,
            keysize: self.keysize.clone(),
            valuesize: self.valuesize.clone(),
            records: self.records,
            update: self.update,
            threads: self.threads,
            affinity: self.affinity,
            connections,
            connections_auto,
            fifo: self.extra.fifo,
            depth: self.depth,
            iadist: self.iadist.clone(),
            noload: self.noload,
            loadonly: self.loadonly,
            warmup_s: self.warmup,
            measure_connections: self.measure_connections,
            measure_qps: self.measure_qps,
            measure_depth: self.measure_depth,
            agents: self.agent.clone(),
            agent_port: self.agent_port,
            save: self.extra.save.clone(),
            hdr_log: self.extra.hdr.clone(),
            feed: self.extra.feed.clone(),
            seed: self.extra.seed,
            popularity,
            spin_us: self.extra.spin_us,
            sleep_only: self.extra.sleep_only,
            engine: self.extra.engine.parse()?,
            roundrobin: self.compat.roundrobin,
            skip: self.compat.skip,
            moderate: self.compat.moderate,
            no_nodelay: self.compat.no_nodelay,
            lambda_mul: self.compat.lambda_mul,
            ..LoadOptions::default()
        })
    }

    /// Refuses mutilate's flags headroom does not implement (SASL) and a zero weight (`-l 0`).
    pub fn refuse_unsupported(&self) -> Result<(), LoadError> {
        if self.compat.username.is_some() || self.compat.password.is_some() {
            return Err(LoadError::Unsupported {
                flags: "-U/--username, -P/--password".into(),
                reason: "SASL authentication (mutilate's binary-protocol SASL PLAIN) is not implemented; run against a server without authentication".into(),
            });
        }
        if self.compat.lambda_mul == 0 {
            return Err(LoadError::invalid(
                "-l/--lambda_mul",
                "0",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// `-W`: how long after start-up the run starts.
    pub fn wait(&self) -> Result<Option<Duration>, LoadError> {
        match self.compat.wait {
            // Bounded as -t and -w are: `-W 1e300` panicked in Duration::from_secs_f64, and
            // `-W 1e19` waited for ever (hostile pass 28).
            Some(w) if !(0.0..=crate::options::MAX_RUN_S).contains(&w) => Err(LoadError::invalid(
                "-W/--wait",
                // `1e300` as typed, not its 301 digits
                if w.abs() >= 1e9 {
                    format!("{w:e}")
                } else {
                    format!("{w}")
                },
                format!(
                    "must be between 0 and {} s (a week)",
                    crate::options::MAX_RUN_S
                ),
            )),
            Some(w) => Ok(Some(Duration::from_secs_f64(w))),
            None => Ok(None),
        }
    }

    /// `--scan` or `--search` (not both), parsed.
    pub fn sweep(&self) -> Result<Sweep, LoadError> {
        let scan = self
            .scan
            .as_deref()
            .map(str::parse::<ScanSpec>)
            .transpose()?;
        let search = self
            .search
            .as_deref()
            .map(str::parse::<SearchSpec>)
            .transpose()?;
        match (scan, search) {
            (Some(_), Some(_)) => Err(LoadError::Combined {
                flag: "--scan".into(),
                other: "--search".into(),
            }),
            (Some(s), None) => Ok(Sweep::Scan(s)),
            (None, Some(s)) => Ok(Sweep::Search(s)),
            (None, None) => Ok(Sweep::Single),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn args(a: &[&str]) -> LoadArgs {
        Cli::try_parse_from(std::iter::once("load").chain(a.iter().copied()))
            .expect("parses")
            .load
    }

    #[test]
    fn defaults_are_mutilates_and_the_options_defaults() {
        let o = args(&[]).to_options().unwrap();
        let d = LoadOptions::default();
        assert_eq!(
            (o.qps, o.time_s, o.records, o.threads),
            (d.qps, d.time_s, d.records, d.threads)
        );
        assert_eq!(
            (o.keysize, o.valuesize, o.iadist),
            (d.keysize, d.valuesize, d.iadist)
        );
        assert_eq!(
            (o.connections, o.depth, o.agent_port),
            (1, 1, DEFAULT_AGENT_PORT)
        );
        assert!(!o.connections_auto);
        assert_eq!(args(&[]).extra.invalid_exit_code, CHECKS_FAILED_EXIT);
        assert_eq!(args(&[]).sweep().unwrap(), Sweep::Single);
    }

    #[test]
    fn flags_reach_their_options() {
        let a = args(&[
            "-s",
            "h:1",
            "-s",
            "h:2",
            "--binary",
            "-q",
            "900",
            "-c",
            "auto",
            "-d",
            "4",
            "-R",
            "--sleep-only",
            "--engine",
            "epoll",
            "--popularity",
            "zipf:0.9",
            "--hdr",
            "x.hdr",
            "-l",
            "3",
            "--fifo",
            "5",
        ]);
        let o = a.to_options().unwrap();
        assert_eq!(o.servers, vec!["h:1", "h:2"]);
        assert_eq!(o.protocol, ProtocolKind::Binary);
        assert_eq!((o.qps, o.depth, o.lambda_mul, o.fifo), (900, 4, 3, Some(5)));
        assert!(o.connections_auto && o.roundrobin && o.sleep_only);
        assert_eq!(o.engine, crate::engine::EngineChoice::Epoll);
        assert_eq!(o.popularity, Popularity::Zipf(0.9));
        assert_eq!(o.hdr_log, Some(PathBuf::from("x.hdr")));
    }

    #[test]
    fn bad_values_name_their_flag() {
        let e = |a: &[&str]| args(a).to_options().unwrap_err().to_string();
        assert_eq!(
            e(&["-c", "many"]),
            "invalid value \"many\" for -c/--connections: expected a whole number or auto"
        );
        assert_eq!(
            e(&["--binary", "--protocol", "redis"]),
            "--binary conflicts with --protocol redis"
        );
        assert!(e(&["--protocol", "http"]).contains("--protocol"));
        let a = args(&["--scan", "1:2:1", "--search", "99:100"]);
        assert_eq!(
            a.sweep().unwrap_err().to_string(),
            "--scan and --search cannot be combined"
        );
        let u = args(&["-U", "me"]).refuse_unsupported().unwrap_err();
        assert!(
            u.is_usage() && u.to_string().contains("not supported: SASL"),
            "{u}"
        );
        assert!(args(&["-l", "0"])
            .refuse_unsupported()
            .unwrap_err()
            .to_string()
            .contains("-l/--lambda_mul"));
        assert!(args(&["--wait=-1"])
            .wait()
            .unwrap_err()
            .to_string()
            .contains("-W/--wait"));
        assert_eq!(
            args(&["-W", "0.5"]).wait().unwrap(),
            Some(Duration::from_millis(500))
        );
    }

    /// Hostile pass 28: `-W 1e300` panicked (exit 101) and `-W 1e19` waited for ever; both are
    /// refused naming the flag, as `-t` and `-w` are.
    #[test]
    fn wait_is_bounded_as_the_other_durations() {
        for w in ["1e300", "1e19", "604801", "inf", "NaN"] {
            let e = args(&["-W", w]).wait().unwrap_err();
            assert!(
                e.is_usage() && e.to_string().contains("-W/--wait"),
                "-W {w}: {e}"
            );
        }
        assert_eq!(
            args(&["-W", "604800"]).wait().unwrap(),
            Some(Duration::from_secs(604800))
        );
    }
}
