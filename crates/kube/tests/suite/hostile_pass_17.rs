//! The seventeenth hostile pass (issue 42, docs/safety-hostile-pass-17.md): pass 16 checked a
//! kubeconfig's exec plugin named by a path (its owner and mode), but not the gcp auth
//! provider's `cmd-path`, which kube-rs also runs as this user (root, for the agent), nor the
//! directories a plugin lies in (another user's directory lets them replace root's plugin
//! between the check and the run, or before kube-rs runs it again to refresh an expired
//! credential), nor a bare name looked up on the `PATH`. Each is now refused by name, before
//! anything runs.

use crate::client_start;
use std::path::Path;

use crate::as_root::{chmod, is_root};

/// A root kubeconfig (0600) at `kc` for a server nobody answers on, its user given by `user`.
fn write_kubeconfig(kc: &Path, user: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n\
         - name: u\n  user:\n{user}\n"
    );
    std::fs::write(kc, text).unwrap();
    chmod(kc, 0o600);
}

/// A plugin script at `path` (mode 0755) that writes its uid to `marker` and prints a token.
fn write_plugin(path: &Path, marker: &Path, gcp: bool) {
    let out = if gcp {
        "printf t".to_string()
    } else {
        "echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t\"}}'".to_string()
    };
    std::fs::write(
        path,
        format!("#!/bin/sh\nid -u > {}\n{out}\n", marker.display()),
    )
    .unwrap();
    chmod(path, 0o755);
}

fn exec_user(command: &str, env_path: Option<&Path>) -> String {
    let env = env_path
        .map(|p| {
            format!(
                "\n      env:\n      - name: PATH\n        value: {}",
                p.display()
            )
        })
        .unwrap_or_default();
    format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {command}\n      interactiveMode: Never{env}"
    )
}

fn gcp_user(cmd_path: &Path) -> String {
    format!(
        "    auth-provider:\n      name: gcp\n      config:\n        cmd-path: {}",
        cmd_path.display()
    )
}

#[test]
fn the_gcp_auth_providers_command_is_checked_as_an_exec_plugin_is() {
    const TEST: &str = "the_gcp_auth_providers_command_is_checked_as_an_exec_plugin_is";
    if !is_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let marker = dir.path().join("ran");
    let plugin = dir.path().join("gcp.sh");
    write_plugin(&plugin, &marker, true);
    let kc = dir.path().join("kc");
    write_kubeconfig(&kc, &gcp_user(&plugin));
    // root's plugin in root's directory runs
    assert_eq!(client_start::start(&kc), "ok");
    assert!(marker.exists(), "root's gcp cmd-path did not run");
    // one uid 65534 owns does not
    std::os::unix::fs::chown(&plugin, Some(65534), Some(65534)).unwrap();
    let _ = std::fs::remove_file(&marker);
    let said = client_start::start(&kc);
    assert!(
        !marker.exists(),
        "root's kubeconfig had uid 65534's gcp cmd-path {} run as uid {}: {said}",
        plugin.display(),
        std::fs::read_to_string(&marker).unwrap_or_default().trim()
    );
    assert!(
        said.starts_with("error") && said.contains("cmd-path") && said.contains("uid 65534"),
        "{said}"
    );
}

#[test]
fn a_plugin_in_a_directory_another_user_may_write_never_runs() {
    const TEST: &str = "a_plugin_in_a_directory_another_user_may_write_never_runs";
    if !is_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let marker = dir.path().join("ran");
    // uid 65534's directory, holding a plugin of root's (0755): uid 65534 may replace it
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let plugin = theirs.join("kube-plugin-p17");
    write_plugin(&plugin, &marker, false);
    // a link of root's, in root's directory, to that plugin
    let link = dir.path().join("link-plugin");
    std::os::unix::fs::symlink(&plugin, &link).unwrap();
    let gcp_plugin = theirs.join("gcp.sh");
    write_plugin(&gcp_plugin, &marker, true);
    let kc = dir.path().join("kc");
    let cases = [
        (
            "by its path",
            exec_user(&plugin.display().to_string(), None),
        ),
        (
            "through a link",
            exec_user(&link.display().to_string(), None),
        ),
        (
            "by a bare name on the PATH",
            exec_user("kube-plugin-p17", Some(&theirs)),
        ),
        ("as gcp's cmd-path", gcp_user(&gcp_plugin)),
    ];
    for (how, user) in &cases {
        write_kubeconfig(&kc, user);
        let _ = std::fs::remove_file(&marker);
        let said = client_start::start(&kc);
        assert!(
            !marker.exists(),
            "a plugin in uid 65534's directory {}, named {how}, ran as uid {}: {said}",
            theirs.display(),
            std::fs::read_to_string(&marker).unwrap_or_default().trim()
        );
        assert!(
            said.starts_with("error") && said.contains(&*theirs.to_string_lossy()),
            "{how}: {said}"
        );
    }
    // the same plugins in a directory of root's run, by path, link and bare name
    std::os::unix::fs::chown(&theirs, Some(0), Some(0)).unwrap();
    for (how, user) in &cases {
        write_kubeconfig(&kc, user);
        let _ = std::fs::remove_file(&marker);
        assert_eq!(client_start::start(&kc), "ok", "{how}");
        assert!(marker.exists(), "{how}: root's plugin did not run");
    }
}
