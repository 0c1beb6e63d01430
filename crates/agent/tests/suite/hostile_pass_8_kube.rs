//! The eighth hostile pass's defects on the `[kubernetes]` side (issue 42,
//! docs/safety-hostile-pass-8-kube.md). Live: needs root (cgroups) and prints SKIP otherwise;
//! the groups are `hp8b-*`, removed (processes killed first) by a guard, also when a test fails.
//! The discovery's sets are sent by the test itself (the binary connects headroom-kube).

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::runtime::{Agent, LcEvents};
use headroom_types::GroupPath;

use live::discovery;
use live::marked::MarkedGroup as Guard;

/// The discovered pod's uid.
const UID: &str = "0a0a0a0a-0000-4000-8000-000000000001";

const HELD: &str = "a_pod_whose_group_another_agent_holds_is_said_once_not_every_second";

/// A discovered pod whose group another live agent manages (its static LC) is refused, and
/// tried again every second until that agent lets go. Each try logged the refusal again and,
/// because the set it compared held the refused pod, reconfigured the policy and wrote an
/// `lc_set` event into the decision log: a line a second, for as long as the other agent runs.
#[test]
fn a_pod_whose_group_another_agent_holds_is_said_once_not_every_second() {
    let _discovery = live::the_discovery_holder();
    let Some(guard) = Guard::setup(HELD, "hp8b", 8, "held", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pod_group = guard.top.join("pod").unwrap();
    if let Err(e) = guard.cgroups.create(&pod_group) {
        return eprintln!("SKIP {HELD}: creating {pod_group}: {e}");
    }
    let lc = live::Children::sleepers(1);
    // Agent B holds the pod's group: its static LC.
    let b_text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{pod_group}\"\npids = [{}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{}/be2\"\ncommand = [\"sleep\", \"{}1\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/b-state.json\"\n\n\
         [api]\nsocket = \"{d}/b.sock\"\nmetrics = \"\"\n",
        lc.pid(0),
        guard.top,
        guard.marker,
        d = dir.path().display()
    );
    let b = match live::start_agent(&b_text, Duration::from_secs(8)) {
        Ok(b) => b,
        Err(e) => return eprintln!("SKIP {HELD}: agent B: {e}"),
    };
    let (tx, rx) = LcEvents::channel();
    let mut a_opts = live::options(
        &discovery::config(
            &guard.top,
            &dir.path().join("a-state.json"),
            &dir.path().join("a.sock"),
        ),
        Duration::from_millis(4500),
    );
    let log = dir.path().join("a-decisions.jsonl");
    a_opts.decision_log = Some(log.clone());
    a_opts.discovery = Some(rx);
    let a = match Agent::start(a_opts) {
        Ok(a) => a,
        Err(e) => {
            let _ = b.join();
            return eprintln!("SKIP {HELD}: agent A does not start here: {e}");
        }
    };
    discovery::send(
        &tx,
        1,
        vec![discovery::pod("shop/held", UID, &pod_group, None)],
    );
    let a_result = a.run().map(|_| ());
    let b_result = b.join().expect("agent B's thread").map(|_| ());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lc_sets = text
        .lines()
        .filter(|l| l.contains("\"event\":\"lc_set\""))
        .count();
    drop(lc);
    assert!(a_result.is_ok(), "agent A: {a_result:?}");
    assert!(b_result.is_ok(), "agent B: {b_result:?}");
    // One set sent: one change of what the policy sees (before: one more every second).
    assert!(
        lc_sets <= 1,
        "{lc_sets} lc_set events in 4.5 s for one set sent:\n{text}"
    );
}

const KUBEW: &str = "kubelet_writes_the_qos_parents_weight_while_the_agent_runs_and_it_stays";

/// Kubelet coexistence on the real kernel here (cgroup v1; the VM stage checks v2): a tree
/// `hp8b-kubew-<pid>/kubepods/{besteffort,burstable,pod…}` (`kubepods` under any prefix is
/// kubelet's, as under `--cgroup-root`), BE = the BestEffort parent, `weights` with
/// `be_cpu_idle = true` (a policy that would write both). A kubelet-style write of both QoS
/// parents' `cpu.shares` while the agent runs succeeds and stays (no "repair"), `cpu.idle` is
/// never set on the BestEffort parent, and `restore` at exit leaves kubelet's weights.
#[test]
fn kubelet_writes_the_qos_parents_weight_while_the_agent_runs_and_it_stays() {
    let _discovery = live::the_discovery_holder();
    let Some(guard) = Guard::setup(KUBEW, "hp8b", 8, "kubew", 2) else {
        return;
    };
    let kube = guard.top.join("kubepods").unwrap();
    let be = kube.join("besteffort").unwrap();
    let burst = kube.join("burstable").unwrap();
    let lc_pod = kube.join("pod0c0c0c0c-0000").unwrap();
    for g in [&kube, &be, &burst, &lc_pod] {
        if let Err(e) = guard.cgroups.create(g) {
            return eprintln!("SKIP {KUBEW}: creating {g}: {e}");
        }
    }
    let cpu = Path::new("/sys/fs/cgroup/cpu");
    let knob = |g: &GroupPath, f: &str| cpu.join(g.as_str()).join(f);
    if !knob(&be, "cpu.shares").exists() || !knob(&be, "cpu.idle").exists() {
        return eprintln!(
            "SKIP {KUBEW}: no v1 cpu.shares and cpu.idle at {}",
            cpu.display()
        );
    }
    let read = |g: &GroupPath, f: &str| {
        std::fs::read_to_string(knob(g, f))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let lc = live::Children::sleepers(1);
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{lc_pod}\"\npids = [{}]\n\n\
         [[be]]\nname = \"pods\"\ncgroup = \"{be}\"\n\n\
         [policy]\nkind = \"weights\"\n[policy.weights]\nmode = \"static\"\nbe_cpu_idle = true\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        lc.pid(0),
        d = dir.path().display()
    );
    let sock = dir.path().join("ctl.sock");
    let agent = match live::start_agent(&text, Duration::from_secs(5)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {KUBEW}: {e}"),
    };
    let answering = live::eventually(Duration::from_secs(10), || {
        headroom_agent::publish::control::request(
            &sock,
            &headroom_agent::publish::control::Request::Status,
        )
        .is_ok()
    });
    // kubelet's values: the minimum shares for BestEffort, the pods' requests for Burstable.
    let wrote_be = std::fs::write(knob(&be, "cpu.shares"), "2");
    let wrote_burst = std::fs::write(knob(&burst, "cpu.shares"), "40");
    // 2 s = 20 agent ticks: a repairing agent puts its value back well within that.
    let mut idle_seen = Vec::new();
    let mut shares_seen = Vec::new();
    for _ in 0..20 {
        let idle = read(&be, "cpu.idle");
        if idle != "0" {
            idle_seen.push(idle);
        }
        shares_seen.push((read(&be, "cpu.shares"), read(&burst, "cpu.shares")));
        std::thread::sleep(Duration::from_millis(100));
    }
    let result = agent.join().expect("the agent's thread").map(|_| ());
    let after = (
        read(&be, "cpu.shares"),
        read(&burst, "cpu.shares"),
        read(&be, "cpu.idle"),
    );
    drop(lc);
    assert!(answering, "the agent answered on {}", sock.display());
    assert!(result.is_ok(), "the run: {result:?}");
    assert!(
        wrote_be.is_ok(),
        "kubelet's write of {be}/cpu.shares: {wrote_be:?}"
    );
    assert!(
        wrote_burst.is_ok(),
        "kubelet's write of {burst}/cpu.shares: {wrote_burst:?}"
    );
    assert!(
        shares_seen.iter().all(|(b, u)| b == "2" && u == "40"),
        "kubelet's weights stay while the agent runs: {shares_seen:?}"
    );
    assert!(
        idle_seen.is_empty(),
        "cpu.idle never set on {be}: {idle_seen:?}"
    );
    assert_eq!(
        after,
        ("2".to_string(), "40".to_string(), "0".to_string()),
        "after restore at exit: kubelet's weights and no cpu.idle"
    );
}
