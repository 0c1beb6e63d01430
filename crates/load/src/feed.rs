//! `--feed SOCKET` (docs/architecture.md, contract 4): one JSON line per second on a Unix stream socket:
//! `{"version":1,"t_unix_ms":…,"interval_s":…,"qps":…,"hist":"<LatencyHist base64>"}` with the
//! interval's corrected latencies, for the colocation agent to read live.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::clock::unix_ms;
use crate::error::LoadError;
use crate::results::Interval;

/// Version of the feed line format.
pub const FEED_VERSION: u32 = 1;

/// One line of the feed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeedLine {
    pub version: u32,
    pub t_unix_ms: u64,
    pub interval_s: f64,
    pub qps: f64,
    /// Base64 HDR V2 deflate histogram of the interval's corrected latencies (ns).
    pub hist: String,
}

/// A connected feed.
pub struct FeedWriter {
    path: PathBuf,
    stream: UnixStream,
}

impl FeedWriter {
    pub fn connect(path: &Path) -> Result<FeedWriter, LoadError> {
        let stream = UnixStream::connect(path).map_err(|source| LoadError::Output {
            what: "connecting to the feed socket",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(FeedWriter {
            path: path.to_path_buf(),
            stream,
        })
    }

    /// Writes the line of one interval.
    pub fn send(&mut self, iv: &Interval) -> Result<(), LoadError> {
        let line = FeedLine {
            version: FEED_VERSION,
            t_unix_ms: unix_ms(),
            interval_s: iv.interval_s,
            qps: iv.qps,
            hist: iv.hist.to_base64(),
        };
        let mut text = serde_json::to_string(&line).expect("plain struct serializes");
        text.push('\n');
        self.stream
            .write_all(text.as_bytes())
            .map_err(|source| LoadError::Output {
                what: "writing to the feed socket",
                path: self.path.clone(),
                source,
            })
    }
}
