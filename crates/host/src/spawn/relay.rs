//! The output of a command run as another user: its fds 1 and 2 are one pipe, never the
//! agent's own (systemd's journal stream, the agent's log file), and a thread of the agent
//! reads the pipe and logs what comes line by line with the command's name. Before (pass
//! 20's low), such a command wrote straight into the agent's journal, as the agent, with
//! `<N>` priority prefixes of its choosing.
//!
//! Bounded every way: a line is cut at [`MAX_LINE`] bytes (the rest up to its newline
//! dropped), at most [`PER_WINDOW`] lines are logged per [`WINDOW`] (the lines past that
//! are counted and the count said), control characters are replaced, and the pipe is read
//! without pause, so the command never waits on the agent beyond a pipe buffer and the
//! thread holds one line at most.

use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The log target of the lines relayed: the agent's default filter (`warn`) lets it through
/// at `info`.
pub const TARGET: &str = "headroom_output";
/// The longest line logged, in bytes; a longer one is cut.
pub const MAX_LINE: usize = 1024;
/// How many lines are logged per [`WINDOW`]; the rest are counted.
pub const PER_WINDOW: u32 = 100;
/// The window [`PER_WINDOW`] counts over.
pub const WINDOW: Duration = Duration::from_secs(10);

/// What the relay says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// One line of the command's output (`cut`: it was longer than [`MAX_LINE`]).
    Line { text: String, cut: bool },
    /// How many lines were not logged (over [`PER_WINDOW`] in a [`WINDOW`]).
    Dropped(u64),
}

/// A pipe for a command's output: (the agent's read end, the command's write end), both
/// close-on-exec (the write end is made the command's fds 1 and 2 by `dup2`, which clears
/// the flag there).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fds just made, owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Logs what comes out of `read` (a [`pipe`]'s read end) on a thread of its own, with
/// `name` and `pid`, until every writer has closed it.
pub fn start(read: OwnedFd, name: &str, pid: i32) -> io::Result<()> {
    let name = name.to_string();
    start_with(read, move |said| match said {
        Said::Line { text, cut: false } => {
            tracing::info!(target: TARGET, command = %name, pid, "output: {text}");
        }
        Said::Line { text, cut: true } => {
            tracing::info!(target: TARGET, command = %name, pid, "output (cut at {MAX_LINE} bytes): {text}");
        }
        Said::Dropped(n) => {
            tracing::warn!(target: TARGET, command = %name, pid, lines = n,
                "output lines not logged: over {PER_WINDOW} in {} s", WINDOW.as_secs());
        }
    })
}

/// [`start`] with what is said handed to `sink`.
pub fn start_with(read: OwnedFd, mut sink: impl FnMut(Said) + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name("output-relay".into())
        .spawn(move || {
            let mut file = std::fs::File::from(read);
            let mut lines = Lines::new(Instant::now());
            let mut buf = [0u8; 4096];
            loop {
                match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => lines.push(&buf[..n], Instant::now(), &mut sink),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            lines.end(&mut sink);
        })
        .map(drop)
}

/// Splits bytes into bounded lines and bounds how many are said.
pub struct Lines {
    line: Vec<u8>,
    cut: bool,
    window: Instant,
    said: u32,
    dropped: u64,
}

impl Lines {
    /// Nothing read yet; the first window begins at `now`.
    pub fn new(now: Instant) -> Lines {
        Lines {
            line: Vec::with_capacity(MAX_LINE),
            cut: false,
            window: now,
            said: 0,
            dropped: 0,
        }
    }

    /// Takes `bytes` read at `now`, saying each line they end.
    pub fn push(&mut self, bytes: &[u8], now: Instant, sink: &mut impl FnMut(Said)) {
        for &b in bytes {
            if b == b'\n' {
                self.line_ends(now, sink);
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            } else {
                self.cut = true;
            }
        }
    }

    /// The pipe closed: a last line without its newline, and the count not said yet.
    pub fn end(&mut self, sink: &mut impl FnMut(Said)) {
        if !self.line.is_empty() || self.cut {
            let now = self.window;
            self.line_ends(now, sink);
        }
        if self.dropped > 0 {
            sink(Said::Dropped(std::mem::take(&mut self.dropped)));
        }
    }

    fn line_ends(&mut self, now: Instant, sink: &mut impl FnMut(Said)) {
        if now.duration_since(self.window) >= WINDOW {
            if self.dropped > 0 {
                sink(Said::Dropped(std::mem::take(&mut self.dropped)));
            }
            self.window = now;
            self.said = 0;
        }
        let cut = std::mem::take(&mut self.cut);
        if self.said >= PER_WINDOW {
            self.dropped += 1;
        } else {
            self.said += 1;
            let text = String::from_utf8_lossy(&self.line)
                .chars()
                .map(|c| match c.is_control() && c != '\t' {
                    true => '\u{fffd}',
                    false => c,
                })
                .collect();
            sink(Said::Line { text, cut });
        }
        self.line.clear();
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
