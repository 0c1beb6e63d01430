//! `safety.be_pids_max` (issue 42, hostile pass 24's medium: a BE's process count was
//! unbounded): the default bounds every host, the key is checked once with the rest, `ctl set`
//! takes the same checks, and the policy's allocation carries the limit whatever the policy.

use std::time::Duration;

use headroom_control::config::default_be_pids_max;
use headroom_control::config::Config;
use headroom_control::policy::{self, MachineInfo};
use headroom_types::mechanism::Mechanism;
use headroom_types::observation::Observation;

use crate::config_support::{refuse, GOOD};

#[test]
fn the_default_is_a_quarter_of_the_hosts_tasks_at_most_32768() {
    assert_eq!(default_be_pids_max(Some(32_768), 1), 8_192);
    assert_eq!(default_be_pids_max(Some(4_194_304), 1), 32_768);
    assert_eq!(
        default_be_pids_max(None, 1),
        8_192,
        "the kernel's default pid_max"
    );
    assert_eq!(
        default_be_pids_max(Some(301), 1),
        75,
        "the kernel's least pid_max"
    );
    assert_eq!(
        default_be_pids_max(Some(32_768), 0),
        8_192,
        "no static group"
    );
    assert_eq!(default_be_pids_max(Some(64), 8), 16, "at least 16");
    let c = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(c.safety.be_pids_max, None);
    assert_eq!(c.safety.be_pids_limit(Some(32_768), 1), Some(8_192));
    let mut machine = MachineInfo::with_cpus(1);
    assert_eq!(machine.host_tasks(), None);
    machine.threads_max = Some(100_000);
    assert_eq!(
        machine.host_tasks(),
        Some(32_768),
        "pid_max unread: the kernel's default"
    );
    machine.pid_max = Some(4_194_304);
    assert_eq!(machine.host_tasks(), Some(100_000));
}

/// `GOOD` with `n` BE groups (`headroom/be`, `headroom/be2`, …).
fn with_be_groups(n: usize) -> String {
    let more: String = (2..=n)
        .map(|i| format!("[[be]]\nname = \"batch{i}\"\ncgroup = \"headroom/be{i}\"\n"))
        .collect();
    GOOD.replacen("[policy]\n", &format!("{more}[policy]\n"), 1)
}

/// Hostile pass 26: the default was a quarter of `kernel.pid_max` for each BE group, so four
/// BE groups (or jobs of one user reaching each other's, pass 25) forking without end took
/// every pid on the host (4 x 8192 of 32768), the LC left unable to fork or start a thread.
/// The default is now a quarter of the host's tasks shared among the groups.
#[test]
fn the_default_for_every_be_group_together_leaves_three_quarters_of_the_pids() {
    let obs = Observation {
        idle_cpus: Some(4.0),
        ..Observation::default()
    };
    let mut machine = MachineInfo::with_cpus(8);
    machine.pid_max = Some(32_768);
    for groups in [1usize, 2, 4, 8] {
        let c = Config::from_toml_str(&with_be_groups(groups)).unwrap();
        assert_eq!(c.be.len(), groups);
        let d = policy::build(&c, &machine).decide(&obs, Duration::ZERO);
        let each = d.allocation.be_pids_max.expect("a limit");
        assert!(
            each * groups as u64 <= 32_768 / 4,
            "{groups} BE groups of {each} tasks each may take {} of the host's 32768 pids",
            each * groups as u64
        );
    }
}

/// Hostile pass 26: `kernel.threads-max` (sized by memory: 8192 on a host of 1 GiB) bounds
/// every fork below a `pid_max` of 4194304 (systemd's): the default took `pid_max` alone, so one
/// BE group's 32768 was every task such a host can run.
#[test]
fn the_default_is_a_quarter_of_threads_max_where_that_is_lower_than_pid_max() {
    let obs = Observation {
        idle_cpus: Some(4.0),
        ..Observation::default()
    };
    let mut machine = MachineInfo::with_cpus(8);
    machine.pid_max = Some(4_194_304);
    machine.threads_max = Some(8_192);
    let c = Config::from_toml_str(GOOD).unwrap();
    let d = policy::build(&c, &machine).decide(&obs, Duration::ZERO);
    assert_eq!(
        d.allocation.be_pids_max,
        Some(2_048),
        "a quarter of threads-max 8192"
    );
}

#[test]
fn a_be_pids_max_that_cannot_hold_a_command_or_that_the_kernel_refuses_is_refused() {
    for n in ["1", "15", "4194305"] {
        let msg = refuse(&format!("{GOOD}[safety]\nbe_pids_max = {n}\n"));
        assert!(msg.contains("safety.be_pids_max"), "{msg}");
        assert!(msg.contains(n), "names the value: {msg}");
        assert!(msg.contains("16..=4194304"), "names the fix: {msg}");
    }
    // Reported with the other problems, all at once.
    let msg = refuse(&format!(
        "{GOOD}[safety]\nbe_pids_max = 3\nbe_memory_limit_bytes = 1\n"
    ));
    assert!(
        msg.contains("safety.be_pids_max") && msg.contains("safety.be_memory_limit_bytes"),
        "{msg}"
    );
    for (n, limit) in [("16", Some(16)), ("0", None), ("4194304", Some(4_194_304))] {
        let c = Config::from_toml_str(&format!("{GOOD}[safety]\nbe_pids_max = {n}\n")).unwrap();
        assert_eq!(c.safety.be_pids_limit(Some(32_768), 1), limit, "{n}");
        assert_eq!(
            c.safety.be_pids_limit(Some(32_768), 4),
            limit,
            "a value given is each group's: {n}"
        );
    }
}

#[test]
fn ctl_set_takes_the_same_checks() {
    let mut c = Config::from_toml_str(GOOD).unwrap();
    let err = c.set("safety.be_pids_max", "8").unwrap_err().to_string();
    assert!(err.contains("safety.be_pids_max"), "{err}");
    assert_eq!(c.safety.be_pids_max, None, "unchanged on error");
    c.set("safety.be_pids_max", "64").unwrap();
    assert_eq!(c.safety.be_pids_max, Some(64));
}

#[test]
fn every_policys_allocation_carries_the_limit_unless_the_host_has_no_pids_controller() {
    let obs = Observation {
        idle_cpus: Some(4.0),
        ..Observation::default()
    };
    let mut machine = MachineInfo::with_cpus(8);
    machine.pid_max = Some(4_194_304);
    for kind in ["none", "heracles"] {
        let text = GOOD.replace("kind = \"heracles\"", &format!("kind = \"{kind}\""));
        let c = Config::from_toml_str(&text).unwrap();
        let d = policy::build(&c, &machine).decide(&obs, Duration::ZERO);
        assert_eq!(d.allocation.be_pids_max, Some(32_768), "{kind}");
    }
    let c = Config::from_toml_str(&format!("{GOOD}[safety]\nbe_pids_max = 64\n")).unwrap();
    let d = policy::build(&c, &machine).decide(&obs, Duration::ZERO);
    assert_eq!(d.allocation.be_pids_max, Some(64));
    machine.mechanisms.set(Mechanism::Pids, false);
    let d = policy::build(&c, &machine).decide(&obs, Duration::ZERO);
    assert_eq!(
        d.allocation.be_pids_max, None,
        "no controller: nothing to write"
    );
}
