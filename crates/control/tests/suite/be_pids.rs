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
fn the_default_is_a_quarter_of_pid_max_at_most_32768() {
    assert_eq!(default_be_pids_max(Some(32_768)), 8_192);
    assert_eq!(default_be_pids_max(Some(4_194_304)), 32_768);
    assert_eq!(
        default_be_pids_max(None),
        8_192,
        "the kernel's default pid_max"
    );
    assert_eq!(
        default_be_pids_max(Some(301)),
        75,
        "the kernel's least pid_max"
    );
    let c = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(c.safety.be_pids_max, None);
    assert_eq!(c.safety.be_pids_limit(Some(32_768)), Some(8_192));
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
        assert_eq!(c.safety.be_pids_limit(Some(32_768)), limit, "{n}");
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
