//! What the tests of a `[kubernetes]` agent share: its config, a discovered pod, and a set sent
//! as the discovery would send it (the tests stand in for headroom-kube). Hold
//! [`super::the_discovery_holder`] while such an agent runs.
#![allow(dead_code)] // not every test that shares `live` runs a discovery agent

use std::path::Path;

use headroom_agent::runtime::LcEventSender;
use headroom_types::discovery::{DiscoveredLc, LcSet, LcSetEvent, PodQos};
use headroom_types::GroupPath;

/// A discovery agent on node `node-a` with BE in `top/be` (no command: kubelet runs BE pods),
/// `multi`, idle sensing by polling, `restore` on exit, its state file and control socket as
/// given, no metrics endpoint.
pub fn config(top: &GroupPath, state: &Path, socket: &Path) -> String {
    format!(
        "[kubernetes]\ndiscover = true\nnode_name = \"node-a\"\ncgroup_layout = \"cgroupfs\"\n\n\
         [[be]]\nname = \"pods\"\ncgroup = \"{top}/be\"\n\n\
         [policy]\nkind = \"multi\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{}\"\n\n\
         [api]\nsocket = \"{}\"\nmetrics = \"\"\n",
        state.display(),
        socket.display()
    )
}

/// A Burstable pod `name` (`uid`) in `cgroup`, p99 target 500 µs, its latency port if any.
pub fn pod(name: &str, uid: &str, cgroup: &GroupPath, latency_port: Option<u16>) -> DiscoveredLc {
    DiscoveredLc {
        name: name.into(),
        uid: uid.into(),
        qos: PodQos::Burstable,
        cgroup: cgroup.clone(),
        target_us: 500.0,
        percentile: 99.0,
        latency_port,
        priority: 0,
        container_ports: Vec::new(),
    }
}

/// Sends the complete set `lcs` of node `node-a` as its `version`.
pub fn send(tx: &LcEventSender, version: u64, lcs: Vec<DiscoveredLc>) {
    tx.send(LcSetEvent {
        t_unix_ms: 0,
        changes: Vec::new(),
        set: LcSet {
            version,
            node: "node-a".into(),
            lcs,
            synced: true,
            ..LcSet::default()
        },
    })
    .expect("the agent takes the set");
}
