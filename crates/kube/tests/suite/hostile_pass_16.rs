//! The sixteenth hostile pass (issue 42, docs/safety-hostile-pass-16.md): a kubeconfig another
//! user could write had root run its exec plugin, and the files a kubeconfig names (its
//! certificate authority, client certificate and key, token file) were read by kube-rs without
//! a bound or a check (a FIFO hung the start). Each is now refused by name, before anything is
//! run or read whole.

use crate::client_start;
use std::path::Path;

use crate::as_root::{chmod, is_root};

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

/// A kubeconfig for a server nobody answers on, its user given by `user` (YAML lines).
fn kubeconfig(user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n\
         - name: u\n  user:\n{user}\n"
    )
}

#[test]
fn a_kubeconfig_another_user_could_write_never_runs_its_exec_plugin() {
    const TEST: &str = "a_kubeconfig_another_user_could_write_never_runs_its_exec_plugin";
    if !is_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let marker = dir.path().join("ran");
    let plugin = dir.path().join("plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nid -u > {}\necho '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\"}}}}'\n",
            marker.display()
        ),
    )
    .unwrap();
    chmod(&plugin, 0o755);
    let text = kubeconfig(&format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      interactiveMode: Never",
        plugin.display()
    ));
    // (owner uid, group gid, mode, what the refusal must name)
    let cases = [
        (65534, 65534, 0o644, "owned by uid 65534"),
        (0, 0, 0o666, "mode 0666"),
        (0, 65534, 0o664, "gid 65534"),
    ];
    for (uid, gid, mode, named) in cases {
        let kc = dir.path().join(format!("kc-{uid}-{gid}-{mode:o}"));
        std::fs::write(&kc, &text).unwrap();
        chown(&kc, uid, gid);
        chmod(&kc, mode);
        let _ = std::fs::remove_file(&marker);
        let said = client_start::start_within_20_s(&kc).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !marker.exists(),
            "{}: a kubeconfig (uid {uid}, gid {gid}, mode {mode:04o}) another user could write had its exec plugin run as uid {}",
            kc.display(),
            std::fs::read_to_string(&marker).unwrap_or_default().trim()
        );
        assert!(
            said.starts_with("error")
                && said.contains(named)
                && said.contains(&*kc.to_string_lossy()),
            "{said}"
        );
    }
    // root's own kubeconfig still runs root's plugin
    let kc = dir.path().join("kc-root");
    std::fs::write(&kc, &text).unwrap();
    chmod(&kc, 0o600);
    let _ = std::fs::remove_file(&marker);
    assert_eq!(client_start::start_within_20_s(&kc).unwrap(), "ok");
    assert!(marker.exists(), "root's kubeconfig's plugin did not run");
    // a plugin another user owns, named by root's kubeconfig, is refused
    chown(&plugin, 65534, 65534);
    let _ = std::fs::remove_file(&marker);
    let said = client_start::start_within_20_s(&kc).unwrap();
    assert!(
        !marker.exists() && said.contains("exec command") && said.contains("owned by uid 65534"),
        "{said}"
    );
}

#[test]
fn the_files_a_kubeconfig_names_are_bounded_and_must_be_roots() {
    const TEST: &str = "the_files_a_kubeconfig_names_are_bounded_and_must_be_roots";
    if !is_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let at = |name: &str| dir.path().join(name);
    let fifo = at("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    std::fs::write(at("theirs"), "stranger-token\n").unwrap();
    chown(&at("theirs"), 65534, 65534);
    // 2 MiB: past the 1 MiB bound (a key, a certificate or a token is a few KiB)
    std::fs::File::create(at("large"))
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let cases = [
        // (the user's lines, the cluster's line, what the refusal must name)
        ("    token: t", "    certificate-authority: fifo", "FIFO"),
        ("    tokenFile: fifo", "", "FIFO"),
        ("    tokenFile: theirs", "", "owned by uid 65534"),
        (
            "    client-certificate: theirs\n    client-key: theirs",
            "",
            "owned by uid 65534",
        ),
        (
            "    client-certificate: large\n    client-key: large",
            "",
            "1 MiB",
        ),
    ];
    for (i, (user, cluster, named)) in cases.iter().enumerate() {
        let mut text = kubeconfig(user);
        if !cluster.is_empty() {
            text = text.replace(
                "    server: http://127.0.0.1:1\n",
                &format!("    server: http://127.0.0.1:1\n{cluster}\n"),
            );
        }
        let kc = at(&format!("kc-{i}"));
        std::fs::write(&kc, &text).unwrap();
        let said = client_start::start_within_20_s(&kc)
            .unwrap_or_else(|e| panic!("{user} {cluster}: {e}"));
        assert!(
            said.starts_with("error") && said.contains(named),
            "{user} {cluster}: a file the kubeconfig names was taken: {said}"
        );
    }
    // root's own token file is still taken
    std::fs::write(at("token"), "t\n").unwrap();
    let kc = at("kc-good");
    std::fs::write(&kc, kubeconfig("    tokenFile: token")).unwrap();
    assert_eq!(client_start::start_within_20_s(&kc).unwrap(), "ok");
}
