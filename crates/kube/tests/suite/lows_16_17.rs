//! A low of the seventeenth hostile pass (docs/safety-hostile-pass-17.md, "Found, not fixed"):
//! every user and cluster of a kubeconfig was checked, so a file or plugin named by an entry
//! the current context does not use refused the whole kubeconfig. Only the current context's
//! user and cluster are checked and used now; another's is at most a warning.

use crate::client_start;
use std::path::Path;

use crate::as_root::{chmod, is_root};

/// Two contexts: `used` (current) with user `u` on cluster `c`, and `other` with user
/// `stranger` (given by `stranger`, YAML lines) on cluster `far`, whose CA is `far_ca`.
fn kubeconfig(u: &str, stranger: &str, far_ca: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n\
         - name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         - name: far\n  cluster:\n    server: http://127.0.0.1:2\n    certificate-authority: {ca}\n\
         contexts:\n- name: used\n  context: {{cluster: c, user: u}}\n\
         - name: other\n  context: {{cluster: far, user: stranger}}\n\
         current-context: used\nusers:\n- name: u\n  user:\n{u}\n- name: stranger\n  user:\n{stranger}\n",
        ca = far_ca.display()
    )
}

const UNUSED: &str = "a_refused_file_of_a_user_the_current_context_does_not_use_refuses_nothing";

#[test]
fn a_refused_file_of_a_user_the_current_context_does_not_use_refuses_nothing() {
    if !is_root(UNUSED) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let fifo = dir.path().join("token-fifo");
    client_start::mkfifo(&fifo);
    let theirs = dir.path().join("their-token");
    std::fs::write(&theirs, "t").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let ca_fifo = dir.path().join("ca-fifo");
    client_start::mkfifo(&ca_fifo);
    let plain = "    token: t";
    // (the unused user's lines, what it is)
    let strangers = [
        (
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: l17-no-such-plugin\n      interactiveMode: Never".to_string(),
            "an exec plugin this host lacks",
        ),
        (format!("    tokenFile: {}", fifo.display()), "a FIFO token file"),
        (
            format!("    tokenFile: {}", theirs.display()),
            "uid 65534's token file",
        ),
    ];
    for (i, (stranger, what)) in strangers.iter().enumerate() {
        let kc = dir.path().join(format!("kc-{i}"));
        std::fs::write(&kc, kubeconfig(plain, stranger, &ca_fifo)).unwrap();
        chmod(&kc, 0o600);
        let said = client_start::start(&kc);
        assert_eq!(
            said, "ok",
            "{what} named by a user the current context does not use (and a FIFO CA of a cluster it does not use) refused the kubeconfig"
        );
    }
    // The user the current context uses is still checked.
    let kc = dir.path().join("kc-used");
    let used = format!("    tokenFile: {}", fifo.display());
    std::fs::write(&kc, kubeconfig(&used, plain, &ca_fifo)).unwrap();
    chmod(&kc, 0o600);
    let said = client_start::start(&kc);
    assert!(
        said.contains("tokenFile") && said.contains("FIFO"),
        "the current user's FIFO token file: {said}"
    );
}
