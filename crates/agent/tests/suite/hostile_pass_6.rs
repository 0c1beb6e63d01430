//! The fifth hostile pass's defects left open, and the sixth pass's (issue 42,
//! docs/safety-hostile-pass-6.md): the config's groups changed between two runs (a BE group
//! added made the whole start a first start, the earlier agent's BE spared beside a second; a
//! BE group dropped stayed frozen for good, its record overwritten); an earlier agent's BE
//! that no state file recorded spared as an operator's and left running at `restore`; a BE
//! group someone left frozen kept BE frozen while "enabled". Live tests need root (cgroups)
//! and print SKIP otherwise; their groups are `hp6-*`, removed (processes killed first) by a
//! guard, also when a test fails.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_agent::runtime::Agent;
use headroom_host::{Cgroups, FreezeState};
use headroom_types::GroupPath;

use live::marked::{alive, groups_of, sleeps_with_marker, MarkedGroup as Guard};

/// Root with a writable cgroupfs and a fresh `hp6-<name>-<pid>` top group, or `None` after a
/// SKIP line. `id` (one per test) makes the marker unique among the tests running together.
fn setup(test: &str, name: &str, id: u32) -> Option<Guard> {
    Guard::setup(test, "hp6", 6, name, id)
}

/// A config on `top`: the LC pid `lc` in `top/lc`, one `[[be]]` per (name, group, argument of
/// `sleep`), static cores (CPU 0 for the LC), `on_exit`, the state file `state`, the socket in
/// `dir`.
fn config(
    top: &GroupPath,
    lc: u32,
    bes: &[(&str, &str, String)],
    on_exit: &str,
    state: &Path,
    dir: &Path,
) -> String {
    let be: String = bes
        .iter()
        .map(|(name, group, arg)| {
            format!(
                "[[be]]\nname = \"{name}\"\ncgroup = \"{top}/{group}\"\ncommand = [\"sleep\", \"{arg}\"]\n\n"
            )
        })
        .collect();
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc}]\n\n{be}\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"{on_exit}\"\nstate_file = \"{}\"\n\n\
         [api]\nsocket = \"{}/ctl.sock\"\nmetrics = \"\"\n",
        state.display(),
        dir.display()
    )
}

/// Runs an agent on `text` for `run_for` in this thread; `Err` (for a SKIP line) when it does
/// not start here.
fn run_once(text: &str, run_for: Duration) -> Result<(), String> {
    let agent = Agent::start(live::options(text, run_for))
        .map_err(|e| format!("the agent does not start here: {e}"))?;
    agent
        .run()
        .map(|_| ())
        .map_err(|e| format!("the run failed: {e}"))
}

/// `ctl status` as JSON (read field by field, so this file builds against the code before the
/// fixes, whose status lacks the fields they added).
fn status(sock: &Path) -> Option<serde_json::Value> {
    let answer = request(sock, &Request::Status).ok()?;
    let st = serde_json::to_value(answer).ok()?;
    st.get("status").filter(|s| s.is_object()).cloned()
}

/// A list of strings in `status` at `key` (empty when absent).
fn strings(status: Option<&serde_json::Value>, key: &str) -> Vec<String> {
    status
        .and_then(|s| s.get(key))
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn frozen(cg: &Cgroups, g: &GroupPath) -> bool {
    cg.freeze_state(g)
        .is_ok_and(|s| s != headroom_host::FreezeState::Thawed)
}

const ADDED: &str = "a_be_group_added_between_runs_keeps_the_earlier_agents_be";

/// A run with one BE group and `on_exit = "freeze"`, then one with a second BE group: the
/// state file no longer named every group, so the start was a first start — the earlier
/// agent's BE was spared as "no agent launched" and a second copy launched beside it. The
/// state file's group is a restart now: its BE adopted, one copy.
#[test]
fn a_be_group_added_between_runs_keeps_the_earlier_agents_be() {
    let Some(guard) = setup(ADDED, "added", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let lc = live::Children::sleepers(1);
    let (m1, m2) = (format!("{}1", guard.marker), format!("{}2", guard.marker));
    let one = [("batch", "be", m1.clone())];
    let text = config(&guard.top, lc.pid(0), &one, "freeze", &state, dir.path());
    if let Err(why) = run_once(&text, Duration::from_millis(1500)) {
        return eprintln!("SKIP {ADDED}: {why}");
    }
    let first = sleeps_with_marker(&m1);
    assert_eq!(first.len(), 1, "run 1 left its BE (frozen): {first:?}");
    let two = [("batch", "be", m1.clone()), ("batch2", "be2", m2.clone())];
    let text = config(&guard.top, lc.pid(0), &two, "restore", &state, dir.path());
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {ADDED}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    live::eventually(Duration::from_secs(5), || {
        status(&sock).is_some() && !sleeps_with_marker(&m2).is_empty()
    });
    let during = sleeps_with_marker(&m1);
    let second = sleeps_with_marker(&m2);
    let result = runner.join();
    let after: Vec<u32> = sleeps_with_marker(&guard.marker);
    assert!(matches!(result, Ok(Ok(_))), "run 2: {result:?}");
    assert_eq!(
        during, first,
        "the earlier agent's BE {first:?} adopted, no second copy (run 2: {during:?})"
    );
    assert_eq!(second.len(), 1, "the new group's BE runs: {second:?}");
    assert!(after.is_empty(), "restore stopped every BE: {after:?}");
}

const DROPPED: &str = "a_be_group_dropped_between_runs_is_released";

/// A run with BE group `be` and `on_exit = "freeze"`, then one whose BE group is `batch`: the
/// old group stayed frozen with the earlier agent's BE in it, for good, and the state file
/// that recorded it was overwritten. It is released now as `restore` would (its BE stopped,
/// its originals back, the group the agent made removed) and said in `ctl status`.
#[test]
fn a_be_group_dropped_between_runs_is_released() {
    let Some(guard) = setup(DROPPED, "dropped", 2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let lc = live::Children::sleepers(1);
    let (m1, m2) = (format!("{}1", guard.marker), format!("{}2", guard.marker));
    let old = [("batch", "be", m1.clone())];
    let text = config(&guard.top, lc.pid(0), &old, "freeze", &state, dir.path());
    if let Err(why) = run_once(&text, Duration::from_millis(1500)) {
        return eprintln!("SKIP {DROPPED}: {why}");
    }
    let be = guard.top.join("be").unwrap();
    let left = sleeps_with_marker(&m1);
    assert_eq!(left.len(), 1, "run 1 left its BE: {left:?}");
    assert!(frozen(&guard.cgroups, &be), "run 1 left it frozen");
    let renamed = [("batch", "batch", m2.clone())];
    let text = config(
        &guard.top,
        lc.pid(0),
        &renamed,
        "restore",
        &state,
        dir.path(),
    );
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {DROPPED}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    let mut st = None;
    live::eventually(Duration::from_secs(5), || {
        st = status(&sock);
        st.is_some() && !sleeps_with_marker(&m2).is_empty()
    });
    let old_running: Vec<u32> = left.iter().copied().filter(|&p| alive(p)).collect();
    let still_frozen = frozen(&guard.cgroups, &be);
    let result = runner.join();
    let be_exists = guard.cgroups.exists(&be);
    assert!(matches!(result, Ok(Ok(_))), "run 2: {result:?}");
    assert!(
        old_running.is_empty(),
        "the earlier agent's BE in the dropped group still runs: {old_running:?} ({:?})",
        left.iter().map(|&p| groups_of(p)).collect::<Vec<_>>()
    );
    assert!(
        !still_frozen || !be_exists,
        "the dropped group {be} is still frozen"
    );
    let said = strings(st.as_ref(), "start_actions");
    assert!(
        said.iter().any(|a| a.contains(be.as_str())),
        "ctl status says it: {said:?}"
    );
    assert!(!be_exists, "the group the earlier agent made is removed");
}

const NO_STATE: &str = "an_earlier_agents_be_is_stopped_without_its_state_file";

/// The state file could not be written (its directory replaced by a file) while BE ran under
/// a pid no state names, then a kill -9 and the state gone at the restart: the first start
/// spared the earlier agent's BE as "no agent launched" and launched a second; `restore` then
/// left the earlier one running, thawed, with no agent. The agent's launches are marked now: a
/// first start stops them (an operator's process, unmarked, is still spared).
#[test]
fn an_earlier_agents_be_is_stopped_without_its_state_file() {
    let Some(guard) = setup(NO_STATE, "no-state", 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let lc = live::Children::sleepers(1);
    let m1 = format!("{}1", guard.marker);
    let bes = [("batch", "be", m1.clone())];
    let text = config(&guard.top, lc.pid(0), &bes, "freeze", &state, dir.path());
    if let Err(why) = run_once(&text, Duration::from_millis(1500)) {
        return eprintln!("SKIP {NO_STATE}: {why}");
    }
    let earlier = sleeps_with_marker(&m1);
    assert_eq!(earlier.len(), 1, "run 1 left its BE: {earlier:?}");
    // An operator's own process in the group (no mark): spared, as the third pass wants.
    let be = guard.top.join("be").unwrap();
    let mine = live::Children(vec![std::process::Command::new("sleep")
        .arg(format!("{}3", guard.marker))
        .spawn()
        .unwrap()]);
    guard.cgroups.move_process(&be, mine.pid(0) as i32).unwrap();
    std::fs::remove_file(&state).unwrap();
    let text = config(&guard.top, lc.pid(0), &bes, "restore", &state, dir.path());
    let runner = match live::start_agent(&text, Duration::from_secs(3)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {NO_STATE}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    let mut st = None;
    // (the group run 1 left frozen stays so after the kill of its BE until the policy thaws
    // it: the new BE execs only then)
    live::eventually(Duration::from_secs(5), || {
        st = status(&sock);
        st.is_some() && sleeps_with_marker(&m1).iter().any(|p| *p != earlier[0])
    });
    let during = sleeps_with_marker(&m1);
    let result = runner.join();
    let after = sleeps_with_marker(&m1);
    let operator_alive = alive(mine.pid(0));
    // thawed before the guard kills it (a frozen child is not reaped)
    let _ = guard.cgroups.thaw(&be);
    drop(mine);
    assert!(matches!(result, Ok(Ok(_))), "run 2: {result:?}");
    assert!(
        !during.contains(&earlier[0]),
        "the earlier agent's BE {earlier:?} was spared beside the new one: {during:?}"
    );
    assert_eq!(during.len(), 1, "one BE: {during:?}");
    assert!(after.is_empty(), "restore left a BE running: {after:?}");
    assert!(operator_alive, "the operator's own process was spared");
    let said = strings(st.as_ref(), "start_actions");
    assert!(
        said.iter().any(|a| a.contains("HEADROOM_BE_OWNER")),
        "ctl status says it: {said:?}"
    );
}

const UNWRITABLE: &str = "a_state_file_that_cannot_be_written_is_said_in_status";

/// The state file's directory replaced by a file: each write failed, said only as an error
/// line once a second. `ctl status` says it now until a write goes through.
#[test]
fn a_state_file_that_cannot_be_written_is_said_in_status() {
    let Some(guard) = setup(UNWRITABLE, "unwritable", 4) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sd = dir.path().join("sd");
    let state = sd.join("state.json");
    let lc = live::Children::sleepers(1);
    let bes = [("batch", "be", guard.marker.clone())];
    let text = config(&guard.top, lc.pid(0), &bes, "restore", &state, dir.path());
    let runner = match live::start_agent(&text, Duration::from_secs(6)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {UNWRITABLE}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    live::eventually(Duration::from_secs(5), || status(&sock).is_some());
    std::fs::remove_dir_all(&sd).unwrap();
    std::fs::write(&sd, "not a directory\n").unwrap();
    let mut error = None;
    live::eventually(Duration::from_secs(4), || {
        error =
            status(&sock).and_then(|s| s.get("state_write_error")?.as_str().map(str::to_string));
        error.is_some()
    });
    std::fs::remove_file(&sd).unwrap();
    let mut cleared = false;
    live::eventually(Duration::from_secs(4), || {
        cleared =
            status(&sock).is_some_and(|s| s.get("state_write_error").is_none_or(|e| e.is_null()));
        cleared
    });
    let result = runner.join();
    assert!(
        error.as_deref().is_some_and(|e| e.contains("state")),
        "ctl status says the state file is not written: {error:?}"
    );
    assert!(cleared, "and stops saying it once a write goes through");
    assert!(matches!(result, Ok(Ok(_))), "the run: {result:?}");
}

const LEFT_FROZEN: &str = "a_first_start_on_a_be_group_left_frozen_runs_be";

/// Thaws a group when dropped: declared last, it runs first, before the guards that kill and
/// wait (a frozen process takes no SIGKILL until thawed: the fifth pass's try of this test
/// hung in its teardown).
struct ThawFirst<'a>(&'a Cgroups, GroupPath);

impl Drop for ThawFirst<'_> {
    fn drop(&mut self) {
        if self.0.exists(&self.1) {
            let _ = self.0.thaw(&self.1);
        }
    }
}

/// A first start on a BE group someone left frozen: the freeze knob's target when BE is
/// enabled was the group's original, FROZEN, so BE never ran while `ctl status` said it was
/// enabled. Enabled is thawed now.
#[test]
fn a_first_start_on_a_be_group_left_frozen_runs_be() {
    let Some(guard) = setup(LEFT_FROZEN, "left-frozen", 5) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let lc = live::Children::sleepers(1);
    let be = guard.top.join("be").unwrap();
    guard.cgroups.create(&be).unwrap();
    let _thaw = ThawFirst(&guard.cgroups, be.clone());
    guard.cgroups.freeze(&be).unwrap();
    let bes = [("batch", "be", guard.marker.clone())];
    let text = config(&guard.top, lc.pid(0), &bes, "restore", &state, dir.path());
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {LEFT_FROZEN}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    let mut seen = (None, None);
    let thawed = live::eventually(Duration::from_secs(3), || {
        let enabled = status(&sock).and_then(|s| s.get("allocation")?.get("be_enabled")?.as_bool());
        seen = (enabled, guard.cgroups.freeze_state(&be).ok());
        enabled == Some(true) && seen.1 == Some(FreezeState::Thawed)
    });
    let mut running = Vec::new();
    live::eventually(Duration::from_secs(2), || {
        running = sleeps_with_marker(&guard.marker);
        running.len() == 1
    });
    let result = runner.join();
    let after = guard.cgroups.freeze_state(&be).ok();
    assert!(matches!(result, Ok(Ok(_))), "the run: {result:?}");
    assert!(
        thawed,
        "BE enabled but its group stays frozen: (be_enabled, freezer) = {seen:?}"
    );
    assert_eq!(running.len(), 1, "BE runs: {running:?}");
    assert_eq!(
        after,
        Some(FreezeState::Frozen),
        "restore puts the group's original back"
    );
}

/// `api.socket` naming another program's datagram socket (journald's `/dev/log`): a stream
/// connect to it fails whatever its use, so it was taken for stale, deleted and replaced —
/// the host's logging socket gone. Refused now, the socket kept.
#[test]
fn a_control_socket_path_naming_a_datagram_socket_never_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let theirs = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let served = headroom_agent::publish::control::serve(&path, stop.clone());
    let err = match served {
        Ok((_, thread)) => {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = std::os::unix::net::UnixStream::connect(&path);
            let _ = thread.join();
            String::from("served")
        }
        Err(e) => e.to_string(),
    };
    let client = std::os::unix::net::UnixDatagram::unbound().unwrap();
    let delivered = client.send_to(b"still theirs", &path).is_ok();
    let mut buf = [0u8; 32];
    theirs.set_nonblocking(true).unwrap();
    let got = theirs.recv(&mut buf).ok();
    assert!(
        delivered && got == Some(12),
        "the datagram socket was replaced ({err})"
    );
    assert!(err.contains("another program's socket"), "{err}");
}

const LC_FROZEN: &str = "an_lc_group_left_frozen_is_thawed_before_the_lc_joins_it";

/// An LC group someone left frozen (or an earlier agent's BE group, the two swapped between
/// runs): the agent moved the LC into it, and the LC stood still for the agent's whole run.
/// Thawed now before the LC joins it, and said in `ctl status`.
#[test]
fn an_lc_group_left_frozen_is_thawed_before_the_lc_joins_it() {
    let Some(guard) = setup(LC_FROZEN, "lc-frozen", 6) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let lc = live::Children::sleepers(1);
    let lc_group = guard.top.join("lc").unwrap();
    guard.cgroups.create(&lc_group).unwrap();
    let _thaw = ThawFirst(&guard.cgroups, lc_group.clone());
    guard.cgroups.freeze(&lc_group).unwrap();
    let bes = [("batch", "be", guard.marker.clone())];
    let text = config(&guard.top, lc.pid(0), &bes, "restore", &state, dir.path());
    let runner = match live::start_agent(&text, Duration::from_secs(3)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {LC_FROZEN}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    let mut st = None;
    live::eventually(Duration::from_secs(5), || {
        st = status(&sock);
        st.is_some()
    });
    let in_group = groups_of(lc.pid(0)).contains(&format!("/{lc_group}"));
    let lc_state = guard.cgroups.freeze_state(&lc_group).ok();
    let result = runner.join();
    let said = strings(st.as_ref(), "start_actions");
    assert!(matches!(result, Ok(Ok(_))), "the run: {result:?}");
    assert!(in_group, "the LC was moved into its group");
    assert_eq!(
        lc_state,
        Some(FreezeState::Thawed),
        "the LC stands still in a frozen group"
    );
    assert!(
        said.iter().any(|a| a.contains(lc_group.as_str())),
        "said: {said:?}"
    );
}

/// The agent's output paths naming what it must not replace: the decision log on a device (a
/// link to `/dev/null` here, never the host's own) was rotated at its cap — the path renamed
/// to `<path>.1`, a regular file made in its place: done to `/dev/null` itself, the host's
/// null device replaced; the decision log on the config file (appended to, its last line cut
/// as "torn"); links planted beside the state file in a world-writable directory (`<state>.tmp`
/// truncated and written through the link).
#[test]
fn the_decision_log_and_the_state_file_never_replace_what_their_paths_name() {
    use headroom_agent::runtime::DecisionLog;
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let mut log = DecisionLog::open(&link, 4096).unwrap();
    for i in 0..1000 {
        log.write_line(&format!("{{\"line\": {i}, \"pad\": \"................\"}}"));
    }
    log.flush();
    drop(log);
    let still_link = std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink());
    let config = dir.path().join("headroom.toml");
    let text = "[lc]\nname = \"kept\"";
    std::fs::write(&config, text).unwrap();
    let opened = DecisionLog::open(&config, 1 << 20).map(drop);
    let config_after = std::fs::read_to_string(&config).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("state.json.tmp")).unwrap();
    let stored = headroom_agent::state::store(
        &dir.path().join("state.json"),
        &headroom_agent::state::AgentState::empty(),
    );
    let victim_after = std::fs::read_to_string(&victim).unwrap();
    assert!(
        still_link && !dir.path().join("null.1").exists(),
        "the log at a link to /dev/null was rotated (the link renamed, a file made)"
    );
    assert!(opened.is_err(), "a config file taken as the decision log");
    assert_eq!(config_after, text, "the config file was written to");
    assert!(stored.is_ok(), "{stored:?}");
    assert_eq!(victim_after, "precious\n", "written through a planted link");
}

const STATE_DEVICE: &str = "a_state_file_path_naming_a_device_or_the_config_is_refused";

/// `safety.state_file = "/dev/null"` (a way to say "no state file"): the start read it as a
/// corrupt state file, set it aside — renamed the host's `/dev/null` — and wrote a regular
/// file in its place. The config file named as the state file was moved away the same way.
/// Refused now (exit 2), both kept. (A character device made here stands for `/dev/null`.)
#[test]
fn a_state_file_path_naming_a_device_or_the_config_is_refused() {
    let Some(guard) = setup(STATE_DEVICE, "state-device", 7) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("null");
    let made = std::process::Command::new("mknod")
        .arg(&dev)
        .args(["c", "1", "3"])
        .status();
    if !made.is_ok_and(|s| s.success()) {
        return eprintln!("SKIP {STATE_DEVICE}: mknod failed");
    }
    let lc = live::Children::sleepers(1);
    let bes = [("batch", "be", guard.marker.clone())];
    let config_path = dir.path().join("headroom.toml");
    let mut outcomes = Vec::new();
    for state in [dev.clone(), config_path.clone()] {
        let text = config(&guard.top, lc.pid(0), &bes, "restore", &state, dir.path());
        std::fs::write(&config_path, &text).unwrap();
        let outcome = match Agent::start(live::options(&text, Duration::from_secs(1))) {
            Ok(agent) => {
                let _ = agent.run();
                "started".to_string()
            }
            Err(e) => format!("refused (usage {}): {e}", e.is_usage()),
        };
        let kept = if state == dev {
            std::fs::symlink_metadata(&dev)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()))
        } else {
            std::fs::read_to_string(&config_path).is_ok_and(|t| t == text)
        };
        outcomes.push((state.display().to_string(), outcome, kept));
    }
    for (state, outcome, kept) in &outcomes {
        assert!(kept, "{state} was replaced ({outcome})");
        assert!(
            outcome.contains("refused (usage true)"),
            "{state}: {outcome}"
        );
    }
}
