//! The io (v1 blkio) controller: throttles per device and weights.

use std::path::{Path, PathBuf};

use crate::error::{HostError, Result};
pub use headroom_types::values::DeviceId;
use headroom_types::values::GroupPath;

use super::{Backend, Cgroups, Controller, KnobFile};

/// Throttles: one `io.max` line per device on v2, four files on v1.
const IO_MAX: KnobFile = KnobFile::v2_only(Controller::Io, "io.max");
const BLKIO_READ_BPS: KnobFile =
    KnobFile::v1_only(Controller::Io, "blkio.throttle.read_bps_device");
const BLKIO_WRITE_BPS: KnobFile =
    KnobFile::v1_only(Controller::Io, "blkio.throttle.write_bps_device");
const BLKIO_READ_IOPS: KnobFile =
    KnobFile::v1_only(Controller::Io, "blkio.throttle.read_iops_device");
const BLKIO_WRITE_IOPS: KnobFile =
    KnobFile::v1_only(Controller::Io, "blkio.throttle.write_iops_device");
/// Proportional weight; v1 kernels with BFQ name it `blkio.bfq.weight`.
const IO_WEIGHT: KnobFile = KnobFile::both(Controller::Io, "blkio.weight", "io.weight");
const BLKIO_BFQ_WEIGHT: KnobFile = KnobFile::v1_only(Controller::Io, "blkio.bfq.weight");

pub use headroom_types::resources::IoLimits;

impl Cgroups {
    /// Disk throttles for one device (`io.max` / `blkio.throttle.*_device`).
    pub fn set_io_limits(
        &self,
        group: &GroupPath,
        device: DeviceId,
        limits: IoLimits,
    ) -> Result<()> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => {
                let f = |v: Option<u64>| v.map_or("max".to_owned(), |v| v.to_string());
                let value = format!(
                    "{device} rbps={} wbps={} riops={} wiops={}",
                    f(limits.read_bps),
                    f(limits.write_bps),
                    f(limits.read_iops),
                    f(limits.write_iops)
                );
                self.knobs.write(&dir.join(IO_MAX.display_name()), &value)
            }
            Backend::V1(_) => {
                for (file, value) in v1_io_files(&limits) {
                    // 0 removes a v1 throttle.
                    self.knobs
                        .write(&dir.join(file), &format!("{device} {}", value.unwrap_or(0)))?;
                }
                Ok(())
            }
        }
    }

    /// The throttles set for `device` (all `None` when it has none).
    pub fn io_limits(&self, group: &GroupPath, device: DeviceId) -> Result<IoLimits> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        let mut limits = IoLimits::default();
        match backend {
            Backend::V2(_) => {
                let path = dir.join(IO_MAX.display_name());
                let text = self.knobs.read(&path)?;
                for line in text.lines() {
                    let mut parts = line.split_whitespace();
                    let Some(dev) = parts.next() else { continue };
                    if dev.parse::<DeviceId>().ok() != Some(device) {
                        continue;
                    }
                    for kv in parts {
                        let (k, v) = kv
                            .split_once('=')
                            .ok_or_else(|| HostError::parse(&path, &text, "expected KEY=VALUE"))?;
                        let value = match v {
                            "max" => None,
                            n => Some(n.parse().map_err(|_| {
                                HostError::parse(&path, &text, "expected a number or `max`")
                            })?),
                        };
                        match k {
                            "rbps" => limits.read_bps = value,
                            "wbps" => limits.write_bps = value,
                            "riops" => limits.read_iops = value,
                            "wiops" => limits.write_iops = value,
                            _ => {}
                        }
                    }
                }
            }
            Backend::V1(_) => {
                let files = v1_io_files(&IoLimits::default());
                let mut values = [None; 4];
                for (slot, (file, _)) in values.iter_mut().zip(files) {
                    let path = dir.join(file);
                    let text = self.knobs.read(&path)?;
                    for line in text.lines() {
                        let mut parts = line.split_whitespace();
                        let (Some(dev), Some(v)) = (parts.next(), parts.next()) else {
                            continue;
                        };
                        if dev.parse::<DeviceId>().ok() == Some(device) {
                            let v: u64 = v.parse().map_err(|_| {
                                HostError::parse(&path, &text, "expected `MAJ:MIN N`")
                            })?;
                            *slot = (v > 0).then_some(v);
                        }
                    }
                }
                [
                    limits.read_bps,
                    limits.write_bps,
                    limits.read_iops,
                    limits.write_iops,
                ] = values;
            }
        }
        Ok(limits)
    }

    /// Proportional disk weight, written natively: v2 `io.weight` "default W" (1..=10000); v1
    /// `blkio.weight` (10..=1000) or, with BFQ, `blkio.bfq.weight` (1..=1000).
    pub fn set_io_weight(&self, group: &GroupPath, weight: u64) -> Result<()> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => self.knobs.write(
                &dir.join(IO_WEIGHT.display_name()),
                &format!("default {weight}"),
            ),
            Backend::V1(_) => self
                .knobs
                .write(&self.v1_io_weight_file(&dir), &weight.to_string()),
        }
    }

    pub fn io_weight(&self, group: &GroupPath) -> Result<u64> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        let path = match backend {
            Backend::V2(_) => dir.join(IO_WEIGHT.display_name()),
            Backend::V1(_) => self.v1_io_weight_file(&dir),
        };
        let text = self.knobs.read(&path)?;
        let value = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("default ")
                    .or_else(|| (!l.contains(' ')).then_some(l))
            })
            .ok_or_else(|| HostError::parse(&path, &text, "expected a weight"))?;
        value
            .trim()
            .parse()
            .map_err(|_| HostError::parse(&path, &text, "expected a weight"))
    }

    fn v1_io_weight_file(&self, dir: &Path) -> PathBuf {
        let bfq = dir.join(BLKIO_BFQ_WEIGHT.display_name());
        if !dir.join(IO_WEIGHT.v1.unwrap_or_default()).exists() && bfq.exists() {
            bfq
        } else {
            dir.join(IO_WEIGHT.v1.unwrap_or_default())
        }
    }
}

fn v1_io_files(limits: &IoLimits) -> [(&'static str, Option<u64>); 4] {
    [
        (BLKIO_READ_BPS.display_name(), limits.read_bps),
        (BLKIO_WRITE_BPS.display_name(), limits.write_bps),
        (BLKIO_READ_IOPS.display_name(), limits.read_iops),
        (BLKIO_WRITE_IOPS.display_name(), limits.write_iops),
    ]
}
