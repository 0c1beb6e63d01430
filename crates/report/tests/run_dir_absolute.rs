//! A run directory given relative (`--out results/x`, the default `headroom-results/<name>`)
//! is held absolute: the agent configs written below it name their state file and sockets by
//! it, and the agent refuses relative ones (seventh and eighth hostile passes).

use headroom_report::store::RunDir;

#[test]
fn a_relative_run_directory_gives_absolute_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = std::env::current_dir().unwrap();
    // The temporary directory spelled relative to the working directory.
    let up = "../".repeat(cwd.components().count() - 1);
    let below = tmp.path().strip_prefix("/").unwrap();
    let rel = std::path::PathBuf::from(up).join(below).join("run");
    assert!(rel.is_relative());
    let dir = RunDir::create(&rel).unwrap();
    assert!(dir.root().is_absolute(), "{}", dir.root().display());
    let state = dir.scratch_path("agent-x.state.json").unwrap();
    assert!(state.is_absolute(), "{}", state.display());
    assert!(
        tmp.path().join("run/raw").is_dir(),
        "made where the relative path said"
    );
}
