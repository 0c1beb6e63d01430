//! Pass 21's low: a command run as a user whose key quota is full could not start at all
//! (`keyctl(KEYCTL_JOIN_SESSION_KEYRING)` failed EDQUOT: the BE exited 126 at every
//! restart, an LC's spawn failed). It now joins its user's own user-session keyring, and
//! still never holds the parent's.

use super::*;
use crate::spawn::StartIn;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// A uid with no passwd entry that only this test uses (its key quota is filled): one for
/// every run, so that the user keyrings the kernel keeps for it are made once.
const QUOTA_UID: u32 = 3_999_724;
/// `keyctl(2)`'s operation that looks a special keyring up (`linux/keyctl.h`).
const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
/// The user-session keyring, as a key id.
const KEY_SPEC_USER_SESSION_KEYRING: libc::c_long = -5;

/// Between fork and exec, as `uid`: makes its user keyrings (as a login would), joins a new
/// session keyring of its own and adds one-byte `user` keys there until the kernel refuses
/// (EDQUOT): short names first, then one-letter ones, until not even a new keyring fits.
/// System calls on stack buffers only. An error other than EDQUOT, or no refusal after
/// 100 000 keys (a quota this test cannot fill), fails the spawn.
fn fill_key_quota(uid: u32) -> io::Result<()> {
    let err = io::Error::last_os_error;
    // SAFETY: system calls with constant arguments or stack buffers.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(NO_ENTRY_GID) != 0
            || libc::setuid(uid) != 0
        {
            return Err(err());
        }
        if libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_GET_KEYRING_ID,
            KEY_SPEC_USER_SESSION_KEYRING,
            1,
        ) < 0
            || libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_JOIN_SESSION_KEYRING,
                std::ptr::null::<libc::c_char>(),
            ) < 0
        {
            return Err(err());
        }
        let kind = c"user";
        let payload = b"k";
        let mut long = *b"q00000\0";
        let mut short = *b"A\0";
        for n in 0..100_000u32 {
            let mut m = n;
            for d in long[1..6].iter_mut().rev() {
                *d = b'0' + (m % 10) as u8;
                m /= 10;
            }
            let added = libc::syscall(
                libc::SYS_add_key,
                kind.as_ptr(),
                long.as_ptr(),
                payload.as_ptr(),
                1usize,
                KEY_SPEC_SESSION_KEYRING,
            );
            if added < 0 {
                if err().raw_os_error() != Some(libc::EDQUOT) {
                    return Err(err());
                }
                // The bytes may have run out before the count: fill what is left with
                // one-letter names (3 bytes each), fewer than a new keyring needs.
                for c in b'A'..=b'z' {
                    short[0] = c;
                    let added = libc::syscall(
                        libc::SYS_add_key,
                        kind.as_ptr(),
                        short.as_ptr(),
                        payload.as_ptr(),
                        1usize,
                        KEY_SPEC_SESSION_KEYRING,
                    );
                    if added < 0 && err().raw_os_error() != Some(libc::EDQUOT) {
                        return Err(err());
                    }
                }
                return Ok(());
            }
        }
    }
    Err(io::Error::from_raw_os_error(libc::E2BIG))
}

/// A user whose key quota is full (a process of its own holds as many keys as the kernel
/// lets it, `/proc/sys/kernel/keys/maxkeys` and `maxbytes`) still runs its commands, the
/// LC's way (`StartIn`) and the BE's (`Gated`): in its own user-session keyring, and never
/// in the keyring of the thread that started them (a named one this test joins). Before,
/// both failed: the spawn, and the BE with exit 126.
#[test]
fn a_user_whose_key_quota_is_full_still_runs_without_the_parents_keyring() {
    const TEST: &str = "a_user_whose_key_quota_is_full_still_runs_without_the_parents_keyring";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIP {TEST}: needs root");
    }
    if !Path::new("/proc/keys").exists() {
        return eprintln!("SKIP {TEST}: no /proc/keys (a kernel without keys)");
    }
    let user = RunAs::resolve(&UserSpec::uid(QUOTA_UID).unwrap())
        .unwrap()
        .expect("a bare uid");
    if user.name.is_some() {
        return eprintln!("SKIP {TEST}: uid {QUOTA_UID} has a passwd entry here");
    }
    let mut holder = Command::new("sleep");
    holder
        .arg("120")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: fill_key_quota makes system calls only.
    unsafe { holder.pre_exec(|| fill_key_quota(QUOTA_UID)) };
    let mut holder = match holder.spawn() {
        Ok(h) => h,
        Err(e) => {
            return eprintln!("SKIP {TEST}: uid {QUOTA_UID}'s key quota not filled here: {e}")
        }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = dir.path().join("keys");
    let name = format!("hr-quota-test-{}", std::process::id());
    let (lc, be) = std::thread::scope(|s| {
        s.spawn(|| {
            super::tests::join_session_keyring_named(&name);
            let mut cmd = Command::new("cat");
            cmd.arg("/proc/keys");
            StartIn::parent()
                .in_own_session()
                .as_user(user.clone())
                .apply(&mut cmd)
                .unwrap();
            let lc = cmd.output();
            let be = super::tests::gated(&user, "cat /proc/keys", &out);
            (lc, be)
        })
        .join()
        .unwrap()
    });
    let _ = holder.kill();
    let _ = holder.wait();
    let lc = lc.expect("the LC's way: the spawn as a user with a full key quota");
    let lc = String::from_utf8_lossy(&lc.stdout).into_owned();
    let own = format!("_uid_ses.{QUOTA_UID}");
    assert!(
        lc.contains(&own) && !lc.contains(&name),
        "StartIn as {QUOTA_UID}: {lc}"
    );
    let (be, end) = be;
    assert!(
        matches!(end, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "Gated as {QUOTA_UID}: {end:?}"
    );
    assert!(
        be.contains(&own) && !be.contains(&name),
        "Gated as {QUOTA_UID}: {be}"
    );
}
