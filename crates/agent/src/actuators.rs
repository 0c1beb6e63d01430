//! Actuators beyond the cgroup knobs the reconciler drives: Intel RDT (resctrl) cache ways and
//! memory-bandwidth throttling for BE (Heracles Alg. 2), and the BE CPUs' frequency cap
//! (Alg. 3). Each one exists only where `doctor` found its mechanism; the others are reported
//! missing with the reason and their policy parts stay off.
//!
//! Like the reconciler: originals are read before the first write, only changes are written, a
//! failed write is retried on the next pass (the applied value is updated only on success) and
//! reported, and `restore` puts every original back (the kill switch and `on_exit`).
//!
//! resctrl layout: BE tasks go into one control group, `headroom-be`, whose L3 mask holds the
//! BE's ways (the top ones, Heracles' partition); the LC keeps the default group, whose mask is
//! set to the complementary low ways, so the two never share a way. MB throttles only the BE
//! group. BE tasks come and go, so they are (re)assigned on every slow pass.

use std::collections::BTreeMap;

use headroom_host::power::CpuFreq;
use headroom_host::resctrl::{
    top_ways_mask, validate_cbm, L3Info, Resctrl, ResctrlGroup, Schemata,
};
use headroom_host::tc::{Egress, HtbConfig, SystemTc, TcRunner};
use headroom_host::{HostError, LinuxHost};

use crate::allocation::Allocation;

/// The resctrl control group BE runs in.
pub const BE_RESCTRL_GROUP: &str = "headroom-be";

/// Errors of the extra actuators (each names the file and value through [`HostError`]).
#[derive(Debug, thiserror::Error)]
pub enum ActuatorError {
    #[error("resctrl: {0}")]
    Resctrl(HostError),
    #[error("cpufreq: {0}")]
    CpuFreq(HostError),
    #[error("egress: {0}")]
    Egress(HostError),
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
}

/// What the last successful pass applied.
#[derive(Debug, Clone, Default, PartialEq)]
struct Applied {
    llc_ways: Option<u32>,
    mba_pct: Option<u32>,
    /// CPU → cap written (kHz).
    freq_khz: BTreeMap<usize, u64>,
    /// BE class ceil (bytes/s) written, once the HTB tree is installed.
    egress_ceil: Option<u64>,
}

struct ResctrlPart {
    resctrl: Resctrl,
    group: ResctrlGroup,
    l3: Option<L3Info>,
    mb: bool,
    /// The default group's schemata before the agent's first write.
    original_default: Option<Schemata>,
    created: bool,
}

struct FreqPart {
    cpufreq: CpuFreq,
    /// CPU → scaling_max_freq before the agent's first cap.
    original: BTreeMap<usize, u64>,
}

/// Heracles Alg. 4's actuator: an HTB tree on one device, the BE class's ceil changed at run
/// time. Installed at the first allocation that sets a ceil, removed by `restore`.
pub struct EgressPart<R: TcRunner> {
    egress: Egress<R>,
    htb: HtbConfig,
    installed: bool,
}

impl<R: TcRunner> EgressPart<R> {
    pub fn new(runner: R, device: &str, link_bits_per_s: u64) -> Result<Self, ActuatorError> {
        Ok(EgressPart {
            egress: Egress::new(runner, device).map_err(ActuatorError::Egress)?,
            htb: HtbConfig::new(link_bits_per_s, link_bits_per_s),
            installed: false,
        })
    }

    /// The BE class id BE traffic must carry (`skb->priority`).
    pub fn be_classid(&self) -> u32 {
        self.htb.be_classid()
    }

    /// Sets the BE ceil (`None` = the whole link); installs the tree on first use.
    fn apply(&mut self, ceil_bytes_per_s: Option<u64>) -> Result<usize, ActuatorError> {
        let bits = ceil_bytes_per_s
            .map_or(self.htb.link_bits_per_s, |b| b.saturating_mul(8))
            .clamp(8, self.htb.link_bits_per_s);
        if !self.installed {
            let mut htb = self.htb;
            htb.be_ceil_bits_per_s = bits;
            self.egress.setup(&htb).map_err(ActuatorError::Egress)?;
            self.installed = true;
            return Ok(1);
        }
        self.egress
            .set_be_ceil(&self.htb, bits)
            .map_err(ActuatorError::Egress)?;
        Ok(1)
    }

    fn restore(&mut self) -> Result<(), ActuatorError> {
        if self.installed {
            self.egress.teardown().map_err(ActuatorError::Egress)?;
            self.installed = false;
        }
        Ok(())
    }
}

/// The extra actuators of one agent.
pub struct Actuators {
    resctrl: Option<ResctrlPart>,
    freq: Option<FreqPart>,
    egress: Option<EgressPart<SystemTc>>,
    applied: Applied,
    /// Sub-actuators that do not run here, with the reason.
    disabled: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for Actuators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actuators")
            .field("resctrl", &self.resctrl.is_some())
            .field("cpufreq", &self.freq.is_some())
            .field("applied", &self.applied)
            .field("disabled", &self.disabled)
            .finish()
    }
}

impl Actuators {
    /// Finds what `host` offers. Never fails: a missing mechanism disables its part only.
    pub fn probe(host: &LinuxHost, cpus: &[u32]) -> Actuators {
        let mut disabled = Vec::new();
        let resctrl = host.resctrl();
        let resctrl = match resctrl.info() {
            Ok(info) if info.l3.is_some() || info.mb.is_some() => {
                if info.l3.is_none() {
                    disabled.push((
                        "resctrl_l3",
                        "no L3 allocation (CAT) in resctrl/info".into(),
                    ));
                }
                if info.mb.is_none() {
                    disabled.push((
                        "resctrl_mba",
                        "no MB allocation (MBA) in resctrl/info".into(),
                    ));
                }
                match ResctrlGroup::new(BE_RESCTRL_GROUP) {
                    Ok(group) => Some(ResctrlPart {
                        resctrl,
                        group,
                        l3: info.l3,
                        mb: info.mb.is_some(),
                        original_default: None,
                        created: false,
                    }),
                    Err(e) => {
                        disabled.push(("resctrl", e.to_string()));
                        None
                    }
                }
            }
            Ok(_) => {
                disabled.push((
                    "resctrl",
                    "resctrl offers neither L3 nor MB allocation".into(),
                ));
                None
            }
            Err(e) => {
                disabled.push(("resctrl", e.to_string()));
                None
            }
        };
        let cpufreq = host.cpufreq();
        let freq = match cpus.iter().find(|&&c| !cpufreq.available(c as usize)) {
            None if !cpus.is_empty() => Some(FreqPart {
                cpufreq,
                original: BTreeMap::new(),
            }),
            _ => {
                let cpu = cpus
                    .iter()
                    .find(|&&c| !cpufreq.available(c as usize))
                    .copied()
                    .unwrap_or(0);
                disabled.push((
                    "cpufreq",
                    format!(
                        "{} missing (no cpufreq driver: common in VMs)",
                        cpufreq
                            .cpu_dir()
                            .join(format!("cpu{cpu}/cpufreq/scaling_max_freq"))
                            .display()
                    ),
                ));
                None
            }
        };
        for (name, reason) in &disabled {
            tracing::info!(actuator = name, reason = %reason, "actuator not available here");
        }
        Actuators {
            resctrl,
            freq,
            egress: None,
            applied: Applied::default(),
            disabled,
        }
    }

    /// Takes over egress shaping of `device` (`[egress]`); `link_mbit` 0 = the device's
    /// `/sys/class/net/<device>/speed`.
    pub fn with_egress(
        mut self,
        host: &LinuxHost,
        device: &str,
        link_mbit: u64,
    ) -> Result<Self, ActuatorError> {
        let mbit = if link_mbit > 0 {
            link_mbit
        } else {
            let path = host.root().join(format!("sys/class/net/{device}/speed"));
            let text = std::fs::read_to_string(&path).map_err(|e| ActuatorError::Invalid {
                what: format!("egress.link_mbit 0 and {}", path.display()),
                reason: format!("{e}: set egress.link_mbit"),
            })?;
            match text.trim().parse::<i64>() {
                Ok(v) if v > 0 => v as u64,
                _ => {
                    return Err(ActuatorError::Invalid {
                        what: format!("{} = {:?}", path.display(), text.trim()),
                        reason: "no link speed (virtual device?): set egress.link_mbit".into(),
                    })
                }
            }
        };
        self.egress = Some(EgressPart::new(
            SystemTc::new(),
            device,
            mbit.saturating_mul(1_000_000),
        )?);
        Ok(self)
    }

    /// The BE HTB class id when egress is shaped (for the BE groups' BPF classifier).
    pub fn egress_be_classid(&self) -> Option<u32> {
        self.egress.as_ref().map(EgressPart::be_classid)
    }

    /// Whether L3 ways, MB throttling and frequency caps are actuated here.
    pub fn available(&self) -> (bool, bool, bool) {
        let r = self.resctrl.as_ref();
        (
            r.is_some_and(|r| r.l3.is_some()),
            r.is_some_and(|r| r.mb),
            self.freq.is_some(),
        )
    }

    /// The LLC's ways (for the policies' `MachineInfo::llc_ways`).
    pub fn llc_ways(&self) -> Option<u32> {
        self.resctrl
            .as_ref()
            .and_then(|r| r.l3.as_ref())
            .map(L3Info::ways)
    }

    /// Parts that do not run here, with the reason (for `ctl status` and the log).
    pub fn disabled(&self) -> &[(&'static str, String)] {
        &self.disabled
    }

    /// Brings the extra mechanisms to `allocation` (writes only what changed). `be_cpus` are the
    /// CPUs BE may run on (the frequency cap applies to them only).
    pub fn apply(
        &mut self,
        allocation: &Allocation,
        be_cpus: &[u32],
    ) -> Result<usize, ActuatorError> {
        let mut writes = 0;
        let ways = allocation.be_llc_ways.filter(|_| allocation.be_enabled);
        let mba = allocation.be_mba_pct.filter(|_| allocation.be_enabled);
        if let Some(r) = self.resctrl.as_mut() {
            if ways != self.applied.llc_ways || mba != self.applied.mba_pct {
                writes += r.apply(ways, mba)?;
                self.applied.llc_ways = ways;
                self.applied.mba_pct = mba;
            }
        }
        if let Some(e) = self.egress.as_mut() {
            let ceil = allocation.be_egress_ceil_bytes_per_s;
            if ceil != self.applied.egress_ceil && (ceil.is_some() || e.installed) {
                writes += e.apply(ceil)?;
                self.applied.egress_ceil = ceil;
            }
        }
        if let Some(f) = self.freq.as_mut() {
            let mut want: BTreeMap<usize, u64> = BTreeMap::new();
            if let Some(khz) = allocation.be_freq_khz {
                for &c in be_cpus {
                    want.insert(c as usize, khz);
                }
            }
            if want != self.applied.freq_khz {
                writes += f.apply(&self.applied.freq_khz, &want)?;
                self.applied.freq_khz = want;
            }
        }
        Ok(writes)
    }

    /// Moves the BE threads `tids` into the BE resctrl group (they appear over time); returns
    /// how many were moved. A thread that exited meanwhile is skipped.
    pub fn assign_be_tasks(&mut self, tids: &[i32]) -> Result<usize, ActuatorError> {
        let Some(r) = self.resctrl.as_mut() else {
            return Ok(0);
        };
        if !r.created {
            return Ok(0);
        }
        let present = r.resctrl.tasks(&r.group).map_err(ActuatorError::Resctrl)?;
        let mut moved = 0;
        for &tid in tids.iter().filter(|t| !present.contains(t)) {
            match r.resctrl.add_task(&r.group, tid) {
                Ok(()) => moved += 1,
                Err(e) if e.errno() == Some(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(ActuatorError::Resctrl(e)),
            }
        }
        Ok(moved)
    }

    /// Puts every original back: the default group's schemata, the BE group removed (its tasks
    /// fall back to the default group), each CPU's frequency cap.
    pub fn restore(&mut self) -> Result<(), ActuatorError> {
        let mut first_error = None;
        if let Some(r) = self.resctrl.as_mut() {
            if let Err(e) = r.restore() {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = self.egress.as_mut() {
            if let Err(err) = e.restore() {
                first_error.get_or_insert(err);
            }
        }
        if let Some(f) = self.freq.as_mut() {
            let to: BTreeMap<usize, u64> = BTreeMap::new();
            if let Err(e) = f.apply(&self.applied.freq_khz, &to) {
                first_error.get_or_insert(e);
            }
        }
        self.applied = Applied::default();
        first_error.map_or(Ok(()), Err)
    }
}

impl ResctrlPart {
    fn original_default(&mut self) -> Result<Schemata, ActuatorError> {
        if self.original_default.is_none() {
            let s = self
                .resctrl
                .schemata(&ResctrlGroup::default_group())
                .map_err(ActuatorError::Resctrl)?;
            self.original_default = Some(s);
        }
        Ok(self.original_default.clone().unwrap_or_default())
    }

    /// Writes the BE group's and the default group's schemata for `ways` / `mba`; `None` for
    /// both returns the default group to its original and leaves the BE group unrestricted.
    fn apply(&mut self, ways: Option<u32>, mba: Option<u32>) -> Result<usize, ActuatorError> {
        let original = self.original_default()?;
        let domains: Vec<u32> = original.l3.keys().copied().collect();
        let mb_domains: Vec<u32> = original.mb.keys().copied().collect();
        let mut be = Schemata::default();
        let mut lc = original.clone();
        if let (Some(w), Some(l3)) = (ways, self.l3.as_ref()) {
            let total = l3.ways();
            if w == 0 || w >= total {
                return Err(ActuatorError::Invalid {
                    what: format!("BE LLC ways {w}"),
                    reason: format!("must leave the LC at least one of the {total} ways"),
                });
            }
            let be_mask = top_ways_mask(l3, w);
            let lc_mask = l3.cbm_mask & !be_mask;
            for &d in &domains {
                validate_cbm(d, be_mask, l3).map_err(ActuatorError::Resctrl)?;
                validate_cbm(d, lc_mask, l3).map_err(ActuatorError::Resctrl)?;
                be.l3.insert(d, be_mask);
                lc.l3.insert(d, lc_mask);
            }
        } else if let Some(l3) = self.l3.as_ref() {
            for &d in &domains {
                be.l3.insert(d, l3.cbm_mask);
            }
        }
        if self.mb {
            for &d in &mb_domains {
                be.mb.insert(d, mba.unwrap_or(100));
            }
        }
        let mut writes = 0;
        if !self.created {
            self.resctrl
                .create_group(&self.group)
                .map_err(ActuatorError::Resctrl)?;
            self.created = true;
        }
        // Narrow the LC first when BE grows, BE first when it shrinks: the two masks never
        // overlap, not even between the two writes.
        let be_grows = ways.is_some_and(|w| {
            self.resctrl
                .schemata(&self.group)
                .ok()
                .and_then(|s| s.l3.values().next().copied())
                .is_none_or(|m| w > m.count_ones())
        });
        let default = ResctrlGroup::default_group();
        let order: [(&ResctrlGroup, &Schemata); 2] = if be_grows {
            [(&default, &lc), (&self.group, &be)]
        } else {
            [(&self.group, &be), (&default, &lc)]
        };
        for (i, (group, schemata)) in order.into_iter().enumerate() {
            if let Err(e) = self.resctrl.set_schemata(group, schemata) {
                if i == 1 {
                    // roll the first write back so nothing is left half-applied
                    let _ = self.resctrl.set_schemata(&default, &original);
                }
                return Err(ActuatorError::Resctrl(e));
            }
            writes += 1;
        }
        Ok(writes)
    }

    fn restore(&mut self) -> Result<(), ActuatorError> {
        if let Some(original) = self.original_default.clone() {
            self.resctrl
                .set_schemata(&ResctrlGroup::default_group(), &original)
                .map_err(ActuatorError::Resctrl)?;
        }
        if self.created {
            self.resctrl
                .remove_group(&self.group)
                .map_err(ActuatorError::Resctrl)?;
            self.created = false;
        }
        Ok(())
    }
}

impl FreqPart {
    /// Moves the caps from `from` to `to`: CPUs leaving get their original back.
    fn apply(
        &mut self,
        from: &BTreeMap<usize, u64>,
        to: &BTreeMap<usize, u64>,
    ) -> Result<usize, ActuatorError> {
        let mut writes = 0;
        for (&cpu, &khz) in to {
            if from.get(&cpu) == Some(&khz) {
                continue;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.original.entry(cpu) {
                e.insert(self.cpufreq.max_khz(cpu).map_err(ActuatorError::CpuFreq)?);
            }
            let info = self.cpufreq.info(cpu).map_err(ActuatorError::CpuFreq)?;
            let khz = khz.clamp(info.cpuinfo_min_khz, info.cpuinfo_max_khz);
            self.cpufreq
                .set_max_khz(cpu, khz)
                .map_err(ActuatorError::CpuFreq)?;
            writes += 1;
        }
        for cpu in from.keys().filter(|c| !to.contains_key(c)) {
            if let Some(&orig) = self.original.get(cpu) {
                self.cpufreq
                    .set_max_khz(*cpu, orig)
                    .map_err(ActuatorError::CpuFreq)?;
                writes += 1;
            }
        }
        Ok(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn read(root: &Path, rel: &str) -> String {
        std::fs::read_to_string(root.join(rel.trim_start_matches('/')))
            .unwrap()
            .trim()
            .to_string()
    }

    /// resctrl with 11 ways (min 1 bit) and MBA on two domains; cpufreq on CPUs 0-3.
    fn fake(root: &Path) {
        for (f, v) in [
            ("cbm_mask", "7ff"),
            ("min_cbm_bits", "1"),
            ("num_closids", "16"),
            ("shareable_bits", "0"),
        ] {
            write(root, &format!("/sys/fs/resctrl/info/L3/{f}"), v);
        }
        for (f, v) in [
            ("bandwidth_gran", "10"),
            ("min_bandwidth", "10"),
            ("num_closids", "8"),
            ("delay_linear", "1"),
        ] {
            write(root, &format!("/sys/fs/resctrl/info/MB/{f}"), v);
        }
        write(
            root,
            "/sys/fs/resctrl/schemata",
            "L3:0=7ff;1=7ff\nMB:0=100;1=100\n",
        );
        write(root, "/sys/fs/resctrl/tasks", "");
        for cpu in 0..4 {
            let d = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
            for (f, v) in [
                ("cpuinfo_min_freq", "800000"),
                ("cpuinfo_max_freq", "3000000"),
                ("scaling_max_freq", "3000000"),
                ("scaling_cur_freq", "2400000"),
            ] {
                write(root, &format!("{d}/{f}"), v);
            }
        }
    }

    fn alloc(ways: Option<u32>, mba: Option<u32>, khz: Option<u64>) -> Allocation {
        Allocation {
            be_llc_ways: ways,
            be_mba_pct: mba,
            be_freq_khz: khz,
            ..Allocation::default()
        }
    }

    /// The fake has no kernel behind it: a new resctrl group directory gets its files from us.
    fn mkgroup(root: &Path) {
        write(root, "/sys/fs/resctrl/headroom-be/schemata", "");
        write(root, "/sys/fs/resctrl/headroom-be/tasks", "");
    }

    /// Delegates to the real file system and keeps every write (a regular file only holds the
    /// last of the per-line schemata writes).
    #[derive(Debug, Default)]
    struct Recording(std::sync::Mutex<Vec<(String, String)>>);

    impl headroom_host::KnobIo for Recording {
        fn read(&self, path: &Path) -> std::io::Result<String> {
            headroom_host::RealIo.read(path)
        }
        fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
            self.0
                .lock()
                .unwrap()
                .push((path.display().to_string(), value.trim().to_string()));
            headroom_host::RealIo.write(path, value)
        }
        fn create_dir(&self, path: &Path) -> std::io::Result<()> {
            headroom_host::RealIo.create_dir(path)
        }
        fn remove_dir(&self, path: &Path) -> std::io::Result<()> {
            headroom_host::RealIo.remove_dir(path)
        }
    }

    impl Recording {
        fn take(&self, file_suffix: &str) -> Vec<String> {
            let mut all = self.0.lock().unwrap();
            let (mine, rest): (Vec<_>, Vec<_>) =
                all.drain(..).partition(|(p, _)| p.ends_with(file_suffix));
            *all = rest;
            mine.into_iter().map(|(_, v)| v).collect()
        }
    }

    #[test]
    fn partitions_ways_writes_only_changes_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake(root);
        mkgroup(root);
        let rec = std::sync::Arc::new(Recording::default());
        let host = LinuxHost::with_io(root, rec.clone());
        let mut a = Actuators::probe(&host, &[0, 1, 2, 3]);
        assert_eq!(a.available(), (true, true, true), "{:?}", a.disabled());
        assert_eq!(a.llc_ways(), Some(11));
        // BE gets the top 3 ways and 40% memory bandwidth, its 2 CPUs capped at 1.6 GHz
        let n = a
            .apply(&alloc(Some(3), Some(40), Some(1_600_000)), &[2, 3])
            .unwrap();
        assert_eq!(n, 4, "two schemata + two CPUs");
        // BE grows from nothing: the LC's default group is narrowed first, then BE's written
        assert_eq!(
            rec.take("resctrl/schemata"),
            ["L3:0=ff;1=ff", "MB:0=100;1=100"]
        );
        assert_eq!(
            rec.take("headroom-be/schemata"),
            ["L3:0=700;1=700", "MB:0=40;1=40"]
        );
        assert_eq!(
            read(
                root,
                "/sys/devices/system/cpu/cpu2/cpufreq/scaling_max_freq"
            ),
            "1600000"
        );
        assert_eq!(
            read(
                root,
                "/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq"
            ),
            "3000000"
        );
        // the same allocation again writes nothing
        assert_eq!(
            a.apply(&alloc(Some(3), Some(40), Some(1_600_000)), &[2, 3])
                .unwrap(),
            0
        );
        // BE moves off CPU 3: CPU 3 gets its original back
        assert_eq!(
            a.apply(&alloc(Some(3), Some(40), Some(1_600_000)), &[2])
                .unwrap(),
            1
        );
        assert_eq!(
            read(
                root,
                "/sys/devices/system/cpu/cpu3/cpufreq/scaling_max_freq"
            ),
            "3000000"
        );
        // BE tasks are moved into the BE group (only those not there yet)
        assert_eq!(a.assign_be_tasks(&[101, 102]).unwrap(), 2);
        // restore: default schemata and frequencies back, the BE group removed
        rec.take("");
        std::fs::remove_file(root.join("sys/fs/resctrl/headroom-be/schemata")).unwrap();
        std::fs::remove_file(root.join("sys/fs/resctrl/headroom-be/tasks")).unwrap();
        a.restore().unwrap();
        assert_eq!(
            rec.take("resctrl/schemata"),
            ["L3:0=7ff;1=7ff", "MB:0=100;1=100"]
        );
        assert!(!root.join("sys/fs/resctrl/headroom-be").exists());
        assert_eq!(
            read(
                root,
                "/sys/devices/system/cpu/cpu2/cpufreq/scaling_max_freq"
            ),
            "3000000"
        );
    }

    #[test]
    fn egress_installs_htb_once_then_changes_the_be_ceil_and_tears_down() {
        use headroom_host::tc::RecordingTc;
        let mut e = EgressPart::new(RecordingTc::new(), "eth0", 10_000_000_000).unwrap();
        assert_eq!(e.be_classid(), 0x0001_0020);
        e.apply(Some(125_000_000)).unwrap(); // 1 Gbit/s
        e.apply(Some(250_000_000)).unwrap();
        e.apply(None).unwrap(); // unrestricted: the whole link
        e.restore().unwrap();
        let calls = e.egress.runner().calls();
        assert!(
            calls[0].starts_with("qdisc replace dev eth0 root handle 1: htb"),
            "{calls:?}"
        );
        assert!(
            calls
                .iter()
                .any(|c| c.contains("classid 1:20 htb rate 1000000000bit ceil 1000000000bit")),
            "{calls:?}"
        );
        assert!(
            calls
                .iter()
                .any(|c| c.starts_with("class change") && c.contains("ceil 2000000000bit")),
            "{calls:?}"
        );
        assert!(
            calls
                .iter()
                .any(|c| c.starts_with("class change") && c.contains("ceil 10000000000bit")),
            "{calls:?}"
        );
        assert!(
            calls.last().unwrap().starts_with("qdisc del dev eth0 root"),
            "{calls:?}"
        );
        assert!(EgressPart::new(RecordingTc::new(), "../x", 1).is_err());
    }

    #[test]
    fn refuses_a_partition_that_leaves_the_lc_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fake(dir.path());
        mkgroup(dir.path());
        let mut a = Actuators::probe(&LinuxHost::new(dir.path()), &[0]);
        let err = a
            .apply(&alloc(Some(11), None, None), &[0])
            .unwrap_err()
            .to_string();
        assert!(err.contains("BE LLC ways 11"), "{err}");
        // nothing half-applied: the default group still has every way
        assert!(read(dir.path(), "/sys/fs/resctrl/schemata").contains("L3:0=7ff"));
        // and the failed value is retried (not recorded as applied)
        assert!(a.apply(&alloc(Some(11), None, None), &[0]).is_err());
    }

    #[test]
    fn a_missing_mechanism_disables_only_its_part() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fake(root);
        std::fs::remove_dir_all(root.join("sys/devices/system/cpu/cpu1/cpufreq")).unwrap();
        let a = Actuators::probe(&LinuxHost::new(root), &[0, 1]);
        assert_eq!(a.available(), (true, true, false));
        let reason = &a
            .disabled()
            .iter()
            .find(|(n, _)| *n == "cpufreq")
            .unwrap()
            .1;
        assert!(reason.contains("cpu1/cpufreq/scaling_max_freq"), "{reason}");

        let bare = tempfile::tempdir().unwrap();
        let a = Actuators::probe(&LinuxHost::new(bare.path()), &[0]);
        assert_eq!(a.available(), (false, false, false));
        assert!(a.disabled().iter().any(|(n, _)| *n == "resctrl"));
    }
}
