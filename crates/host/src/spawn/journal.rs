//! A journald stream of its own for an LC command run as another user, so that its output
//! outlives the agent. Through the agent's relay (a pipe whose only reader is a thread of the
//! agent) a user-run LC died at its first write after any exit of the agent (SIGPIPE): the
//! agent leaves LC commands running, and a `systemctl restart` killed the LC it left.
//!
//! The stream is the one `systemd-cat` opens (`sd_journal_stream_fd`): a connection to
//! journald's stdout socket, a header of seven lines (identifier, unit, priority, whether a
//! line's `<N>` prefix sets its priority, and three forwarding switches), then the command's
//! lines. Its lines carry their own identifier and journald's own `_PID`/`_UID` fields of the
//! connection, and a `<N>` the command writes is text, never a priority.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// journald's stream socket (systemd's `/run/systemd/journal/stdout`).
pub const STDOUT_SOCKET: &str = "/run/systemd/journal/stdout";

/// The priority of every line of the stream: info (6), as systemd logs a service's stdout.
const PRIORITY: u8 = 6;

/// How long [`open`] waits for journald to take the stream. A journald that takes none (hung,
/// its socket's backlog full) blocked a plain `connect` without end, and with it the agent's
/// start, before any log line (a SIGTERM there ends it by the signal's default action): a
/// restart left BE at the last allocation with no control loop and no exit action (hostile
/// pass 26).
pub const CONNECT_WAIT: Duration = Duration::from_secs(1);
/// Between two tries of a connect journald's full backlog refused.
const CONNECT_RETRY: Duration = Duration::from_millis(10);

/// Whether this process's fd 2 is the journald stream systemd connected it to: systemd sets
/// `$JOURNAL_STREAM` to that stream's `<device>:<inode>` (systemd.exec(5)).
pub fn agent_logs_to_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    is_this_stream(value.to_str(), st.st_dev, st.st_ino)
}

/// Whether `journal_stream` (the `$JOURNAL_STREAM` value) names the file of device `dev` and
/// inode `ino`.
pub fn is_this_stream(journal_stream: Option<&str>, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// The identifier a stream's lines carry: `identifier` with every character that is not a
/// printable ASCII character or is a space replaced by `_` (a newline would end the header
/// line early), at most 64 bytes.
pub fn clean_identifier(identifier: &str) -> String {
    identifier
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .take(64)
        .collect()
}

/// Opens a new stream to the journald socket at `socket` whose lines are logged with
/// `identifier` at info, a line's `<N>` prefix kept as text, nothing forwarded to syslog, the
/// kernel log or the console. The stream is write-only: give it as a command's fds 1 and 2.
/// A journald that does not take the stream within [`CONNECT_WAIT`] is an error
/// (`TimedOut`), never a wait without end.
pub fn open(socket: &Path, identifier: &str) -> io::Result<OwnedFd> {
    let mut stream = connect_within(socket, CONNECT_WAIT)?;
    stream.shutdown(std::net::Shutdown::Read)?;
    let header = format!(
        "{}\n\n{PRIORITY}\n0\n0\n0\n0\n",
        clean_identifier(identifier)
    );
    stream.write_all(header.as_bytes())?;
    Ok(OwnedFd::from(stream))
}

/// A stream connected to `socket`, tried without blocking until `wait` has passed (a Unix
/// socket's full backlog refuses a non-blocking connect with EAGAIN at once), then blocking
/// again for the command's writes.
fn connect_within(socket: &Path, wait: Duration) -> io::Result<UnixStream> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket as new_socket, AddressFamily, SockFlag, SockType};
    let addr = nix::sys::socket::UnixAddr::new(socket)?;
    let deadline = Instant::now() + wait;
    loop {
        let fd = new_socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {
                // SAFETY: clearing O_NONBLOCK on an fd this function owns.
                if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) } < 0 {
                    return Err(io::Error::last_os_error());
                }
                return Ok(UnixStream::from(fd));
            }
            Err(Errno::EAGAIN) if Instant::now() < deadline => std::thread::sleep(CONNECT_RETRY),
            Err(Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}: journald took no stream within {} ms (its backlog full: hung?)",
                        socket.display(),
                        wait.as_millis()
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    /// The header `systemd-cat -t <identifier>` sends (`sd_journal_stream_fd` with level prefix
    /// off), then the command's lines as written.
    #[test]
    fn the_stream_says_its_identifier_priority_and_no_level_prefix_then_the_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let listener = UnixListener::bind(&path).unwrap();
        let fd = open(&path, "headroom-lc-web\nfake").unwrap();
        let mut writer = std::fs::File::from(fd);
        writer.write_all(b"<0>not an emergency\n").unwrap();
        drop(writer);
        let (conn, _) = listener.accept().unwrap();
        let lines: Vec<String> = BufReader::new(conn).lines().map(Result::unwrap).collect();
        assert_eq!(
            lines,
            [
                "headroom-lc-web_fake",
                "",
                "6",
                "0",
                "0",
                "0",
                "0",
                "<0>not an emergency"
            ]
        );
    }

    /// Hostile pass 26: a journald that takes no stream (its socket's backlog full) blocked
    /// `open` without end, and with it the agent's start; now an error after the wait.
    #[test]
    fn a_journald_that_takes_no_stream_is_an_error_not_a_wait_without_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let listener = UnixListener::bind(&path).unwrap();
        // The least backlog (one pending connection), filled; nothing is ever accepted.
        // SAFETY: listen on a socket this test owns.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let mut held = Vec::new();
        for _ in 0..8 {
            let Ok(c) = connect_within(&path, Duration::ZERO) else {
                break;
            };
            held.push(c);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(open(&p, "x").map(drop)));
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}"),
            Ok(Ok(())) => panic!("a stream journald never took was opened"),
            Err(_) => panic!("open blocked for 20 s on a journald that takes no stream"),
        }
        drop(held);
    }

    #[test]
    fn no_journald_socket_is_an_error_naming_nothing_opened() {
        let dir = tempfile::tempdir().unwrap();
        assert!(open(&dir.path().join("none"), "x").is_err());
    }

    #[test]
    fn the_journal_stream_variable_names_one_device_and_inode() {
        assert!(is_this_stream(Some("8:1234"), 8, 1234));
        assert!(!is_this_stream(Some("8:1234"), 8, 1235));
        assert!(!is_this_stream(Some("8:1234"), 9, 1234));
        assert!(!is_this_stream(Some("garbage"), 8, 1234));
        assert!(!is_this_stream(Some(""), 0, 0));
        assert!(!is_this_stream(None, 8, 1234));
    }

    #[test]
    fn an_identifier_is_one_printable_word_of_at_most_64_bytes() {
        assert_eq!(clean_identifier("a b\tc\u{202e}d"), "a_b_c_d");
        assert_eq!(clean_identifier(&"x".repeat(100)).len(), 64);
    }
}
