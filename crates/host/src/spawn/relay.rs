//! The output of a command run as another user: its fds 1 and 2 are one pipe, never the
//! agent's own (systemd's journal stream, the agent's log file), and a thread of the agent
//! reads the pipe and logs what comes line by line with the command's name. Before (pass
//! 20's low), such a command wrote straight into the agent's journal, as the agent, with
//! `<N>` priority prefixes of its choosing.
//!
//! Bounded every way: a line is cut at [`MAX_LINE`] bytes (the rest up to its newline
//! dropped), at most [`PER_WINDOW`] lines are logged per [`WINDOW`] (the lines past that
//! are counted and the count said), control and format characters are replaced
//! ([`hidden`]), and the pipe is read
//! without pause, so the command never waits on the agent beyond a pipe buffer and the
//! thread holds one line at most.
//!
//! Bounded in time too (hostile pass 22): a BE's relay ends at most [`GRACE`] after the
//! command's own process has ended, whoever still holds the pipe. Before, it read until the
//! last writer closed: a BE that left a process behind (`sleep 1d &`), or any process of its
//! user that opened `/proc/<pid>/fd/1`, kept the thread and its fd alive, one more at every
//! restart, without bound.
//!
//! And bounded in the agent's CPU: a BE's relay reads at most [`BYTES_PER_WINDOW`] per
//! [`WINDOW`], then leaves the pipe until the window ends (the BE waits on its full pipe, on
//! its own CPUs). Before, a BE writing as fast as it could (`cat /dev/zero`) kept the relay
//! thread, outside every BE limit, at about half a CPU (hostile pass 22). An LC command run
//! as a user is not relayed: its output must outlive the agent (`super::journal`).
//!
//! A BE an earlier agent launched and this one adopts is relayed too ([`start_adopted`]):
//! its pipe's reader ended with that agent, and thawed it died on its first write (hostile
//! pass 23's low).

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The log target of the lines relayed: the agent's default filter (`warn`) lets it through
/// at `info`.
pub const TARGET: &str = "headroom_output";
/// The longest line logged, in bytes; a longer one is cut.
pub const MAX_LINE: usize = 1024;
/// How many lines are logged per [`WINDOW`]; the rest are counted.
pub const PER_WINDOW: u32 = 100;
/// The window [`PER_WINDOW`] counts over.
pub const WINDOW: Duration = Duration::from_secs(10);
/// How long the relay reads on after the command's own process has ended (what it left
/// behind may still be writing its last lines); then it ends, whoever holds the pipe.
pub const GRACE: Duration = Duration::from_secs(5);
/// The most a paced relay (a BE's) reads per [`WINDOW`]: ten times what it may log
/// ([`PER_WINDOW`] lines of [`MAX_LINE`] bytes).
pub const BYTES_PER_WINDOW: usize = 10 * PER_WINDOW as usize * MAX_LINE;

/// What the relay says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// One line of the command's output (`cut`: it was longer than [`MAX_LINE`]).
    Line { text: String, cut: bool },
    /// How many lines were not logged (over [`PER_WINDOW`] in a [`WINDOW`]).
    Dropped(u64),
    /// The command ended more than the grace ago and something (a process it left) still
    /// holds the pipe: the relay ends, and what is written from now on is not read.
    Abandoned,
    /// A paced relay read its [`BYTES_PER_WINDOW`]: the rest waits in the pipe (the command
    /// with it) until the window ends. Said once per window.
    Paced,
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

/// Which pipe a relay reads: its device and inode (`st_dev`, `st_ino`), recorded in the state
/// file at launch so that the next agent relays an adopted BE's output only from that pipe
/// ([`start_adopted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PipeId {
    pub dev: u64,
    pub ino: u64,
}

impl PipeId {
    /// The pipe (or any file) `fd` is.
    pub fn of(fd: &impl AsFd) -> io::Result<PipeId> {
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(io::Error::from)?;
        Ok(PipeId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }
}

/// A pidfd for `pid` (`pidfd_open(2)`, Linux 5.3): readable once the process has ended.
/// `pid` must be the caller's child not yet reaped, so that it names no other process.
pub fn pidfd(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Logs what comes out of `read` (a [`pipe`]'s read end) on a thread of its own, with
/// `name` and `pid` (the caller's BE command, not reaped yet, restarted at will), until every
/// writer has closed it or [`GRACE`] after `pid` has ended, reading at most
/// [`BYTES_PER_WINDOW`] per [`WINDOW`]. (An LC command is never relayed: its output must
/// outlive the agent, `super::journal`.)
pub fn start(read: OwnedFd, name: &str, pid: i32) -> io::Result<()> {
    let end = match pidfd(pid) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(target: TARGET, command = %name, pid, error = %e,
                "no pidfd for the command: its output is relayed until the last process holding it closes it");
            None
        }
    };
    start_until(read, end, GRACE, Some(BYTES_PER_WINDOW), logged(name, pid))
}

/// Relays the output of a BE command an earlier agent launched and this one adopts (pid
/// `pid`, started at `born`, `/proc/<pid>/stat`'s clock ticks), exactly as [`start`] does
/// for a BE it launched: paced, ended [`GRACE`] after the process ends, logged under
/// [`TARGET`]. Hostile pass 23's low: the BE's fds 1 and 2 were the earlier agent's relay
/// pipe, whose only reader ended with that agent, so an adopted BE thawed and writing died
/// on its closed pipe (SIGPIPE). A read end of that same pipe is opened through
/// `/proc/<pid>/fd/<n>` (a pipe opens there like a FIFO), for each of fds 1 and 2 that is
/// `pipe`: the relay pipe the earlier agent made at launch, as its state file recorded it
/// (`None`: a state file that recorded none, nothing relayed). Anything else (`/dev/null`, a
/// file, a socket, a terminal, any other pipe or FIFO: hostile pass 26's low, a BE could
/// point its fd 1 at a FIFO of the agent's user and have the agent read what that FIFO's
/// writers meant for its reader) is left, and said. The process is held by a [`pidfd`]
/// taken after its start time is checked, and is checked alive after the opens: the pipes
/// are that process's. Returns how many pipes are relayed. Call it before the BE is thawed:
/// a frozen BE writes nothing meanwhile.
pub fn start_adopted(pid: i32, born: u64, name: &str, pipe: Option<PipeId>) -> io::Result<usize> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let end = pidfd(pid)?;
    let gone = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("pid {pid} is no longer the process adopted (started at {born})"),
        )
    };
    if crate::pids::start_time(std::path::Path::new("/"), pid as u32) != Some(born) {
        return Err(gone());
    }
    let key = |m: &std::fs::Metadata| PipeId {
        dev: m.dev(),
        ino: m.ino(),
    };
    let me = crate::process::effective_uid();
    let mut pipes: Vec<(PipeId, std::fs::File)> = Vec::new();
    for fd in [1, 2] {
        let path = format!("/proc/{pid}/fd/{fd}");
        // (the uid too: a pipe the BE made itself is its user's, whatever inode it reuses)
        let is_ours = |m: &std::fs::Metadata| {
            m.file_type().is_fifo() && m.uid() == me && Some(key(m)) == pipe
        };
        // What the fd is, before opening it (a device is never opened).
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if !is_ours(&meta) {
            if meta.file_type().is_fifo() {
                tracing::warn!(target: TARGET, command = %name, pid, fd, pipe = ?key(&meta), recorded = ?pipe,
                    "the adopted BE command's fd is a pipe or FIFO the earlier agent did not make for it: left, not read");
            }
            continue;
        }
        if pipes.iter().any(|(k, _)| *k == key(&meta)) {
            continue;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)?;
        // The same pipe as the fd (the fd may have changed between the two looks).
        let opened = file.metadata()?;
        let now = std::fs::metadata(&path)?;
        if !is_ours(&opened) || key(&opened) != key(&meta) || key(&now) != key(&meta) {
            continue;
        }
        // Read as a launched BE's pipe is: blocking, woken by poll.
        // SAFETY: clearing O_NONBLOCK on an fd this function owns.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) };
        pipes.push((key(&meta), file));
    }
    if ended(&end) {
        return Err(gone());
    }
    let n = pipes.len();
    for (_, file) in pipes {
        let end = end.try_clone()?;
        start_until(
            file.into(),
            Some(end),
            GRACE,
            Some(BYTES_PER_WINDOW),
            logged(name, pid),
        )?;
    }
    Ok(n)
}

/// Whether the process of `pidfd` has ended (its pidfd is readable).
fn ended(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of an open fd, no wait.
    let ready = unsafe { libc::poll(&mut p, 1, 0) };
    ready != 0
}

/// What is said, logged under [`TARGET`] with the command's `name` and `pid`.
fn logged(name: &str, pid: i32) -> impl FnMut(Said) + Send + 'static {
    let name = name.to_string();
    move |said| match said {
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
        Said::Abandoned => {
            tracing::warn!(target: TARGET, command = %name, pid, grace_s = GRACE.as_secs(),
                "the command ended and processes it left still hold its output: no longer relayed (run the command in the foreground)");
        }
        Said::Paced => {
            tracing::warn!(target: TARGET, command = %name, pid, bytes = BYTES_PER_WINDOW,
                "output over {BYTES_PER_WINDOW} bytes in {} s: not read until the window ends (the command waits on its output)", WINDOW.as_secs());
        }
    }
}

/// [`start`] with what is said handed to `sink`, read until the last writer closes.
pub fn start_with(read: OwnedFd, sink: impl FnMut(Said) + Send + 'static) -> io::Result<()> {
    start_until(read, None, GRACE, None, sink)
}

/// [`start_with`], ending at most `grace` after `end` (a [`pidfd`]) is readable, and
/// reading at most `budget` bytes per [`WINDOW`] when there is one.
pub fn start_until(
    read: OwnedFd,
    end: Option<OwnedFd>,
    grace: Duration,
    budget: Option<usize>,
    mut sink: impl FnMut(Said) + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("output-relay".into())
        .spawn(move || {
            let mut file = std::fs::File::from(read);
            let mut lines = Lines::new(Instant::now());
            let mut buf = [0u8; 4096];
            let mut ended: Option<Instant> = None;
            // the budget's window: when it began and what was read in it
            let (mut window, mut read_in) = (Instant::now(), 0usize);
            let mut paced_said = false;
            loop {
                if window.elapsed() >= WINDOW {
                    (window, read_in, paced_said) = (Instant::now(), 0, false);
                }
                let paused = budget.is_some_and(|b| read_in >= b);
                if paused && !paced_said {
                    paced_said = true;
                    sink(Said::Paced);
                }
                let mut polls = [
                    libc::pollfd {
                        fd: file.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: end.as_ref().map_or(-1, |e| e.as_raw_fd()),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128) as i32;
                let mut wait_ms = match ended {
                    // a negative fd is skipped by poll: only the pipe is watched
                    Some(at) => match grace.checked_sub(at.elapsed()) {
                        Some(left) => ms(left),
                        None => {
                            sink(Said::Abandoned);
                            break;
                        }
                    },
                    None => -1,
                };
                if ended.is_some() {
                    polls[1].fd = -1;
                }
                if paused {
                    // the pipe is left until the window ends
                    polls[0].fd = -1;
                    let rest = ms(WINDOW.saturating_sub(window.elapsed()));
                    wait_ms = if wait_ms < 0 { rest } else { wait_ms.min(rest) };
                }
                // SAFETY: two pollfds of open fds (or -1, skipped).
                let rc = unsafe { libc::poll(polls.as_mut_ptr(), 2, wait_ms) };
                if rc < 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    break;
                }
                if ended.is_none() && polls[1].revents != 0 {
                    ended = Some(Instant::now());
                }
                if polls[0].revents == 0 {
                    continue;
                }
                match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        read_in += n;
                        lines.push(&buf[..n], Instant::now(), &mut sink);
                    }
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
                .map(|c| match hidden(c) {
                    true => '\u{fffd}',
                    false => c,
                })
                .collect();
            sink(Said::Line { text, cut });
        }
        self.line.clear();
    }
}

/// Whether `c` is replaced in a relayed line: a control character (C0, DEL and C1, U+0080 to
/// U+009F: `char::is_control`) but the tab, or a format character that changes how a line
/// is drawn without being seen (hostile pass 22's low: a line with U+202E was drawn
/// reordered in a terminal): the bidirectional marks, embeddings, overrides and isolates,
/// the zero-width ones, the word joiner and invisible operators, the byte order mark, the
/// interlinear annotation marks and the tag characters.
pub fn hidden(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c,
            '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}')
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
