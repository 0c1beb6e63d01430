//! The safety rules' view of several `[[lc]]` services: each service's CPUs are the LC's (BE
//! never gets them), an arbitrating policy's per-service CPU sets may move CPUs between
//! services but never hand a service's configured CPUs to BE, and under `multi` rules 2 and 3
//! judge every service's latency, naming the one at fault.

use std::borrow::Cow;

use crate::config::Config;
use crate::policy::MachineInfo;
use headroom_types::allocation::Allocation;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

/// Rules 2–3 over every service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ServicesLatency {
    /// The first service (highest priority first) whose latency is unknown or stale.
    pub stale: Option<String>,
    /// The first service (highest priority first) whose fresh latency is above its target,
    /// from a figure that may judge it.
    pub violating: Option<String>,
    /// The first service above its target by a figure its sensors mark untrusted, and why
    /// (it holds BE and starts no cooldown).
    pub violating_untrusted: Option<(String, String)>,
}

/// Each configured service's latency from `obs.lc_groups` (by name): a service missing there,
/// without a finite latency, or older than `safety.latency_max_age_ms` is stale.
pub(super) fn services_latency(config: &Config, obs: &Observation) -> ServicesLatency {
    let max_age = config.safety.latency_max_age_ms;
    let mut order: Vec<usize> = (0..config.lcs.len()).collect();
    order.sort_by(|&a, &b| {
        config.lcs[b]
            .priority
            .cmp(&config.lcs[a].priority)
            .then(a.cmp(&b))
    });
    let mut out = ServicesLatency {
        stale: None,
        violating: None,
        violating_untrusted: None,
    };
    for i in order {
        let lc = &config.lcs[i];
        let group = obs.lc_groups.iter().find(|g| g.name == lc.name);
        let fresh = group.and_then(|g| {
            g.latency_us
                .filter(|l| l.is_finite() && g.latency_age_ms.is_some_and(|a| a <= max_age))
        });
        let untrusted = group.and_then(|g| g.latency_untrusted.as_ref());
        match (fresh, untrusted) {
            (None, _) if out.stale.is_none() => out.stale = Some(lc.name.clone()),
            (Some(l), None) if l > lc.slo.target_us && out.violating.is_none() => {
                out.violating = Some(lc.name.clone())
            }
            (Some(l), Some(why)) if l > lc.slo.target_us && out.violating_untrusted.is_none() => {
                out.violating_untrusted = Some((lc.name.clone(), why.clone()))
            }
            _ => {}
        }
    }
    out
}

/// Makes a policy's `lc_services` sane: only configured services; a CPU a service is pinned to
/// by the config stays with some service (a service's set shrinks only to give to another
/// service, never to BE); no empty set (on cgroup v2 an empty cpuset inherits its parent's,
/// i.e. every CPU). Returns the overrides it made.
pub(super) fn sanitize_lc_services(config: &Config, a: &mut Allocation) -> Vec<Cow<'static, str>> {
    let mut out: Vec<Cow<'static, str>> = Vec::new();
    if a.lc_services.is_empty() {
        return out;
    }
    let before = a.lc_services.len();
    a.lc_services
        .retain(|s| config.lcs.iter().any(|l| l.name == s.name));
    if a.lc_services.len() != before {
        out.push("safety:unknown-lc-service:dropped".into());
    }
    for lc in config.lcs.iter().filter(|l| l.threads.pin) {
        for cpu in lc.threads.cpus.iter() {
            if a.lc_services.iter().any(|s| s.cpus.contains(cpu)) {
                continue;
            }
            if let Some(s) = a.lc_services.iter_mut().find(|s| s.name == lc.name) {
                s.cpus = s.cpus.iter().chain([cpu]).collect::<CpuSet>();
                let why: Cow<'static, str> =
                    Cow::Owned(format!("safety:lc-cpus-to-be:restored:{}", lc.name));
                if !out.contains(&why) {
                    out.push(why);
                }
            }
        }
    }
    let before = a.lc_services.len();
    a.lc_services.retain(|s| !s.cpus.is_empty());
    if a.lc_services.len() != before {
        out.push("safety:empty-lc-service:dropped".into());
    }
    out
}

/// Every CPU a service is pinned to: by the config, by its observed affinity (when narrower
/// than the machine), or by the policy's `lc_services`; sorted.
pub(super) fn services_cpus(
    config: &Config,
    machine: &MachineInfo,
    obs: &Observation,
    a: &Allocation,
) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for lc in &config.lcs {
        if lc.threads.pin {
            out.extend(lc.threads.cpus.iter());
        }
        let observed = obs
            .lc_groups
            .iter()
            .find(|g| g.name == lc.name)
            .and_then(|g| g.cpus.as_ref());
        if let Some(cpus) = observed {
            if !machine.cpus.iter().all(|c| cpus.contains(c)) {
                out.extend(cpus.iter().copied());
            }
        }
    }
    for s in &a.lc_services {
        out.extend(s.cpus.iter());
    }
    out.sort_unstable();
    out.dedup();
    out
}
