//! `ctl set` goes through the same checks as a start, the machine's included (issue 42): a
//! static-cores cpuset naming CPUs this machine lacks was accepted live though refused at
//! start. Needs root (cgroups); prints SKIP otherwise.

use crate::live;

use std::time::Duration;

use headroom_agent::publish::control::{request, Request};

const TEST: &str = "ctl_set_refuses_cpus_the_machine_lacks";

#[test]
fn ctl_set_refuses_cpus_the_machine_lacks() {
    if !live::is_root() {
        return eprintln!("SKIP {TEST}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-set-checks-{}", std::process::id());
    let _cleanup = live::RemoveOnDrop::new(&top).wait_for_agent(Duration::from_secs(6));
    let d = dir.path().display();
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{pid}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        pid = lc.pid(0)
    );
    let runner = match live::start_agent(&text, Duration::from_secs(6)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {TEST}: {why}"),
    };
    let socket = dir.path().join("ctl.sock");
    // The loop answers requests once it runs.
    std::thread::sleep(Duration::from_millis(300));
    if runner.is_finished() {
        panic!("the agent stopped: {:?}", runner.join().unwrap());
    }
    let set = |key: &str, value: &str| {
        request(
            &socket,
            &Request::Set {
                key: key.into(),
                value: value.into(),
            },
        )
    };
    let r = match set("policy.static-cores.cpus", "0-1000") {
        Ok(r) => r,
        Err(e) => panic!("ctl set: {e}; the agent: {:?}", runner.join()),
    };
    assert!(!r.ok, "CPUs the machine lacks accepted live: {}", r.message);
    assert!(
        r.message.contains("policy.static-cores.cpus"),
        "{}",
        r.message
    );
    let r = match set("safety.agent_fifo_priority", "99") {
        Ok(r) => r,
        Err(e) => panic!("ctl set: {e}; the agent: {:?}", runner.join()),
    };
    assert!(!r.ok, "a start-only key acknowledged live: {}", r.message);
    let r = set("policy.static-cores.cpus", "\"0\"").expect("ctl set");
    assert!(r.ok, "{}", r.message);
    // The change is not written back: the answer says it lasts for this run only.
    assert_eq!(
        r.message,
        "policy.static-cores.cpus = \"0\" (for this run; the config file is unchanged)"
    );
    let _ = runner.join();
}
