//! Lows of the sixteenth and seventeenth hostile passes (issue 42,
//! docs/safety-hostile-pass-16.md and -17.md "Found, not fixed"), through the binary:
//!
//! - a kubeconfig found through `KUBECONFIG` whose named files are refused fell back to the
//!   in-cluster config and, without one, exited 1: now exit 2 with the refusal, as
//!   `--kubeconfig` does;
//! - `sim fleet --agent-config` read its file whole and waiting (a FIFO hung it): now read as
//!   the agent's config is (never waiting, a regular file, bounded), exit 2 naming it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// `cmd` run to its end, or killed after `bound` (a hang detector): `Err` with what it is.
fn bounded(mut cmd: Command, bound: Duration, what: &str) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + bound;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: still running after {bound:?}; killed"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output().unwrap())
}

/// Whether this runs as root (the kubeconfig rule takes root's files here).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

const KUBECONFIG_ENV: &str = "a_kubeconfig_through_kubeconfig_naming_a_refused_file_exits_2";

#[cfg(feature = "kube")]
#[test]
fn a_kubeconfig_through_kubeconfig_naming_a_refused_file_exits_2() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        return eprintln!("SKIP {KUBECONFIG_ENV}: needs root (a file owned by uid 65534)");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fifo = d.join("token-fifo");
    mkfifo(&fifo);
    let theirs = d.join("their-ca.pem");
    std::fs::write(&theirs, "not a cert").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    // (the user's and cluster's extra lines, the file the refusal must name, and why)
    let cases = [
        ("    tokenFile: ", &fifo, "", "FIFO"),
        (
            "",
            &theirs,
            "    certificate-authority: ",
            "owned by uid 65534",
        ),
    ];
    for (i, (user_key, file, cluster_key, why)) in cases.iter().enumerate() {
        let (user, cluster) = if user_key.is_empty() {
            (
                "    token: t".to_string(),
                format!("\n{cluster_key}{}", file.display()),
            )
        } else {
            (format!("{user_key}{}", file.display()), String::new())
        };
        let kc = d.join(format!("kc-{i}"));
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1{cluster}\n\
                 contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n\
                 users:\n- name: u\n  user:\n{user}\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args([
            "kube-discover",
            "--node",
            "node-a",
            "--once",
            "--for-s",
            "5",
        ])
        .env("KUBECONFIG", &kc)
        .env("HOME", d)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
        let out = bounded(cmd, Duration::from_secs(30), "kube-discover").unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The code before: exit 1, "no API config: in-cluster: …; kubeconfig: …".
        assert_eq!(
            out.status.code(),
            Some(2),
            "KUBECONFIG naming {} ({why}): {stderr}",
            file.display()
        );
        assert!(
            stderr.contains(&file.display().to_string()) && stderr.contains(why),
            "the refusal names the file and why: {stderr}"
        );
        assert!(!stderr.contains("in-cluster"), "no fallback: {stderr}");
    }
}

const SIM_CONFIG: &str = "sim_fleets_agent_config_is_read_bounded_and_never_waits";

#[test]
fn sim_fleets_agent_config_is_read_bounded_and_never_waits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("agent-fifo.toml");
    mkfifo(&fifo);
    let zero = d.join("agent-zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let huge = d.join("agent-huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len((4 << 20) + 1)
        .unwrap();
    // The FIFO first: the code before hung on it (and on /dev/zero grew without end).
    for (file, says) in [
        (&fifo, "not a regular file"),
        (&zero, "not a regular file"),
        (&huge, "at most"),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(["sim", "fleet", "--servers", "1", "--hours", "1", "--quiet"])
            .arg("--agent-config")
            .arg(file)
            .arg("--out")
            .arg(d.join("out"));
        let out = bounded(
            cmd,
            Duration::from_secs(20),
            &format!("{SIM_CONFIG}: sim fleet --agent-config {}", file.display()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", file.display());
        assert!(
            stderr.contains(&file.display().to_string()) && stderr.contains(says),
            "names the file and why: {stderr}"
        );
    }
}

/// `headroom doctor` said nothing of who the agent's commands run as: a BE command with no
/// `[[be]] user` runs as root (and can leave its group). With `--config` (or the configs of the
/// agents holding locks) it says, for each BE and LC command, the user it runs as.
#[test]
fn doctor_says_who_each_command_runs_as() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = d.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[lc]\nname = \"lc\"\ncgroup = \"l17-doc/lc\"\npids = [1]\n\n\
             [[be]]\nname = \"batch\"\ncgroup = \"l17-doc/be\"\ncommand = [\"sleep\", \"60\"]\n\n\
             [[be]]\nname = \"theirs\"\ncgroup = \"l17-doc/be2\"\ncommand = [\"sleep\", \"60\"]\nuser = \"65534\"\n\n\
             [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
             [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
             [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
            d = d.display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["doctor", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("no line for {key}: {stdout}"))
            .to_string()
    };
    let batch = line("be[0].command (batch)");
    assert!(
        batch.contains("root") && batch.contains("[[be]] user"),
        "BE without a user runs as root, said: {batch}"
    );
    let theirs = line("be[1].command (theirs)");
    assert!(
        theirs.contains("uid 65534") && !theirs.contains("root"),
        "BE with user 65534: {theirs}"
    );
    let json = Command::new(BIN)
        .args(["doctor", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let runs = v["commands_run_as"].as_array().expect("commands_run_as");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["root"], true, "{runs:?}");
    assert_eq!(runs[1]["root"], false, "{runs:?}");
}
