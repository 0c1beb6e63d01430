//! Kubernetes discovery's LC services as the policy sees them (pure: the live agent and
//! `--replay` build the policy's config with the same function from the same inputs, so a
//! decision log stays replayable across pods coming and going).

use headroom_types::discovery::DiscoveredLc;

use crate::config::{holder, Config, ConfigError, LcConfig, PolicyKind};

/// Why a discovered pod is not one of the agent's LC services (the pod and the key named).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PodRefused {
    #[error("pod {pod}: {source}")]
    Config {
        pod: String,
        #[source]
        source: ConfigError,
    },
    #[error("pod {pod}: name: a static [lc] (lc[{index}]) has the same name")]
    SameName { pod: String, index: usize },
    #[error("pod {pod}: cgroup {cgroup:?} overlaps lc[{index}].cgroup {other:?} ({name:?}): a static [lc] and a discovered pod cannot share a group")]
    SharesLcGroup {
        pod: String,
        cgroup: String,
        index: usize,
        other: String,
        name: String,
    },
    #[error("pod {pod}: cgroup {cgroup:?} overlaps be[{index}].cgroup {other:?}: an LC cannot be BE's group, inside it, or around it")]
    SharesBeGroup {
        pod: String,
        cgroup: String,
        index: usize,
        other: String,
    },
}

impl PodRefused {
    /// The key of the pod's service the refusal is about (`cgroup`, `name`, `slo.target_us`…).
    pub fn key(&self) -> &str {
        match self {
            PodRefused::Config {
                source: ConfigError::Invalid { key, .. },
                ..
            } => key,
            PodRefused::Config { .. } => "annotations",
            PodRefused::SameName { .. } => "name",
            PodRefused::SharesLcGroup { .. } | PodRefused::SharesBeGroup { .. } => "cgroup",
        }
    }

    /// The refused value where it is not the pod's group (a bad annotation's value).
    pub fn value(&self) -> Option<&str> {
        match self {
            PodRefused::Config {
                source: ConfigError::Invalid { value, .. },
                ..
            } => Some(value),
            _ => None,
        }
    }
}

/// A discovered pod as one of the agent's LC services, or why it cannot be one (the pod and
/// the key named): a bad SLO, a group that is a static `[lc]`'s or BE's, or inside one.
pub fn accept(config: &Config, lc: &DiscoveredLc) -> Result<LcConfig, PodRefused> {
    let pod = || lc.name.clone();
    let service = config
        .kubernetes
        .lc_config(lc)
        .map_err(|source| PodRefused::Config { pod: pod(), source })?;
    for (index, s) in config.static_lcs().iter().enumerate() {
        if s.name == service.name {
            return Err(PodRefused::SameName { pod: pod(), index });
        }
        if s.cgroup.overlaps(&service.cgroup) {
            return Err(PodRefused::SharesLcGroup {
                pod: pod(),
                cgroup: service.cgroup.as_str().into(),
                index,
                other: s.cgroup.as_str().into(),
                name: s.name.clone(),
            });
        }
    }
    for (index, b) in config.be.iter().enumerate() {
        if b.cgroup.overlaps(&service.cgroup) {
            return Err(PodRefused::SharesBeGroup {
                pod: pod(),
                cgroup: service.cgroup.as_str().into(),
                index,
                other: b.cgroup.as_str().into(),
            });
        }
    }
    Ok(service)
}

/// The config the policy decides with: the static services, then every discovered LC the
/// agent accepts. Until the first pod list (`synced`), and while there is no LC at all, the
/// holder service stands first (with `multi`, or alone): its latency is never known, so the
/// safety rules hold BE (no growth, then disabled) and name it.
pub fn policy_config(config: &Config, synced: bool, discovered: &[DiscoveredLc]) -> Config {
    let statics = config.static_lcs().to_vec();
    let found: Vec<LcConfig> = discovered
        .iter()
        .filter_map(|d| accept(config, d).ok())
        .collect();
    let hold = !synced || (statics.is_empty() && found.is_empty());
    let mut c = config.clone();
    c.lcs = Vec::new();
    if hold && (statics.is_empty() || config.policy.kind == PolicyKind::Multi) {
        c.lcs.push(holder(true));
    }
    c.lcs.extend(statics);
    c.lcs.extend(found);
    c
}

/// The config a policy starts with: [`policy_config`] before the first pod list when
/// discovery is on, the config itself otherwise.
pub fn initial_policy_config(config: &Config) -> Config {
    if config.kubernetes.discover {
        policy_config(config, false, &[])
    } else {
        config.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{is_holder, HOLDER_NAME};
    use headroom_types::discovery::PodQos;
    use headroom_types::GroupPath;

    fn pod(name: &str, cgroup: &str, target_us: f64) -> DiscoveredLc {
        DiscoveredLc {
            name: name.into(),
            uid: name.into(),
            qos: PodQos::Burstable,
            cgroup: GroupPath::new(cgroup).unwrap(),
            target_us,
            percentile: 99.0,
            latency_port: None,
            priority: 0,
            container_ports: Vec::new(),
        }
    }

    fn discovery_only() -> Config {
        Config::from_toml_str(
            "[kubernetes]\ndiscover = true\nnode_name = \"n1\"\n[policy]\nkind = \"multi\"\n\
             [[be]]\nname = \"batch\"\ncgroup = \"kubepods/besteffort\"\n",
        )
        .unwrap()
    }

    #[test]
    fn the_holder_stands_until_the_first_list_and_while_no_pod_is_an_lc() {
        let c = discovery_only();
        assert!(is_holder(c.lc()) && c.static_lcs().is_empty());
        let names = |c: &Config| c.lcs.iter().map(|l| l.name.clone()).collect::<Vec<_>>();
        let p = initial_policy_config(&c);
        assert_eq!(names(&p), [HOLDER_NAME]);
        assert!(p.lc().latency.is_some(), "the safety rules must judge it");
        let a = pod("shop/a", "kubepods/burstable/poda", 500.0);
        assert_eq!(
            names(&policy_config(&c, false, std::slice::from_ref(&a))),
            [HOLDER_NAME, "shop/a"]
        );
        assert_eq!(
            names(&policy_config(&c, true, std::slice::from_ref(&a))),
            ["shop/a"]
        );
        assert_eq!(names(&policy_config(&c, true, &[])), [HOLDER_NAME]);
        let p = policy_config(&c, true, &[a]);
        assert_eq!(p.lc().slo.target_us, 500.0);
    }

    #[test]
    fn a_pod_on_a_static_or_be_group_is_refused_naming_both() {
        let c = Config::from_toml_str(
            "[kubernetes]\ndiscover = true\nnode_name = \"n1\"\n[policy]\nkind = \"none\"\n\
             [lc]\nname = \"memcached\"\ncgroup = \"kubepods/burstable/podm\"\n\
             [[be]]\nname = \"batch\"\ncgroup = \"kubepods/besteffort\"\n",
        )
        .unwrap();
        let refused = accept(&c, &pod("shop/m", "kubepods/burstable/podm", 500.0)).unwrap_err();
        assert_eq!(refused.key(), "cgroup");
        let e = refused.to_string();
        assert!(
            e.contains("shop/m") && e.contains("lc[0].cgroup") && e.contains("memcached"),
            "{e}"
        );
        let e = accept(&c, &pod("shop/b", "kubepods/besteffort/podb", 500.0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shop/b") && e.contains("be[0].cgroup"), "{e}");
        let refused = accept(&c, &pod("shop/z", "kubepods/burstable/podz", 0.0)).unwrap_err();
        assert!(refused.key().ends_with("target_us"), "{refused:?}");
        assert_eq!(refused.value(), Some("0.0"));
        let e = refused.to_string();
        assert!(e.contains("shop/z") && e.contains("target_us"), "{e}");
        // refused pods are not the policy's; single-LC policies keep the static LC first
        let p = policy_config(&c, true, &[pod("shop/m", "kubepods/burstable/podm", 1.0)]);
        assert_eq!(p.lcs.len(), 1);
        assert_eq!(p.lc().name, "memcached");
    }

    #[test]
    fn no_lc_at_all_is_refused_without_discovery_and_single_lc_policies_need_one() {
        let e = Config::from_toml_str("[policy]\nkind = \"none\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lc") && e.contains("discover"), "{e}");
        let e =
            Config::from_toml_str("[kubernetes]\ndiscover = true\n[policy]\nkind = \"hybrid\"\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("policy.kind") && e.contains("multi"), "{e}");
    }
}
