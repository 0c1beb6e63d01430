//! `Cgroups::kill_all_except`: the group is frozen for the kill (no fork between the read and
//! the kill) and ends frozen or thawed as it was before. On v2 a frozen task dies of SIGKILL, so
//! the poll can find the group empty before any thaw: the fake answers the group's
//! `cgroup.procs` as the kernel would then (the process, the process, then nobody).

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};

use crate::support::Fake;
use headroom_host::{Cgroups, FreezeState};
use headroom_types::GroupPath;

/// A group holding one live process (a `sleep` child) whose `cgroup.procs` reads list it
/// `reads_listing` times, then nobody.
fn group_with_a_dying_process(fake: &Fake, reads_listing: usize) -> (Cgroups, GroupPath, Child) {
    let cgroups = fake.host().cgroups().unwrap();
    let group = GroupPath::new("hr/be").unwrap();
    cgroups.create(&group).unwrap();
    let child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id().to_string();
    let mut answers = vec![pid.as_str(); reads_listing];
    answers.push("");
    fake.kernel.script_reads("/hr/be/cgroup.procs", &answers);
    (cgroups, group, child)
}

fn killed_by_sigkill(mut child: Child) -> bool {
    child.wait().unwrap().signal() == Some(9)
}

#[test]
fn a_thawed_group_whose_processes_die_while_frozen_ends_thawed() {
    let fake = Fake::v2();
    // (the first look, the kill's, then empty: gone while frozen, as v2 does)
    let (cgroups, group, child) = group_with_a_dying_process(&fake, 2);
    let killed = cgroups.kill_all_except(&group, &BTreeSet::new());
    assert!(
        killed_by_sigkill(child),
        "the group's process was not killed"
    );
    assert_eq!(killed.unwrap(), 1);
    assert!(
        fake.kernel
            .writes()
            .iter()
            .any(|(p, v)| p.ends_with("hr/be/cgroup.freeze") && v == "1"),
        "the group was not frozen for the kill"
    );
    assert_eq!(
        cgroups.freeze_state(&group).unwrap(),
        FreezeState::Thawed,
        "the kill left a group that ran thawed frozen (what it spared with it)"
    );
}

#[test]
fn a_frozen_group_stays_frozen_after_the_kill() {
    let fake = Fake::v2();
    // (still listed at the first poll: thawed so it takes the signal, as v1 needs)
    let (cgroups, group, child) = group_with_a_dying_process(&fake, 3);
    cgroups.freeze(&group).unwrap();
    let spared = BTreeSet::from([1]);
    let killed = cgroups.kill_all_except(&group, &spared);
    assert!(
        killed_by_sigkill(child),
        "the group's process was not killed"
    );
    assert_eq!(killed.unwrap(), 1);
    assert_eq!(
        cgroups.freeze_state(&group).unwrap(),
        FreezeState::Frozen,
        "the kill thawed a group that was frozen (BE held off)"
    );
}
