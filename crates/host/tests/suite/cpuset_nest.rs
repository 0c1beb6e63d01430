//! A nest of more than eight v1 cpuset groups below BE kept BE frozen with a repeated bare
//! EBUSY (hostile pass 13, "Found, not fixed"): the follow stops at its depth bound, and the
//! kernel refuses narrowing the last followed level while a group below holds more CPUs. The
//! refusal now names that group, its depth and why BE stays frozen; nothing is written (the
//! freeze the agent falls back to is the safe side, and is kept). Root, a v1 cpuset hierarchy
//! and two CPUs; SKIP otherwise.

use crate::real;

use headroom_host::Controller;
use headroom_types::{CpuSet, GroupPath};
use real::{real_cgroups, ScratchGroup, SERIAL};

const T: &str = "a_nest_deeper_than_the_follow_is_refused_by_name_and_depth";

#[test]
fn a_nest_deeper_than_the_follow_is_refused_by_name_and_depth() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(cg) = real_cgroups(T, &[Controller::Cpuset]) else {
        return;
    };
    if cg.backend(Controller::Cpuset).is_ok_and(|b| b.is_v2()) {
        return eprintln!("SKIP {T}: cgroup v1 only (v2 groups follow in the kernel)");
    }
    let scratch = match ScratchGroup::new(&cg, "l14-nest") {
        Ok(s) => s,
        Err(e) => return eprintln!("SKIP {T}: {e}"),
    };
    let all = cg.cpuset_cpus(&scratch.path).unwrap();
    if all.len() < 2 {
        return eprintln!("SKIP {T}: needs two CPUs, the group has {all:?}");
    }
    let one = CpuSet::from([all.iter().last().unwrap()]);
    // Ten levels below the group: n1 … n10, each with every CPU.
    let mut levels = Vec::new();
    let mut path = scratch.path.to_string();
    for i in 1..=10 {
        path = format!("{path}/n{i}");
        let g = GroupPath::new(&path).unwrap();
        cg.create(&g).expect("creating a nest level");
        levels.push(g);
    }
    let result = cg.set_cpuset_cpus(&scratch.path, &one);
    let kept: Vec<CpuSet> = levels.iter().map(|g| cg.cpuset_cpus(g).unwrap()).collect();
    let top = cg.cpuset_cpus(&scratch.path).unwrap();
    for g in levels.iter().rev() {
        let _ = cg.remove(g);
    }
    let msg = match result {
        Ok(()) => panic!("narrowing above a nest of ten was taken"),
        Err(e) => e.to_string(),
    };
    // The group at depth 9 (n9) is the one not followed; named with its depth and the why.
    let n9 = levels[8].to_string();
    assert!(
        msg.contains(n9.trim_start_matches('/')),
        "names the group: {msg}"
    );
    assert!(msg.contains("9 levels below"), "says the depth: {msg}");
    assert!(
        msg.contains("8 levels deep at most") && msg.contains("BE stays frozen"),
        "{msg}"
    );
    assert!(
        !msg.contains("EBUSY ("),
        "not the kernel's bare EBUSY: {msg}"
    );
    assert_eq!(top, all, "nothing narrowed above");
    assert!(
        kept.iter().all(|c| *c == all),
        "nothing narrowed below: {kept:?}"
    );
}
