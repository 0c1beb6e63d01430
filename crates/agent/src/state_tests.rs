//! The state file's paths, the groups a later config dropped (sixth hostile pass).

use super::*;

fn g(p: &str) -> GroupPath {
    GroupPath::new(p).unwrap()
}

fn with_originals(groups: &[&str]) -> AgentState {
    let mut st = AgentState::empty();
    for p in groups {
        st.originals.push(OriginalValue {
            knob: Knob::cgroup(&g(p), CgroupKnob::Frozen),
            value: KnobValue::Frozen(false),
        });
    }
    st
}

/// `state_file = "/dev/null"` had the host's `/dev/null` set aside as corrupt and replaced
/// by a regular file; a config file named as the state file was moved away. Both refused.
#[test]
fn a_state_file_path_naming_a_device_or_another_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("headroom.toml");
    std::fs::write(&config, "[lc]\nname = \"x\"\n").unwrap();
    for (path, what) in [
        (Path::new("/dev/null"), "is a device"),
        (dir.path(), "is a directory"),
        (config.as_path(), "holds something else"),
    ] {
        match check_path(path) {
            Err(StateError::NotAStateFile { what: w, .. }) => assert!(w.contains(what), "{w}"),
            other => panic!("{}: {other:?}", path.display()),
        }
    }
    assert!(matches!(
        load(&config),
        Err(StateError::NotAStateFile { .. })
    ));
    // torn or empty: set aside as before
    for text in ["", "{\"version\": 2, \"pid\": 12"] {
        let p = dir.path().join("state.json");
        std::fs::write(&p, text).unwrap();
        check_path(&p).unwrap();
        assert!(matches!(load(&p), Err(StateError::Invalid { .. })));
    }
    check_path(&dir.path().join("absent.json")).unwrap();
}

/// In a directory others can write, links planted at `<state>.tmp` and `<state>.lock` had
/// the agent (root) truncate and write their targets. Neither is followed now.
#[test]
fn links_planted_beside_the_state_file_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let state = dir.path().join("state.json");
    std::os::unix::fs::symlink(&victim, dir.path().join("state.json.tmp")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("state.json.lock")).unwrap();
    store(&state, &AgentState::empty()).unwrap();
    assert!(load(&state).unwrap().is_some(), "the state is written");
    let lock = StateLock::acquire(&state);
    assert!(lock.is_err(), "a linked lock file is refused");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

/// The config's groups changed between two runs: the state's groups it still names make
/// the start a restart; those it dropped are released with the role they had.
#[test]
fn the_groups_a_config_dropped_are_named_with_their_role() {
    let mut st = with_originals(&["t/lc", "t/be", "t/old", "t/pending"]);
    st.lc_groups = vec![g("t/lc")];
    for (name, grp, command) in [("a", "t/be", true), ("b", "t/old", false)] {
        let rec = RecordedBe {
            group: g(grp),
            command,
            argv: None,
        };
        st.be_groups.insert(name.into(), rec);
    }
    let now = ManagedGroups {
        lc: g("t/lc2"),
        be: vec![g("t/be"), g("t/new")],
    };
    let lcs = [g("t/lc2")];
    assert!(st.names_any(&now, &lcs));
    assert!(st.records_be(&g("t/be")) && !st.records_be(&g("t/new")));
    let dropped = st.dropped_groups(&now, &lcs);
    let seen: Vec<(&str, EarlierRole, Option<bool>)> = dropped
        .iter()
        .map(|d| (d.group.as_str(), d.role, d.command))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("t/old", EarlierRole::Be, Some(false)),
            ("t/lc", EarlierRole::Lc, Some(false)),
            // originals with no role (a release an agent did not finish)
            ("t/pending", EarlierRole::Be, None),
        ]
    );
    let other = ManagedGroups {
        lc: g("u/lc"),
        be: vec![g("u/be")],
    };
    assert!(!st.names_any(&other, &[g("u/lc")]));
    // an older agent's file: no roles, every group it names
    let old = with_originals(&["t/lc", "t/be"]);
    assert!(old.records_be(&g("t/be")));
    assert_eq!(old.dropped_groups(&other, &[g("u/lc")]).len(), 2);
}

/// Pass 18's low: the state file was 0644 (others could read the originals and pids). It is
/// written 0600, and one found readable by others is made 0600 when it is taken.
#[test]
fn the_state_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    store(&state, &AgentState::empty()).unwrap();
    assert_eq!(mode(&state), 0o600, "written");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(load(&state).unwrap().is_some());
    assert_eq!(mode(&state), 0o600, "taken");
}

/// Pass 20's low: a file at the state path was made 0600, through a link too, before it was
/// known to be a state file: root's 0644 file a link named became 0600, then the start was
/// refused. A link is refused by name, and a file is made 0600 only once it parses.
#[test]
fn nothing_is_chmodded_before_it_is_known_a_state_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    let state = dir.path().join("state.json");
    std::os::unix::fs::symlink(&victim, &state).unwrap();
    let e = load(&state).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(mode(&victim), 0o644, "the link's target untouched");
    std::fs::remove_file(&state).unwrap();
    std::fs::write(&state, "{\"not\": \"state\"}\n").unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(load(&state).is_err());
    assert_eq!(mode(&state), 0o644, "not a state file: untouched");
}

/// Pass 20's low: a restart tried its BE's own recorded pid, then every recorded pid, its
/// own again: one not adopted was warned about twice.
#[test]
fn each_recorded_pid_is_tried_once_its_own_first() {
    let mut state = AgentState::empty();
    state.owned_pids.insert("a".into(), 30);
    state.owned_pids.insert("b".into(), 20);
    state.owned_pids.insert("c".into(), 30);
    assert_eq!(state.adoptable_pids("b"), vec![20, 30]);
    assert_eq!(state.adoptable_pids("gone"), vec![30, 20]);
}
