//! `[kubernetes]`: live discovery of the node's LC pods (the `headroom-kube` crate watches them)
//! and how a discovered pod becomes an LC service of the agent.

use headroom_types::discovery::{DiscoveredLc, LayoutChoice};
use headroom_types::GroupPath;
use serde::{Deserialize, Serialize};

use crate::config::{invalid, ConfigError, LcConfig, Problems};

/// `[kubernetes]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Watch the node's pods: every Running pod annotated `headroom.io/slo-p99-us` is an LC
    /// from the moment it runs until it goes (docs/kubernetes.md).
    pub discover: bool,
    /// The node whose pods are watched; default: the `NODE_NAME` environment variable (the
    /// downward API's `spec.nodeName`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// A kubeconfig file; default: the pod's service account (in-cluster), else `KUBECONFIG`
    /// or `~/.kube/config`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    /// kubelet's cgroup layout: `auto` (found under the cgroup root), `cgroupfs` or `systemd`.
    pub cgroup_layout: LayoutChoice,
    /// The SLO window of a discovered LC, s.
    pub window_s: f64,
    /// A pod with `headroom.io/latency-port` is measured by the kernel sensor on that port; with
    /// `probe_fallback` the prober fills in (on `127.0.0.1:<port>`, so for `hostNetwork` pods).
    pub probe_fallback: bool,
    /// Publish the node's SLO-safe BE capacity as the extended resource `headroom.io/be-cpu`
    /// (milli-CPUs) in the Node's status ([`crate::advertise`], docs/kubernetes.md).
    pub advertise: bool,
    /// How far back the BE CPUs granted are looked at, s (the diurnal peak should be in view).
    pub advertise_horizon_s: f64,
    /// The low percentile of the horizon that is advertised.
    pub advertise_percentile: f64,
    /// Taken off the percentile, milli-CPUs.
    pub advertise_margin_millicpu: u64,
    /// The value moves in whole steps of this many milli-CPUs.
    pub advertise_step_millicpu: u64,
    /// At most one rise per this many s, and only this long after the last violation.
    pub advertise_damping_s: f64,
    /// How much of the horizon must be seen before anything above the floor is advertised, s.
    pub advertise_min_history_s: f64,
    /// `headroom.io/be-memory`: taken off the room BE had at the LC's and system's peak, bytes
    /// (at least `safety.min_mem_available_bytes`, below which BE is disabled).
    pub advertise_memory_margin_bytes: u64,
    /// `headroom.io/be-memory` moves in whole steps of this many bytes.
    pub advertise_memory_step_bytes: u64,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            discover: false,
            node_name: None,
            kubeconfig: None,
            cgroup_layout: LayoutChoice::Auto,
            window_s: crate::config::SloConfig::default().window_s,
            probe_fallback: false,
            advertise: false,
            advertise_horizon_s: 3600.0,
            advertise_percentile: 10.0,
            advertise_margin_millicpu: 200,
            advertise_step_millicpu: 100,
            advertise_damping_s: 300.0,
            advertise_min_history_s: 600.0,
            advertise_memory_margin_bytes: 512 << 20,
            advertise_memory_step_bytes: 64 << 20,
        }
    }
}

/// The LC slot standing for "the node's LC pods" while discovery has none to show (before the
/// first pod list, or when the node runs no LC pod), and the first service of a config with
/// `discover = true` and no static `[lc]`: an empty group the agent creates (and removes on
/// exit) so the runtime always has a first service; it never has a latency, so the safety
/// rules hold BE (no growth, then disabled) while it is the only service.
pub const HOLDER_NAME: &str = "kubernetes";
/// The holder's group (an empty group at the hierarchy's root, not a pod's).
pub const HOLDER_CGROUP: &str = "headroom-discovery";

/// The holder service ([`HOLDER_NAME`]). `with_latency`: the form the policy sees, whose
/// latency rules then apply to it (no source is ever started for it, so its latency is never
/// known); the runtime's form has none (nothing to start).
pub fn holder(with_latency: bool) -> LcConfig {
    let mut t = toml::Table::new();
    t.insert("name".into(), HOLDER_NAME.into());
    t.insert("cgroup".into(), HOLDER_CGROUP.into());
    if with_latency {
        let mut lat = toml::Table::new();
        lat.insert("source".into(), "feed".into());
        lat.insert(
            "socket".into(),
            "/nonexistent/headroom-discovery.sock".into(),
        );
        t.insert("latency".into(), lat.into());
    }
    toml::Value::Table(t)
        .try_into()
        .expect("the holder service is a valid [lc]")
}

/// Whether `lc` is the holder service (by name and group: a config printed by `ctl status` and
/// read back keeps it as a plain `[lc]`).
pub fn is_holder(lc: &LcConfig) -> bool {
    lc.name == HOLDER_NAME && lc.cgroup == HOLDER_CGROUP
}

/// The environment variable the node name comes from by default.
pub const NODE_NAME_ENV: &str = "NODE_NAME";

impl KubernetesConfig {
    /// Whether the section says nothing (it is then left out of the TOML form).
    pub fn is_default(&self) -> bool {
        *self == KubernetesConfig::default()
    }

    /// The node to watch: `node_name`, else `env_node` (the value of `NODE_NAME`).
    pub fn node(&self, env_node: Option<String>) -> Result<String, ConfigError> {
        self.node_name
            .clone()
            .or(env_node)
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| {
                invalid(
                    "kubernetes.node_name",
                    "",
                    "discover = true needs the node's name: set node_name, or NODE_NAME from the downward API (fieldRef spec.nodeName)",
                )
            })
    }

    /// The LC service a discovered pod stands for: its name (`namespace/pod`), cgroup,
    /// priority and SLO; latency from the kernel sensor on its port when it has one (else none:
    /// the safety rules treat its latency as unknown), no load source, no thread treatment.
    pub fn lc_config(&self, lc: &DiscoveredLc) -> Result<LcConfig, ConfigError> {
        let mut t = toml::Table::new();
        t.insert("name".into(), lc.name.clone().into());
        t.insert("cgroup".into(), lc.cgroup.as_str().into());
        t.insert("priority".into(), i64::from(lc.priority).into());
        let mut slo = toml::Table::new();
        slo.insert("percentile".into(), lc.percentile.into());
        slo.insert("target_us".into(), lc.target_us.into());
        slo.insert("window_s".into(), self.window_s.into());
        t.insert("slo".into(), slo.into());
        // The annotated port, else every declared TCP containerPort (the sensor takes several).
        let ports = lc.latency_ports();
        if !ports.is_empty() {
            let mut lat = toml::Table::new();
            lat.insert("source".into(), "kernel".into());
            if let [port] = ports[..] {
                lat.insert("port".into(), i64::from(port).into());
            } else {
                let list: Vec<toml::Value> = ports.iter().map(|&p| i64::from(p).into()).collect();
                lat.insert("ports".into(), list.into());
            }
            if self.probe_fallback {
                lat.insert("fallback".into(), "probe".into());
            }
            t.insert("latency".into(), lat.into());
        }
        let config: LcConfig = toml::Value::Table(t)
            .try_into()
            .map_err(|e: toml::de::Error| invalid("lc", &lc.name, e.to_string()))?;
        let mut p = Problems::default();
        config.validate_as(&format!("lc[{}]", lc.name), &mut p);
        p.into_result()?;
        Ok(config)
    }

    /// The `[kubernetes]` section alone (default when absent) of the text of the agent config
    /// file at `path`, for tools that need only it (`headroom kube-discover --config`).
    pub fn from_config_text(
        text: &str,
        path: &std::path::Path,
    ) -> Result<KubernetesConfig, ConfigError> {
        let doc: toml::Table = toml::from_str(text)
            .map_err(|e| ConfigError::Parse(format!("{}: {e}", path.display())))?;
        let k: KubernetesConfig = match doc.get("kubernetes") {
            None => KubernetesConfig::default(),
            Some(v) => v.clone().try_into().map_err(|e: toml::de::Error| {
                ConfigError::Parse(format!("{}: [kubernetes]: {e}", path.display()))
            })?,
        };
        let mut p = Problems::default();
        k.validate(&mut p);
        p.into_result()?;
        Ok(k)
    }

    /// The advertiser's parameters (validated with the section).
    pub fn advertise_params(&self) -> crate::advertise::AdvertiseParams {
        let ms = |s: f64| (s * 1000.0).round() as u64;
        let horizon_ms = ms(self.advertise_horizon_s);
        crate::advertise::AdvertiseParams {
            horizon_ms,
            percentile: self.advertise_percentile,
            margin: self.advertise_margin_millicpu,
            step: self.advertise_step_millicpu,
            cap: None,
            damping_ms: ms(self.advertise_damping_s),
            // 360 buckets over the horizon, none shorter than a second.
            bucket_ms: (horizon_ms / 360).max(1000),
            min_history_ms: ms(self.advertise_min_history_s),
        }
    }

    /// The be-memory advertiser's parameters: the horizon, damping and warming of be-cpu's; the
    /// least room of the horizon (the LC's and system's peak: memory is not compressible, so no
    /// percentile above it); the margin at least `safety.min_mem_available_bytes`; capped by
    /// `safety.be_memory_limit_bytes` (BE can hold no more).
    pub fn advertise_memory_params(
        &self,
        safety: &crate::config::SafetyConfig,
    ) -> crate::advertise::AdvertiseParams {
        crate::advertise::AdvertiseParams {
            percentile: 0.0,
            margin: self
                .advertise_memory_margin_bytes
                .max(safety.min_mem_available_bytes.unwrap_or(0)),
            step: self.advertise_memory_step_bytes,
            cap: safety.be_memory_limit_bytes,
            ..self.advertise_params()
        }
    }

    pub(crate) fn validate(&self, p: &mut Problems) {
        // A week at most: the buckets of a longer horizon would be too coarse to follow a day.
        const MAX_HORIZON_S: f64 = 7.0 * 86400.0;
        let h = self.advertise_horizon_s;
        if !(60.0..=MAX_HORIZON_S).contains(&h) {
            p.push(invalid(
                "kubernetes.advertise_horizon_s",
                h,
                format!("must be in [60, {MAX_HORIZON_S}] s"),
            ));
        }
        let pc = self.advertise_percentile;
        if !(pc > 0.0 && pc <= 100.0) {
            p.push(invalid(
                "kubernetes.advertise_percentile",
                pc,
                "must be in (0, 100]",
            ));
        }
        if self.advertise_step_millicpu == 0 || self.advertise_step_millicpu > 100_000 {
            p.push(invalid(
                "kubernetes.advertise_step_millicpu",
                self.advertise_step_millicpu,
                "must be in [1, 100000] milli-CPUs",
            ));
        }
        if self.advertise_margin_millicpu > 1_000_000 {
            p.push(invalid(
                "kubernetes.advertise_margin_millicpu",
                self.advertise_margin_millicpu,
                "must be at most 1000000 milli-CPUs",
            ));
        }
        // 1 TiB: a step or margin beyond any node's memory is a typo.
        const MAX_MEMORY_BYTES: u64 = 1 << 40;
        if self.advertise_memory_step_bytes == 0
            || self.advertise_memory_step_bytes > MAX_MEMORY_BYTES
        {
            p.push(invalid(
                "kubernetes.advertise_memory_step_bytes",
                self.advertise_memory_step_bytes,
                format!("must be in [1, {MAX_MEMORY_BYTES}] bytes"),
            ));
        }
        if self.advertise_memory_margin_bytes > MAX_MEMORY_BYTES {
            p.push(invalid(
                "kubernetes.advertise_memory_margin_bytes",
                self.advertise_memory_margin_bytes,
                format!("must be at most {MAX_MEMORY_BYTES} bytes"),
            ));
        }
        let d = self.advertise_damping_s;
        if !(0.0..=MAX_HORIZON_S).contains(&d) {
            p.push(invalid(
                "kubernetes.advertise_damping_s",
                d,
                format!("must be in [0, {MAX_HORIZON_S}] s"),
            ));
        }
        let m = self.advertise_min_history_s;
        if !(0.0..=h).contains(&m) {
            p.push(invalid(
                "kubernetes.advertise_min_history_s",
                m,
                format!("must be in [0, advertise_horizon_s = {h}] s"),
            ));
        }
        // the 1 ms floor of `lc.slo.window_s` (a discovered LC's window)
        if let Err(e) = crate::config::checks::window("kubernetes.window_s", self.window_s) {
            p.push(e);
        } else if self.window_s > crate::config::MAX_WINDOW_S {
            p.push(invalid(
                "kubernetes.window_s",
                self.window_s,
                format!("must be in (0, {}] s", crate::config::MAX_WINDOW_S),
            ));
        }
        if let Some(n) = &self.node_name {
            if n.trim().is_empty() {
                p.push(invalid(
                    "kubernetes.node_name",
                    n,
                    "must not be empty (leave it out to read NODE_NAME)",
                ));
            }
        }
    }
}

/// A policy with no knob on this node: it acts only through CPU weights (`weights`: the BE
/// weight or `cpu.idle`, the LC weight), and every group it would write is one whose weight
/// kubelet owns ([`crate::actuation::target::kubelet_owns_weight`]), which the agent leaves to
/// kubelet (docs/kubernetes.md). Said at start, so the operator is not left wondering why
/// nothing happens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "policy.kind = \"{kind}\" acts only through CPU weights, and kubelet owns the weight of every group it would write ({groups}): it has no knob here, BE runs unconfined by it; use a policy that confines through cpusets or quota (static-cores, blind, hybrid)"
)]
pub struct PolicyWithoutKnob {
    pub kind: &'static str,
    pub groups: String,
}

/// [`PolicyWithoutKnob`] for `config`, if so.
pub fn policy_without_knob(config: &crate::config::Config) -> Option<PolicyWithoutKnob> {
    use crate::actuation::target::kubelet_owns_weight;
    if config.policy.kind != crate::config::PolicyKind::Weights || config.be.is_empty() {
        return None;
    }
    let groups: Vec<&GroupPath> = config
        .be
        .iter()
        .map(|b| &b.cgroup)
        .chain(
            config
                .lcs
                .iter()
                .filter(|l| !is_holder(l))
                .map(|l| &l.cgroup),
        )
        .collect();
    groups
        .iter()
        .all(|g| kubelet_owns_weight(g))
        .then(|| PolicyWithoutKnob {
            kind: config.policy.kind.as_str(),
            groups: groups
                .iter()
                .map(|g| g.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LatencyFallback, LatencySource};
    use headroom_types::discovery::PodQos;
    use headroom_types::GroupPath;

    fn discovered(port: Option<u16>) -> DiscoveredLc {
        DiscoveredLc {
            name: "shop/cart-0".into(),
            uid: "u1".into(),
            qos: PodQos::Burstable,
            cgroup: GroupPath::new("kubepods/burstable/podu1").unwrap(),
            target_us: 300.0,
            percentile: 99.0,
            latency_port: port,
            priority: 3,
            container_ports: Vec::new(),
        }
    }

    #[test]
    fn a_discovered_pod_becomes_an_lc_service() {
        let k = KubernetesConfig {
            probe_fallback: true,
            ..KubernetesConfig::default()
        };
        let lc = k.lc_config(&discovered(Some(11211))).unwrap();
        assert_eq!(lc.name, "shop/cart-0");
        assert_eq!(lc.cgroup, "kubepods/burstable/podu1");
        assert_eq!(lc.priority, 3);
        assert_eq!(
            (lc.slo.percentile, lc.slo.target_us, lc.slo.window_s),
            (99.0, 300.0, 15.0)
        );
        let lat = lc.latency.unwrap();
        assert_eq!(lat.source, LatencySource::Kernel);
        assert_eq!(lat.kernel_ports(), [11211]);
        assert_eq!(lat.fallback, Some(LatencyFallback::Probe));
        assert!(lc.pids.is_empty() && lc.command.is_empty() && lc.load.is_none());

        let lc = KubernetesConfig::default()
            .lc_config(&discovered(None))
            .unwrap();
        assert!(lc.latency.is_none());

        // No annotation: the declared TCP containerPorts, all of them.
        let mut d = discovered(None);
        d.container_ports = vec![8080, 9090];
        let lat = KubernetesConfig::default()
            .lc_config(&d)
            .unwrap()
            .latency
            .unwrap();
        assert_eq!(lat.source, LatencySource::Kernel);
        assert_eq!(lat.kernel_ports(), [8080, 9090]);
        d.container_ports = vec![8080];
        let lat = KubernetesConfig::default()
            .lc_config(&d)
            .unwrap()
            .latency
            .unwrap();
        assert_eq!(lat.kernel_ports(), [8080]);
    }

    #[test]
    fn the_node_comes_from_the_key_or_the_environment() {
        let mut k = KubernetesConfig::default();
        assert_eq!(k.node(Some("n1".into())).unwrap(), "n1");
        let e = k.node(None).unwrap_err().to_string();
        assert!(e.starts_with("kubernetes.node_name"), "{e}");
        k.node_name = Some("n2".into());
        assert_eq!(k.node(Some("n1".into())).unwrap(), "n2");
    }

    #[test]
    fn the_section_parses_and_refuses_bad_values() {
        let k: KubernetesConfig = toml::from_str(
            "discover = true\nnode_name = \"n1\"\ncgroup_layout = \"systemd\"\nwindow_s = 5.0",
        )
        .unwrap();
        assert!(k.discover && !k.is_default());
        assert_eq!(k.cgroup_layout, LayoutChoice::Systemd);
        assert!(toml::from_str::<KubernetesConfig>("cgroup_layout = \"cgroupv3\"").is_err());
        assert!(toml::from_str::<KubernetesConfig>("discovr = true").is_err());
        let mut p = Problems::default();
        KubernetesConfig {
            window_s: 0.0,
            node_name: Some(" ".into()),
            ..KubernetesConfig::default()
        }
        .validate(&mut p);
        let keys: Vec<String> = p.0.iter().map(|e| e.to_string()).collect();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(KubernetesConfig::default().is_default());
    }

    #[test]
    fn the_advertise_keys_parse_and_every_bad_one_is_named() {
        let k: KubernetesConfig = toml::from_str(
            "advertise = true\nadvertise_horizon_s = 1800.0\nadvertise_damping_s = 60.0",
        )
        .unwrap();
        assert!(k.advertise);
        let a = k.advertise_params();
        assert_eq!(
            (a.horizon_ms, a.damping_ms, a.bucket_ms),
            (1_800_000, 60_000, 5000)
        );
        let mut p = Problems::default();
        KubernetesConfig {
            advertise_horizon_s: 10.0,
            advertise_percentile: 0.0,
            advertise_step_millicpu: 0,
            advertise_damping_s: -1.0,
            advertise_min_history_s: 20.0,
            ..KubernetesConfig::default()
        }
        .validate(&mut p);
        let text: Vec<String> = p.0.iter().map(|e| e.to_string()).collect();
        for key in [
            "advertise_horizon_s = 10",
            "advertise_percentile = 0",
            "advertise_step_millicpu = 0",
            "advertise_damping_s = -1",
            "advertise_min_history_s = 20",
        ] {
            assert!(text.iter().any(|t| t.contains(key)), "{key}: {text:?}");
        }
    }

    #[test]
    fn the_memory_params_share_the_horizon_and_take_the_safety_keys() {
        let k: KubernetesConfig = toml::from_str(
            "advertise = true\nadvertise_horizon_s = 1800.0\nadvertise_memory_margin_bytes = 1000\nadvertise_memory_step_bytes = 4096",
        )
        .unwrap();
        let safety = crate::config::SafetyConfig {
            min_mem_available_bytes: Some(1 << 30),
            be_memory_limit_bytes: Some(8 << 30),
            ..Default::default()
        };
        let m = k.advertise_memory_params(&safety);
        let c = k.advertise_params();
        assert_eq!(
            (m.horizon_ms, m.damping_ms, m.bucket_ms, m.min_history_ms),
            (c.horizon_ms, c.damping_ms, c.bucket_ms, c.min_history_ms)
        );
        // The least room; the margin at least what keeps BE enabled; the limit as the cap.
        assert_eq!((m.percentile, m.margin, m.step), (0.0, 1 << 30, 4096));
        assert_eq!(m.cap, Some(8 << 30));
        let m = k.advertise_memory_params(&crate::config::SafetyConfig::default());
        assert_eq!((m.margin, m.cap), (1000, None));
        let mut p = Problems::default();
        KubernetesConfig {
            advertise_memory_step_bytes: 0,
            advertise_memory_margin_bytes: 1 << 50,
            ..KubernetesConfig::default()
        }
        .validate(&mut p);
        let text: Vec<String> = p.0.iter().map(|e| e.to_string()).collect();
        for key in [
            "advertise_memory_step_bytes = 0",
            "advertise_memory_margin_bytes = 1125899906842624",
        ] {
            assert!(text.iter().any(|t| t.contains(key)), "{key}: {text:?}");
        }
    }

    fn weights_config(lc: &str, be: &str) -> crate::config::Config {
        crate::config::Config::from_toml_str(&format!(
            "[lc]\nname = \"lc\"\ncgroup = \"{lc}\"\n\n[[be]]\nname = \"be\"\ncgroup = \"{be}\"\n\n[policy]\nkind = \"weights\"\n"
        ))
        .unwrap()
    }

    #[test]
    fn weights_on_kubelet_groups_is_said_to_have_no_knob_with_the_key_named() {
        for (lc, be) in [
            ("kubepods/pod0c0c", "kubepods/besteffort"),
            (
                "kubepods.slice/kubepods-pod0c0c.slice",
                "kubepods.slice/kubepods-besteffort.slice",
            ),
        ] {
            let w = policy_without_knob(&weights_config(lc, be)).expect(be);
            let text = w.to_string();
            assert!(text.contains("policy.kind = \"weights\""), "{text}");
            assert!(text.contains(be) && text.contains(lc), "{text}");
        }
        // The agent's own groups keep their weights: the policy has its knobs.
        assert_eq!(policy_without_knob(&weights_config("hr/lc", "hr/be")), None);
        // A static LC outside kubepods still gets its weight raised.
        assert_eq!(
            policy_without_knob(&weights_config("hr/lc", "kubepods/besteffort")),
            None
        );
        // Another policy confines through cpusets and quota.
        let mut c = weights_config("kubepods/pod0c0c", "kubepods/besteffort");
        c.policy.kind = crate::config::PolicyKind::Hybrid;
        assert_eq!(policy_without_knob(&c), None);
    }
}
