//! A BE command scoped to its own processes with Landlock: from its exec on, it and what it
//! forks may signal, ptrace and open the `/proc/<pid>/mem` of processes in their own Landlock
//! domain only. Without it a BE run as a user could take over any other process of that user
//! outside the BE groups (hostile pass 25: a BE as `nobody` opened a root-group `sleep` of uid
//! 65534's `/proc/<pid>/mem` read-write) and run its work there, unconfined, or kill it. Files,
//! sockets and the network are not restricted (the ruleset handles no file or network access),
//! nor are processes outside the domain limited in what they do to it (the agent, an operator).
//!
//! Signal scoping is Landlock ABI 6 (Linux 6.12); any Landlock domain limits ptrace. The domain
//! is entered while the child is still root (`CAP_SYS_ADMIN`), before it drops to its user, so
//! `no_new_privs` is not needed and a setuid program the BE runs still works.

use std::sync::OnceLock;

/// What a BE command may reach among the other processes of its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessScope {
    /// Whatever its user may (an LC command, a test's child).
    Any,
    /// Its own Landlock domain only, where the kernel has it ([`available`]); else as [`Any`](ProcessScope::Any).
    Own,
}

/// `LANDLOCK_CREATE_RULESET_VERSION`: `landlock_create_ruleset` returns the ABI version.
const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;
/// `LANDLOCK_SCOPE_SIGNAL`.
const SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with [`SCOPE_SIGNAL`].
pub const SIGNAL_SCOPE_ABI: i64 = 6;

/// `struct landlock_ruleset_attr` as of ABI 6.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// Why BE commands run unscoped here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeUnavailable {
    #[error("the kernel has no Landlock enabled (landlock_create_ruleset: {0})")]
    NoLandlock(nix::errno::Errno),
    #[error("the kernel's Landlock ABI is {0}; signal scoping needs ABI {need} (Linux 6.12)", need = SIGNAL_SCOPE_ABI)]
    OldAbi(i64),
    #[error("entering a Landlock domain failed in a test child ({0}; it needs CAP_SYS_ADMIN or no_new_privs)")]
    Refused(nix::errno::Errno),
}

/// The kernel's Landlock ABI version.
pub fn landlock_abi() -> Result<i64, ScopeUnavailable> {
    // SAFETY: the version query takes no attribute (NULL, 0).
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 0 {
        return Err(ScopeUnavailable::NoLandlock(nix::errno::Errno::last()));
    }
    Ok(abi)
}

/// Puts the calling process in a new Landlock domain scoped to signals (ptrace is scoped by any
/// domain). Async-signal-safe (two syscalls and a close on the stack): called between fork and
/// exec. The errno on failure.
pub(crate) fn enter_own_scope() -> Result<(), libc::c_int> {
    let attr = RulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: SCOPE_SIGNAL,
    };
    // SAFETY: attr is a valid ruleset attribute of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(nix::errno::Errno::last_raw());
    }
    // SAFETY: fd is the ruleset just made; restrict_self takes no other argument.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd as libc::c_int, 0u32) };
    let err = nix::errno::Errno::last_raw();
    // SAFETY: closing the ruleset fd made above (the domain holds what it needs).
    unsafe { libc::close(fd as libc::c_int) };
    if rc < 0 {
        return Err(err);
    }
    Ok(())
}

/// Whether BE commands can be scoped here: the ABI checked, then a forked child enters a
/// domain as a BE command would (so a missing capability, a seccomp filter or an LSM setting
/// is found once, here, not as a BE that never starts). Probed once per process.
pub fn available() -> Result<(), ScopeUnavailable> {
    static PROBED: OnceLock<Result<(), ScopeUnavailable>> = OnceLock::new();
    PROBED.get_or_init(probe).clone()
}

fn probe() -> Result<(), ScopeUnavailable> {
    let abi = landlock_abi()?;
    if abi < SIGNAL_SCOPE_ABI {
        return Err(ScopeUnavailable::OldAbi(abi));
    }
    // SAFETY: the child makes only async-signal-safe calls (enter_own_scope, _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ScopeUnavailable::Refused(nix::errno::Errno::last()));
    }
    if pid == 0 {
        let code = match enter_own_scope() {
            Ok(()) => 0,
            Err(e) => e.clamp(1, 255),
        };
        // SAFETY: ends the test child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
        Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
            Err(ScopeUnavailable::Refused(nix::errno::Errno::from_raw(code)))
        }
        Ok(_) => Err(ScopeUnavailable::Refused(nix::errno::Errno::EINTR)),
        Err(e) => Err(ScopeUnavailable::Refused(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn::{Gated, RunAs};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    /// What `script` printed, run the BE's way (`Gated`) as uid 65534 with `scope`.
    fn run_as_nobody(user: &RunAs, scope: ProcessScope, script: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = dir.path().join("out");
        let argv = [
            "sh".to_string(),
            "-c".to_string(),
            format!("{{ {script} ; }} > {}", out.display()),
        ];
        let gated = Gated::fork_as(&argv, &[], Some(user), scope).expect("fork");
        assert!(gated.wait_ready(std::time::Duration::from_secs(10)));
        let pid = nix::unistd::Pid::from_raw(gated.pid());
        gated.open();
        let end = nix::sys::wait::waitpid(pid, None).expect("waitpid");
        assert_eq!(end, nix::sys::wait::WaitStatus::Exited(pid, 0), "{script}");
        std::fs::read_to_string(out).unwrap_or_default()
    }

    /// Hostile pass 25's low: a BE run as a user reached another process of that user outside
    /// the BE groups (a signal, its environment, its `/proc/<pid>/mem` opened read-write).
    /// Scoped, it reaches none of them, and still signals what it forks; unscoped (the control,
    /// so this test can see the access at all), it reaches all three.
    #[test]
    fn a_scoped_command_reaches_only_what_it_forks() {
        const TEST: &str = "a_scoped_command_reaches_only_what_it_forks";
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return eprintln!("SKIP {TEST}: needs root");
        }
        if let Err(why) = available() {
            return eprintln!("SKIP {TEST}: {why}");
        }
        let Ok(Some(nobody)) = RunAs::resolve(&headroom_types::UserSpec::Uid(65534)) else {
            return eprintln!("SKIP {TEST}: uid 65534 does not resolve here");
        };
        let mut victim = std::process::Command::new("sleep")
            .arg("30")
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        let v = victim.id();
        let script = format!(
            "kill -0 {v} 2>/dev/null && echo signal; \
             cat /proc/{v}/environ >/dev/null 2>&1 && echo environ; \
             (exec 3<>/proc/{v}/mem) 2>/dev/null && echo mem; \
             sleep 5 & kill -0 $! && echo own; kill $!"
        );
        let scoped = run_as_nobody(&nobody, ProcessScope::Own, &script);
        let open = run_as_nobody(&nobody, ProcessScope::Any, &script);
        victim.kill().unwrap();
        victim.wait().unwrap();
        assert_eq!(open, "signal\nenviron\nmem\nown\n", "unscoped");
        assert_eq!(
            scoped, "own\n",
            "scoped: it reached another process of its user"
        );
    }
}
