//! Pressure stall information (PSI) of a group.

use crate::error::{HostError, Result};
use crate::sensors::{parse_psi, Psi, PsiResource};
use headroom_types::values::GroupPath;

use super::Cgroups;

impl Cgroups {
    /// Per-group pressure stall information (v2 only: `cpu.pressure`, …).
    pub fn psi(&self, group: &GroupPath, resource: PsiResource) -> Result<Psi> {
        let Some(mount) = self.layout.v2.as_ref().filter(|_| self.layout.v2_usable()) else {
            return Err(HostError::unavailable(
                "per-group PSI",
                "needs the cgroup2 hierarchy with controllers (this host controls groups through v1)",
            ));
        };
        let path = group
            .dir_in(mount)
            .join(format!("{}.pressure", resource.name()));
        let text = self.knobs.read(&path)?;
        parse_psi(&path, &text)
    }
}
