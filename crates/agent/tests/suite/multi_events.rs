//! `multi` sleeps between decisions as hybrid does: it decides on the idle-CPU count through
//! hybrid's inner loop, so it gets the event-driven loop (thresholds disarmed while BE is held
//! off). Before, it polled at blind's `poll_ms` — 1 000 ticks a second with BE off, on the
//! CPU the agent shares. Checked by the loop the agent chose and by its tick count over a run
//! (a count, not a timing: polling gives thousands, events a few per period).
//! Needs root (cgroups, BPF); prints SKIP otherwise.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};

const TEST: &str = "multi_is_event_driven_and_quiet_while_be_is_held";

fn lc_table(top: &str, d: &str, name: &str, pid: u32) -> String {
    format!(
        "[[lc]]\nname = \"{name}\"\ncgroup = \"{top}/{name}\"\npids = [{pid}]\n\
         [lc.latency]\nsource = \"feed\"\nsocket = \"{d}/{name}.sock\"\n\
         [lc.load]\nsource = \"feed\"\npeak_qps = 1000.0\n\n"
    )
}

#[test]
fn multi_is_event_driven_and_quiet_while_be_is_held() {
    if !live::is_root() {
        return eprintln!("SKIP {TEST}: needs root (cgroups, BPF)");
    }
    if let Err(e) = headroom_host::idle_bpf::BpfIdleSampler::attach(Path::new("/")) {
        return eprintln!("SKIP {TEST}: no BPF idle program here: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let lcs = live::Children::sleepers(2);
    let top = format!("headroom-multi-events-{}", std::process::id());
    let d = dir.path().display().to_string();
    let text = format!(
        "{a}{b}[[be]]\nname = \"be\"\ncgroup = \"{top}/be\"\n\n\
         [policy]\nkind = \"multi\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n\n\
         [sensors]\nidle = \"bpf\"\nidle_sensing = \"events\"\n",
        a = lc_table(&top, &d, "a", lcs.pid(0)),
        b = lc_table(&top, &d, "b", lcs.pid(1)),
    );
    let run_for = Duration::from_secs(3);
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {TEST}: {why}"),
    };
    let status = request(&dir.path().join("ctl.sock"), &Request::Status)
        .expect("ctl status")
        .status
        .expect("a status");
    let summary = runner.join().expect("the agent thread").expect("the run");
    eprintln!(
        "idle sensing: {}; {} ticks in {run_for:?}; wakes {:?}",
        status.idle_sensing, summary.ticks, summary.wakes
    );
    assert!(
        status.idle_sensing.starts_with("events"),
        "multi polls: {}",
        status.idle_sensing
    );
    // No latency arrives: BE is held off the whole run, so no crossing is armed and the loop
    // wakes for its periodic duty (100 ms) alone — ~30 ticks; polling at 1 ms gave ~3 000.
    assert!(
        summary.ticks < 300,
        "{} ticks in {run_for:?} with BE held off (wakes {:?})",
        summary.ticks,
        summary.wakes
    );
}
