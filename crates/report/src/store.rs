//! The run directory: a manifest plus one JSON file per recorded result, written atomically so an
//! interrupted run resumes by skipping every result whose file exists.
//!
//! ```text
//! DIR/manifest.json          parameters, machine, SLO, peak
//! DIR/<kind>/<id>.json       raw results (points/, runs/, baselines/)
//! DIR/summary.json ...       written by the format step
//! ```

use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Serialize};

use crate::error::{ReportError, Result};
use crate::model::Manifest;

/// A run directory on disk.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

/// Result kinds, one subdirectory each.
pub const POINTS: &str = "points";
pub const RUNS: &str = "runs";
pub const BASELINES: &str = "baselines";

/// `root` made absolute against the working directory: the agent configs written below it
/// name their state file and sockets by it, and the agent refuses relative ones (seventh and
/// eighth hostile passes), so `--out results/x` (or the default `headroom-results/<name>`)
/// would give configs the agent refuses.
fn absolute(root: PathBuf) -> Result<PathBuf> {
    std::path::absolute(&root).map_err(|e| ReportError::io("resolving", &root, e))
}

impl RunDir {
    /// Opens (creating if needed) a run directory.
    pub fn create(root: impl Into<PathBuf>) -> Result<RunDir> {
        let root = absolute(root.into())?;
        std::fs::create_dir_all(&root).map_err(|e| ReportError::io("creating", &root, e))?;
        Ok(RunDir { root })
    }

    /// Opens an existing run directory (one holding a manifest).
    pub fn open(root: impl Into<PathBuf>) -> Result<RunDir> {
        let root = absolute(root.into())?;
        let manifest = root.join("manifest.json");
        if !manifest.is_file() {
            return Err(ReportError::Input(format!(
                "{} is not a run directory: {} is missing",
                root.display(),
                manifest.display()
            )));
        }
        Ok(RunDir { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.root.join("manifest.json")
    }

    /// The manifest, its figures checked (a hand-edited or corrupt one is refused naming every
    /// bad value, not drawn: `slo_us = -1e300` made a report of nothing but violations).
    pub fn read_manifest(&self) -> Result<Manifest> {
        let path = self.manifest_path();
        let m: Manifest = read_json(&path)?;
        // 0 is "not set" (an experiment without an SLO or a peak writes the defaults).
        let mut bad = Vec::new();
        if !(m.slo_us.is_finite() && m.slo_us >= 0.0) {
            bad.push(format!(
                "slo_us = {:?}: must be a number of µs, 0 or more",
                m.slo_us
            ));
        }
        if !(m.percentile >= 0.0 && m.percentile < 100.0) {
            bad.push(format!(
                "percentile = {:?}: must be in [0, 100)",
                m.percentile
            ));
        }
        if let Some(p) = m.peak_qps.filter(|p| !(p.is_finite() && *p >= 0.0)) {
            bad.push(format!("peak_qps = {p:?}: must be a rate, 0 or more"));
        }
        if bad.is_empty() {
            Ok(m)
        } else {
            Err(ReportError::Input(format!(
                "{}: {}",
                path.display(),
                bad.join("; ")
            )))
        }
    }

    /// The existing manifest, if any (a resumed run keeps its SLO, peak and start time).
    pub fn try_read_manifest(&self) -> Result<Option<Manifest>> {
        if self.manifest_path().is_file() {
            self.read_manifest().map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        write_json_atomic(&self.manifest_path(), manifest)
    }

    /// Where the result `id` of `kind` lives. Ids are made file-name safe.
    pub fn result_path(&self, kind: &str, id: &str) -> PathBuf {
        self.root.join(kind).join(format!("{}.json", file_safe(id)))
    }

    /// A scratch file for a subprocess's output (load JSON, progress, decision log).
    pub fn scratch_path(&self, name: &str) -> Result<PathBuf> {
        let dir = self.root.join("raw");
        std::fs::create_dir_all(&dir).map_err(|e| ReportError::io("creating", &dir, e))?;
        Ok(dir.join(file_safe(name)))
    }

    /// The stored result, `None` when it was never recorded.
    pub fn load<T: DeserializeOwned>(&self, kind: &str, id: &str) -> Result<Option<T>> {
        let path = self.result_path(kind, id);
        if !path.is_file() {
            return Ok(None);
        }
        read_json(&path).map(Some)
    }

    pub fn save<T: Serialize>(&self, kind: &str, id: &str, value: &T) -> Result<()> {
        let path = self.result_path(kind, id);
        let dir = self.root.join(kind);
        std::fs::create_dir_all(&dir).map_err(|e| ReportError::io("creating", &dir, e))?;
        write_json_atomic(&path, value)
    }

    /// Returns the stored result, or records it with `record` and stores it. The flag says whether
    /// it was resumed (true: `record` was not called).
    /// The recorder's own error type is kept (a bench's recorder fails with the bench's errors).
    pub fn get_or_record<T, E, F>(&self, kind: &str, id: &str, record: F) -> Result<(T, bool), E>
    where
        T: Serialize + DeserializeOwned,
        E: From<ReportError>,
        F: FnOnce() -> Result<T, E>,
    {
        if let Some(v) = self.load(kind, id)? {
            return Ok((v, true));
        }
        let v = record()?;
        self.save(kind, id, &v)?;
        Ok((v, false))
    }

    /// Every stored result of `kind`, sorted by file name.
    pub fn all<T: DeserializeOwned>(&self, kind: &str) -> Result<Vec<T>> {
        let dir = self.root.join(kind);
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| ReportError::io("listing", &dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths.iter().map(|p| read_json(p)).collect()
    }
}

/// Replaces every character outside `[A-Za-z0-9._-]` with `_` (ids carry `/`, `:` and `=`).
pub fn file_safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| ReportError::io("reading", path, e))?;
    serde_json::from_str(&text).map_err(|source| ReportError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes pretty JSON through a temporary file and a rename, so a crash never leaves half a file
/// that a resumed run would take for a result.
pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| ReportError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    write_atomic(path, text.as_bytes())
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| ReportError::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ReportError::io("renaming into", path, e))
}
