//! A test whose LC is a command the agent launches: `sleep <marker>` in `<top>/lc` (one BE
//! `sleep` in `<top>/be`, static cores, `restore`), and the processes running it.

#![allow(dead_code)] // the standalone test files that share `live` launch no LC command

use std::path::Path;

use super::marked::MarkedGroup;
use headroom_types::GroupPath;

pub struct LcCommand {
    pub guard: MarkedGroup,
    pub dir: tempfile::TempDir,
    /// `sleep <marker>`
    pub command: Vec<String>,
    /// The agent's config.
    pub text: String,
    pub lc_group: GroupPath,
}

impl LcCommand {
    pub fn new(guard: MarkedGroup) -> LcCommand {
        let dir = tempfile::tempdir().unwrap();
        let top = &guard.top;
        let text = super::agent_config(
            &format!("{top}/lc"),
            &format!("{top}/be"),
            &format!("command = [\"sleep\", \"{}\"]", guard.marker),
            &dir.path().join("state.json"),
            &dir.path().join("ctl.sock"),
        );
        LcCommand {
            command: vec!["sleep".to_string(), guard.marker.clone()],
            lc_group: GroupPath::new(&format!("{top}/lc")).unwrap(),
            guard,
            dir,
            text,
        }
    }

    /// The processes running the command, sorted.
    pub fn copies(&self) -> Vec<u32> {
        let mut c = headroom_host::pids::running(Path::new("/"), &self.command);
        c.sort_unstable();
        c
    }

    /// Whether `pid` is in the LC group (the first hierarchy's).
    pub fn in_lc_group(&self, pid: u32) -> bool {
        self.guard
            .cgroups
            .procs(&self.lc_group)
            .unwrap_or_default()
            .contains(&(pid as i32))
    }
}
