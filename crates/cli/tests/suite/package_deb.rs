//! What an operator installs (scripts/package.sh, deploy/): the systemd unit passes
//! `systemd-analyze verify`; the .deb installs into a scratch dpkg root (its maintainer scripts
//! run chrootless with DPKG_ROOT, as dpkg does for such roots), `headroom doctor` runs from the
//! installed binary, and a purge leaves nothing; the image the DaemonSet names runs `doctor`
//! under podman.
//!
//! The .deb and the image are built by scripts/package.sh (scripts/test.sh runs it before the
//! tests, with HEADROOM_PACKAGED=1: then a missing artifact fails instead of skipping).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use headroom_types::doctor::Doctor;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    out
}

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// An artifact of scripts/package.sh, or None (after printing SKIP) where it was not built.
fn artifact(test: &str, what: &str, exists: bool) -> bool {
    if exists {
        return true;
    }
    if std::env::var("HEADROOM_PACKAGED").as_deref() == Ok("1") {
        panic!("{what} missing although scripts/test.sh ran scripts/package.sh");
    }
    eprintln!("SKIP {test}: {what} not built (bash scripts/package.sh)");
    false
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `systemd-analyze verify` in a scratch root holding the system's units, the unit under test
/// and an executable at its ExecStart path; returns its output.
fn verify_unit(unit_text: &str) -> Output {
    let root = tempfile::tempdir().unwrap();
    let units = root.path().join("lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    for system_units in ["/lib/systemd/system", "/usr/lib/systemd/system"] {
        if Path::new(system_units).is_dir() {
            let st = Command::new("cp")
                .args(["-a", &format!("{system_units}/."), units.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(st.success());
            break;
        }
    }
    std::fs::write(units.join("headroom.service"), unit_text).unwrap();
    std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
    std::fs::copy(BIN, root.path().join("usr/bin/headroom")).unwrap();
    run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .arg("headroom.service"))
}

#[test]
fn the_systemd_unit_verifies_clean() {
    if !have("systemd-analyze") {
        eprintln!(
            "SKIP the_systemd_unit_verifies_clean: no systemd-analyze (apt-get install systemd)"
        );
        return;
    }
    let unit = std::fs::read_to_string(repo().join("deploy/headroom.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/headroom agent"),
        "the unit runs the packaged binary"
    );
    let out = verify_unit(&unit);
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify: {}",
        text(&out)
    );
    // The same check reports a broken unit (it warns and still exits 0, hence the stderr check).
    let broken = verify_unit(&unit.replace("KillMode=process", "KillMode=bogus"));
    assert!(
        String::from_utf8_lossy(&broken.stderr).contains("kill mode"),
        "a bad KillMode is reported: {}",
        text(&broken)
    );
}

#[test]
fn the_daemonset_names_the_image_package_sh_builds() {
    let yaml =
        std::fs::read_to_string(repo().join("deploy/kubernetes/headroom-daemonset.yaml")).unwrap();
    let images: Vec<&str> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .filter(|i| i.starts_with("headroom"))
        .collect();
    assert_eq!(images, vec![format!("headroom:{VERSION}").as_str()]);
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("FROM scratch AS runtime"),
        "minimal final stage"
    );
    assert!(dockerfile.contains(&format!("headroom:{VERSION}")));
}

#[test]
fn the_deb_installs_runs_doctor_and_purges_clean() {
    let test = "the_deb_installs_runs_doctor_and_purges_clean";
    if !have("dpkg") || !have("dpkg-deb") {
        eprintln!("SKIP {test}: no dpkg");
        return;
    }
    if !is_root() {
        eprintln!("SKIP {test}: not root (dpkg --root needs to own the files it installs)");
        return;
    }
    let deb = repo().join(format!("target/package/headroom_{VERSION}_amd64.deb"));
    if !artifact(test, &deb.display().to_string(), deb.exists()) {
        return;
    }
    // The package's metadata and contents.
    let info = run(Command::new("dpkg-deb").arg("--info").arg(&deb));
    let info_text = String::from_utf8_lossy(&info.stdout);
    for want in [
        "Package: headroom",
        &format!("Version: {VERSION}"),
        "Architecture: amd64",
        "conffiles",
        "postinst",
        "prerm",
        "postrm",
    ] {
        assert!(info_text.contains(want), "{want} in:\n{info_text}");
    }
    assert!(
        !info_text.contains("Depends:"),
        "static binary: no dependencies\n{info_text}"
    );
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    let contents = String::from_utf8_lossy(&contents.stdout);
    for path in [
        "./usr/bin/headroom",
        "./lib/systemd/system/headroom.service",
        "./etc/headroom/headroom.toml",
        "./usr/share/doc/headroom/agent.md",
        "./usr/share/doc/headroom/grafana-headroom.json",
    ] {
        assert!(contents.contains(path), "{path} in:\n{contents}");
    }

    // Install into a scratch root.
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    std::fs::write(r.join("var/lib/dpkg/available"), "").unwrap();
    let dpkg = |args: &[&str]| {
        run(Command::new("dpkg")
            .arg(format!("--root={}", r.display()))
            .args(["--force-script-chrootless", "--log=/dev/null"])
            .args(args))
    };
    let out = dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(out.status.success(), "dpkg -i: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("systemctl enable --now headroom"),
        "postinst says how to start it and starts nothing: {}",
        text(&out)
    );
    let installed = r.join("usr/bin/headroom");
    let unit = std::fs::read_to_string(r.join("lib/systemd/system/headroom.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/headroom"));
    assert!(r.join("etc/headroom/headroom.toml").exists());
    let status = dpkg(&["-s", "headroom"]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("Status: install ok installed"),
        "{}",
        text(&status)
    );

    // doctor from the installed binary.
    let out = run(Command::new(&installed).args(["doctor", "--json"]));
    assert!(
        out.status.success(),
        "installed headroom doctor: {}",
        text(&out)
    );
    let doctor: Doctor = serde_json::from_slice(&out.stdout).expect("doctor --json parses");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(doctor.kernel, release.trim());
    let out = run(Command::new(&installed).arg("doctor"));
    assert!(out.status.success(), "{}", text(&out));
    println!("{}", String::from_utf8_lossy(&out.stdout));

    // Purge: binary, unit, conffile and the agent's state directory go.
    std::fs::create_dir_all(r.join("var/lib/headroom")).unwrap();
    std::fs::write(r.join("var/lib/headroom/state.json"), "{}").unwrap();
    let out = dpkg(&["--purge", "headroom"]);
    assert!(out.status.success(), "dpkg --purge: {}", text(&out));
    for gone in [
        "usr/bin/headroom",
        "lib/systemd/system/headroom.service",
        "etc/headroom/headroom.toml",
        "var/lib/headroom",
    ] {
        assert!(!r.join(gone).exists(), "{gone} left after purge");
    }
}

#[test]
fn the_image_runs_doctor_under_podman() {
    let test = "the_image_runs_doctor_under_podman";
    if !have("podman") || !run(Command::new("podman").arg("info")).status.success() {
        eprintln!("SKIP {test}: no working podman (apt-get install podman)");
        return;
    }
    let tag = format!("headroom:{VERSION}");
    let exists = run(Command::new("podman").args(["image", "exists", &tag]))
        .status
        .success();
    if !artifact(test, &format!("image {tag}"), exists) {
        return;
    }
    // As the DaemonSet runs it: privileged, host PID and network, the host's cgroupfs. runc
    // where it is installed: crun refuses a hybrid host whose cgroup2 has a controller bound.
    // The ulimits are set, not inherited: this sandbox refuses raising RLIMIT_NOFILE/NPROC.
    let mut podman = Command::new("podman");
    if have("runc") {
        podman.args(["--runtime", "runc"]);
    }
    podman.args([
        "run",
        "--rm",
        "--ulimit=nofile=4096:4096",
        "--ulimit=nproc=1024:1024",
        "--privileged",
        "--pid=host",
        "--network=host",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup",
        &tag,
        "doctor",
        "--json",
    ]);
    let out = run(&mut podman);
    assert!(
        out.status.success(),
        "podman run {tag} doctor: {}",
        text(&out)
    );
    let inside: Doctor = serde_json::from_slice(&out.stdout).expect("doctor --json parses");
    let out = run(Command::new(BIN).args(["doctor", "--json"]));
    let host: Doctor = serde_json::from_slice(&out.stdout).expect("host doctor --json parses");
    // The image sees the cgroup mechanisms the host offers.
    let m = |d: &Doctor| {
        let m = &d.mechanisms;
        [
            m.cpuset.available,
            m.cpu_weight.available,
            m.cpu_idle.available,
            m.cpu_quota.available,
            m.freeze.available,
            m.memory.available,
            m.io.available,
        ]
    };
    assert_eq!(m(&inside), m(&host), "inside: {inside:?}\nhost: {host:?}");
    assert_eq!(inside.cgroup_mode, host.cgroup_mode);
    assert_eq!(inside.cpus, host.cpus);
    // FROM scratch: the binary and the example config, nothing else.
    let out = run(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{len .RootFS.Layers}}",
        &tag,
    ]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "2",
        "two COPY layers: {}",
        text(&out)
    );
}
