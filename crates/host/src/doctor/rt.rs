//! Whether the agent may run SCHED_FIFO here, and why not: probed with `sched_setscheduler` on
//! a short-lived thread of this process (the thread ends; nothing else changes), then the usual
//! causes of a refusal read: the real-time budget of this process's cpu group (cgroup v1
//! `cpu.rt_runtime_us`; on v2, real-time group scheduling admits FIFO only in the root group),
//! `CAP_SYS_NICE`, `RLIMIT_RTPRIO`. The agent works without it (kernel stamps time the prober).

use headroom_types::doctor::Availability;

/// `CAP_SYS_NICE`'s bit in the capability sets.
const CAP_SYS_NICE: u32 = 23;

/// The probe, live (`sched_syscalls`) or skipped.
pub fn probe_sched_fifo(sched_syscalls: bool) -> Availability {
    if !sched_syscalls {
        return Availability::no("not probed (not the live root)");
    }
    let refused = std::thread::spawn(|| {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: a valid sched_param; affects only this short-lived thread.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
        (r != 0).then(std::io::Error::last_os_error)
    })
    .join()
    .unwrap_or_else(|_| Some(std::io::Error::other("probe thread panicked")));
    let causes = causes();
    match refused {
        None => Availability::yes(format!("sched_setscheduler(SCHED_FIFO) allowed ({causes})")),
        Some(e) => Availability::no(format!(
            "sched_setscheduler(SCHED_FIFO) refused: {e} ({causes}); the agent runs without it (the prober times by kernel stamps)"
        )),
    }
}

/// What decides a refusal, as read here.
fn causes() -> String {
    let mut out = Vec::new();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "cpu") {
            let budget = crate::rt_budget::RtBudget::of_this_process(std::path::Path::new("/"));
            if let (Some(dir), Some(v)) = (budget.group_dir, budget.group_runtime_us) {
                let f = dir.join("cpu.rt_runtime_us");
                let f = f.display();
                out.push(if v == 0 {
                    format!("RT group budget: {f} = 0 (no real-time time in this group)")
                } else {
                    format!("RT group budget: {f} = {v}")
                });
            }
        } else if controllers.is_empty() && !path.trim().is_empty() {
            // cgroup v2: with real-time group scheduling, FIFO only in the root group
            let rt_group = std::path::Path::new("/sys/fs/cgroup/cpu.rt_runtime_us").exists();
            if rt_group && path.trim() != "/" {
                out.push(format!(
                    "cgroup v2 group {} with real-time group scheduling (FIFO only in the root group)",
                    path.trim()
                ));
            }
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    match cap_eff {
        Some(c) if c & (1 << CAP_SYS_NICE) != 0 => out.push("CAP_SYS_NICE: yes".into()),
        Some(_) => out.push("CAP_SYS_NICE: no".into()),
        None => {}
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_RTPRIO, &raw mut lim) } == 0 {
        let cur = if lim.rlim_cur == libc::RLIM_INFINITY {
            "unlimited".to_owned()
        } else {
            lim.rlim_cur.to_string()
        };
        out.push(format!("RLIMIT_RTPRIO: {cur}"));
    }
    out.join("; ")
}
