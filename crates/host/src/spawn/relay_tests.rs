//! The relay's bounds (line length, rate, control characters) and a user-run command's
//! output reaching it rather than the agent's fds.

use super::*;

fn said(lines: &mut Lines, bytes: &[u8], now: Instant) -> Vec<Said> {
    let mut out = Vec::new();
    lines.push(bytes, now, &mut |s| out.push(s));
    out
}

fn line(text: &str) -> Said {
    Said::Line {
        text: text.into(),
        cut: false,
    }
}

#[test]
fn lines_are_said_whole_cut_and_cleaned() {
    let t0 = Instant::now();
    let mut lines = Lines::new(t0);
    assert_eq!(said(&mut lines, b"one\ntw", t0), vec![line("one")]);
    assert_eq!(said(&mut lines, b"o\n", t0), vec![line("two")]);
    // A priority prefix is text like any other; escapes and CRs are replaced.
    assert_eq!(
        said(&mut lines, b"<0>\x1b[2Jroot\r\xff\n", t0),
        vec![line("<0>\u{fffd}[2Jroot\u{fffd}\u{fffd}")]
    );
    let mut long = vec![b'x'; MAX_LINE * 3];
    long.push(b'\n');
    let out = said(&mut lines, &long, t0);
    assert_eq!(
        out,
        vec![Said::Line {
            text: "x".repeat(MAX_LINE),
            cut: true
        }]
    );
    assert!(lines.line.capacity() <= MAX_LINE, "one line held at most");
    let mut out = Vec::new();
    lines.push(b"last", t0, &mut |s| out.push(s));
    lines.end(&mut |s| out.push(s));
    assert_eq!(out, vec![line("last")]);
}

#[test]
fn lines_past_the_rate_are_counted_and_said() {
    let t0 = Instant::now();
    let mut lines = Lines::new(t0);
    let flood = b"l\n".repeat(PER_WINDOW as usize + 50);
    let out = said(&mut lines, &flood, t0);
    assert_eq!(out.len(), PER_WINDOW as usize, "the rest counted, not said");
    // The next window: the count first, then the line.
    let out = said(&mut lines, b"next\n", t0 + WINDOW);
    assert_eq!(out, vec![Said::Dropped(50), line("next")]);
    let out = said(&mut lines, &flood, t0 + WINDOW);
    assert_eq!(out.len(), PER_WINDOW as usize - 1);
    let mut out = Vec::new();
    lines.end(&mut |s| out.push(s));
    assert_eq!(out, vec![Said::Dropped(51)], "said at the end too");
}

/// Pass 20's low: a command run as a user had the agent's fds 1 and 2 (systemd's journal
/// stream, its log file) and wrote lines into the agent's journal as the agent. Its fds 1
/// and 2 are now the relay's pipe: not the agent's, and what it writes is read.
#[test]
fn a_user_run_commands_output_is_not_the_agents() {
    if crate::process::effective_uid() != 0 {
        return eprintln!("SKIP a_user_run_commands_output_is_not_the_agents: needs root");
    }
    let ours = |fd: i32| {
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    let user = crate::spawn::RunAs::resolve(&headroom_types::UserSpec::Uid(65534))
        .unwrap()
        .expect("uid 65534");
    let script = "[ \"$(readlink /proc/$$/fd/1)\" = \"$1\" ] && exit 1; \
                  [ \"$(readlink /proc/$$/fd/2)\" = \"$2\" ] && exit 2; \
                  case \"$(readlink /proc/$$/fd/1)\" in pipe:*) ;; *) exit 3;; esac; \
                  echo l20-out; echo l20-err >&2; exit 0";
    let argv: Vec<String> = ["sh", "-c", script, "sh", &ours(1), &ours(2)]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let g = crate::spawn::Gated::fork_as(&argv, &[], Some(&user), crate::spawn::ProcessScope::Any)
        .expect("fork");
    let pid = nix::unistd::Pid::from_raw(g.pid());
    assert!(g.wait_ready(Duration::from_secs(5)));
    g.open();
    assert_eq!(
        nix::sys::wait::waitpid(pid, None).unwrap(),
        nix::sys::wait::WaitStatus::Exited(pid, 0),
        "1: its fd 1 was the agent's ({}), 2: its fd 2 ({}), 3: fd 1 no pipe",
        ours(1),
        ours(2)
    );
}

/// What is written into the pipe reaches the sink, line by line, and the thread ends when
/// the last writer closes.
#[test]
fn the_relay_reads_until_the_last_writer_closes() {
    let (read, write) = pipe().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    start_with(read, move |s| tx.send(s).unwrap()).unwrap();
    let mut w = std::fs::File::from(write);
    std::io::Write::write_all(&mut w, b"a\nb").unwrap();
    drop(w);
    let got: Vec<Said> = rx.iter().collect(); // ends when the thread drops its sender
    assert_eq!(got, vec![line("a"), line("b")]);
}

/// Hostile pass 22: a command that left a process holding its output (a BE's `sleep 1d &`,
/// or a process of its user that opened `/proc/<pid>/fd/1`) kept the relay's thread and fd
/// alive for as long as that process lived, one more at every restart. The relay now ends at
/// most its grace after the command's own process has ended, whoever still holds the pipe.
#[test]
fn the_relay_ends_after_its_command_though_a_writer_is_left() {
    let (read, write) = pipe().unwrap();
    let mut child = std::process::Command::new("true").spawn().expect("true");
    let end = pidfd(child.id() as i32).expect("pidfd_open");
    let (tx, rx) = std::sync::mpsc::channel();
    start_until(
        read,
        Some(end),
        Duration::from_millis(200),
        None,
        move |s| tx.send(s).unwrap(),
    )
    .unwrap();
    let mut left = std::fs::File::from(write); // the process the command left, never closed
    std::io::Write::write_all(&mut left, b"a\n").unwrap();
    child.wait().unwrap();
    let mut got = Vec::new();
    let ended = loop {
        // a bound for a broken relay, not a timing: the grace is 200 ms
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(s) => got.push(s),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break true,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break false,
        }
    };
    assert!(
        ended,
        "the relay still ran 20 s after its command ended, a writer left (said {got:?})"
    );
    assert_eq!(got, vec![line("a"), Said::Abandoned]);
    drop(left);
}

/// Hostile pass 22: a BE writing as fast as it could (`cat /dev/zero`) kept the relay thread,
/// outside every BE limit, at about half a CPU. A paced relay reads its budget per window and
/// then leaves the pipe: a writer that never waits finds it full after about the budget and
/// a pipe buffer, not after everything it wrote.
#[test]
fn a_paced_relay_reads_no_more_than_its_budget_per_window() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let (read, write) = pipe().unwrap();
    // SAFETY: setting O_NONBLOCK on the test's own pipe end.
    unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    start_until(read, None, GRACE, Some(8192), |_| {}).unwrap();
    let mut w = std::fs::File::from(write);
    let chunk = [b'x'; 4096];
    let (mut accepted, mut full_for) = (0usize, 0u32);
    // At most 16 MiB; full for 200 looks 10 ms apart (2 s, within the 10 s window) ends it.
    while accepted < 16 << 20 && full_for < 200 {
        match w.write(&chunk) {
            Ok(n) => (accepted, full_for) = (accepted + n, 0),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                full_for += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(
        accepted < 1 << 20,
        "the relay read on past its budget: {accepted} bytes written"
    );
}

/// Hostile pass 22's low: the cleaning kept Unicode format characters, so a relayed line with
/// U+202E (right-to-left override) was drawn reordered in a terminal, and zero-width ones
/// hid text. They are replaced as control characters are, the C1 controls (U+0085, U+009B,
/// an 8-bit CSI) with them; other text, a tab and ordinary non-ASCII letters stay.
#[test]
fn format_characters_are_replaced_as_controls_are() {
    let t0 = Instant::now();
    let mut lines = Lines::new(t0);
    let hidden = [
        '\u{202a}',
        '\u{202b}',
        '\u{202c}',
        '\u{202d}',
        '\u{202e}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{200e}',
        '\u{200f}',
        '\u{200b}',
        '\u{200c}',
        '\u{200d}',
        '\u{2060}',
        '\u{feff}',
        '\u{0080}',
        '\u{0085}',
        '\u{009b}',
        '\u{009f}',
        '\u{061c}',
        '\u{e0041}',
    ];
    for c in hidden {
        let text = format!("a{c}b\n");
        assert_eq!(
            said(&mut lines, text.as_bytes(), t0),
            vec![line("a\u{fffd}b")],
            "U+{:04X} kept",
            c as u32
        );
    }
    assert_eq!(
        said(&mut lines, "k\té – ✓ 漢\n".as_bytes(), t0),
        vec![line("k\té – ✓ 漢")]
    );
}

/// Hostile pass 23's low: a BE left frozen (`on_exit = "freeze"`) and adopted by the next
/// agent died on its first write once thawed: its fds 1 and 2 were the earlier agent's relay
/// pipe, whose only reader had ended with that agent. The adopting side opens a read end of
/// that same pipe through `/proc/<pid>/fd/1`: here a child writing a line every 50 ms whose
/// first reader (this test's, standing for the earlier agent) is closed once the pipe is
/// adopted ends by itself (exit 0), not by SIGPIPE. A child whose output is `/dev/null` is
/// left (no pipe relayed), and a pid whose start time differs is refused.
#[test]
fn an_adopted_commands_output_pipe_is_read_again() {
    use std::os::unix::process::ExitStatusExt;
    let (read, write) = pipe().unwrap();
    let recorded = PipeId::of(&write).unwrap();
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "i=0; while [ $i -lt 20 ]; do echo l24-line $i; i=$((i+1)); sleep 0.05; done",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::from(write.try_clone().unwrap()))
        .stderr(std::fs::File::from(write))
        .spawn()
        .expect("sh");
    let pid = child.id() as i32;
    let born = crate::pids::start_time(std::path::Path::new("/"), pid as u32).expect("stat");
    assert!(
        start_adopted(pid, born + 1, "sh", Some(recorded)).is_err(),
        "another start time: another process"
    );
    assert_eq!(
        start_adopted(pid, born, "sh", Some(recorded)).unwrap(),
        1,
        "one pipe (fds 1 and 2)"
    );
    drop(read); // the earlier agent's reader ends
    let status = child.wait().unwrap();
    assert_eq!(
        (status.code(), status.signal()),
        (Some(0), None),
        "the adopted command's writes after its first reader ended"
    );
    let mut quiet = std::process::Command::new("sleep")
        .arg("5")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("sleep");
    let pid = quiet.id() as i32;
    let born = crate::pids::start_time(std::path::Path::new("/"), pid as u32).expect("stat");
    let relayed = start_adopted(pid, born, "sleep", Some(recorded));
    let _ = quiet.kill();
    let _ = quiet.wait();
    assert_eq!(relayed.unwrap(), 0, "/dev/null is no pipe: left");
}

/// Hostile pass 26's low: `start_adopted` relayed any FIFO of the agent's user that the
/// adopted BE's fd 1 or 2 named, so a BE could point its output at a FIFO of root's and have
/// the agent read (and log) what that FIFO's writers meant for its reader. Now only the relay
/// pipe the earlier agent recorded is read: a child whose fds 1 and 2 are a FIFO (made here,
/// root's as the agent is) is left, whatever pipe was recorded, and nothing is read from it.
#[test]
fn an_adopted_commands_fifo_that_is_not_the_recorded_pipe_is_left() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("l27-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Read and write: the open does not wait for a reader.
    let end = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let (_read, write) = pipe().unwrap();
    let recorded = PipeId::of(&write).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("5")
        .stdin(std::process::Stdio::null())
        .stdout(end.try_clone().unwrap())
        .stderr(end.try_clone().unwrap())
        .spawn()
        .expect("sleep");
    let pid = child.id() as i32;
    let born = crate::pids::start_time(std::path::Path::new("/"), pid as u32).expect("stat");
    let with_other = start_adopted(pid, born, "sleep", Some(recorded));
    let with_none = start_adopted(pid, born, "sleep", None);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        with_other.unwrap(),
        0,
        "a FIFO that is not the recorded relay pipe is never read"
    );
    assert_eq!(with_none.unwrap(), 0, "no pipe recorded: nothing read");
}
