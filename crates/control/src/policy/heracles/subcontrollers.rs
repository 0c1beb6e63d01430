//! Heracles' sub-controllers, each on its own period: cores & memory (Alg. 2), power (Alg. 3)
//! and network egress (Alg. 4). Each returns the event it caused, if any.

use super::{Heracles, Pending, Phase};
use crate::config::LowSlackAction;
use crate::policy::Mechanism;
use headroom_types::observation::Observation;

impl Heracles {
    pub(super) fn shrink_for_low_slack(&mut self) {
        let h = self.h();
        self.be_cores = match h.slack_shrink_action {
            LowSlackAction::Keep => self.be_cores.min(h.slack_shrink_cores),
            LowSlackAction::Remove => self.be_cores.saturating_sub(h.slack_shrink_cores),
        };
        self.pending = None;
    }

    /// Alg. 2, one period. Returns an event reason if something changed.
    pub(super) fn cores_and_memory(&mut self, obs: &Observation, max_cores: u32) -> Option<String> {
        let h = self.h().clone();
        let peak = h.dram_peak_bytes_per_s.or(obs.dram_bw_peak_bytes_per_s);
        let total = obs.dram_bw_bytes_per_s;
        let limit = peak.map(|p| h.dram_limit * p);
        let bw = match (total, limit) {
            (Some(t), Some(l)) => {
                self.dram_status = "running".into();
                Some((t, l))
            }
            _ => {
                self.dram_status =
                    "disabled: no DRAM bandwidth measurement or peak (resctrl mon)".into();
                None
            }
        };
        let be_bw = obs.be_dram_bw_bytes_per_s;
        let per_core = be_bw
            .filter(|_| self.be_cores > 0)
            .map(|b| b / self.be_cores as f64);
        let mut event = None;

        // MeasureDRAMBw() after the last reallocation: derivative, rollback, BeBenefit.
        if let Some(p) = self.pending.take() {
            if let (Some(before), Some(now_bw)) = (p.bw_before, total) {
                self.bw_derivative = now_bw - before;
            }
            if let Some((prev_ways, progress_before)) = p.llc {
                if total.is_some() && p.bw_before.is_some() && self.bw_derivative >= 0.0 {
                    self.llc_ways = prev_ways;
                    self.phase = Phase::GrowCores;
                    event = Some("heracles:llc-bw-not-reduced:rollback".to_string());
                } else if let (Some(before), Some(after)) = (progress_before, obs.be_progress) {
                    if after <= before * (1.0 + h.be_benefit_min) {
                        self.phase = Phase::GrowCores;
                        event = Some("heracles:llc-no-be-benefit:grow-cores".to_string());
                    }
                }
            }
        }
        let bw_over = bw.is_some_and(|(t, l)| t > l);
        if event.is_some() && !bw_over {
            // A rollback or phase switch ends this period, so the next step is measured alone.
            return event;
        }

        if let Some((t, l)) = bw {
            if t > l {
                let overage = t - l;
                let remove = per_core
                    .filter(|pc| *pc > 0.0)
                    .map_or(1, |pc| (overage / pc).ceil() as u32)
                    .max(1);
                self.be_cores = self.be_cores.saturating_sub(remove);
                return Some("heracles:dram>limit:remove-cores".to_string());
            }
        }
        if !self.top.growth_allowed {
            return event;
        }
        match self.phase {
            Phase::GrowLlc => {
                let Some(total_ways) = self.llc_total() else {
                    self.llc_status = "disabled: no LLC allocation (resctrl L3)".into();
                    self.phase = Phase::GrowCores;
                    return event;
                };
                self.llc_status = "running".into();
                let predicted_over = bw.is_some_and(|(t, l)| t + self.bw_derivative > l);
                if predicted_over || self.llc_ways + 1 >= total_ways {
                    self.phase = Phase::GrowCores;
                    return event.or(Some("heracles:llc-done:grow-cores".to_string()));
                }
                self.pending = Some(Pending {
                    bw_before: total,
                    llc: Some((self.llc_ways, obs.be_progress)),
                });
                self.llc_ways = (self.llc_ways + h.llc_step_ways).min(total_ways - 1);
                Some("heracles:grow-llc".to_string())
            }
            Phase::GrowCores => {
                let lc_model = h
                    .lc_bw_model_bytes_per_s
                    .map(|m| m * obs.lc_load.unwrap_or(1.0))
                    .or_else(|| total.map(|t| t - be_bw.unwrap_or(0.0)));
                if let (Some((_, l)), Some(lc), Some(be), Some(pc)) =
                    (bw, lc_model, be_bw, per_core)
                {
                    if lc + be + pc > l {
                        self.phase = Phase::GrowLlc;
                        return Some("heracles:cores-would-saturate-dram:grow-llc".to_string());
                    }
                }
                let slack_ok = self.top.slack.is_some_and(|s| s > h.slack_disallow_growth);
                if slack_ok && self.be_cores < max_cores {
                    self.pending = Some(Pending {
                        bw_before: total,
                        llc: None,
                    });
                    self.be_cores += 1;
                    Some("heracles:grow-cores".to_string())
                } else {
                    event
                }
            }
        }
    }

    /// Alg. 3, one period.
    pub(super) fn power(&mut self, obs: &Observation) -> Option<String> {
        let h = self.h().clone();
        let mech = self.machine.mechanisms;
        let inputs = (
            obs.power_w,
            obs.tdp_w,
            obs.lc_freq_mhz,
            h.guaranteed_freq_mhz,
        );
        let (power, tdp, lc_freq, guaranteed) = match inputs {
            _ if !mech.has(Mechanism::Rapl) => {
                self.power_status = "disabled: RAPL missing".into();
                return None;
            }
            _ if !mech.has(Mechanism::Cpufreq) => {
                self.power_status = "disabled: cpufreq missing".into();
                return None;
            }
            (Some(p), Some(t), Some(f), Some(g)) => (p, t, f, g),
            (_, _, _, None) => {
                self.power_status = "disabled: policy.heracles.guaranteed_freq_mhz not set".into();
                return None;
            }
            _ => {
                self.power_status = "disabled: no power, TDP or LC frequency reading".into();
                return None;
            }
        };
        self.power_status = "running".into();
        let before = self.freq_cap_mhz;
        let over = power > h.power_tdp_frac * tdp;
        if over && lc_freq < guaranteed {
            self.freq_cap_mhz = (self.freq_cap_mhz - h.freq_step_mhz).max(h.be_freq_min_mhz);
            (self.freq_cap_mhz < before).then(|| "heracles:power>tdp:lower-be-freq".to_string())
        } else if !over && lc_freq >= guaranteed {
            self.freq_cap_mhz = (self.freq_cap_mhz + h.freq_step_mhz).min(h.be_freq_max_mhz);
            (self.freq_cap_mhz > before).then(|| "heracles:power-ok:raise-be-freq".to_string())
        } else {
            None
        }
    }

    /// Alg. 4, one period.
    pub(super) fn network(&mut self, obs: &Observation) -> Option<String> {
        let h = self.h().clone();
        if !self.machine.mechanisms.has(Mechanism::TcHtb) {
            self.net_status = "disabled: tc HTB missing".into();
            self.egress_ceil = None;
            return None;
        }
        let link = h.link_bytes_per_s.or(obs.link_bytes_per_s);
        let (Some(link), Some(lc)) = (link, obs.lc_tx_bytes_per_s) else {
            self.net_status = "disabled: no link rate or LC egress rate".into();
            self.egress_ceil = None;
            return None;
        };
        self.net_status = "running".into();
        let be = link - lc - (h.net_link_headroom * link).max(h.net_lc_headroom * lc);
        let ceil = Some(be.max(0.0).floor() as u64);
        let changed = ceil != self.egress_ceil;
        self.egress_ceil = ceil;
        changed.then(|| "heracles:egress:set-be-ceil".to_string())
    }
}
