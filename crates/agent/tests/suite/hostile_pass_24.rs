//! Hostile pass 24 (issue 42): the LC command the agent launched ended and its service manager
//! started it again; the agent followed the new process into the LC group (moving targets),
//! but at its exit recorded only the launched one, which had ended. `on_exit = "restore"` then
//! moved the followed process back out of the group, and the next start, finding none in the
//! group and none recorded, launched a second copy beside it (a routine restart doubled the
//! LC, as in pass 23).

use crate::live;

use std::time::Duration;

use live::marked::MarkedGroup as Guard;

const FOLLOWED: &str = "a_restart_after_restore_takes_the_followed_lc_command";

/// Agent one launches `sleep <marker>` as the LC command; the test kills that copy and starts
/// the same command itself (as a service manager restarting the LC would), which agent one
/// follows into the LC group; agent one stops with `restore`, which hands it back. Agent two,
/// on the same config, must launch none: the test's copy stays the only process running the
/// command, and it is taken into the LC group.
#[test]
fn a_restart_after_restore_takes_the_followed_lc_command() {
    let Some(guard) = Guard::setup(FOLLOWED, "hp24", 2, "followed-lc", 24) else {
        return;
    };
    let case = live::lc_command::LcCommand::new(guard);
    let (text, copies) = (&case.text, || case.copies());
    let in_group = |pid| case.in_lc_group(pid);
    let first = match live::start_agent(text, Duration::from_secs(6)) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {FOLLOWED}: {e}"),
    };
    let launched = copies();
    assert_eq!(launched.len(), 1, "agent one launched its LC: {launched:?}");
    // The launched copy ends; the LC's service manager (here, the test) starts it again.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launched[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    live::eventually(Duration::from_secs(10), || copies().is_empty());
    let mut again = std::process::Command::new("sleep")
        .arg(&case.guard.marker)
        .spawn()
        .unwrap();
    let again_pid = again.id();
    // Agent one follows it into the LC group (checked once a second).
    let followed = live::eventually(Duration::from_secs(10), || in_group(again_pid));
    first
        .join()
        .unwrap()
        .expect("the first agent ran and restored");
    assert!(
        followed,
        "agent one never followed the LC's new process into its group"
    );
    let before = copies();
    assert_eq!(before, vec![again_pid], "after agent one's restore");
    let second = live::start_agent(text, Duration::from_millis(1200))
        .expect("the second agent starts after the first's restore");
    let during = copies();
    let taken = in_group(again_pid);
    second
        .join()
        .unwrap()
        .expect("the second agent ran and restored");
    let _ = again.kill();
    let _ = again.wait();
    assert_eq!(
        during, before,
        "the restart launched the LC command again beside the followed one a restore left running"
    );
    assert!(
        taken,
        "the followed LC {again_pid} was not taken into its group"
    );
}

const TWO_SERVICES: &str = "a_services_follow_leaves_another_services_command_in_its_group";

/// Pass 24's low: two LC services run one command line (`sleep <marker>`); when service a's
/// launched command ends, its follow looks for processes running that command and took
/// service b's, emptying b's group. b's process must stay in b's group.
#[test]
fn a_services_follow_leaves_another_services_command_in_its_group() {
    let Some(guard) = Guard::setup(TWO_SERVICES, "hp24", 2, "two-services", 25) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let top = &guard.top;
    let d = dir.path().display();
    let lc = |name: &str| {
        format!(
            "[[lc]]\nname = \"{name}\"\ncgroup = \"{top}/{name}\"\ncommand = [\"sleep\", \"{}\"]\n\n",
            guard.marker
        )
    };
    let text = format!(
        "{a}{b}[[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"60\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        a = lc("a"),
        b = lc("b"),
    );
    let members = |name: &str| -> Vec<u32> {
        let g = headroom_types::GroupPath::new(&format!("{top}/{name}")).unwrap();
        let mut v: Vec<u32> = guard
            .cgroups
            .procs(&g)
            .unwrap_or_default()
            .into_iter()
            .map(|p| p as u32)
            .collect();
        v.sort_unstable();
        v
    };
    let agent = match live::start_agent(&text, Duration::from_secs(5)) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {TWO_SERVICES}: {e}"),
    };
    let (a, b) = (members("a"), members("b"));
    // a's launched command ends; the agent looks for it once a second.
    if let Some(&pid) = a.first() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    std::thread::sleep(Duration::from_millis(2500));
    let (a_after, b_after) = (members("a"), members("b"));
    agent.join().unwrap().expect("the agent ran and restored");
    assert_eq!(
        (a.len(), b.len()),
        (1, 1),
        "each service launched its command"
    );
    assert_eq!(
        b_after, b,
        "service b's command was taken into service a's group ({a_after:?})"
    );
    assert!(a_after.is_empty(), "service a's group: {a_after:?}");
}
