//! The config read from its file: errors name the file (and the line).

use headroom_control::config::ConfigError;

#[test]
fn io_errors_name_the_file() {
    let err = headroom_agent::config_file::read_config(std::path::Path::new(
        "/nonexistent/headroom.toml",
    ))
    .unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(
        err.to_string().contains("/nonexistent/headroom.toml"),
        "{err}"
    );
}

#[test]
fn syntax_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[lc]\nname = \n").unwrap();
    let msg = headroom_agent::config_file::read_config(&path)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("bad.toml") && msg.contains("line 2"), "{msg}");
}
