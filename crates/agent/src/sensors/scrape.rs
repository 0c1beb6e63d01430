//! Pull sources of LC signals, polled once per second in a thread:
//! - `prometheus`: a histogram metric scraped over HTTP on loopback; the percentile over the SLO
//!   window comes from the bucket deltas between now and a scrape one window ago. A counter
//!   metric gives the load as its rate.
//! - `memcache-stats`: `stats` → `cmd_get + cmd_set` rate.
//! - `redis-info`: `INFO stats` → `total_commands_processed` rate.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sensors::lc_signal::{CounterRate, SignalCell, StopFlag};

/// Why a pull source's poll gave no figure: each names the address, URL or metric at fault.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("resolving {address}: {source}")]
    Resolve {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{address} resolves to nothing")]
    NoAddress { address: String },
    #[error("{doing} {address}: {source}")]
    Io {
        doing: &'static str,
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("url {url:?}: only http:// is supported")]
    NotHttp { url: String },
    #[error("url {url:?}: the agent scrapes loopback addresses only")]
    NotLoopback { url: String },
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("parsing the scrape: {0}")]
    Exposition(#[source] std::io::Error),
    #[error("{metric} sample without an le label")]
    NoLe { metric: String },
    #[error("{metric}: bad le {le:?}")]
    BadLe { metric: String, le: String },
    #[error("no {metric} samples in the scrape")]
    NoSamples { metric: String },
    #[error("{address}: {reply} has no {field}")]
    MissingField {
        address: String,
        reply: &'static str,
        field: &'static str,
    },
    #[error("{address}: bad {field} value {value:?}")]
    BadValue {
        address: String,
        field: String,
        value: String,
    },
}

fn io_error(doing: &'static str, address: &str) -> impl FnOnce(std::io::Error) -> ScrapeError {
    let address = address.to_string();
    move |source| ScrapeError::Io {
        doing,
        address,
        source,
    }
}

/// What a pull source reads.
#[derive(Debug, Clone)]
pub enum PullKind {
    /// Percentile (0..100) of histogram `metric` over `window_s` seconds, published in µs.
    PromHistogram {
        url: String,
        metric: String,
        percentile: f64,
        window_s: f64,
        /// Observations the window needs before its percentile is published.
        min_samples: u64,
    },
    /// Rate of counter `metric` (summed over its label sets).
    PromCounter {
        url: String,
        metric: String,
    },
    MemcacheStats {
        address: String,
    },
    RedisInfo {
        address: String,
    },
}

/// Starts a pull source polling every `period`.
pub fn spawn(
    kind: PullKind,
    period: Duration,
    cell: Arc<SignalCell>,
    stop: StopFlag,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("headroom-scrape".into())
        .spawn(move || {
            let mut hist_history: VecDeque<(Instant, Vec<(f64, f64)>)> = VecDeque::new();
            let mut rate = CounterRate::default();
            let mut conn = None;
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    // One wake-up a period; a stop unparks the thread (see
                    // `crate::sensors::wake_and_join`).
                    std::thread::park_timeout(next - now);
                    continue;
                }
                next = now + period;
                let result = poll_once(&kind, &mut hist_history, &mut rate, &mut conn, now);
                match result {
                    Ok(Some(v)) => cell.publish(v, now),
                    Ok(None) => {}
                    Err(e) => cell.error(kind_name(&kind), e.to_string()),
                }
            }
        })
}

fn kind_name(kind: &PullKind) -> &'static str {
    match kind {
        PullKind::PromHistogram { .. } => "prometheus-latency",
        PullKind::PromCounter { .. } => "prometheus-load",
        PullKind::MemcacheStats { .. } => "memcache-stats",
        PullKind::RedisInfo { .. } => "redis-info",
    }
}

fn poll_once(
    kind: &PullKind,
    history: &mut VecDeque<(Instant, Vec<(f64, f64)>)>,
    rate: &mut CounterRate,
    conn: &mut Option<TcpStream>,
    now: Instant,
) -> Result<Option<f64>, ScrapeError> {
    match kind {
        PullKind::PromHistogram {
            url,
            metric,
            percentile,
            window_s,
            min_samples,
        } => {
            let text = http_get(url)?;
            let buckets = histogram_buckets(&text, metric)?;
            history.push_back((now, buckets.clone()));
            let window = Duration::from_secs_f64(*window_s);
            // Keep the newest scrape at least one window old as the baseline.
            while history.len() > 2 && now.saturating_duration_since(history[1].0) >= window {
                history.pop_front();
            }
            let (base_at, base) = history.front().expect("just pushed");
            // Nothing before the window has been full once (as for the other sources: the
            // first seconds after a start are the start-up transient, not a window's tail).
            if now.saturating_duration_since(*base_at) < window {
                return Ok(None);
            }
            let delta = bucket_delta(&buckets, base);
            let observations = delta.iter().map(|(_, c)| *c).fold(0.0, f64::max);
            if observations < *min_samples as f64 {
                return Ok(None);
            }
            Ok(percentile_from_buckets(&delta, *percentile).map(|v| v * unit_to_us(metric)))
        }
        PullKind::PromCounter { url, metric } => {
            let text = http_get(url)?;
            let value = counter_value(&text, metric)?;
            Ok(rate.update(value, now))
        }
        PullKind::MemcacheStats { address } => {
            let text = request(conn, address, b"stats\r\n", b"END\r\n")?;
            let mut total = None::<f64>;
            for line in text.lines() {
                let mut f = line.split_whitespace();
                if f.next() == Some("STAT") {
                    if let (Some(k @ ("cmd_get" | "cmd_set")), Some(v)) = (f.next(), f.next()) {
                        let v: f64 = v.parse().map_err(|_| ScrapeError::BadValue {
                            address: address.clone(),
                            field: k.to_string(),
                            value: v.to_string(),
                        })?;
                        *total.get_or_insert(0.0) += v;
                    }
                }
            }
            let total = total.ok_or_else(|| ScrapeError::MissingField {
                address: address.clone(),
                reply: "`stats`",
                field: "cmd_get/cmd_set",
            })?;
            Ok(rate.update(total, now))
        }
        PullKind::RedisInfo { address } => {
            let text = request(conn, address, b"INFO stats\r\n", b"\r\n\r\n")?;
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix("total_commands_processed:"))
                .ok_or_else(|| ScrapeError::MissingField {
                    address: address.clone(),
                    reply: "INFO",
                    field: "total_commands_processed",
                })?;
            let v: f64 = value.trim().parse().map_err(|_| ScrapeError::BadValue {
                address: address.clone(),
                field: "total_commands_processed".into(),
                value: value.to_string(),
            })?;
            Ok(rate.update(v, now))
        }
    }
}

/// Sends `req` and reads until `until` ends the data (or 1 s passes), on the connection kept
/// in `conn` from the last poll where there is one: a fresh connection each second cost a TCP
/// handshake and teardown on both sides (the agent's and the LC's) every poll. A kept
/// connection that fails (the LC restarted, or closed it) is dropped and the request made
/// once more on a fresh one; a connection is kept only after a complete answer, so nothing of
/// an earlier answer can be read as the next.
fn request(
    conn: &mut Option<TcpStream>,
    address: &str,
    req: &[u8],
    until: &[u8],
) -> Result<String, ScrapeError> {
    if let Some(s) = conn.as_mut() {
        match exchange(s, address, req, until) {
            Ok((text, true)) => return Ok(text),
            _ => *conn = None,
        }
    }
    let addr = resolve(address)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(io_error("connecting to", address))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(io_error("setting a read timeout on", address))?;
    let (text, complete) = exchange(&mut s, address, req, until)?;
    if complete {
        *conn = Some(s);
    }
    Ok(text)
}

/// One request and its answer; `true` when the answer ended with `until` (else the peer
/// closed first).
fn exchange(
    s: &mut TcpStream,
    address: &str,
    req: &[u8],
    until: &[u8],
) -> Result<(String, bool), ScrapeError> {
    s.write_all(req).map_err(io_error("writing to", address))?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    let complete = loop {
        let n = s
            .read(&mut chunk)
            .map_err(io_error("reading from", address))?;
        if n == 0 {
            break false;
        }
        out.extend_from_slice(&chunk[..n]);
        if out.ends_with(until) {
            break true;
        }
    };
    Ok((String::from_utf8_lossy(&out).into_owned(), complete))
}

fn resolve(address: &str) -> Result<SocketAddr, ScrapeError> {
    address
        .to_socket_addrs()
        .map_err(|source| ScrapeError::Resolve {
            address: address.into(),
            source,
        })?
        .next()
        .ok_or_else(|| ScrapeError::NoAddress {
            address: address.into(),
        })
}

/// `GET` of a `http://host:port/path` URL on loopback; returns the body.
pub fn http_get(url: &str) -> Result<String, ScrapeError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ScrapeError::NotHttp { url: url.into() })?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let addr = resolve(hostport)?;
    if !is_loopback(addr.ip()) {
        return Err(ScrapeError::NotLoopback { url: url.into() });
    }
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .redirects(0)
        .build();
    let response = agent.get(url).call().map_err(|e| ScrapeError::Http {
        url: url.into(),
        source: Box::new(e),
    })?;
    let mut body = String::new();
    response
        .into_reader()
        .take(MAX_BODY_BYTES)
        .read_to_string(&mut body)
        .map_err(io_error("reading the body of", url))?;
    Ok(body)
}

/// The largest scrape body read (a bigger one is cut, and fails to parse where it matters).
const MAX_BODY_BYTES: u64 = 16 << 20;

fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

/// Unit factor from a metric's name to µs (Prometheus convention: seconds).
fn unit_to_us(metric: &str) -> f64 {
    if metric.contains("microseconds") || metric.ends_with("_us") {
        1.0
    } else if metric.contains("milliseconds") || metric.ends_with("_ms") {
        1e3
    } else if metric.contains("nanoseconds") || metric.ends_with("_ns") {
        1e-3
    } else {
        1e6
    }
}

/// The exposition parsed by `prometheus-parse` (text format 0.0.4 and OpenMetrics' text).
fn parse_exposition(text: &str) -> Result<prometheus_parse::Scrape, ScrapeError> {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .map_err(ScrapeError::Exposition)
}

/// Cumulative buckets `(le, count)` of histogram `metric`, summed over label sets, sorted by le.
/// A `# TYPE … histogram` family and bare `…_bucket{le=…}` samples are both read.
pub fn histogram_buckets(text: &str, metric: &str) -> Result<Vec<(f64, f64)>, ScrapeError> {
    use prometheus_parse::Value;
    let scrape = parse_exposition(text)?;
    let want = format!("{metric}_bucket");
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut add = |le: f64, v: f64| match out.iter_mut().find(|(l, _)| *l == le) {
        Some((_, c)) => *c += v,
        None => out.push((le, v)),
    };
    for s in &scrape.samples {
        match &s.value {
            Value::Histogram(buckets) if s.metric == metric => {
                for b in buckets {
                    add(b.less_than, b.count);
                }
            }
            Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v) if s.metric == want => {
                let le = s.labels.get("le").ok_or_else(|| ScrapeError::NoLe {
                    metric: want.clone(),
                })?;
                let le = match le {
                    "+Inf" => f64::INFINITY,
                    other => other.parse().map_err(|_| ScrapeError::BadLe {
                        metric: want.clone(),
                        le: other.into(),
                    })?,
                };
                add(le, *v);
            }
            _ => {}
        }
    }
    if out.is_empty() {
        return Err(ScrapeError::NoSamples { metric: want });
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(out)
}

/// Value of counter `metric` (or `metric_total`), summed over label sets.
pub fn counter_value(text: &str, metric: &str) -> Result<f64, ScrapeError> {
    use prometheus_parse::Value;
    let scrape = parse_exposition(text)?;
    let total = format!("{metric}_total");
    let mut sum = None::<f64>;
    for s in &scrape.samples {
        if s.metric != metric && s.metric != total {
            continue;
        }
        if let Value::Counter(v) | Value::Untyped(v) | Value::Gauge(v) = s.value {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum.ok_or_else(|| ScrapeError::NoSamples {
        metric: metric.into(),
    })
}

/// `now - base` per bucket (buckets missing from `base` count from 0; a reset gives `now`).
pub fn bucket_delta(now: &[(f64, f64)], base: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let reset = now
        .iter()
        .any(|(le, c)| base.iter().any(|(l, b)| l == le && b > c));
    now.iter()
        .map(|(le, c)| {
            let b = if reset {
                0.0
            } else {
                base.iter().find(|(l, _)| l == le).map_or(0.0, |(_, b)| *b)
            };
            (*le, c - b)
        })
        .collect()
}

/// The percentile of a cumulative-bucket histogram, interpolating linearly inside the bucket
/// (as PromQL's `histogram_quantile`); `None` when empty. A rank in the +Inf bucket gives the
/// largest finite bound.
pub fn percentile_from_buckets(buckets: &[(f64, f64)], percentile: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = percentile / 100.0 * total;
    let mut prev_le = 0.0;
    let mut prev_count = 0.0;
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev_le);
            }
            let in_bucket = count - prev_count;
            let frac = if in_bucket > 0.0 {
                (rank - prev_count) / in_bucket
            } else {
                1.0
            };
            return Some(prev_le + (le - prev_le) * frac);
        }
        prev_le = le;
        prev_count = count;
    }
    Some(prev_le)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# TYPE req_seconds histogram\n\
        req_seconds_bucket{path=\"/a\",le=\"0.001\"} 50\n\
        req_seconds_bucket{path=\"/a\",le=\"0.01\"} 90\n\
        req_seconds_bucket{path=\"/a\",le=\"+Inf\"} 100\n\
        req_seconds_bucket{path=\"/b\",le=\"0.001\"} 50\n\
        req_seconds_bucket{path=\"/b\",le=\"0.01\"} 90\n\
        req_seconds_bucket{path=\"/b\",le=\"+Inf\"} 100\n\
        req_seconds_count 200\n\
        requests_total{code=\"200\"} 10\nrequests_total{code=\"500\"} 5\n";

    #[test]
    fn buckets_sum_over_label_sets_and_interpolate() {
        let b = histogram_buckets(SCRAPE, "req_seconds").unwrap();
        assert_eq!(
            b,
            vec![(0.001, 100.0), (0.01, 180.0), (f64::INFINITY, 200.0)]
        );
        // p50 = rank 100 → top of the first bucket.
        assert!((percentile_from_buckets(&b, 50.0).unwrap() - 0.001).abs() < 1e-12);
        // p70 = rank 140 → halfway through (0.001, 0.01].
        assert!((percentile_from_buckets(&b, 70.0).unwrap() - 0.0055).abs() < 1e-9);
        assert_eq!(counter_value(SCRAPE, "requests").unwrap(), 15.0);
        assert!(histogram_buckets(SCRAPE, "nope").is_err());
    }

    #[test]
    fn deltas_over_the_window() {
        let base = vec![(0.001, 100.0), (f64::INFINITY, 100.0)];
        let now = vec![(0.001, 100.0), (f64::INFINITY, 200.0)];
        let d = bucket_delta(&now, &base);
        assert_eq!(d, vec![(0.001, 0.0), (f64::INFINITY, 100.0)]);
        assert_eq!(percentile_from_buckets(&d, 99.0), Some(0.001));
    }

    /// A fake memcached on loopback: answers `stats` with `cmd_get` = the request's number
    /// times 100, closes the connection after `close_after` answers; gives the connections
    /// it accepted when done.
    fn fake_memcached(
        requests: usize,
        close_after: usize,
    ) -> (String, std::thread::JoinHandle<usize>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let t = std::thread::spawn(move || {
            let (mut served, mut accepted) = (0, 0);
            while served < requests {
                let (mut c, _) = l.accept().expect("accept");
                c.set_read_timeout(Some(Duration::from_secs(5)))
                    .expect("timeout");
                accepted += 1;
                let mut on_this = 0;
                let mut buf = [0u8; 64];
                while served < requests && on_this < close_after {
                    let n = c.read(&mut buf).expect("read");
                    if n == 0 {
                        break;
                    }
                    assert_eq!(&buf[..n], b"stats\r\n");
                    served += 1;
                    on_this += 1;
                    let body = format!(
                        "STAT pid 1\r\nSTAT cmd_get {}\r\nSTAT cmd_set 0\r\nEND\r\n",
                        served * 100
                    );
                    c.write_all(body.as_bytes()).expect("write");
                }
            }
            accepted
        });
        (addr, t)
    }

    #[test]
    fn memcache_stats_keep_one_connection_and_reconnect_when_it_closes() {
        let kind = |address: &str| PullKind::MemcacheStats {
            address: address.to_string(),
        };
        // one connection for every poll
        let (addr, server) = fake_memcached(4, usize::MAX);
        let (mut hist, mut rate, mut conn) = (VecDeque::new(), CounterRate::default(), None);
        let t0 = Instant::now();
        for i in 0..4u64 {
            let now = t0 + Duration::from_secs(i);
            let got = poll_once(&kind(&addr), &mut hist, &mut rate, &mut conn, now);
            let got = got.expect("poll");
            if i > 0 {
                assert_eq!(got, Some(100.0), "poll {i}: 100 gets a second");
            }
        }
        drop(conn.take());
        assert_eq!(server.join().expect("server"), 1, "one connection kept");
        // the LC closes each connection after two answers: every poll still answered
        let (addr, server) = fake_memcached(5, 2);
        let (mut hist, mut rate, mut conn) = (VecDeque::new(), CounterRate::default(), None);
        for i in 0..5u64 {
            let now = t0 + Duration::from_secs(i);
            let got = poll_once(&kind(&addr), &mut hist, &mut rate, &mut conn, now);
            assert!(got.is_ok(), "poll {i}: {got:?}");
            if i > 0 {
                assert_eq!(got.expect("poll"), Some(100.0), "poll {i}");
            }
        }
        drop(conn.take());
        assert_eq!(
            server.join().expect("server"),
            3,
            "a new connection after each close"
        );
    }
}
