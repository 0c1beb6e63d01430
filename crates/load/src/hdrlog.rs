//! `--hdr F`: the per-second latency histograms as an HdrHistogram interval log (the format of
//! HdrHistogram's `HistogramLogWriter`, readable by HdrHistogram's log tools), values in
//! nanoseconds. Three lines per interval: the corrected latency (from each request's scheduled
//! send, less the client's own lateness; untagged, `warmup` during the warmup), then the same
//! requests from their actual send (the kernel's transmit stamp; tagged `actual-send`,
//! `warmup-actual-send`) — what a sensor that stamps requests in the kernel or the server sees —
//! then the same requests' send lag, the client's own lateness that neither latency includes
//! (tagged `send-lag`, `warmup-send-lag`). Tools that read one histogram per interval select by
//! tag.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;

use crate::error::LoadError;
use crate::results::Interval;

/// The tags of an interval's two lines.
const WARMUP: &str = "warmup";
const ACTUAL_SEND: &str = "actual-send";
const WARMUP_ACTUAL_SEND: &str = "warmup-actual-send";
const SEND_LAG: &str = "send-lag";
const WARMUP_SEND_LAG: &str = "warmup-send-lag";

/// An open interval log.
pub struct HdrLogWriter {
    path: PathBuf,
    out: BufWriter<File>,
    serializer: V2DeflateSerializer,
}

impl HdrLogWriter {
    /// Creates the file and writes the log header (start time, units).
    pub fn create(path: &Path) -> Result<HdrLogWriter, LoadError> {
        let io = |source| LoadError::Output {
            what: "creating the HDR interval log",
            path: path.to_path_buf(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        let mut serializer = V2DeflateSerializer::new();
        let now = SystemTime::now();
        IntervalLogWriterBuilder::new()
            .add_comment(
                "headroom load: latency per interval, values in nanoseconds; untagged/warmup: \
                 from the scheduled send (corrected), actual-send/warmup-actual-send: from the \
                 actual send, send-lag/warmup-send-lag: the client's own send lag",
            )
            .with_start_time(now)
            .with_base_time(now)
            .with_max_value_divisor(1e6)
            .begin_log_with(&mut out, &mut serializer)
            .map_err(io)?;
        Ok(HdrLogWriter {
            path: path.to_path_buf(),
            out,
            serializer,
        })
    }

    /// Appends one interval: its corrected line, its actual-send line, its send-lag line.
    pub fn log(&mut self, iv: &Interval) -> Result<(), LoadError> {
        let start = Duration::from_secs_f64((iv.t_s - iv.interval_s).max(0.0));
        let duration = Duration::from_secs_f64(iv.interval_s);
        let (corrected_tag, actual_tag, lag_tag) = if iv.warmup {
            (Some(WARMUP), WARMUP_ACTUAL_SEND, WARMUP_SEND_LAG)
        } else {
            (None, ACTUAL_SEND, SEND_LAG)
        };
        let mut w = IntervalLogWriterBuilder::new()
            .begin_log_with(&mut self.out, &mut self.serializer)
            .map_err(|e| LoadError::Output {
                what: "writing the HDR interval log",
                path: self.path.clone(),
                source: e,
            })?;
        for (h, tag) in [
            (iv.hist.histogram(), corrected_tag),
            (iv.actual_send.histogram(), Some(actual_tag)),
            (iv.send_lag.histogram(), Some(lag_tag)),
        ] {
            w.write_histogram(h, start, duration, tag.and_then(Tag::new))
                .map_err(|e| LoadError::Output {
                    what: "writing the HDR interval log",
                    path: self.path.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
        }
        Ok(())
    }

    fn err(&self, source: std::io::Error) -> LoadError {
        LoadError::Output {
            what: "writing the HDR interval log",
            path: self.path.clone(),
            source,
        }
    }

    /// Flushes the file.
    pub fn finish(&mut self) -> Result<(), LoadError> {
        let r = self.out.flush();
        r.map_err(|e| self.err(e))
    }
}

/// One interval read back from a `--hdr` log, on the wall clock.
#[derive(Debug, Clone)]
pub struct LoggedInterval {
    /// Start, seconds since the Unix epoch (the log's base time + the interval's offset).
    pub start_unix_s: f64,
    pub duration_s: f64,
    /// Tagged `warmup`.
    pub warmup: bool,
    /// Corrected latency (from each request's scheduled send).
    pub hist: crate::stats::LatencyHist,
    /// The same requests from their actual send (`None` in a log written before it was kept).
    pub actual_send: Option<crate::stats::LatencyHist>,
    /// The same requests' send lag, the client's own (`None` in a log written before it was
    /// kept).
    pub send_lag: Option<crate::stats::LatencyHist>,
}

impl LoggedInterval {
    pub fn end_unix_s(&self) -> f64 {
        self.start_unix_s + self.duration_s
    }
}

/// Reads a `--hdr` log written by [`HdrLogWriter`] (or any HdrHistogram interval log with a
/// `BaseTime` or `StartTime`): its intervals in order, on the wall clock.
pub fn read_intervals(path: &Path) -> Result<Vec<LoggedInterval>, LoadError> {
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    let bad = |detail: String| LoadError::Output {
        what: "reading the HDR interval log",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, detail),
    };
    let bytes = std::fs::read(path).map_err(|source| LoadError::Output {
        what: "reading the HDR interval log",
        path: path.to_path_buf(),
        source,
    })?;
    let mut base: Option<f64> = None;
    let mut start: Option<f64> = None;
    let mut out = Vec::new();
    for (i, entry) in IntervalLogIterator::new(&bytes).enumerate() {
        match entry.map_err(|e| bad(format!("entry {}: {e:?}", i + 1)))? {
            LogEntry::BaseTime(t) => base = Some(t.as_secs_f64()),
            LogEntry::StartTime(t) => start = Some(t.as_secs_f64()),
            LogEntry::Interval(iv) => {
                // Interval offsets count from BaseTime; without one they are absolute.
                let origin = base.or(start.map(|_| 0.0)).unwrap_or(0.0);
                let hist = crate::stats::LatencyHist::from_base64(iv.encoded_histogram())
                    .map_err(|e| bad(format!("interval {}: {e}", out.len() + 1)))?;
                let start_unix_s = origin + iv.start_timestamp().as_secs_f64();
                let tag = iv.tag().map(|t| t.as_str().to_owned());
                let second = matches!(tag.as_deref(), Some(ACTUAL_SEND | WARMUP_ACTUAL_SEND));
                let third = matches!(tag.as_deref(), Some(SEND_LAG | WARMUP_SEND_LAG));
                if second || third {
                    // a further line of the interval just read
                    let last: Option<&mut LoggedInterval> = out.last_mut();
                    match last {
                        Some(l) if (l.start_unix_s - start_unix_s).abs() < 1e-3 => {
                            if second {
                                l.actual_send = Some(hist)
                            } else {
                                l.send_lag = Some(hist)
                            }
                        }
                        _ => {
                            return Err(bad(format!(
                                "a {} line at {start_unix_s:.3} s follows no interval starting \
                                 then",
                                tag.as_deref().unwrap_or_default()
                            )))
                        }
                    }
                    continue;
                }
                out.push(LoggedInterval {
                    start_unix_s,
                    duration_s: iv.duration().as_secs_f64(),
                    warmup: tag.as_deref() == Some(WARMUP),
                    hist,
                    actual_send: None,
                    send_lag: None,
                });
            }
        }
    }
    if out.is_empty() {
        return Err(bad("no intervals".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::LatencyHist;

    fn interval(index: u64, t_s: f64, warmup: bool, values_us: &[u64]) -> Interval {
        let mut hist = LatencyHist::new();
        for v in values_us {
            hist.record_ns(v * 1000);
        }
        // the actual-send figures: each 10 µs less (the client's send lag)
        let mut actual_send = LatencyHist::new();
        for v in values_us {
            actual_send.record_ns((v - 10) * 1000);
        }
        // and a send lag of 3 µs each
        let mut send_lag = LatencyHist::new();
        for _ in values_us {
            send_lag.record_ns(3_000);
        }
        Interval {
            index,
            t_s,
            interval_s: 1.0,
            qps: values_us.len() as f64,
            hist,
            actual_send,
            send_lag,
            warmup,
        }
    }

    #[test]
    fn a_written_log_reads_back_on_the_wall_clock_with_its_warmup_tag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.hdr");
        let before = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let mut w = HdrLogWriter::create(&path).unwrap();
        w.log(&interval(0, 1.0, true, &[5_000])).unwrap();
        w.log(&interval(1, 2.0, false, &[100, 200, 300])).unwrap();
        w.finish().unwrap();
        let after = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let ivs = read_intervals(&path).unwrap();
        assert_eq!(ivs.len(), 2);
        assert!(ivs[0].warmup && !ivs[1].warmup);
        // the first interval starts at the log's base time (ms resolution)
        assert!(
            ivs[0].start_unix_s >= before - 0.002 && ivs[0].start_unix_s <= after + 0.002,
            "{} not in {before}..{after}",
            ivs[0].start_unix_s
        );
        assert!((ivs[1].start_unix_s - ivs[0].start_unix_s - 1.0).abs() < 0.002);
        assert!((ivs[1].end_unix_s() - ivs[1].start_unix_s - 1.0).abs() < 0.002);
        assert_eq!(ivs[1].hist.count(), 3);
        let p99 = ivs[1].hist.percentile_us(99.0);
        assert!((299.0..=301.0).contains(&p99), "{p99}");
        // each interval's actual-send line is paired with it, warm-up included
        let actual = ivs[1].actual_send.as_ref().expect("an actual-send line");
        assert_eq!(actual.count(), 3);
        let p99 = actual.percentile_us(99.0);
        assert!((289.0..=291.0).contains(&p99), "{p99}");
        assert_eq!(ivs[0].actual_send.as_ref().map(|h| h.count()), Some(1));
        // and so is its send-lag line
        let lag = ivs[1].send_lag.as_ref().expect("a send-lag line");
        assert_eq!(lag.count(), 3);
        assert!((2.9..=3.1).contains(&lag.percentile_us(99.0)));
        assert_eq!(ivs[0].send_lag.as_ref().map(|h| h.count()), Some(1));
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junk.hdr");
        std::fs::write(&path, "Tag=x,not,a,log\n").unwrap();
        let e = read_intervals(&path).unwrap_err().to_string();
        assert!(e.contains("junk.hdr"), "{e}");
    }
}
