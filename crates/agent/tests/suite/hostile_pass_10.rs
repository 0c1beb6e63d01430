//! The tenth hostile pass's defects, host side (issue 42, docs/safety-hostile-pass-10-host.md).
//! No group is made; the files are in temporary directories.

use std::os::unix::fs::{symlink, PermissionsExt};

use headroom_agent::runtime::DecisionLog;

/// The decision log was opened through whatever link its path named, at start and again when
/// the path no longer named the open file. In a directory others can write, a stranger
/// replaced the log with a link to a root-only file, and the next flush appended the agent's
/// lines to it (the reopen has no content check); a link planted before the start to an empty
/// or missing file was written too (tenth pass, live 23:34 with `nobody`'s links). Such a link
/// is not followed now; the operator's own link in a directory only they can write still is.
#[test]
fn a_link_in_a_directory_others_can_write_is_never_written_through() {
    let d = tempfile::tempdir().unwrap();
    let public = d.path().join("pub");
    std::fs::create_dir(&public).unwrap();
    // Others may write it (a directory another user made, or a shared one): no sticky bit.
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o777)).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();

    // Replaced under the agent.
    let log_path = public.join("agent.log");
    let mut log = DecisionLog::open(&log_path, 1 << 20).expect("a fresh log opens");
    log.write_line("{\"event\":\"first\"}");
    log.flush();
    std::fs::remove_file(&log_path).unwrap();
    symlink(&victim, &log_path).unwrap();
    log.write_line("{\"event\":\"after the link\"}");
    log.flush();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "the log's lines went through the planted link into its target"
    );
    assert!(
        std::fs::symlink_metadata(&log_path)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the stranger's link is left as it is"
    );

    // Planted before the start: an empty file passes the content check, a missing one is made.
    let empty = d.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let missing = d.path().join("made-by-the-agent");
    for (name, target) in [("early.log", &empty), ("dangling.log", &missing)] {
        let planted = public.join(name);
        symlink(target, &planted).unwrap();
        match DecisionLog::open(&planted, 1 << 20) {
            Ok(mut log) => {
                log.write_line("{\"event\":\"x\"}");
                log.flush();
                panic!(
                    "{name}: opened through a stranger's link; {} now holds {:?}",
                    target.display(),
                    std::fs::read_to_string(target).unwrap_or_default()
                );
            }
            Err(e) => assert!(e.to_string().contains("not followed"), "{name}: {e}"),
        }
    }
    assert_eq!(std::fs::read_to_string(&empty).unwrap(), "");
    assert!(
        !missing.exists(),
        "a file was made where the dangling link pointed"
    );

    // The operator's own link, in a directory only they (or root) can write, is followed.
    let own = d.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
    let target = own.join("real.log");
    symlink(&target, own.join("link.log")).unwrap();
    let mut log = DecisionLog::open(&own.join("link.log"), 1 << 20)
        .expect("a link in the operator's own directory is followed");
    log.write_line("{\"event\":\"own\"}");
    log.flush();
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "{\"event\":\"own\"}\n"
    );
}

/// A state file another user wrote was trusted: `nobody` planted one in the state file's
/// directory (a 1777 one standing for /tmp) after a clean exit had removed root's, with the
/// LC's origin groups pointing at a group of its making (cpuset 0, a 1% quota); root's agent
/// started from it and its `restore` exit moved the LC there (tenth pass, live 23:44). A state
/// file owned by another user, or writable by others, now refuses the start (exit 2) and is
/// kept for the operator to read; the agent's own (0644 whatever the umask) still loads.
#[test]
fn a_state_file_another_user_could_have_written_is_not_trusted() {
    use headroom_agent::state::{self, AgentState, StateError};
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("state.json");
    state::store(&path, &AgentState::empty()).unwrap();
    assert!(
        state::load(&path).unwrap().is_some(),
        "the agent's own file loads"
    );

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    match state::load_or_set_aside(&path) {
        Err(StateError::NotTrusted { why, .. }) => assert!(why.contains("writable"), "{why}"),
        other => panic!("a state file anyone may write was read: {other:?}"),
    }
    assert!(path.exists(), "kept in place for the operator");

    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP a_state_file_another_user_could_have_written_is_not_trusted (owner part): needs root to chown");
        return;
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    match state::load_or_set_aside(&path) {
        Err(StateError::NotTrusted { why, .. }) => assert!(why.contains("65534"), "{why}"),
        other => panic!("a state file owned by uid 65534 was read: {other:?}"),
    }
}
