//! Hostile pass 38 (issue 42, docs/safety-hostile-pass-38.md): the agent's stdout and stderr a
//! pipe nobody reads (a stuck log collector). Every thread that logged blocked on the full pipe:
//! `ctl off` was not answered, a violation did not freeze BE, SIGTERM did not end the agent.
//! Log lines now go through a bounded queue that drops and counts. Real kernel (root, cgroups);
//! skips with a printed reason elsewhere.

use crate::support;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_host::Controller;
use support::{forking_be, root_cgroups, wait_for, write_config, Guard, BIN};

const STUCK: &str = "a_log_pipe_nobody_reads_never_holds_off_or_sigterm";

#[test]
fn a_log_pipe_nobody_reads_never_holds_off_or_sigterm() {
    let controllers = [Controller::Cpuset, Controller::Cpu, Controller::Freezer];
    let Some(cgroups) = root_cgroups(STUCK, &controllers) else {
        return;
    };
    let mut guard = Guard::fresh(&cgroups, "headroom-logpipe");
    let lc = guard.sleeper();
    let marker = format!("{}.4{}", 7700 + std::process::id() % 100, lc % 1000);
    let head = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc}]\n{be}",
        top = guard.top,
        be = forking_be(&guard.top, &marker),
    );
    let socket = guard.dir.path().join("ctl.sock");
    let cfg = write_config(guard.dir.path(), "a.toml", &head, "restore", &socket, "");
    // A pipe filled to the brim before the agent starts: its first line would block.
    let (reader, mut writer) = std::io::pipe().unwrap();
    // SAFETY: fcntl reads a property of a descriptor this test owns.
    let size = unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_GETPIPE_SZ) };
    if size <= 0 {
        return eprintln!("SKIP {STUCK}: F_GETPIPE_SZ refused ({size})");
    }
    writer.write_all(&vec![b'.'; size as usize]).unwrap();
    let agent = Command::new(BIN)
        .args(["agent", "--config"])
        .arg(&cfg)
        .env("HEADROOM_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    guard.children.push(agent);
    let up = wait_for("the agent's first status", Duration::from_secs(20), || {
        request(&socket, &Request::Status).is_ok_and(|r| r.ok)
    });
    let off = up.and_then(|_| request(&socket, &Request::Off).ok());
    support::signal(&guard.children[0], nix::sys::signal::Signal::SIGTERM);
    let ended = wait_for("the agent's exit", Duration::from_secs(10), || {
        guard.children[0].try_wait().is_ok_and(|s| s.is_some())
    });
    // Read what the agent wrote (its last line says what the exit did), then the asserts.
    drop(reader);
    assert!(
        up.is_some(),
        "the agent answered `status` with its log pipe full"
    );
    assert!(
        off.as_ref().is_some_and(|r| r.ok),
        "`ctl off` answered with the agent's log pipe full: {off:?}"
    );
    assert!(
        ended.is_some(),
        "SIGTERM ended the agent within 10 s with its log pipe full"
    );
}
