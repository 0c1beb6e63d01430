//! `headroom antagonist KIND`: interference workloads with a per-second progress feed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_workloads::antagonist::{self, AntagonistConfig, AntagonistError, Kind};
use headroom_workloads::{signal, topology};

const KINDS: &str = "spin, power, llc, dram, mix, square, net, disk, memory, ht";

/// Flags of `headroom antagonist`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// spin | power | llc | dram | mix | square | net | disk | memory | ht
    pub kind: String,
    /// Seconds to run (default: until SIGTERM/SIGINT)
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Worker threads
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Pin worker i to the i-th CPU of this list (e.g. 0-3,6)
    #[arg(long)]
    pub cpus: Option<String>,
    /// Append one JSON line per second ({"t_unix_ms","kind","ops_per_s","ops_total","threads",…});
    /// "-" writes them to stdout
    #[arg(long)]
    pub progress: Option<PathBuf>,

    /// llc: stream through this fraction of the LLC (0.25/0.5/1.0 = small/medium/big)
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub fraction: f64,
    /// dram, mix: array size in MiB (default 8 × LLC, at least 256); memory: MiB to allocate
    /// (default 256)
    #[arg(long)]
    pub mb: Option<u64>,
    /// memory: MiB per second to allocate/touch (0 = as fast as possible)
    #[arg(long, default_value_t = 100.0, allow_negative_numbers = true)]
    pub rate_mb_s: f64,
    /// square: busy milliseconds per period
    #[arg(long, default_value_t = 6.0, allow_negative_numbers = true)]
    pub on_ms: f64,
    /// square: idle milliseconds per period
    #[arg(long, default_value_t = 42.0, allow_negative_numbers = true)]
    pub off_ms: f64,
    /// net: where to send (loopback or a local interface's address, e.g. in a netns)
    #[arg(long)]
    pub to: Option<String>,
    /// net: number of TCP flows (many small = mice, few large = elephants)
    #[arg(long, default_value_t = 16)]
    pub flows: usize,
    /// net: message size in bytes
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// net: also run the sink at --to in this process
    #[arg(long)]
    pub sink: bool,
    /// net: run only the sink, listening at --to
    #[arg(long)]
    pub sink_only: bool,
    /// disk: directory for the scratch files (removed at exit)
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// disk: size of each thread's file in MiB
    #[arg(long, default_value_t = 64)]
    pub file_mb: u64,
    /// disk: I/O size in KiB
    #[arg(long, default_value_t = 8)]
    pub block_kb: usize,
    /// ht: spin on the SMT sibling(s) of this CPU
    #[arg(long)]
    pub cpu: Option<usize>,
}

fn usage_from(e: AntagonistError) -> anyhow::Error {
    if e.is_usage() {
        super::usage(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

fn millis(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if !v.is_finite() || v < 0.0 {
        return Err(super::usage(format!(
            "{flag} {v}: must be a non-negative number of milliseconds"
        )));
    }
    Ok(Duration::from_secs_f64(v / 1000.0))
}

fn socket_addr(flag: &str, v: Option<&String>) -> anyhow::Result<SocketAddr> {
    let v = v.ok_or_else(|| super::usage(format!("net needs {flag} ADDR:PORT")))?;
    v.parse().map_err(|_| {
        super::usage(format!(
            "{flag} {v:?}: expected ADDR:PORT, e.g. 127.0.0.1:5001"
        ))
    })
}

/// Builds the library kind from the flags.
fn kind_from_args(args: &Args) -> anyhow::Result<Kind> {
    // The machine's cache and SMT layout, read only for the kinds sized or placed by it.
    let topology = || {
        headroom_host::Topology::read(Path::new("/"))
            .map_err(|e| anyhow::anyhow!("reading the CPU topology: {e}"))
    };
    let kind = match args.kind.as_str() {
        "spin" => Kind::Spin,
        "power" => Kind::Power,
        "llc" => Kind::llc(&topology()?, args.fraction).map_err(usage_from)?,
        "dram" => Kind::dram(&topology()?, args.mb).map_err(usage_from)?,
        "mix" => Kind::mix(&topology()?, args.mb).map_err(usage_from)?,
        "square" => {
            let on = millis("--on-ms", args.on_ms)?;
            let off = millis("--off-ms", args.off_ms)?;
            if on.is_zero() {
                return Err(super::usage("--on-ms must be positive"));
            }
            Kind::Square { on, off }
        }
        "net" if args.sink_only => Kind::NetSink {
            listen: socket_addr("--to", args.to.as_ref())?,
            size: args.size,
        },
        "net" => Kind::Net {
            to: socket_addr("--to", args.to.as_ref())?,
            flows: args.flows,
            size: args.size,
            sink: args.sink,
        },
        "disk" => {
            let dir = args
                .path
                .clone()
                .ok_or_else(|| super::usage("disk needs --path DIR"))?;
            Kind::Disk {
                dir,
                file_bytes: args.file_mb << 20,
                block_bytes: args.block_kb << 10,
            }
        }
        "memory" => Kind::Memory {
            mb: args.mb.unwrap_or(256),
            rate_mb_s: args.rate_mb_s,
        },
        "ht" => {
            let cpu = args
                .cpu
                .ok_or_else(|| super::usage("ht needs --cpu C (it spins on C's SMT sibling)"))?;
            Kind::ht(&topology()?, cpu).map_err(usage_from)?
        }
        other => {
            return Err(super::usage(format!(
                "unknown antagonist kind {other:?}: expected one of {KINDS}"
            )))
        }
    };
    Ok(kind)
}

enum ProgressOut {
    Stdout,
    File(PathBuf, File),
}

fn open_progress(path: &Path) -> anyhow::Result<ProgressOut> {
    if path == Path::new("-") {
        return Ok(ProgressOut::Stdout);
    }
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| super::usage(format!("cannot open progress file {}: {e}", path.display())))?;
    Ok(ProgressOut::File(path.to_path_buf(), f))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let kind = kind_from_args(&args)?;
    let duration = args
        .duration
        .map(|d| super::seconds_flag("--duration", d))
        .transpose()?;
    let cpus = match &args.cpus {
        None => None,
        Some(list) => {
            Some(topology::parse_cpu_list(list).map_err(|e| super::usage(format!("--cpus: {e}")))?)
        }
    };
    let config = AntagonistConfig {
        kind,
        threads: args.threads,
        cpus,
        duration,
    };
    config.validate().map_err(usage_from)?;
    let mut out = match &args.progress {
        None => None,
        Some(p) => Some(open_progress(p)?),
    };
    let stop = signal::install_stop_flag()?;
    let mut write_error: Option<anyhow::Error> = None;
    let summary = antagonist::run(&config, stop, &mut |p| {
        let line = p.to_json_line();
        match &mut out {
            None => {}
            Some(ProgressOut::Stdout) => {
                println!("{line}");
            }
            Some(ProgressOut::File(path, f)) => {
                if let Err(e) = writeln!(f, "{line}").and_then(|_| f.flush()) {
                    write_error.get_or_insert(anyhow::anyhow!(
                        "writing progress to {}: {e}",
                        path.display()
                    ));
                }
            }
        }
    })
    .map_err(usage_from)?;
    if let Some(e) = write_error {
        return Err(e);
    }
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
