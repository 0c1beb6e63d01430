//! The knobs on the real kernel (root + writable cgroupfs; skipped with a printed reason
//! otherwise). Each test checks the effect on a spinning child, not just the file.

use crate::real;

use std::time::{Duration, Instant};

use headroom_host::{sched, Controller, CpuQuota, FreezeState};
use headroom_types::CpuSet;
use real::{cpu_seconds, cpu_share_over, real_cgroups, ChildGuard, ScratchGroup, SERIAL};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_20_percent_quota_gives_20_percent_of_a_cpu() {
    let _s = serial();
    let Some(cg) = real_cgroups(
        "a_20_percent_quota_gives_20_percent_of_a_cpu",
        &[Controller::Cpu],
    ) else {
        return;
    };
    let group = ScratchGroup::new(&cg, "quota").unwrap();
    // A high weight, so a busy machine cannot push it below its quota: the quota is what binds.
    cg.set_cpu_weight(&group.path, 10_000).unwrap();
    cg.set_cpu_quota(&group.path, CpuQuota::percent_of_cpu(20.0))
        .unwrap();
    assert_eq!(cg.cpu_quota(&group.path).unwrap().quota_us, Some(20_000));
    let spinner = ChildGuard::spinner();
    cg.move_process(&group.path, spinner.pid()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let share = cpu_share_over(spinner.pid(), Duration::from_secs(2));
    eprintln!("quota 20%: measured {:.1}% of a CPU", share * 100.0);
    assert!((0.15..=0.25).contains(&share), "share {share}");
    let throttled = cg.cpu_throttling(&group.path).unwrap();
    assert!(throttled.nr_throttled > 0, "{throttled:?}");
    assert!(cg.cpu_usage_ns(&group.path).unwrap() > 0 || !cg.has(Controller::Cpuacct));
}

#[test]
fn a_cpuset_of_cpu_1_keeps_the_child_off_cpu_0() {
    let _s = serial();
    let Some(cg) = real_cgroups(
        "a_cpuset_of_cpu_1_keeps_the_child_off_cpu_0",
        &[Controller::Cpuset],
    ) else {
        return;
    };
    let online = headroom_host::LinuxHost::system()
        .topology()
        .unwrap()
        .cpus_online;
    if !online.contains(0) || !online.contains(1) {
        eprintln!("SKIP a_cpuset_of_cpu_1_keeps_the_child_off_cpu_0: needs CPUs 0 and 1 online");
        return;
    }
    let group = ScratchGroup::new(&cg, "cpuset").unwrap();
    cg.set_cpuset_cpus(&group.path, &CpuSet::from(vec![1]))
        .unwrap();
    let spinner = ChildGuard::spinner();
    cg.move_process(&group.path, spinner.pid()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut seen = CpuSet::new();
    for _ in 0..100 {
        seen.insert(
            sched::last_cpu(std::path::Path::new("/"), spinner.pid(), spinner.pid()).unwrap()
                as u32,
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen.to_vec(), vec![1], "ran on {seen}");
    assert_eq!(
        cg.cpuset_effective_cpus(&group.path).unwrap().to_vec(),
        vec![1]
    );
}

#[test]
fn freeze_stops_progress_and_thaw_resumes_it() {
    let _s = serial();
    let Some(cg) = real_cgroups(
        "freeze_stops_progress_and_thaw_resumes_it",
        &[Controller::Freezer],
    ) else {
        return;
    };
    let group = ScratchGroup::new(&cg, "freeze").unwrap();
    let spinner = ChildGuard::spinner();
    cg.move_process(&group.path, spinner.pid()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    cg.freeze(&group.path).unwrap();
    assert_eq!(cg.freeze_state(&group.path).unwrap(), FreezeState::Frozen);
    let frozen_at = cpu_seconds(spinner.pid());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        cpu_seconds(spinner.pid()),
        frozen_at,
        "a frozen group made progress"
    );
    cg.thaw(&group.path).unwrap();
    assert_eq!(cg.freeze_state(&group.path).unwrap(), FreezeState::Thawed);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        cpu_seconds(spinner.pid()) > frozen_at,
        "no progress after thaw"
    );
}

/// Two spinners pinned to one CPU for `window`: (CPU share of `normal`, of `yielding`).
fn co_pinned_shares(normal: &ChildGuard, yielding: &ChildGuard, window: Duration) -> (f64, f64) {
    let cpu = CpuSet::from(vec![1]);
    for child in [normal, yielding] {
        sched::set_affinity(child.pid(), &cpu).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let (n0, y0) = (cpu_seconds(normal.pid()), cpu_seconds(yielding.pid()));
    std::thread::sleep(window);
    let (n1, y1) = (cpu_seconds(normal.pid()), cpu_seconds(yielding.pid()));
    let w = window.as_secs_f64();
    ((n1 - n0) / w, (y1 - y0) / w)
}

/// Whether CPU 1 is there to pin two spinners on (a SKIP line for `test` if not).
fn has_cpu_1(test: &str) -> bool {
    let online = headroom_host::LinuxHost::system()
        .topology()
        .unwrap()
        .cpus_online;
    if online.len() < 2 {
        eprintln!("SKIP {test}: needs CPU 1");
        return false;
    }
    true
}

/// Pins both on CPU 1 for 1.5 s: `normal` gets more than 10 times what `yielding` (made to
/// yield by `how`) gets.
fn assert_normal_wins(how: &str, normal: &ChildGuard, yielding: &ChildGuard) {
    let (n, y) = co_pinned_shares(normal, yielding, Duration::from_millis(1500));
    eprintln!("{how}: normal {:.1}%, idle {:.1}%", n * 100.0, y * 100.0);
    assert!(n > 10.0 * y.max(0.005), "normal {n} vs idle {y}");
}

#[test]
fn cpu_idle_makes_a_co_pinned_busy_group_yield_to_a_normal_one() {
    let _s = serial();
    let Some(cg) = real_cgroups(
        "cpu_idle_makes_a_co_pinned_busy_group_yield",
        &[Controller::Cpu],
    ) else {
        return;
    };
    if !has_cpu_1("cpu_idle_makes_a_co_pinned_busy_group_yield") {
        return;
    }
    let idle_group = ScratchGroup::new(&cg, "idle").unwrap();
    let normal_group = ScratchGroup::new(&cg, "normal").unwrap();
    cg.set_cpu_idle(&idle_group.path, true).unwrap();
    assert!(cg.cpu_idle(&idle_group.path).unwrap());
    let (normal, yielding) = (ChildGuard::spinner(), ChildGuard::spinner());
    cg.move_process(&normal_group.path, normal.pid()).unwrap();
    cg.move_process(&idle_group.path, yielding.pid()).unwrap();
    assert_normal_wins("cpu.idle", &normal, &yielding);
}

#[test]
fn sched_idle_makes_a_co_pinned_busy_process_yield_to_a_normal_one() {
    let _s = serial();
    if !has_cpu_1("sched_idle_makes_a_co_pinned_busy_process_yield") {
        return;
    }
    let (normal, yielding) = (ChildGuard::spinner(), ChildGuard::spinner());
    sched::set_sched(yielding.pid(), headroom_host::SchedPolicy::Idle).unwrap();
    assert_eq!(
        sched::sched(yielding.pid()).unwrap().policy,
        libc::SCHED_IDLE as u32
    );
    assert_normal_wins("SCHED_IDLE", &normal, &yielding);
}

#[test]
fn a_memory_limit_kills_an_over_allocating_child() {
    let _s = serial();
    let Some(cg) = real_cgroups(
        "a_memory_limit_kills_an_over_allocating_child",
        &[Controller::Memory],
    ) else {
        return;
    };
    let group = ScratchGroup::new(&cg, "memory").unwrap();
    cg.set_memory_max(&group.path, Some(32 << 20)).unwrap();
    assert_eq!(cg.memory_max(&group.path).unwrap(), Some(32 << 20));
    // dd allocates a 256 MiB buffer and fills it from /dev/zero: far over the limit.
    let mut child = ChildGuard::gated("exec dd if=/dev/zero of=/dev/null bs=256M count=1");
    cg.move_process(&group.path, child.pid()).unwrap();
    child.release();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the over-allocating child was not stopped"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("over-allocating child ended with {status:?}");
    assert!(!status.success(), "{status:?}");
    let events = cg.memory_events(&group.path).unwrap();
    assert!(events.max > 0 || events.oom_kill > 0, "{events:?}");
}

#[test]
fn scratch_groups_are_removed_even_when_the_test_panics() {
    let _s = serial();
    let Some(cg) = real_cgroups(
        "scratch_groups_are_removed_even_when_the_test_panics",
        &[Controller::Cpu],
    ) else {
        return;
    };
    let mut dirs = Vec::new();
    // Silence the deliberate panic's report (every real test holds SERIAL, so none is hidden).
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let group = ScratchGroup::new(&cg, "panics").unwrap();
        dirs = cg
            .group_dirs(&group.path)
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        let spinner = ChildGuard::spinner();
        cg.move_process(&group.path, spinner.pid()).unwrap();
        panic!("deliberate failure with a live member");
    }));
    std::panic::set_hook(hook);
    assert!(result.is_err());
    assert!(!dirs.is_empty());
    for d in dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

/// kubelet's v1 layout: the BestEffort parent has pod groups (and containers) below it, each
/// with its own cpuset.cpus. Narrowing the parent is EBUSY while a child uses more, and children
/// do not follow as on v2: `set_cpuset_cpus` makes them follow (narrowed first, widened after).
#[test]
fn a_v1_cpuset_parent_narrows_and_widens_with_the_groups_below_it() {
    let test = "a_v1_cpuset_parent_narrows_and_widens_with_the_groups_below_it";
    let _s = serial();
    let Some(cg) = real_cgroups(test, &[Controller::Cpuset]) else {
        return;
    };
    if cg.backend(Controller::Cpuset).is_ok_and(|b| b.is_v2()) {
        eprintln!("SKIP {test}: cpuset is on cgroup v2 (children follow in the kernel)");
        return;
    }
    let online = headroom_host::LinuxHost::system()
        .topology()
        .unwrap()
        .cpus_online;
    if !online.contains(0) || !online.contains(1) {
        eprintln!("SKIP {test}: needs CPUs 0 and 1 online");
        return;
    }
    let both = CpuSet::from(vec![0, 1]);
    let be = ScratchGroup::new(&cg, "be").unwrap();
    cg.set_cpuset_cpus(&be.path, &both).unwrap();
    let pod = ScratchGroup::new(&cg, "be/pod1").unwrap();
    cg.set_cpuset_cpus(&pod.path, &both).unwrap();
    let container = ScratchGroup::new(&cg, "be/pod1/c").unwrap();
    cg.set_cpuset_cpus(&container.path, &both).unwrap();
    let pinned = ScratchGroup::new(&cg, "be/pod2").unwrap();
    cg.set_cpuset_cpus(&pinned.path, &CpuSet::from(vec![1]))
        .unwrap();
    let sleeper = ChildGuard(
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep"),
    );
    cg.move_process(&container.path, sleeper.pid()).unwrap();
    let cpus = |g: &ScratchGroup| cg.cpuset_cpus(&g.path).unwrap().to_list();
    let affinity = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", sleeper.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim()
            .to_string()
    };

    // Narrower: the groups that had the parent's CPUs follow, the pinned one keeps its own.
    cg.set_cpuset_cpus(&be.path, &CpuSet::from(vec![0]))
        .unwrap();
    assert_eq!(
        (cpus(&be), cpus(&pod), cpus(&container)),
        ("0".into(), "0".into(), "0".into())
    );
    assert_eq!(cpus(&pinned), "0", "none of its CPUs left: the parent's");
    assert_eq!(affinity(), "0");
    // Neither narrower nor wider: through the union.
    cg.set_cpuset_cpus(&be.path, &CpuSet::from(vec![1]))
        .unwrap();
    assert_eq!(
        (cpus(&be), cpus(&pod), cpus(&container), cpus(&pinned)),
        ("1".into(), "1".into(), "1".into(), "1".into())
    );
    assert_eq!(affinity(), "1");
    // Wider again: they follow back.
    cg.set_cpuset_cpus(&be.path, &both).unwrap();
    assert_eq!(
        (cpus(&be), cpus(&pod), cpus(&container)),
        ("0-1".into(), "0-1".into(), "0-1".into())
    );
    assert_eq!(affinity(), "0-1");
    // A child pinned narrower than its parent keeps its CPUs when the parent narrows around them.
    cg.set_cpuset_cpus(&pinned.path, &CpuSet::from(vec![1]))
        .unwrap();
    cg.set_cpuset_cpus(&pod.path, &CpuSet::from(vec![0]))
        .unwrap();
    cg.set_cpuset_cpus(&be.path, &CpuSet::from(vec![1]))
        .unwrap();
    assert_eq!(cpus(&pinned), "1");
    assert_eq!(cpus(&pod), "1", "its CPU 0 is gone: the parent's");
    drop(sleeper);
}
