//! `--hdr F`: the per-second corrected-latency histograms as an HdrHistogram interval log (the
//! format of HdrHistogram's `HistogramLogWriter`, readable by HdrHistogram's log tools), values in
//! nanoseconds, one line per interval, tagged `warmup` during the warmup.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;

use crate::error::LoadError;
use crate::runner::Interval;

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
            .add_comment("headroom load: corrected latency per interval, values in nanoseconds")
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

    /// Appends one interval.
    pub fn log(&mut self, iv: &Interval) -> Result<(), LoadError> {
        let h = iv.hist.histogram();
        let start = Duration::from_secs_f64((iv.t_s - iv.interval_s).max(0.0));
        let tag = if iv.warmup { Tag::new("warmup") } else { None };
        let mut w = IntervalLogWriterBuilder::new()
            .begin_log_with(&mut self.out, &mut self.serializer)
            .map_err(|e| LoadError::Output {
                what: "writing the HDR interval log",
                path: self.path.clone(),
                source: e,
            })?;
        w.write_histogram(h, start, Duration::from_secs_f64(iv.interval_s), tag)
            .map_err(|e| LoadError::Output {
                what: "writing the HDR interval log",
                path: self.path.clone(),
                source: std::io::Error::other(e.to_string()),
            })
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
