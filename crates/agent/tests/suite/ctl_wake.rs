//! A control request wakes the event-driven agent at once: the control socket's doorbell
//! (an eventfd) sits in the same epoll set as the BPF idle ring buffer, so `ctl status` on an
//! idle host is answered without waiting for the periodic duty (100 ms). Checked by the wake
//! reason the loop counts, and by a generous bound on each answer (well under the period).
//! Needs root (cgroups, BPF); prints SKIP otherwise.

use crate::live;

use std::path::Path;
use std::time::{Duration, Instant};

use headroom_agent::publish::control::{request, Request};

const TEST: &str = "a_ctl_request_wakes_the_event_driven_agent_at_once";

fn skip(reason: &str) {
    eprintln!("SKIP {TEST}: {reason}");
}

#[test]
fn a_ctl_request_wakes_the_event_driven_agent_at_once() {
    if !live::is_root() {
        return skip("needs root (cgroups, BPF)");
    }
    if let Err(e) = headroom_host::idle_bpf::BpfIdleSampler::attach(Path::new("/")) {
        return skip(&format!("no BPF idle program here: {e}"));
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-ctl-wake-{}", std::process::id());
    let d = dir.path().display();
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{pid}]\n\n\
         [[be]]\nname = \"be\"\ncgroup = \"{top}/be\"\n\n\
         [policy]\nkind = \"blind\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n\n\
         [sensors]\nidle = \"bpf\"\nidle_sensing = \"events\"\n",
        pid = lc.pid(0)
    );
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => return skip(&why),
    };
    let socket = dir.path().join("ctl.sock");

    let first = request(&socket, &Request::Status).expect("ctl status");
    let sensing = first.status.expect("a status").idle_sensing;
    if !sensing.starts_with("events") {
        let _ = runner.join();
        return skip(&format!("the agent polls here ({sensing})"));
    }
    let mut answered = Vec::new();
    for i in 0..8u64 {
        // land at different phases of the 100 ms period
        std::thread::sleep(Duration::from_millis(37 + 11 * i));
        let t = Instant::now();
        let r = request(&socket, &Request::Status).expect("ctl status");
        answered.push(t.elapsed());
        assert!(r.ok, "{}", r.message);
    }
    let summary = runner.join().expect("the agent thread").expect("the run");
    eprintln!(
        "ctl status answered in {answered:?}; wakes {:?}",
        summary.wakes
    );
    assert!(
        summary.wakes.request >= 1,
        "no wake-up for a request: {:?}",
        summary.wakes
    );
    let slowest = answered.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_millis(50),
        "a ctl status took {slowest:?} (the periodic duty is 100 ms): {answered:?}"
    );
}
