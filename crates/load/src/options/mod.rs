//! `LoadOptions`: every mutilate flag as a typed field, plus headroom's extensions, and their
//! validation; the parsers for the values the flags take are in `values`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::dist::Dist;
use crate::error::LoadError;
use crate::keys::Popularity;
use crate::protocol::MAX_VALUE_LEN;

/// mutilate's default agent port.
pub const DEFAULT_AGENT_PORT: u16 = 5556;

mod values;

pub use values::{ProtocolKind, ScanSpec, SearchSpec};

/// All settings of one load run. Field names follow mutilate's long flags.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadOptions {
    /// `-s/--server H[:P]`, repeatable.
    pub servers: Vec<String>,
    /// `--protocol` (`--binary` selects [`ProtocolKind::Binary`]).
    pub protocol: ProtocolKind,
    /// `-q/--qps`: target aggregate QPS; 0 = peak (each connection keeps `depth` in flight).
    pub qps: u64,
    /// `-t/--time`: measured seconds (after warmup).
    pub time_s: f64,
    /// `-K/--keysize`: key length distribution.
    pub keysize: String,
    /// `-V/--valuesize`: value length distribution.
    pub valuesize: String,
    /// `-r/--records`: records per server.
    pub records: u64,
    /// `-u/--update`: fraction of requests that are sets.
    pub update: f64,
    /// `-T/--threads`: load threads.
    pub threads: usize,
    /// `--affinity`: pin thread i to CPU i mod ncpu.
    pub affinity: bool,
    /// `-c/--connections`: connections per server per thread.
    pub connections: usize,
    /// `-d/--depth`: maximum requests in flight per connection.
    pub depth: usize,
    /// `-i/--iadist`: inter-arrival distribution; its mean is set from the rate.
    pub iadist: String,
    /// `--noload`: skip preloading keys.
    pub noload: bool,
    /// `--loadonly`: preload and exit.
    pub loadonly: bool,
    /// `-w/--warmup`: seconds of load before measuring.
    pub warmup_s: f64,
    /// `-C/--measure_connections`: measurement connections per server.
    pub measure_connections: Option<usize>,
    /// `-Q/--measure_qps`: rate of the measurement connections together.
    pub measure_qps: Option<u64>,
    /// `-D/--measure_depth`: depth of each measurement connection.
    pub measure_depth: Option<usize>,
    /// `-a/--agent`: remote load agents.
    pub agents: Vec<String>,
    /// `-p/--agent_port`.
    pub agent_port: u16,
    /// `--save F`: every measured request's scheduled time and latency.
    pub save: Option<PathBuf>,
    /// `--hdr F`: interval histogram log.
    pub hdr_log: Option<PathBuf>,
    /// `--feed SOCKET`: one JSON line per second to a Unix stream socket (docs/architecture.md, contract 4).
    pub feed: Option<PathBuf>,
    /// `--seed`: makes keys, sizes and schedules reproducible.
    pub seed: Option<u64>,
    /// `--popularity uniform|zipf:S`.
    pub popularity: Popularity,
    /// Busy-wait the last `spin_us` before a send instead of sleeping (precision vs client CPU).
    pub spin_us: u64,
    /// After the end, how long to wait for outstanding replies (they count as errors after it).
    pub drain_ms: u64,
    /// `-R/--roundrobin`: thread t connects only to servers t, t + T, … (mutilate's assignment)
    /// instead of every thread to every server.
    #[serde(default)]
    pub roundrobin: bool,
    /// `-S/--skip`: a connection more than 5 ms behind at its depth cap skips sends.
    #[serde(default)]
    pub skip: bool,
    /// `--moderate`: no send within 250 µs of the connection's last reply.
    #[serde(default)]
    pub moderate: bool,
    /// `--no_nodelay`: leave Nagle's algorithm on.
    #[serde(default)]
    pub no_nodelay: bool,
    /// `--sleep-only`: never wake early to busy-poll before a send (sleep on the timer to the
    /// send's time; the cheapest in CPU, the sends late by the timer's wake-up). A wait shorter
    /// than a sleep's own CPU cost is polled, in every mode.
    #[serde(default)]
    pub sleep_only: bool,
    /// `-l/--lambda_mul`: this client's weight in the split of the rate among clients.
    #[serde(default = "one")]
    pub lambda_mul: u64,
    /// `--engine auto|io_uring|epoll`: the event loop (auto: io_uring where the kernel allows it).
    #[serde(default)]
    pub engine: crate::engine::EngineChoice,
    /// `-c auto` (ours): connections per server per thread sized from the round trip measured
    /// before the run and the rate (`connections` is then ignored), grown during the run when a
    /// send finds every connection to its server at the depth cap. See [`crate::sizing`].
    #[serde(default)]
    pub connections_auto: bool,
    /// `--fifo PRIO` (ours): ask for SCHED_FIFO at PRIO for the load threads; where it is refused
    /// they run SCHED_OTHER and the result says why.
    #[serde(default)]
    pub fifo: Option<u32>,
}

fn one() -> u64 {
    1
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            servers: Vec::new(),
            protocol: ProtocolKind::Memcache,
            qps: 0,
            time_s: 5.0,
            keysize: "30".into(),
            valuesize: "200".into(),
            records: 10000,
            update: 0.0,
            threads: 1,
            affinity: false,
            connections: 1,
            depth: 1,
            iadist: "exponential".into(),
            noload: false,
            loadonly: false,
            warmup_s: 0.0,
            measure_connections: None,
            measure_qps: None,
            measure_depth: None,
            agents: Vec::new(),
            agent_port: DEFAULT_AGENT_PORT,
            save: None,
            hdr_log: None,
            feed: None,
            seed: None,
            popularity: Popularity::Uniform,
            spin_us: 0,
            drain_ms: 1000,
            roundrobin: false,
            skip: false,
            moderate: false,
            no_nodelay: false,
            sleep_only: false,
            lambda_mul: 1,
            engine: crate::engine::EngineChoice::Auto,
            connections_auto: false,
            fifo: None,
        }
    }
}

/// Default measurement rate when `-C` is given without `-Q`.
pub const DEFAULT_MEASURE_QPS: u64 = 1000;

/// The options checked and turned into what the engine uses.
#[derive(Clone, Debug)]
pub struct Validated {
    pub servers: Vec<(String, SocketAddr)>,
    pub keysize: Dist,
    pub valuesize: Dist,
    /// Inter-arrival distribution at rate 1/s (scaled per connection by the engine).
    pub iadist_unit: Dist,
    /// QPS of the load connections (all threads, this client only).
    pub load_qps: u64,
    /// QPS of the measurement connections (0 when there are none).
    pub measure_qps: u64,
    pub measure_connections: usize,
    pub measure_depth: usize,
}

fn parse_dist(flag: &str, spec: &str) -> Result<Dist, LoadError> {
    spec.parse::<Dist>()
        .map_err(|e| LoadError::invalid(flag, spec, e.to_string()))
}

/// The shortest measured run (`-t`): below it no request is scheduled at any rate one would ask.
pub const MIN_TIME_S: f64 = 0.001;
/// The longest `-t` or `-w`: a week (the run's deadlines must fit the clock, and a longer run is
/// a typo).
pub const MAX_RUN_S: f64 = 7.0 * 24.0 * 3600.0;
/// Most client threads.
pub const MAX_THREADS: usize = 1024;
/// Most connections of one client (every thread and server together).
pub const MAX_CONNECTIONS: usize = 100_000;

/// A duration flag within [`MAX_RUN_S`] and at least `min`.
fn check_seconds(flag: &str, v: f64, min: f64) -> Result<(), LoadError> {
    if v.is_finite() && v >= min && v <= MAX_RUN_S && (min > 0.0 || v >= 0.0) {
        return Ok(());
    }
    // `1e300` as typed, not its 301 digits.
    let shown = if v != 0.0 && v.is_finite() && !(1e-3..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    };
    Err(LoadError::invalid(
        flag,
        shown,
        format!("must be between {min} and {MAX_RUN_S} s (a week)"),
    ))
}

/// Values larger than the reply parser takes ([`MAX_VALUE_LEN`], memcached's default item size)
/// would be sent and then refused when read: a distribution whose 99.9th percentile (or fixed
/// value) is above it is refused; rarer draws above it are sent at that size.
fn check_value_sizes(d: &Dist, spec: &str) -> Result<(), LoadError> {
    let high = match d {
        Dist::Fixed(v) => Some(*v),
        other => other.quantile(0.999),
    };
    match high {
        Some(v) if !v.is_finite() || v > MAX_VALUE_LEN as f64 => Err(LoadError::invalid(
            "-V/--valuesize",
            spec,
            format!(
                "values up to {v:.0} bytes; at most {MAX_VALUE_LEN} (1 MiB, memcached's default item size) are taken"
            ),
        )),
        _ => Ok(()),
    }
}

/// Resolves `H[:P]` (IPv6 as `[::1]:P`) to a socket address.
pub fn resolve_server(spec: &str, default_port: u16) -> Result<SocketAddr, LoadError> {
    if spec.is_empty() {
        return Err(LoadError::invalid("-s/--server", spec, "empty address"));
    }
    let with_port = if spec.parse::<SocketAddr>().is_ok() {
        spec.to_string()
    } else if spec.starts_with('[') && spec.ends_with(']') {
        format!("{spec}:{default_port}")
    } else if spec.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{spec}]:{default_port}")
    } else if let Some((_, port)) = spec.rsplit_once(':') {
        port.parse::<u16>().map_err(|_| {
            LoadError::invalid(
                "-s/--server",
                spec,
                format!("port {port:?} is not a number"),
            )
        })?;
        spec.to_string()
    } else {
        format!("{spec}:{default_port}")
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| LoadError::Resolve {
            addr: spec.to_string(),
            reason: e.to_string(),
        })?;
    addrs.next().ok_or_else(|| LoadError::Resolve {
        addr: spec.to_string(),
        reason: "no addresses".into(),
    })
}

impl LoadOptions {
    /// Checks every value and parses the distributions; errors name the flag and the value, every
    /// one found at once ([`LoadError::Several`] where there are more than one).
    pub fn validate(&self) -> Result<Validated, LoadError> {
        let mut problems: Vec<LoadError> = Vec::new();
        let mut note = |r: Result<(), LoadError>| {
            if let Err(e) = r {
                problems.push(e);
            }
        };
        if self.servers.is_empty() {
            note(Err(LoadError::invalid(
                "-s/--server",
                "",
                "at least one server is required",
            )));
        }
        let mut servers = Vec::new();
        for s in &self.servers {
            match resolve_server(s, self.protocol.default_port()) {
                Ok(a) => servers.push((s.clone(), a)),
                Err(e) => note(Err(e)),
            }
        }
        let keysize = parse_dist("-K/--keysize", &self.keysize);
        let valuesize = parse_dist("-V/--valuesize", &self.valuesize).and_then(|d| {
            check_value_sizes(&d, &self.valuesize)?;
            Ok(d)
        });
        let iadist_unit = Dist::interarrival(&self.iadist, 1.0)
            .map_err(|e| LoadError::invalid("-i/--iadist", &self.iadist, e.to_string()));
        note(check_seconds("-t/--time", self.time_s, MIN_TIME_S));
        note(check_seconds("-w/--warmup", self.warmup_s, 0.0));
        if self.records == 0 {
            note(Err(LoadError::invalid(
                "-r/--records",
                "0",
                "must be at least 1",
            )));
        }
        if !(0.0..=1.0).contains(&self.update) {
            note(Err(LoadError::invalid(
                "-u/--update",
                self.update.to_string(),
                "must be between 0 and 1",
            )));
        }
        if let Some(p) = self.fifo {
            if !(1..=99).contains(&p) {
                note(Err(LoadError::invalid(
                    "--fifo",
                    p.to_string(),
                    "SCHED_FIFO priorities are 1..=99",
                )));
            }
        }
        for (flag, v) in [
            ("-T/--threads", self.threads),
            ("-c/--connections", self.connections),
            ("-d/--depth", self.depth),
        ] {
            if v == 0 {
                note(Err(LoadError::invalid(flag, "0", "must be at least 1")));
            }
        }
        if self.threads > MAX_THREADS {
            note(Err(LoadError::invalid(
                "-T/--threads",
                self.threads.to_string(),
                format!("at most {MAX_THREADS}"),
            )));
        } else if self.connections * self.servers.len() * self.threads > MAX_CONNECTIONS {
            note(Err(LoadError::invalid(
                "-c/--connections",
                self.connections.to_string(),
                format!(
                    "{} connections in total (-c {} × -T {} × {} server(s)), more than {MAX_CONNECTIONS}",
                    self.connections * self.servers.len() * self.threads,
                    self.connections,
                    self.threads,
                    self.servers.len()
                ),
            )));
        }
        let wants_measure = self.measure_connections.is_some()
            || self.measure_qps.is_some()
            || self.measure_depth.is_some();
        let measure_connections = if wants_measure {
            self.measure_connections.unwrap_or(1)
        } else {
            0
        };
        if wants_measure && measure_connections == 0 {
            note(Err(LoadError::invalid(
                "-C/--measure_connections",
                "0",
                "must be at least 1",
            )));
        }
        let measure_depth = self.measure_depth.unwrap_or(1);
        if measure_depth == 0 {
            note(Err(LoadError::invalid(
                "-D/--measure_depth",
                "0",
                "must be at least 1",
            )));
        }
        let measure_qps = if wants_measure {
            let q = self.measure_qps.unwrap_or(DEFAULT_MEASURE_QPS);
            if q == 0 {
                note(Err(LoadError::invalid(
                    "-Q/--measure_qps",
                    "0",
                    "measurement connections need a rate",
                )));
            }
            if self.qps > 0 && q > self.qps {
                note(Err(LoadError::invalid(
                    "-Q/--measure_qps",
                    q.to_string(),
                    format!("exceeds the total --qps {}", self.qps),
                )));
            }
            q
        } else {
            0
        };
        let load_qps = self.qps.saturating_sub(measure_qps);
        let (keysize, valuesize, iadist_unit) = match (keysize, valuesize, iadist_unit) {
            (Ok(k), Ok(v), Ok(i)) if problems.is_empty() => (k, v, i),
            (k, v, i) => {
                problems.extend([k.err(), v.err(), i.err()].into_iter().flatten());
                return Err(LoadError::several(problems));
            }
        };
        Ok(Validated {
            servers,
            keysize,
            valuesize,
            iadist_unit,
            load_qps,
            measure_qps,
            measure_connections,
            measure_depth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_spec_parses_and_lists_steps() {
        let s: ScanSpec = "1000:3000:1000".parse().unwrap();
        assert_eq!(s.steps(), vec![1000, 2000, 3000]);
        let err = "1000:3000".parse::<ScanSpec>().unwrap_err().to_string();
        assert!(err.contains("--scan") && err.contains("1000:3000"), "{err}");
        assert!("1000:3000:0".parse::<ScanSpec>().is_err());
        assert!("3000:1000:10".parse::<ScanSpec>().is_err());
    }

    #[test]
    fn search_spec_takes_fractional_percentiles() {
        let s: SearchSpec = "99.9:500".parse().unwrap();
        assert_eq!(s.percentile, 99.9);
        assert_eq!(s.target_us, 500.0);
        let err = "100:500".parse::<SearchSpec>().unwrap_err().to_string();
        assert!(err.contains("--search"), "{err}");
        assert!("99:abc".parse::<SearchSpec>().is_err());
    }

    #[test]
    fn server_addresses_get_the_default_port() {
        assert_eq!(
            resolve_server("127.0.0.1", 11211).unwrap(),
            "127.0.0.1:11211".parse().unwrap()
        );
        assert_eq!(
            resolve_server("127.0.0.1:99", 11211).unwrap(),
            "127.0.0.1:99".parse().unwrap()
        );
        assert_eq!(
            resolve_server("::1", 6379).unwrap(),
            "[::1]:6379".parse().unwrap()
        );
        let err = resolve_server("127.0.0.1:xx", 1).unwrap_err().to_string();
        assert!(err.contains("xx"), "{err}");
    }

    fn options(args: &[&str]) -> LoadOptions {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            load: crate::LoadArgs,
        }
        let mut all = vec!["load"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
            .expect("parses")
            .load
            .to_options()
            .expect("options")
    }

    #[test]
    fn every_bad_option_is_named_at_once() {
        let err = options(&[
            "-s",
            "127.0.0.1:1",
            "-t",
            "1e300",
            "--warmup=-1",
            "-u",
            "2",
            "-V",
            "1e12",
        ])
        .validate()
        .unwrap_err();
        assert!(err.is_usage(), "{err}");
        let text = err.to_string();
        for flag in ["-t/--time", "-w/--warmup", "-u/--update", "-V/--valuesize"] {
            assert!(text.contains(flag), "{flag} missing from: {text}");
        }
        assert!(text.starts_with("4 problems: "), "{text}");
        // One problem is itself, not a list of one.
        let err = options(&["-s", "127.0.0.1:1", "-t", "0.0001"])
            .validate()
            .unwrap_err();
        assert!(matches!(err, LoadError::InvalidOption { .. }), "{err}");
    }

    #[test]
    fn durations_and_value_sizes_are_bounded_where_they_are_accepted() {
        for (args, flag) in [
            (vec!["-t", "1e300"], "-t/--time"),
            (vec!["-t", "1e-300"], "-t/--time"),
            (vec!["-w", "1e300"], "-w/--warmup"),
            (vec!["-V", "1e12"], "-V/--valuesize"),
            (vec!["-V", "exponential:0.000001"], "-V/--valuesize"),
            (vec!["-T", "2000"], "-T/--threads"),
        ] {
            let mut all = vec!["-s", "127.0.0.1:1"];
            all.extend(args.iter().copied());
            let err = options(&all).validate().unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        // The bounds themselves are taken.
        for args in [
            vec!["-t", "604800", "-w", "0"],
            vec!["-t", "0.001"],
            vec!["-V", "1048576"],
        ] {
            let mut all = vec!["-s", "127.0.0.1:1"];
            all.extend(args.iter().copied());
            options(&all)
                .validate()
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    #[test]
    fn popularity_parses() {
        assert_eq!(
            "uniform".parse::<Popularity>().unwrap(),
            Popularity::Uniform
        );
        assert_eq!(
            "zipf:0.99".parse::<Popularity>().unwrap(),
            Popularity::Zipf(0.99)
        );
        assert!("zipf:-1".parse::<Popularity>().is_err());
    }
}
