//! `--no-rt`: the agent started where SCHED_FIFO is refused (a v1 `cpu` group whose
//! `cpu.rt_runtime_us` is 0, else without CAP_SYS_NICE), as on a cloud VM's non-root cgroup.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::error::{Result, ToolError};
use headroom_host::spawn::{Capability, StartIn};

/// The v1 `cpu` group the agent is started in with `--no-rt`.
const NO_RT_GROUP: &str = "headroom-bench-prober-no-rt";

/// How the agent is denied SCHED_FIFO (or not).
#[derive(Debug)]
pub enum AgentRt {
    /// It runs as the bench does.
    Allowed,
    /// In a v1 `cpu` group whose `cpu.rt_runtime_us` is 0.
    Group { dir: PathBuf },
    /// Without CAP_SYS_NICE (bounding and inheritable sets), where no such group can be made.
    NoCapability,
}

/// `chrt -f 1 true` started as `start` says: whether SCHED_FIFO is granted there (a child
/// that could not be started so is not granted it either).
fn fifo_granted(start: &StartIn) -> bool {
    let mut cmd = Command::new("chrt");
    cmd.args(["-f", "1", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    start.apply(&mut cmd).is_ok() && cmd.status().is_ok_and(|s| s.success())
}

/// Whether the bench itself (and so its reference instruments) may use SCHED_FIFO.
pub fn fifo_allowed_here() -> bool {
    fifo_granted(&StartIn::parent())
}

impl AgentRt {
    /// Prepares a place where SCHED_FIFO is refused, and checks that it is.
    pub fn refuse() -> Result<AgentRt> {
        let rt = match headroom_host::rt_budget::no_rt_group(Path::new("/"), NO_RT_GROUP)? {
            Some(dir) => AgentRt::Group { dir },
            None => AgentRt::NoCapability,
        };
        if fifo_granted(&rt.start()) {
            let what = rt.describe();
            rt.remove();
            return Err(ToolError::Measurement(format!(
                "--no-rt: SCHED_FIFO is still granted ({what}); cannot refuse it on this host"
            )));
        }
        Ok(rt)
    }

    /// How a command is started here.
    pub fn start(&self) -> StartIn {
        match self {
            AgentRt::Allowed => StartIn::parent(),
            AgentRt::Group { dir } => StartIn::parent().in_group(dir),
            AgentRt::NoCapability => StartIn::parent().without(Capability::SysNice),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            AgentRt::Allowed => "allowed where the host allows it".into(),
            AgentRt::Group { dir } => format!(
                "refused: started in {} (cpu.rt_runtime_us = 0)",
                dir.display()
            ),
            AgentRt::NoCapability => "refused: started without CAP_SYS_NICE".into(),
        }
    }

    /// Removes the group (its processes are gone by then).
    pub fn remove(&self) {
        if let AgentRt::Group { dir } = self {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_puts_the_agent_in_the_group_or_drops_its_capability() {
        let g = AgentRt::Group {
            dir: PathBuf::from("/sys/fs/cgroup/cpu/x"),
        };
        let s = g.start();
        assert_eq!(s.group_dirs(), &[PathBuf::from("/sys/fs/cgroup/cpu/x")]);
        assert!(s.dropped().is_empty());
        let s = AgentRt::NoCapability.start();
        assert_eq!(
            (s.group_dirs(), s.dropped()),
            (&[][..], &[Capability::SysNice][..])
        );
        assert!(AgentRt::Allowed.start().is_parent());
    }

    /// Live: where a v1 cpu hierarchy with real-time group scheduling is mounted (root), the
    /// group is made and `chrt -f` is refused inside it while the bench itself keeps FIFO.
    #[test]
    fn fifo_is_refused_in_the_no_rt_group() {
        const TEST: &str = "fifo_is_refused_in_the_no_rt_group";
        if !fifo_allowed_here() {
            eprintln!("SKIP {TEST}: SCHED_FIFO is not granted to this process");
            return;
        }
        let rt = match AgentRt::refuse() {
            Ok(rt) => rt,
            Err(e) => panic!("{e}"),
        };
        let refused = !fifo_granted(&rt.start());
        let what = rt.describe();
        rt.remove();
        assert!(refused, "{what}");
        if matches!(rt, AgentRt::NoCapability) {
            eprintln!("SKIP {TEST} (group part): no v1 cpu hierarchy with real-time group scheduling; refused by dropping CAP_SYS_NICE");
        }
    }
}
