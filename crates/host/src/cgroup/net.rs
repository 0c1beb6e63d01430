//! net_cls and net_prio (v1 only): the class id `tc` filters match and per-device priorities.

use std::path::PathBuf;

use crate::error::{HostError, Result};
use headroom_types::values::GroupPath;

use super::{Cgroups, Controller, KnobFile};

const NET_CLS_CLASSID: KnobFile = KnobFile::v1_only(Controller::NetCls, "net_cls.classid");
const NET_PRIO_IFPRIOMAP: KnobFile = KnobFile::v1_only(Controller::NetPrio, "net_prio.ifpriomap");

impl Cgroups {
    /// Tags the group's sockets with a tc class id (v1 `net_cls.classid`, `major << 16 | minor`).
    pub fn set_net_classid(&self, group: &GroupPath, classid: u32) -> Result<()> {
        let path = self.v1_only(&NET_CLS_CLASSID, group)?;
        self.knobs.write(&path, &classid.to_string())
    }

    pub fn net_classid(&self, group: &GroupPath) -> Result<u32> {
        let path = self.v1_only(&NET_CLS_CLASSID, group)?;
        let text = self.knobs.read(&path)?;
        text.trim()
            .parse()
            .map_err(|_| HostError::parse(&path, &text, "expected a class id"))
    }

    /// Sets the `skb->priority` of the group's sockets on `device` (v1 `net_prio.ifpriomap`).
    /// With a tc class id as the priority (`HtbConfig::be_classid()`), HTB puts the traffic in that
    /// class without any filter: cgroup classification on kernels without `cls_cgroup`. The device
    /// is resolved in the writer's network namespace.
    pub fn set_net_prio(&self, group: &GroupPath, device: &str, priority: u32) -> Result<()> {
        if device.is_empty() || device.contains([' ', '/', '\n', '\0']) {
            return Err(HostError::invalid(
                "network device",
                device,
                "not a valid interface name",
            ));
        }
        let path = self.v1_only(&NET_PRIO_IFPRIOMAP, group)?;
        self.knobs.write(&path, &format!("{device} {priority}"))
    }

    /// The group's per-device priorities (`net_prio.ifpriomap`).
    pub fn net_prio(&self, group: &GroupPath) -> Result<Vec<(String, u32)>> {
        let path = self.v1_only(&NET_PRIO_IFPRIOMAP, group)?;
        let text = self.knobs.read(&path)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let mut parts = line.split_whitespace();
                match (parts.next(), parts.next().and_then(|p| p.parse().ok())) {
                    (Some(dev), Some(prio)) => Ok((dev.to_owned(), prio)),
                    _ => Err(HostError::parse(
                        &path,
                        &text,
                        "expected `DEVICE PRIORITY` lines",
                    )),
                }
            })
            .collect()
    }

    /// The path of a v1-only knob (net_cls and net_prio have no v2 controller: v2 classifies
    /// by cgroup path in BPF instead).
    fn v1_only(&self, file: &KnobFile, group: &GroupPath) -> Result<PathBuf> {
        let controller = file.controller;
        match (self.layout.v1.get(&controller), file.v1) {
            (Some(mount), Some(name)) => Ok(group.dir_in(mount).join(name)),
            _ => Err(HostError::unavailable(
                format!("cgroup controller {controller}"),
                format!("no v1 {controller} hierarchy mounted"),
            )),
        }
    }
}
