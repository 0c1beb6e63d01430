//! The optional hardware sensors read on the slow period: package power and CPU frequencies
//! (RAPL, cpufreq), DRAM bandwidth, and the egress rates of the agent's HTB tree.

use super::*;

/// Package power from RAPL (Heracles Alg. 3): the energy counters' rate over the slow period,
/// the long-term power limit as TDP, and the CPUs' current frequencies.
pub struct PowerSensor {
    rapl: headroom_host::power::Rapl,
    cpufreq: headroom_host::power::CpuFreq,
    /// Package zones (`package-N`) with their last counter reading.
    packages: Vec<(headroom_host::power::RaplZone, Option<(Instant, u64)>)>,
    tdp_w: Option<f64>,
}

impl PowerSensor {
    /// `None` when the host has no RAPL package zone.
    pub fn open(host: &LinuxHost) -> Option<PowerSensor> {
        let rapl = host.rapl();
        let zones = rapl.zones().ok()?;
        let packages: Vec<_> = zones
            .into_iter()
            .filter(|z| z.name.starts_with("package"))
            .map(|z| (z, None))
            .collect();
        if packages.is_empty() {
            return None;
        }
        // TDP: the sum of the packages' long-term limits (constraint 0, "long_term").
        let tdp_uw: u64 = packages
            .iter()
            .filter_map(|(z, _)| {
                rapl.constraints(z)
                    .ok()?
                    .into_iter()
                    .find(|c| c.name == "long_term" || c.index == 0)
                    .map(|c| c.power_limit_uw)
            })
            .sum();
        Some(PowerSensor {
            rapl,
            cpufreq: host.cpufreq(),
            packages,
            tdp_w: (tdp_uw > 0).then_some(tdp_uw as f64 / 1e6),
        })
    }

    /// Watts since the last reading (None on the first), TDP, and the mean current frequency
    /// of `lc_cpus` and `be_cpus` in MHz.
    pub(super) fn sample(
        &mut self,
        now: Instant,
        lc_cpus: &[u32],
        be_cpus: &[u32],
    ) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
        let mut watts = 0.0;
        let mut complete = true;
        for (zone, last) in &mut self.packages {
            match self.rapl.energy_uj(zone) {
                Ok(e) => {
                    if let Some((t, e0)) = *last {
                        let dt = now.saturating_duration_since(t).as_secs_f64();
                        let de =
                            headroom_host::power::energy_delta_uj(e0, e, zone.max_energy_range_uj);
                        if dt > 0.0 {
                            watts += de as f64 / 1e6 / dt;
                        } else {
                            complete = false;
                        }
                    } else {
                        complete = false;
                    }
                    *last = Some((now, e));
                }
                Err(_) => complete = false,
            }
        }
        let mhz = |cpus: &[u32]| -> Option<f64> {
            let f: Vec<f64> = cpus
                .iter()
                .filter_map(|&c| self.cpufreq.cur_khz(c as usize).ok())
                .map(|k| k as f64 / 1000.0)
                .collect();
            (!f.is_empty()).then(|| f.iter().sum::<f64>() / f.len() as f64)
        };
        (
            complete.then_some(watts),
            self.tdp_w,
            mhz(lc_cpus),
            mhz(be_cpus),
        )
    }
}

/// DRAM bandwidth from resctrl memory-bandwidth monitoring (Heracles Alg. 2): the rate of
/// `mbm_total_bytes` summed over L3 domains, for the whole machine (default group + the BE
/// group) and for BE alone.
pub struct DramSensor {
    resctrl: headroom_host::resctrl::Resctrl,
    be: headroom_host::resctrl::ResctrlGroup,
    last: Option<(Instant, u64, u64)>,
}

impl DramSensor {
    /// `None` without MBM (`mbm_total_bytes`) in the default group's `mon_data`.
    pub fn open(host: &LinuxHost) -> Option<DramSensor> {
        let resctrl = host.resctrl();
        let default = headroom_host::resctrl::ResctrlGroup::default_group();
        let readings = resctrl.mon_data(&default).ok()?;
        if !readings.iter().any(|r| r.mbm_total_bytes.is_some()) {
            return None;
        }
        Some(DramSensor {
            resctrl,
            be: headroom_host::resctrl::ResctrlGroup::new(
                headroom_control::actuation::BE_RESCTRL_GROUP,
            )
            .ok()?,
            last: None,
        })
    }

    fn total_bytes(&self, group: &headroom_host::resctrl::ResctrlGroup) -> Option<u64> {
        let r = self.resctrl.mon_data(group).ok()?;
        Some(r.iter().filter_map(|m| m.mbm_total_bytes).sum())
    }

    /// (machine bytes/s, BE bytes/s) since the last reading (None on the first).
    pub(super) fn sample(&mut self, now: Instant) -> (Option<f64>, Option<f64>) {
        let default = headroom_host::resctrl::ResctrlGroup::default_group();
        let Some(rest) = self.total_bytes(&default) else {
            return (None, None);
        };
        // the BE group exists only while the agent partitions the cache
        let be = self.total_bytes(&self.be).unwrap_or(0);
        let out = match self.last {
            Some((t, r0, b0)) => {
                let dt = now.saturating_duration_since(t).as_secs_f64();
                if dt > 0.0 && rest >= r0 {
                    let be_rate = be.saturating_sub(b0) as f64 / dt;
                    (Some((rest - r0) as f64 / dt + be_rate), Some(be_rate))
                } else {
                    (None, None)
                }
            }
            None => (None, None),
        };
        self.last = Some((now, rest, be));
        out
    }
}

/// Egress rates of the LC and BE HTB classes (Heracles Alg. 4), from `tc -s class show` once a
/// second (it spawns `tc`).
pub struct EgressSensor {
    egress: headroom_host::tc::Egress<headroom_host::tc::SystemTc>,
    pub(super) link_bytes_per_s: f64,
    last: Option<(Instant, u64, u64)>,
    pub(super) last_values: (Option<f64>, Option<f64>),
}

impl EgressSensor {
    pub fn new(
        device: &str,
        link_bits_per_s: u64,
    ) -> Result<EgressSensor, headroom_host::HostError> {
        Ok(EgressSensor {
            egress: headroom_host::tc::Egress::new(headroom_host::tc::SystemTc::new(), device)?,
            link_bytes_per_s: link_bits_per_s as f64 / 8.0,
            last: None,
            last_values: (None, None),
        })
    }

    /// (LC bytes/s, BE bytes/s) of classes 1:10 and 1:20 since the last reading.
    pub(super) fn sample(&mut self, now: Instant) -> (Option<f64>, Option<f64>) {
        let Ok(stats) = self.egress.class_stats() else {
            return (None, None);
        };
        let bytes = |h: &str| stats.iter().find(|c| c.handle == h).map(|c| c.bytes);
        let (Some(lc), be) = (bytes("1:10"), bytes("1:20").unwrap_or(0)) else {
            self.last = None;
            return (None, None);
        };
        let out = match self.last {
            Some((t, l0, b0)) if lc >= l0 => {
                let dt = now.saturating_duration_since(t).as_secs_f64().max(1e-3);
                (
                    Some((lc - l0) as f64 / dt),
                    Some(be.saturating_sub(b0) as f64 / dt),
                )
            }
            _ => (None, None),
        };
        self.last = Some((now, lc, be));
        out
    }
}
