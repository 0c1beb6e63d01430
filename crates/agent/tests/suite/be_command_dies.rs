//! A BE command that dies at once (a `taskset` to a CPU outside BE's cpuset did, in every
//! `bench multi-lc` run before 2026-11-27) is visible where an operator looks: `ctl status`
//! lists it with its restarts and how it last ended, instead of "BE enabled" with nothing
//! running. Needs root (cgroups); prints SKIP otherwise.

use crate::live;

use std::time::{Duration, Instant};

use headroom_agent::publish::control::{request, Request};

const TEST: &str = "a_be_command_that_dies_at_once_is_listed_with_how_it_ended";

#[test]
fn a_be_command_that_dies_at_once_is_listed_with_how_it_ended() {
    if !live::is_root() {
        return eprintln!("SKIP {TEST}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-be-dies-{}", std::process::id());
    let d = dir.path().display();
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{pid}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\n\
         command = [\"sh\", \"-c\", \"exit 3\"]\nrestart_backoff_ms = 200\n\n\
         [policy]\nkind = \"none\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        pid = lc.pid(0)
    );
    let began = Instant::now();
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {TEST}: {why}"),
    };
    let socket = dir.path().join("ctl.sock");
    // the first restart comes after the 200 ms backoff and the supervision period (100 ms)
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut seen = None;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let status = request(&socket, &Request::Status)
            .expect("ctl status")
            .status
            .expect("a status");
        let c = status.be_commands.first().cloned().expect("the BE command");
        if c.restarts >= 1 && c.last_exit.is_some() {
            seen = Some(c);
            break;
        }
    }
    let _ = runner.join();
    let c = seen.expect("the dying command listed with a restart and how it ended");
    assert_eq!(c.name, "batch");
    let how = c.last_exit.unwrap();
    assert!(how.contains("exit status: 3"), "{how}");
    // How long it ran is its own life, never more than the test has run (issue 42: a
    // `sleep 600` reported `ran_ms=601001` after ~20 s).
    let ran_s: f64 = how
        .rsplit_once(" after ")
        .and_then(|(_, t)| t.strip_suffix(" s"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {how:?}"));
    assert!(
        ran_s <= began.elapsed().as_secs_f64(),
        "{how}: longer than the {:.1} s the test ran",
        began.elapsed().as_secs_f64()
    );
}
