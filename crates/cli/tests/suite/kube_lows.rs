//! Lows of the tenth and eleventh hostile passes on the Kubernetes side (issue 42,
//! docs/safety-hostile-pass-11-kube.md "Found, not fixed"), through the binary.
//!
//! - an absent or unparsable `[kubernetes] kubeconfig` exited 1, where the other config paths
//!   naming what the host lacks exit 2: now a start error of the config, exit 2, naming the
//!   path and the fix, with nothing made.
#![cfg(feature = "kube")]

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

/// An agent config with discovery and advertise, whose kubeconfig is `kubeconfig`, its BE group
/// `be` (below the cgroup root; never made by a start that is refused).
fn config(d: &Path, kubeconfig: &Path, be: &str) -> std::path::PathBuf {
    let cfg = d.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[kubernetes]\ndiscover = true\nadvertise = true\nnode_name = \"node-a\"\n\
             kubeconfig = \"{kc}\"\ncgroup_layout = \"cgroupfs\"\n\n\
             [[be]]\nname = \"pods\"\ncgroup = \"{be}\"\n\n\
             [policy]\nkind = \"multi\"\n\n\
             [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
             [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
            kc = kubeconfig.display(),
            d = d.display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn a_kubeconfig_the_host_lacks_or_cannot_parse_refuses_the_start_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let absent = d.join("no-such-kubeconfig");
    let garbage = d.join("garbage-kubeconfig");
    std::fs::write(&garbage, "clusters: [unclosed\n").unwrap();
    for kc in [&absent, &garbage] {
        // kube-discover
        let out = Command::new(BIN)
            .args([
                "kube-discover",
                "--node",
                "node-a",
                "--once",
                "--for-s",
                "5",
            ])
            .arg("--kubeconfig")
            .arg(kc)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The code before: Some(1).
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", kc.display());
        assert!(stderr.contains(&kc.display().to_string()), "{stderr}");
        assert!(
            stderr.contains("name a kubeconfig file"),
            "the fix: {stderr}"
        );
        // the agent: refused before it touches the host
        let be = format!("kube-lows-e-{}/be", std::process::id());
        let cfg = config(d, kc, &be);
        let out = Command::new(BIN)
            .args(["agent", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", kc.display());
        assert!(stderr.contains(&kc.display().to_string()), "{stderr}");
        assert!(stderr.contains("name a kubeconfig file"), "{stderr}");
        assert!(!d.join("state.json").exists(), "no state file made");
        assert!(!d.join("ctl.sock").exists(), "no socket made");
        let top = be.split('/').next().unwrap();
        assert!(
            !Path::new("/sys/fs/cgroup").join(top).exists(),
            "no group made: {top}"
        );
    }
}
