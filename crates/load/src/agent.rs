//! Distributed load: `headroom load agent` (mutilate's `-A`) and the master side (`-a HOST`).
//!
//! Wire format, version [`AGENT_PROTOCOL_VERSION`]: JSON objects, one per line (`\n`), over TCP
//! (default port 5556, like mutilate). Every message has a `"type"`:
//!
//! ```text
//! master → agent  {"type":"hello","version":1}
//! agent  → master {"type":"hello","version":1}        or {"type":"error","message":"…"}
//! master → agent  {"type":"run","options":{…LoadOptions…}}
//! agent  → master {"type":"results","results":{…}}    or {"type":"error","message":"…"}
//! ```
//!
//! `results` carries histograms as base64 HDR V2-deflate (nanoseconds) and counters, never
//! percentiles: the master merges histograms. A version mismatch is refused by whichever side
//! notices it, with an `error` message naming both versions, and the connection is closed.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::LoadError;
use crate::options::LoadOptions;
use crate::results::Interval;
use crate::results::{RawResults, WireResults};
use crate::runner::run_local;

/// Version of the agent message format.
pub const AGENT_PROTOCOL_VERSION: u32 = 1;

/// One message of the agent protocol.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    Hello {
        version: u32,
        /// The agent's `-l/--lambda_mul`: its weight in the split of the rate (1 when absent).
        #[serde(default = "one", skip_serializing_if = "is_one")]
        lambda_mul: u64,
    },
    Run {
        options: Box<LoadOptions>,
    },
    Results {
        results: Box<WireResults>,
    },
    Error {
        message: String,
    },
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

fn send(stream: &mut TcpStream, msg: &AgentMessage) -> std::io::Result<()> {
    let mut line = serde_json::to_string(msg).map_err(std::io::Error::other)?;
    line.push('\n');
    stream.write_all(line.as_bytes())
}

/// The next message from `peer`; the error names the peer and what broke.
fn recv(reader: &mut BufReader<TcpStream>, peer: &str) -> Result<AgentMessage, LoadError> {
    let mut line = String::new();
    let n = reader
        .read_line(&mut line)
        .map_err(|e| LoadError::agent(peer, format!("reading: {e}")))?;
    if n == 0 {
        return Err(LoadError::agent(peer, "connection closed"));
    }
    serde_json::from_str(line.trim_end()).map_err(|e| {
        let shown: String = line.chars().take(120).collect();
        LoadError::agent(peer, format!("unreadable message {shown:?}: {e}"))
    })
}

/// Serves masters one after another on `listener`; stops after `max_sessions` when given.
/// A failed session is reported to its master and logged; the agent goes on serving.
pub fn serve(listener: TcpListener, max_sessions: Option<usize>) -> Result<(), LoadError> {
    serve_weighted(listener, max_sessions, 1)
}

/// [`serve`] for an agent started with `-l/--lambda_mul N`: masters give it N shares of the rate
/// for every share of a client with weight 1 (mutilate's lambda multiplier).
pub fn serve_weighted(
    listener: TcpListener,
    max_sessions: Option<usize>,
    lambda_mul: u64,
) -> Result<(), LoadError> {
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut served = 0usize;
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("agent on {local}: accept failed: {e}");
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        if let Err(e) = session(stream, &peer, lambda_mul.max(1)) {
            tracing::error!("agent on {local}: {e}");
            eprintln!("headroom load agent: {e}");
        }
        served += 1;
        if max_sessions.is_some_and(|m| served >= m) {
            break;
        }
    }
    Ok(())
}

fn session(mut stream: TcpStream, peer: &str, lambda_mul: u64) -> Result<(), LoadError> {
    let io = |e: std::io::Error| LoadError::agent(format!("master {peer}"), e.to_string());
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().map_err(io)?);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    match recv(&mut reader, &format!("master {peer}"))? {
        AgentMessage::Hello { version, .. } if version == AGENT_PROTOCOL_VERSION => {}
        AgentMessage::Hello { version, .. } => {
            let message = format!(
                "version mismatch: agent speaks protocol version {AGENT_PROTOCOL_VERSION}, master sent {version}"
            );
            let _ = send(
                &mut stream,
                &AgentMessage::Error {
                    message: message.clone(),
                },
            );
            return Err(LoadError::agent(format!("master {peer}"), message));
        }
        other => {
            let message = format!("expected hello, got {other:?}");
            let _ = send(
                &mut stream,
                &AgentMessage::Error {
                    message: message.clone(),
                },
            );
            return Err(LoadError::agent(format!("master {peer}"), message));
        }
    }
    send(
        &mut stream,
        &AgentMessage::Hello {
            version: AGENT_PROTOCOL_VERSION,
            lambda_mul,
        },
    )
    .map_err(io)?;
    let options = match recv(&mut reader, &format!("master {peer}"))? {
        AgentMessage::Run { options } => options,
        other => {
            let message = format!("expected run, got {other:?}");
            let _ = send(
                &mut stream,
                &AgentMessage::Error {
                    message: message.clone(),
                },
            );
            return Err(LoadError::agent(format!("master {peer}"), message));
        }
    };
    tracing::info!(
        "agent: running {} QPS for {} s against {:?} for {peer}",
        options.qps,
        options.time_s,
        options.servers
    );
    let reply = match run_local(&options, &mut |_| {}) {
        Ok(raw) => AgentMessage::Results {
            results: Box::new(raw.to_wire()),
        },
        Err(e) => AgentMessage::Error {
            message: e.to_string(),
        },
    };
    send(&mut stream, &reply).map_err(io)
}

/// The master's handle on one agent between hello and results.
pub struct AgentLink {
    peer: String,
    /// The agent's weight in the rate split (its `-l`).
    pub lambda_mul: u64,
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl AgentLink {
    /// Connects to `spec` (`HOST` or `HOST:PORT`) and exchanges hellos.
    pub fn connect(spec: &str, default_port: u16) -> Result<AgentLink, LoadError> {
        let with_port = if spec.contains(':') && !spec.ends_with(']') {
            spec.to_string()
        } else {
            format!("{spec}:{default_port}")
        };
        let peer = with_port.clone();
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| LoadError::agent(&peer, format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| LoadError::agent(&peer, "no address"))?;
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| LoadError::agent(&peer, format!("cannot connect: {e}")))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        let reader = BufReader::new(
            stream
                .try_clone()
                .map_err(|e| LoadError::agent(&peer, e.to_string()))?,
        );
        send(
            &mut stream,
            &AgentMessage::Hello {
                version: AGENT_PROTOCOL_VERSION,
                lambda_mul: 1,
            },
        )
        .map_err(|e| LoadError::agent(&peer, format!("sending hello: {e}")))?;
        let mut link = AgentLink {
            peer,
            lambda_mul: 1,
            stream,
            reader,
        };
        match link.recv()? {
            AgentMessage::Hello {
                version,
                lambda_mul,
            } if version == AGENT_PROTOCOL_VERSION => {
                link.lambda_mul = lambda_mul.max(1);
                Ok(link)
            }
            AgentMessage::Hello { version, .. } => {
                let message = format!(
                    "version mismatch: master speaks protocol version {AGENT_PROTOCOL_VERSION}, agent {version}"
                );
                let _ = send(
                    &mut link.stream,
                    &AgentMessage::Error {
                        message: message.clone(),
                    },
                );
                Err(LoadError::agent(&link.peer, message))
            }
            AgentMessage::Error { message } => Err(LoadError::agent(&link.peer, message)),
            other => Err(LoadError::agent(
                &link.peer,
                format!("expected hello, got {other:?}"),
            )),
        }
    }

    fn recv(&mut self) -> Result<AgentMessage, LoadError> {
        recv(&mut self.reader, &self.peer)
    }

    /// Sends the agent its share of the run.
    pub fn start(&mut self, options: &LoadOptions) -> Result<(), LoadError> {
        let wait = options.warmup_s + options.time_s + options.drain_ms as f64 / 1000.0 + 60.0;
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_secs_f64(wait)));
        send(
            &mut self.stream,
            &AgentMessage::Run {
                options: Box::new(options.clone()),
            },
        )
        .map_err(|e| LoadError::agent(&self.peer, format!("sending the run: {e}")))
    }

    /// Waits for the agent's results.
    pub fn finish(mut self) -> Result<RawResults, LoadError> {
        match self.recv()? {
            AgentMessage::Results { results } => RawResults::from_wire(&results, &self.peer),
            AgentMessage::Error { message } => Err(LoadError::agent(&self.peer, message)),
            other => Err(LoadError::agent(
                &self.peer,
                format!("expected results, got {other:?}"),
            )),
        }
    }
}

/// Splits `total` in proportion to `weights`, in integers that sum exactly to `total` (the
/// remainder goes one by one to the first clients with a weight).
pub fn weighted_split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u64 = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut out: Vec<u64> = weights
        .iter()
        .map(|w| (total as u128 * *w as u128 / sum as u128) as u64)
        .collect();
    let mut left = total - out.iter().sum::<u64>();
    for (o, w) in out.iter_mut().zip(weights) {
        if left == 0 {
            break;
        }
        if *w > 0 {
            *o += 1;
            left -= 1;
        }
    }
    out
}

/// Runs `opts` with its agents: the master preloads, splits the load rate among the clients that
/// carry load (the agents, plus the master itself unless it runs the measurement connections),
/// runs its part and merges everyone's histograms.
pub fn run_distributed(
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Interval),
) -> Result<RawResults, LoadError> {
    let v = opts.validate()?;
    if !opts.noload {
        crate::preload::preload(opts, &v)?;
    }
    let master_measures = v.measure_connections > 0;
    let mut links = Vec::new();
    for a in &opts.agents {
        links.push(AgentLink::connect(a, opts.agent_port)?);
    }
    // Client i's weight: agents first, then the master (weight 0 when it only measures).
    let mut weights: Vec<u64> = links.iter().map(|l| l.lambda_mul).collect();
    weights.push(if master_measures {
        0
    } else {
        opts.lambda_mul.max(1)
    });
    let shares = weighted_split(v.load_qps, &weights);
    let share = |i: u64| -> u64 { shares[i as usize] };
    for (i, link) in links.iter_mut().enumerate() {
        let agent_opts = LoadOptions {
            qps: share(i as u64),
            noload: true,
            loadonly: false,
            agents: Vec::new(),
            measure_connections: None,
            measure_qps: None,
            measure_depth: None,
            save: None,
            hdr_log: None,
            feed: None,
            seed: opts
                .seed
                .map(|s| s ^ (i as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
            ..opts.clone()
        };
        if opts.qps > 0 && agent_opts.qps == 0 {
            return Err(LoadError::invalid(
                "-q/--qps",
                opts.qps.to_string(),
                "too low to give every agent a share",
            ));
        }
        link.start(&agent_opts)?;
    }
    let local_opts = LoadOptions {
        qps: if opts.qps == 0 {
            0
        } else if master_measures {
            v.measure_qps
        } else {
            share(opts.agents.len() as u64)
        },
        noload: true,
        agents: Vec::new(),
        ..opts.clone()
    };
    let local = run_local(&local_opts, progress);
    let mut merged = local?;
    for link in links {
        let r = link.finish()?;
        merged.merge(&r);
    }
    if opts.qps > 0 {
        merged.target_qps = opts.qps as f64;
    }
    Ok(merged)
}
