//! The reconciler on the real kernel (root and a writable cpu controller with `cpu.idle`; skips
//! with a printed reason otherwise): an idle BE group's weight belongs to the kernel, so passes
//! that read everything back neither "repair" it nor fail on it.

use headroom_control::actuation::ManagedGroups;
use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_types::allocation::{Allocation, CpuWeight};
use headroom_types::GroupPath;

use crate::support;

const TEST: &str = "an_idle_be_group_keeps_reconciling_on_the_real_kernel";

struct Scratch(Cgroups, GroupPath);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = self.0.remove(&self.1) {
            eprintln!("cleanup: removing {}: {e}", self.1);
        }
    }
}

#[test]
fn an_idle_be_group_keeps_reconciling_on_the_real_kernel() {
    if !nix::unistd::geteuid().is_root() {
        return eprintln!("SKIP {TEST}: not root");
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) if c.backend(Controller::Cpu).is_ok() => c,
        Ok(_) => return eprintln!("SKIP {TEST}: no cpu controller"),
        Err(e) => return eprintln!("SKIP {TEST}: no cgroups: {e}"),
    };
    let top = GroupPath::new(&format!("headroom-test-idle-{}", std::process::id())).unwrap();
    let (lc, be) = (top.join("lc").unwrap(), top.join("be").unwrap());
    if let Err(e) = cgroups.create(&lc) {
        return eprintln!("SKIP {TEST}: cgroupfs not writable: {e}");
    }
    let _scratch = Scratch(cgroups.clone(), top.clone());
    cgroups.create(&be).unwrap();
    if cgroups.cpu_idle(&be).is_err() {
        return eprintln!("SKIP {TEST}: no cpu.idle on this kernel");
    }
    let original = cgroups.cpu_weight(&be).unwrap();
    let mut r = support::Plan::attach(
        &LinuxHost::system(),
        ManagedGroups {
            lc,
            be: vec![be.clone()],
        },
    );
    let weighted = |shares, weight| Allocation {
        be_enabled: true,
        be_cpu_idle: Some(false),
        be_cpu_weight: Some(CpuWeight { shares, weight }),
        ..Allocation::default()
    };
    let idle = Allocation {
        be_cpu_idle: Some(true),
        ..weighted(2, 1)
    };
    r.apply(&idle, true).unwrap();
    assert!(cgroups.cpu_idle(&be).unwrap());
    let idle_weight = cgroups.cpu_weight(&be).unwrap();
    eprintln!("{TEST}: weight of the idle group as the kernel shows it: {idle_weight}");
    for _ in 0..3 {
        let report = r
            .apply(&idle, true)
            .expect("a verifying pass over an idle group");
        assert!(report.writes.is_empty(), "{:?}", report.writes);
        assert!(report.drift.is_empty(), "{:?}", report.drift);
    }
    // Out of idle with a weight: both land, whatever the kernel reset the weight to.
    r.apply(&weighted(2048, 200), false).unwrap();
    assert!(!cgroups.cpu_idle(&be).unwrap());
    let w = cgroups.cpu_weight(&be).unwrap();
    assert!(w == 2048 || w == 200, "weight after leaving idle: {w}");
    r.restore_original().unwrap();
    assert!(!cgroups.cpu_idle(&be).unwrap());
    assert_eq!(cgroups.cpu_weight(&be).unwrap(), original);
}
