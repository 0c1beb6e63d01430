//! A memcached the tools' benchmarks measure against: one worker thread on a free loopback
//! port, pinned where asked, killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use headroom_host::spawn::StartIn;

use crate::tools::error::{Result, ToolError};

/// A memcached on a free loopback port, killed on drop.
pub(crate) struct Memcached {
    pub(crate) port: u16,
    child: Child,
}

impl Memcached {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn cpu_s(&self) -> Option<f64> {
        headroom_host::process::process_cpu_time(self.child.id() as i32)
            .ok()
            .map(|d| d.as_secs_f64())
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// memcached with one worker thread; with `cpu`, pinned there (its threads inherit the
/// affinity set before exec).
pub(crate) fn start_memcached(cpu: Option<usize>) -> Result<Memcached> {
    // Ready when *our* memcached answers `stats` with its pid, not when the port accepts.
    let (child, addr) = headroom_load::readiness::spawn_memcache_server(
        |port| {
            let mut cmd = Command::new("memcached");
            if let Some(cpu) = cpu {
                // Only a group directory can be refused: none here.
                let _ = StartIn::parent().on_cpu(cpu).apply(&mut cmd);
            }
            cmd.args([
                "-l",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "0",
                "-t",
                "1",
            ])
            .args(["-m", "256", "-u", "root"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
            cmd
        },
        5,
        Duration::from_secs(5),
    )
    .map_err(ToolError::Memcached)?;
    Ok(Memcached {
        port: addr.port(),
        child,
    })
}
