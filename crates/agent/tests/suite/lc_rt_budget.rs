//! The LC group's real-time budget on a fake cgroup v1 tree with RT group scheduling: a group at
//! `cpu.rt_runtime_us` = 0 refuses SCHED_FIFO, so the agent gives the LC group (and each
//! ancestor at 0) what its parent can spare, top down, records the originals, and puts them back
//! children first on restore — also from a restarted agent's state file.

use crate::support;

use headroom_agent::sensors::lc_threads::{LcThreads, LcThreadsState};
use headroom_types::allocation::LcTreatment;
use headroom_types::GroupPath;
use support::Fake;

fn fifo() -> LcTreatment {
    LcTreatment {
        fifo_priority: Some(1),
        ..LcTreatment::default()
    }
}

fn rt_writes(fake: &Fake) -> Vec<String> {
    fake.io
        .take_writes()
        .into_iter()
        .filter(|(p, _)| p.ends_with("cpu.rt_runtime_us"))
        .map(|(p, v)| format!("{p}={v}"))
        .collect()
}

#[test]
fn the_chain_gets_what_each_parent_spares_top_down_and_gets_it_back_children_first() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    for g in ["system", "hr", "hr/lc", "hr/be"] {
        cg.create(&GroupPath::new(g).unwrap()).unwrap();
    }
    // another root child already holds 200 ms of the root's 950 ms
    fake.set_knob("cpu", "system", "cpu.rt_runtime_us", "200000");
    fake.io.take_writes();
    let lc = GroupPath::new("hr/lc").unwrap();

    let mut threads = LcThreads::default();
    // an empty LC group: no thread to treat, but the budget is still prepared for FIFO
    assert_eq!(threads.apply(&cg, &lc, &fifo()), 0);
    assert_eq!(
        rt_writes(&fake),
        vec![
            "cpu/hr/cpu.rt_runtime_us=750000",
            "cpu/hr/lc/cpu.rt_runtime_us=750000"
        ],
        "root 950000 - system 200000 for hr, then all of hr's (its other child holds 0) for hr/lc"
    );
    assert_eq!(
        threads.state().rt_budgets,
        vec![("hr".parse().unwrap(), 0), ("hr/lc".parse().unwrap(), 0)]
    );
    // a second pass finds the budget in place and writes nothing
    threads.apply(&cg, &lc, &fifo());
    assert!(rt_writes(&fake).is_empty());

    // a restarted agent restores what the first recorded
    let state: LcThreadsState =
        serde_json::from_str(&serde_json::to_string(threads.state()).unwrap()).unwrap();
    let mut restarted = LcThreads::from_state(state);
    assert_eq!(restarted.restore(Some(&cg)), 0, "no thread was treated");
    assert_eq!(
        rt_writes(&fake),
        vec![
            "cpu/hr/lc/cpu.rt_runtime_us=0",
            "cpu/hr/cpu.rt_runtime_us=0"
        ],
        "children first: the kernel refuses a parent budget below its children's"
    );
    assert!(restarted.state().rt_budgets.is_empty());
    assert_eq!(fake.knob("cpu", "hr", "cpu.rt_runtime_us"), "0");
}

#[test]
fn only_the_groups_at_zero_are_raised_and_siblings_budgets_are_respected() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    for g in ["hr", "hr/lc", "hr/other"] {
        cg.create(&GroupPath::new(g).unwrap()).unwrap();
    }
    fake.set_knob("cpu", "hr", "cpu.rt_runtime_us", "500000");
    fake.set_knob("cpu", "hr/other", "cpu.rt_runtime_us", "200000");
    fake.io.take_writes();
    let lc = GroupPath::new("hr/lc").unwrap();
    let mut threads = LcThreads::default();
    threads
        .ensure_rt_budget(&cg, &lc)
        .expect("budget available");
    assert_eq!(rt_writes(&fake), vec!["cpu/hr/lc/cpu.rt_runtime_us=300000"]);
    threads.restore(Some(&cg));
    assert_eq!(rt_writes(&fake), vec!["cpu/hr/lc/cpu.rt_runtime_us=0"]);
    // hr's own budget was never the agent's: left as it was
    assert_eq!(fake.knob("cpu", "hr", "cpu.rt_runtime_us"), "500000");
}

#[test]
fn no_budget_left_is_an_error_naming_the_knob_and_nothing_is_written() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    for g in ["hr", "hr/lc", "hr/other"] {
        cg.create(&GroupPath::new(g).unwrap()).unwrap();
    }
    fake.set_knob("cpu", "hr", "cpu.rt_runtime_us", "100000");
    fake.set_knob("cpu", "hr/other", "cpu.rt_runtime_us", "100000");
    fake.io.take_writes();
    let mut threads = LcThreads::default();
    let err = threads
        .ensure_rt_budget(&cg, &GroupPath::new("hr/lc").unwrap())
        .expect_err("hr's budget is all held by hr/other");
    let msg = err.to_string();
    assert!(
        msg.contains("cpu.rt_runtime_us") && msg.contains("hr/lc"),
        "{msg}"
    );
    assert!(rt_writes(&fake).is_empty());
    assert!(threads.state().rt_budgets.is_empty());
    // restore has nothing to undo
    threads.restore(Some(&cg));
    assert!(rt_writes(&fake).is_empty());
}

#[test]
fn hosts_without_rt_group_scheduling_need_no_budget() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    for g in ["hr", "hr/lc"] {
        cg.create(&GroupPath::new(g).unwrap()).unwrap();
    }
    // a kernel without CONFIG_RT_GROUP_SCHED has no cpu.rt_runtime_us
    for g in ["", "hr", "hr/lc"] {
        std::fs::remove_file(fake.path("cpu", g, "cpu.rt_runtime_us")).unwrap();
    }
    fake.io.take_writes();
    let mut threads = LcThreads::default();
    threads
        .ensure_rt_budget(&cg, &GroupPath::new("hr/lc").unwrap())
        .unwrap();
    assert!(rt_writes(&fake).is_empty());
    assert!(threads.state().rt_budgets.is_empty());
}
