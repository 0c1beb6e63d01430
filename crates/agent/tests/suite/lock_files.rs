//! Group lock files do not pile up (third hostile pass, issue 42: /run/headroom/locks held
//! 2317 files on a test machine, one per group per run for ever): a released lock's file is
//! removed, files nobody holds are removed when a lock is taken, and removal never lets two
//! holders in at once nor refuses an agent sharing an ancestor with one letting go. Temp
//! directories only (no cgroups, no root).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};

use headroom_agent::state::{lock_file_name, GroupLock, StateError};
use headroom_types::control::LockHolder;

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn group(name: &str) -> PathBuf {
    PathBuf::from("/sys/fs/cgroup/cpu/hostile3").join(name)
}

#[test]
fn a_released_lock_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let lock = GroupLock::acquire_nested(
        dir.path(),
        &[group("top/lc"), group("top/be")],
        &[group("top")],
        LockHolder::default(),
    )
    .unwrap();
    assert_eq!(files(dir.path()).len(), 3, "{:?}", files(dir.path()));
    drop(lock);
    assert_eq!(files(dir.path()), Vec::<String>::new());
    // Taken again: the same semantics on new files.
    let again = GroupLock::acquire(dir.path(), &[group("top/lc")], LockHolder::default());
    assert!(again.is_ok(), "{again:?}");
}

#[test]
fn a_shared_ancestor_file_stays_while_another_agent_still_shares_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = GroupLock::acquire_nested(
        dir.path(),
        &[group("top/a")],
        &[group("top")],
        LockHolder::default(),
    )
    .unwrap();
    let b = GroupLock::acquire_nested(
        dir.path(),
        &[group("top/b")],
        &[group("top")],
        LockHolder::default(),
    )
    .unwrap();
    drop(a);
    let top = lock_file_name(&group("top"));
    assert!(files(dir.path()).contains(&top), "{:?}", files(dir.path()));
    // Still shared by b: an agent on `top` itself is refused.
    let on_top = GroupLock::acquire(dir.path(), &[group("top")], LockHolder::default());
    assert!(matches!(on_top, Err(StateError::Held { .. })), "{on_top:?}");
    drop(b);
    assert_eq!(files(dir.path()), Vec::<String>::new());
}

#[test]
fn stale_lock_files_nobody_holds_are_removed_when_a_lock_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    // Left by agents that died (or never removed theirs).
    for i in 0..300 {
        std::fs::write(
            dir.path().join(lock_file_name(&group(&format!("old/{i}")))),
            "{}\n",
        )
        .unwrap();
    }
    // Not a lock file: not ours to remove.
    std::fs::write(dir.path().join("README"), "x").unwrap();
    let live = GroupLock::acquire(dir.path(), &[group("live")], LockHolder::default()).unwrap();
    let live_file = lock_file_name(&group("live"));
    let mine = GroupLock::acquire(dir.path(), &[group("mine")], LockHolder::default()).unwrap();
    let left = files(dir.path());
    assert_eq!(
        left.len(),
        3,
        "{} files left of 301 stale and 2 held",
        left.len()
    );
    assert_eq!(
        left,
        vec![
            "README".to_string(),
            live_file.clone(),
            lock_file_name(&group("mine"))
        ],
        "the stale files removed, the live holder's kept"
    );
    drop((live, mine));
}

#[test]
fn racing_takers_and_releasers_never_hold_one_group_twice() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let took = Arc::new(AtomicU32::new(0));
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (dir, inside, most, took, start) = (
                dir.clone(),
                inside.clone(),
                most.clone(),
                took.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..400 {
                    let r = GroupLock::acquire(
                        dir.path(),
                        &[group("contended")],
                        LockHolder::default(),
                    );
                    if let Ok(lock) = r {
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        took.fetch_add(1, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(lock);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(took.load(Ordering::SeqCst) > 0, "no thread ever took it");
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(files(dir.path()), Vec::<String>::new());
}

#[test]
fn agents_sharing_an_ancestor_are_not_refused_while_others_let_go() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (dir, start) = (dir.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for round in 0..300 {
                    let r = GroupLock::acquire_nested(
                        dir.path(),
                        &[group(&format!("top/{i}"))],
                        &[group("top")],
                        LockHolder::default(),
                    );
                    assert!(r.is_ok(), "thread {i} round {round}: {r:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(files(dir.path()), Vec::<String>::new());
}
