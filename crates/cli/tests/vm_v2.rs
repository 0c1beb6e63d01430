//! The VM stage from `cargo test`: runs scripts/vm-test.sh with this build's `headroom` binary
//! (Debian's kernel under qemu, cgroup v2 with every controller, 2 and then 4 vCPUs; the checks
//! are in scripts/vm/checks.sh) and turns its exit status into pass, fail or SKIP. The console
//! logs stay in target/vm/out/.
//!
//! HEADROOM_VM=0 skips it (for quick local runs); the README's test command runs it.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

#[test]
fn cgroup_v2_checks_pass_in_a_real_kernel() {
    if std::env::var("HEADROOM_VM").as_deref() == Ok("0") {
        eprintln!("SKIP cgroup_v2_checks_pass_in_a_real_kernel: HEADROOM_VM=0");
        return;
    }
    if Command::new("bash").arg("--version").output().is_err() {
        eprintln!("SKIP cgroup_v2_checks_pass_in_a_real_kernel: no bash");
        return;
    }
    let root = repo_root();
    let start = Instant::now();
    let out = Command::new("bash")
        .arg(root.join("scripts/vm-test.sh"))
        .args(["--bin", BIN])
        .current_dir(&root)
        .output()
        .expect("run scripts/vm-test.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(77) => {
            let reason = stderr
                .lines()
                .find_map(|l| l.strip_prefix("SKIP vm-test: "))
                .unwrap_or("scripts/vm-test.sh cannot run here");
            eprintln!("SKIP cgroup_v2_checks_pass_in_a_real_kernel: {reason}");
        }
        Some(0) => {
            // Every check and its result, so the test log shows what ran on the real kernel.
            println!("{stdout}");
            let summaries: Vec<&str> = stdout
                .lines()
                .filter(|l| l.starts_with("vm-test.sh: smp"))
                .collect();
            assert_eq!(
                summaries.len(),
                2,
                "one summary per VM (2 and 4 vCPUs):\n{stdout}"
            );
            assert!(
                !stdout.contains("VMCHECK FAIL"),
                "exit 0 with a failed check:\n{stdout}"
            );
            eprintln!("VM stage: {:.0} s", start.elapsed().as_secs_f64());
        }
        code => panic!(
            "scripts/vm-test.sh exited {code:?} after {:.0} s\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
            start.elapsed().as_secs_f64()
        ),
    }
}
