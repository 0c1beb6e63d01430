//! Intel RDT / AMD QoS through `/sys/fs/resctrl`: LLC way masks (`L3:`), memory bandwidth
//! allocation (`MB:`) and monitoring (`mon_data`).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{HostError, Result};
use crate::knob_io::Knobs;
use headroom_types::values::CpuSet;

pub use headroom_types::resources::{top_ways_mask, L3Info, MbInfo, Schemata};

/// Monitoring capabilities (`info/L3_MON`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MonInfo {
    pub mon_features: Vec<String>,
    pub num_rmids: u32,
}

/// What resctrl offers here; each part is `None` when the hardware lacks it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResctrlInfo {
    pub l3: Option<L3Info>,
    pub mb: Option<MbInfo>,
    pub mon: Option<MonInfo>,
}

/// A resctrl group name: one path component below the resctrl root (or the default group).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResctrlGroup(String);

impl ResctrlGroup {
    pub fn new(name: &str) -> Result<Self> {
        let bad = |reason: &str| HostError::invalid("resctrl group", name, reason);
        if name.is_empty() {
            return Err(bad("empty (use ResctrlGroup::default_group())"));
        }
        if name.contains('/') || name == "." || name == ".." || name.chars().any(|c| c.is_control())
        {
            return Err(bad("must be a single plain path component"));
        }
        if ["info", "mon_groups", "mon_data"].contains(&name) {
            return Err(bad("reserved resctrl name"));
        }
        Ok(ResctrlGroup(name.to_owned()))
    }

    /// The root (default) group, which holds every task not in another group.
    pub fn default_group() -> Self {
        ResctrlGroup(String::new())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResctrlGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "(default)"
        } else {
            &self.0
        })
    }
}

/// Reading a `schemata` file.
pub trait ParseSchemata: Sized {
    /// Parses a `schemata` file (other resources such as L2 or L3CODE are ignored).
    fn parse(path: &Path, text: &str) -> Result<Self>;
}

impl ParseSchemata for Schemata {
    fn parse(path: &Path, text: &str) -> Result<Self> {
        let mut schemata = Schemata::default();
        for line in text.lines() {
            let Some((resource, domains)) = line.trim().split_once(':') else {
                continue;
            };
            let resource = resource.trim();
            if resource != "L3" && resource != "MB" {
                continue;
            }
            for domain in domains.split(';') {
                let bad =
                    || HostError::parse(path, text, format!("bad {resource} domain `{domain}`"));
                let (id, value) = domain.trim().split_once('=').ok_or_else(bad)?;
                let id: u32 = id.trim().parse().map_err(|_| bad())?;
                if resource == "L3" {
                    schemata.l3.insert(
                        id,
                        u64::from_str_radix(value.trim(), 16).map_err(|_| bad())?,
                    );
                } else {
                    schemata
                        .mb
                        .insert(id, value.trim().parse().map_err(|_| bad())?);
                }
            }
        }
        Ok(schemata)
    }
}

/// Monitoring counters of one domain (`mon_data/mon_L3_XX/*`); `None` when unsupported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MonReading {
    pub domain: u32,
    pub llc_occupancy_bytes: Option<u64>,
    pub mbm_total_bytes: Option<u64>,
    pub mbm_local_bytes: Option<u64>,
}

/// The resctrl file system mounted at `<root>/sys/fs/resctrl`.
#[derive(Debug, Clone)]
pub struct Resctrl {
    dir: PathBuf,
    knobs: Knobs,
}

impl Resctrl {
    pub(crate) fn new(dir: PathBuf, knobs: Knobs) -> Self {
        Resctrl { dir, knobs }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True when resctrl is mounted (its `info` directory exists).
    pub fn is_mounted(&self) -> bool {
        self.dir.join("info").is_dir()
    }

    /// Reads the capabilities from `info/`.
    pub fn info(&self) -> Result<ResctrlInfo> {
        let info = self.dir.join("info");
        if !info.is_dir() {
            return Err(HostError::unavailable(
                "resctrl",
                format!("{} is not mounted (kernel without CONFIG_X86_CPU_RESCTRL, CPU without RDT, or `mount -t resctrl resctrl /sys/fs/resctrl` not done)", self.dir.display()),
            ));
        }
        let l3 = if info.join("L3").is_dir() {
            let d = info.join("L3");
            Some(L3Info {
                cbm_mask: self.read_hex(&d.join("cbm_mask"))?,
                min_cbm_bits: self.knobs.read_u64(&d.join("min_cbm_bits"))? as u32,
                num_closids: self.knobs.read_u64(&d.join("num_closids"))? as u32,
                shareable_bits: self.read_hex(&d.join("shareable_bits")).unwrap_or(0),
            })
        } else {
            None
        };
        let mb = if info.join("MB").is_dir() {
            let d = info.join("MB");
            Some(MbInfo {
                bandwidth_gran: self.knobs.read_u64(&d.join("bandwidth_gran"))? as u32,
                min_bandwidth: self.knobs.read_u64(&d.join("min_bandwidth"))? as u32,
                num_closids: self.knobs.read_u64(&d.join("num_closids"))? as u32,
                delay_linear: self.knobs.read_u64(&d.join("delay_linear")).unwrap_or(1) != 0,
            })
        } else {
            None
        };
        let mon = if info.join("L3_MON").is_dir() {
            let d = info.join("L3_MON");
            Some(MonInfo {
                mon_features: self
                    .knobs
                    .read(&d.join("mon_features"))?
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect(),
                num_rmids: self.knobs.read_u64(&d.join("num_rmids"))? as u32,
            })
        } else {
            None
        };
        Ok(ResctrlInfo { l3, mb, mon })
    }

    fn read_hex(&self, path: &Path) -> Result<u64> {
        let text = self.knobs.read(path)?;
        u64::from_str_radix(text.trim(), 16)
            .map_err(|_| HostError::parse(path, &text, "expected a hex mask"))
    }

    fn group_dir(&self, group: &ResctrlGroup) -> PathBuf {
        if group.0.is_empty() {
            self.dir.clone()
        } else {
            self.dir.join(&group.0)
        }
    }

    /// Creates a control group (idempotent).
    pub fn create_group(&self, group: &ResctrlGroup) -> Result<()> {
        let dir = self.group_dir(group);
        if group.0.is_empty() || dir.is_dir() {
            return Ok(());
        }
        self.knobs.create_dir(&dir)
    }

    /// Removes a control group (its tasks fall back to the default group); idempotent.
    pub fn remove_group(&self, group: &ResctrlGroup) -> Result<()> {
        if group.0.is_empty() {
            return Err(HostError::invalid(
                "resctrl group",
                "",
                "the default group cannot be removed",
            ));
        }
        let dir = self.group_dir(group);
        if !dir.is_dir() {
            return Ok(());
        }
        self.knobs.remove_dir(&dir)
    }

    /// Writes each resource line of `schemata` (one write per line, as the kernel wants). A
    /// mask violating `min_cbm_bits` or contiguity is refused before writing when `info` is read.
    pub fn set_schemata(&self, group: &ResctrlGroup, schemata: &Schemata) -> Result<()> {
        if let Ok(info) = self.info() {
            if let Some(l3) = &info.l3 {
                for (domain, mask) in &schemata.l3 {
                    validate_cbm(*domain, *mask, l3)?;
                }
            }
            if let Some(mb) = &info.mb {
                for (domain, pct) in &schemata.mb {
                    if *pct < mb.min_bandwidth || *pct > 100 {
                        return Err(HostError::invalid(
                            "MB percent",
                            format!("{domain}={pct}"),
                            format!("must be within {}..=100", mb.min_bandwidth),
                        ));
                    }
                }
            }
        }
        let path = self.group_dir(group).join("schemata");
        for line in schemata.to_lines() {
            self.knobs.write(&path, &format!("{line}\n"))?;
        }
        Ok(())
    }

    pub fn schemata(&self, group: &ResctrlGroup) -> Result<Schemata> {
        let path = self.group_dir(group).join("schemata");
        let text = self.knobs.read(&path)?;
        Schemata::parse(&path, &text)
    }

    /// Moves one task (thread id) into the group.
    pub fn add_task(&self, group: &ResctrlGroup, tid: i32) -> Result<()> {
        self.knobs
            .write(&self.group_dir(group).join("tasks"), &tid.to_string())
    }

    pub fn tasks(&self, group: &ResctrlGroup) -> Result<Vec<i32>> {
        let path = self.group_dir(group).join("tasks");
        let text = self.knobs.read(&path)?;
        text.split_whitespace()
            .map(|t| {
                t.parse()
                    .map_err(|_| HostError::parse(&path, &text, "expected one tid per line"))
            })
            .collect()
    }

    /// Assigns whole CPUs to the group (`cpus_list`).
    pub fn set_cpus(&self, group: &ResctrlGroup, cpus: &CpuSet) -> Result<()> {
        self.knobs
            .write(&self.group_dir(group).join("cpus_list"), &cpus.to_list())
    }

    pub fn cpus(&self, group: &ResctrlGroup) -> Result<CpuSet> {
        let path = self.group_dir(group).join("cpus_list");
        let text = self.knobs.read(&path)?;
        CpuSet::parse_list(&text).map_err(|e| HostError::parse(&path, &text, e.to_string()))
    }

    /// Monitoring counters per L3 domain (`mon_data/mon_L3_NN`).
    pub fn mon_data(&self, group: &ResctrlGroup) -> Result<Vec<MonReading>> {
        let dir = self.group_dir(group).join("mon_data");
        let mut out = Vec::new();
        for name in self.knobs.list_dirs(&dir)? {
            let Some(domain) = name.strip_prefix("mon_L3_").and_then(|d| d.parse().ok()) else {
                continue;
            };
            let d = dir.join(&name);
            let read = |file: &str| -> Result<Option<u64>> {
                let path = d.join(file);
                if !path.exists() {
                    return Ok(None);
                }
                let text = self.knobs.read(&path)?;
                match text.trim() {
                    // The kernel answers "Unavailable" / "Error" when an RMID cannot be read.
                    "Unavailable" | "Error" => Ok(None),
                    v => v
                        .parse()
                        .map(Some)
                        .map_err(|_| HostError::parse(&path, &text, "expected bytes")),
                }
            };
            out.push(MonReading {
                domain,
                llc_occupancy_bytes: read("llc_occupancy")?,
                mbm_total_bytes: read("mbm_total_bytes")?,
                mbm_local_bytes: read("mbm_local_bytes")?,
            });
        }
        out.sort_by_key(|r| r.domain);
        Ok(out)
    }
}

/// Intel requires contiguous masks of at least `min_cbm_bits` set bits inside `cbm_mask`.
pub fn validate_cbm(domain: u32, mask: u64, l3: &L3Info) -> Result<()> {
    let shown = format!("{domain}={mask:x}");
    if mask & !l3.cbm_mask != 0 {
        return Err(HostError::invalid(
            "L3 mask",
            shown,
            format!("has bits outside cbm_mask {:x}", l3.cbm_mask),
        ));
    }
    if mask.count_ones() < l3.min_cbm_bits {
        return Err(HostError::invalid(
            "L3 mask",
            shown,
            format!("needs at least {} bits", l3.min_cbm_bits),
        ));
    }
    let shifted = mask >> mask.trailing_zeros();
    if shifted & (shifted + 1) != 0 {
        return Err(HostError::invalid(
            "L3 mask",
            shown,
            "bits must be contiguous",
        ));
    }
    Ok(())
}
