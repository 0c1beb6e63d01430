//! A kubeconfig path naming a FIFO hung the start for ever, and `/dev/zero` (or any huge file)
//! was read whole (hostile pass 13, "Found, not fixed"): the file is now opened without waiting,
//! refused unless regular, bounded in size, and what was read is what kube-rs parses.

use crate::client_start;

use headroom_kube::kubeconfig_file::{self, MAX_KUBECONFIG_BYTES};

#[test]
fn a_kubeconfig_that_is_a_fifo_a_device_or_huge_is_refused_by_name_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo-kubeconfig");
    client_start::mkfifo(&fifo);
    let said = client_start::start_within_20_s(&fifo).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        said.starts_with("error (kubeconfig)")
            && said.contains("FIFO")
            && said.contains(&*fifo.to_string_lossy()),
        "{said}"
    );

    // A link to /dev/zero: refused on what the open file is, before a byte is read.
    let zero = dir.path().join("zero-kubeconfig");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let said = client_start::start_within_20_s(&zero).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        said.starts_with("error (kubeconfig)") && said.contains("character device"),
        "{said}"
    );

    // A regular file past the bound (sparse: no disk used).
    let huge = dir.path().join("huge-kubeconfig");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(MAX_KUBECONFIG_BYTES + 1)
        .unwrap();
    let said = client_start::start_within_20_s(&huge).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        said.starts_with("error (kubeconfig)")
            && said.contains("1 MiB")
            && said.contains("huge-kubeconfig"),
        "{said}"
    );

    // A good kubeconfig still makes a client (nothing is sent before a request).
    let good = dir.path().join("good-kubeconfig");
    std::fs::write(&good, PLAIN).unwrap();
    assert_eq!(client_start::start_within_20_s(&good).unwrap(), "ok");
}

const PLAIN: &str = r#"{"apiVersion": "v1", "kind": "Config",
 "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
 "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
 "current-context": "x", "users": [{"name": "u", "user": {}}]}"#;

const GOOD: &str = r#"apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: http://127.0.0.1:1
    certificate-authority: certs/ca.pem
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
users:
- name: u
  user:
    tokenFile: token
    exec: {command: ./bin/auth, apiVersion: client.authentication.k8s.io/v1}
"#;

/// Read from memory, the files the kubeconfig names by relative paths are still its directory's
/// (as kube-rs's own reader makes them).
#[test]
fn relative_paths_in_a_kubeconfig_are_its_directorys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(&path, GOOD).unwrap();
    let kc = kubeconfig_file::read(&path).unwrap();
    let at = |rel: &str| Some(dir.path().join(rel).to_string_lossy().into_owned());
    let cluster = kc.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.certificate_authority, at("certs/ca.pem"));
    let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(user.token_file, at("token"));
    assert_eq!(user.exec.as_ref().unwrap().command, at("./bin/auth"));
}
