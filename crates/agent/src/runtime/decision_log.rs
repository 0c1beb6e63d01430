//! The decision log file: one JSON line per decision, size-capped and rotated once. Lines are
//! gathered in memory and written whole: a write the disk refuses part-way (ENOSPC) is cut
//! back to the last whole line, and every line that did not reach the file is counted in
//! `lost` (`decision_log_lost_lines` in `ctl status`). A torn line is never left in the middle
//! of the log, so `--replay` reads every line before a crash's torn tail.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use headroom_control::config::Config;
use headroom_control::policy::MachineInfo;

use super::{machine_sidecar, AgentError, AgentOptions};

/// Lines gathered before they are written (the loop also flushes every slow pass).
const BUFFER_BYTES: usize = 1 << 16;

/// The decision log. When it reaches `max_bytes` it is renamed to `<path>.1` (replacing the
/// previous one) and started anew, so it never holds more than twice its cap on disk. A
/// failing write is logged once, and again only after a write has succeeded in between.
pub struct DecisionLog {
    path: PathBuf,
    file: File,
    /// Bytes in the file now (whole lines only).
    written: u64,
    max_bytes: u64,
    failing: bool,
    /// Lines gathered, not yet written, and where each one ends in `pending`.
    pending: Vec<u8>,
    ends: Vec<usize>,
    /// A torn tail the file could not be cut back from (cut before the next write).
    torn: bool,
    /// Lines that could not be written.
    pub lost: u64,
}

impl DecisionLog {
    pub fn open(path: &Path, max_bytes: u64) -> io::Result<DecisionLog> {
        let file = open_append(path)?;
        let written = file.metadata().map_or(0, |m| m.len());
        let mut log = DecisionLog {
            path: path.to_path_buf(),
            file,
            written,
            max_bytes: max_bytes.max(4096),
            failing: false,
            pending: Vec::new(),
            ends: Vec::new(),
            torn: false,
            lost: 0,
        };
        // A file that is not a decision log (the config named by mistake, a system file) is
        // refused: lines were appended to it, and its last line cut as a "torn tail".
        if written > 0 && log.is_regular() {
            use std::os::unix::fs::FileExt;
            let mut head = [0u8; 64];
            let n = log.file.read_at(&mut head, 0)?;
            let text = String::from_utf8_lossy(&head[..n]);
            if !text.trim_start().starts_with('{') {
                let begins: String = text.chars().take(40).collect();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "not a decision log (it begins {begins:?}): give the log a path of its own"
                    ),
                ));
            }
        }
        // A tail torn by a crash (or an older agent) is cut, not continued by the next line.
        if written > 0 && log.is_regular() {
            let whole = whole_lines_len(&log.file, written)?;
            if whole < written {
                tracing::warn!(path = %path.display(), torn_bytes = written - whole, "the decision log ends in a torn line: cutting it");
                log.file.set_len(whole)?;
                log.written = whole;
            }
        }
        Ok(log)
    }

    /// Whether the log is a regular file (not `/dev/stdout`, `/dev/null`, a pipe): only such a
    /// file is capped, rotated and given a machine description beside it.
    pub fn is_regular(&self) -> bool {
        self.file.metadata().is_ok_and(|m| m.is_file())
    }

    /// Appends `line` and a newline (written at the next flush, or when the buffer is full).
    pub fn write_line(&mut self, line: &str) {
        let len = line.len() + 1;
        // Rotating renames the path: done to `/dev/null` or `/dev/stdout` it replaced the
        // host's device (or its link) with a regular file (sixth hostile pass).
        if self.written + (self.pending.len() + len) as u64 > self.max_bytes && self.is_regular() {
            self.flush();
            if let Err(e) = self.rotate() {
                self.failed("rotating", &e);
            }
        }
        self.pending.extend_from_slice(line.as_bytes());
        self.pending.push(b'\n');
        self.ends.push(self.pending.len());
        if self.pending.len() >= BUFFER_BYTES {
            self.flush();
        }
    }

    /// Writes the gathered lines, whole or not at all.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let lines = self.ends.len() as u64;
        self.reopen_if_replaced();
        if self.torn {
            // the cut failed last time: nothing goes after a torn line
            if let Err(e) = self.file.set_len(self.written) {
                self.lost += lines;
                self.clear();
                self.failed("cutting a torn line from", &e);
                return;
            }
            self.torn = false;
        }
        let (done, result) = write_counting(&mut self.file, &self.pending);
        match result {
            Ok(()) => {
                self.written += done as u64;
                if self.failing {
                    tracing::info!(path = %self.path.display(), lost = self.lost, "decision log writable again");
                }
                self.failing = false;
            }
            Err(e) => {
                let whole = self.ends.iter().filter(|&&end| end <= done).count();
                let kept = if whole == 0 { 0 } else { self.ends[whole - 1] };
                if done > kept && self.is_regular() {
                    // the disk took part of a line: cut it back to the last whole one
                    self.torn = self.file.set_len(self.written + kept as u64).is_err();
                }
                self.written += kept as u64;
                self.lost += lines - whole as u64;
                self.failed("writing", &e);
            }
        }
        self.clear();
    }

    /// Opens the path again when it no longer names the open file. A log removed under the
    /// agent (an operator's `rm`, a cleanup) took every later line into the unlinked file,
    /// unseen and uncounted, and past the cap its rotation failed and that file grew without
    /// bound (fifth hostile pass).
    fn reopen_if_replaced(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let named = std::fs::metadata(&self.path).ok().map(id);
        if named.is_some() && named == self.file.metadata().ok().map(id) {
            return;
        }
        let opened = open_append(&self.path);
        match opened {
            Ok(file) => {
                tracing::warn!(path = %self.path.display(), "the decision log was removed or replaced: writing to the path again");
                self.written = file.metadata().map_or(0, |m| m.len());
                self.file = file;
                self.torn = false;
            }
            Err(e) => self.failed("opening again", &e),
        }
    }

    fn clear(&mut self) {
        self.pending.clear();
        self.ends.clear();
    }

    fn failed(&mut self, what: &str, e: &io::Error) {
        if !self.failing {
            tracing::error!(path = %self.path.display(), error = %e, lost = self.lost,
                "{what} the decision log failed: lines are lost (counted in decision_log_lost_lines; reported once until it works again)");
        }
        self.failing = true;
    }

    fn rotate(&mut self) -> io::Result<()> {
        let mut old = self.path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(&self.path, PathBuf::from(old))?;
        self.file = open_append(&self.path)?;
        self.written = 0;
        self.torn = false;
        Ok(())
    }
}

impl Drop for DecisionLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Writes `bytes`, returning how many reached the file before an error.
/// Opens the log to append (made when missing). A link at the path is followed only where no
/// one but root or this user can write its directory: in one others can write, a stranger
/// replaced the log with a link and root's agent appended its lines to the link's target (a
/// root-only file; the reopen after a replacement had no content check), or made a new file
/// wherever a dangling link pointed (tenth hostile pass). `/dev/stdout` (a link in root's
/// `/dev`) and an operator's own link in a directory of theirs are still followed.
fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let guarded = !only_trusted_write(dir);
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true).read(true);
    if guarded {
        // Non-blocking too: a FIFO is opened without waiting, then refused below.
        options
            .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits());
    }
    let file = options.open(path).map_err(|e| {
        if guarded && e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
            io::Error::new(
                e.kind(),
                format!(
                    "a link in a directory others can write ({}): not followed (another user may have put it there, pointing anywhere); give the log a path in a directory only root or this user can write",
                    dir.display()
                ),
            )
        } else {
            e
        }
    })?;
    // Only a regular file there: a stranger's FIFO took the agent's lines until its pipe was
    // full, then blocked the control loop for good, `ctl` and SIGTERM unanswered (thirteenth
    // hostile pass, live). The operator's own FIFO or `/dev/stdout`, elsewhere, is theirs.
    if guarded && !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a regular file, in a directory others can write ({}): another user may have put it there (a FIFO blocks the agent's writes); give the log a path in a directory only root or this user can write",
                dir.display()
            ),
        ));
    }
    Ok(file)
}

/// Whether only root or this user can have put a file in `dir` (the agent's one rule for
/// directories, [`crate::trusted_dir::doubt`]).
fn only_trusted_write(dir: &Path) -> bool {
    crate::trusted_dir::doubt(dir, headroom_host::process::effective_uid()).is_ok()
}

fn write_counting(file: &mut File, bytes: &[u8]) -> (usize, io::Result<()>) {
    let mut done = 0;
    while done < bytes.len() {
        match file.write(&bytes[done..]) {
            Ok(0) => return (done, Err(io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Err(e)),
        }
    }
    (done, Ok(()))
}

/// The length of `file`'s first `len` bytes up to and including its last newline.
fn whole_lines_len(file: &File, len: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut end = len;
    let mut buf = vec![0u8; 1 << 16];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Opens the decision log (and writes the machine description replay needs beside it).
pub(super) fn open_log(
    options: &AgentOptions,
    config: &Config,
    machine: &MachineInfo,
) -> Result<Option<DecisionLog>, AgentError> {
    let path = options
        .decision_log
        .clone()
        .or_else(|| config.api.decision_log.as_ref().map(PathBuf::from));
    let Some(p) = path else {
        return Ok(None);
    };
    let log = DecisionLog::open(&p, config.api.decision_log_max_mb.saturating_mul(1 << 20))
        .map_err(|source| AgentError::DecisionLog {
            path: p.clone(),
            source,
        })?;
    if !log.is_regular() {
        // `/dev/stdout`, a pipe: nothing is written beside it (it made `/dev/stdout.machine.json`)
        tracing::info!(log = %p.display(), "the decision log is not a regular file: not capped, no machine description beside it (replay needs one)");
        return Ok(Some(log));
    }
    let side = machine_sidecar(&p);
    // Made anew, never written through a link planted beside the log (sixth hostile pass).
    let written = match std::fs::remove_file(&side) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&side)
            .and_then(|mut f| {
                f.write_all(&serde_json::to_vec_pretty(machine).expect("machine serializes"))
            }),
    };
    written.map_err(|source| AgentError::Io {
        what: "writing",
        path: side,
        source,
    })?;
    Ok(Some(log))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decision log path naming another file (the config, by mistake): JSON lines were
    /// appended to it and its last line, having no newline, cut as a torn tail. Refused.
    #[test]
    fn a_file_that_is_no_decision_log_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("headroom.toml");
        let text = "[lc]\nname = \"kept\"";
        std::fs::write(&config, text).unwrap();
        let e = DecisionLog::open(&config, 1 << 20).err().expect("refused");
        assert!(e.to_string().contains("not a decision log"), "{e}");
        assert_eq!(std::fs::read_to_string(&config).unwrap(), text);
    }

    /// A log at `/dev/null` (or a link to it, as here: a test must not touch the host's)
    /// reached its cap and was rotated: the path renamed to `<path>.1` and a regular file made
    /// in its place — the host's `/dev/null` replaced. Never rotated now.
    #[test]
    fn a_log_that_is_no_regular_file_is_never_rotated() {
        if !Path::new("/dev/null").exists() {
            return eprintln!("SKIP a_log_that_is_no_regular_file_is_never_rotated: no /dev/null");
        }
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let mut log = DecisionLog::open(&link, 4096).unwrap();
        assert!(!log.is_regular());
        for i in 0..1000 {
            log.write_line(&format!("{{\"line\": {i}, \"pad\": \"..............\"}}"));
        }
        log.flush();
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(meta.file_type().is_symlink(), "the link is still the link");
        assert!(!dir.path().join("null.1").exists(), "nothing rotated");
        assert_eq!(log.lost, 0);
    }

    /// A log on a full disk counts every line it loses (before, lines sat in a buffer that
    /// failed to flush, uncounted, and `decision_log_lost_lines` stayed 0).
    #[test]
    fn every_line_a_full_disk_refuses_is_counted() {
        if !Path::new("/dev/full").exists() {
            return eprintln!("SKIP every_line_a_full_disk_refuses_is_counted: no /dev/full");
        }
        let mut log = DecisionLog::open(Path::new("/dev/full"), 1 << 30).unwrap();
        for _ in 0..100 {
            log.write_line(&"y".repeat(100));
        }
        log.flush();
        assert_eq!(log.lost, 100);
        for _ in 0..10 {
            log.write_line("{}");
            log.flush();
        }
        assert_eq!(log.lost, 110);
    }

    /// A tmpfs of 64 KiB mounted on `dir` (unmounted on drop).
    struct Tmpfs(PathBuf);

    impl Tmpfs {
        fn mount(dir: &Path) -> Option<Tmpfs> {
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
                .arg(dir)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            ok.then(|| Tmpfs(dir.to_path_buf()))
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    /// A disk that fills up part-way through a write: the file holds whole lines only, the
    /// lines that did not fit are counted, and a line written once space is back follows a
    /// whole line.
    #[test]
    fn a_disk_full_part_way_leaves_whole_lines_and_counts_the_rest() {
        const NAME: &str = "a_disk_full_part_way_leaves_whole_lines_and_counts_the_rest";
        if !headroom_host::process::is_root() {
            return eprintln!("SKIP {NAME}: needs root (a tmpfs mount)");
        }
        let dir = tempfile::tempdir().unwrap();
        let Some(_mount) = Tmpfs::mount(dir.path()) else {
            return eprintln!("SKIP {NAME}: could not mount a tmpfs");
        };
        // leave about 3 pages free
        let filler = dir.path().join("filler");
        std::fs::write(&filler, vec![0u8; 52 * 1024]).unwrap();
        let path = dir.path().join("decisions.jsonl");
        let mut log = DecisionLog::open(&path, 1 << 30).unwrap();
        let line = format!("{{\"t_ms\":1,\"pad\":\"{}\"}}", "x".repeat(290));
        for _ in 0..100 {
            log.write_line(&line);
        }
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let kept = text.lines().count() as u64;
        assert!(log.lost > 0, "the disk was full: some lines lost");
        assert_eq!(
            kept + log.lost,
            100,
            "every line either in the file or counted"
        );
        assert!(text.is_empty() || text.ends_with('\n'), "no torn tail");
        assert!(text.lines().all(|l| l == line), "only whole lines");
        // space back: the next line follows a whole one
        std::fs::remove_file(&filler).unwrap();
        log.write_line("{\"t_ms\":2}");
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("\n{\"t_ms\":2}\n") || text == "{\"t_ms\":2}\n");
        assert_eq!(log.lost + text.lines().count() as u64, 101);
    }

    /// A log removed while the agent writes it (an operator's `rm`): the lines went into the
    /// unlinked file, unseen, and past the cap it grew without bound. The path is written
    /// again.
    #[test]
    fn a_removed_log_is_written_again_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let mut log = DecisionLog::open(&path, 4096).unwrap();
        log.write_line("{\"t_ms\":1}");
        log.flush();
        std::fs::remove_file(&path).unwrap();
        for t in 2..400 {
            log.write_line(&format!("{{\"t_ms\":{t}}}"));
            if t % 10 == 0 {
                log.flush();
            }
        }
        log.flush();
        let text = std::fs::read_to_string(&path).expect("the log is written again");
        assert!(text.ends_with("{\"t_ms\":399}\n"), "{text}");
        assert!(text.len() <= 4096, "capped: {} bytes", text.len());
        assert_eq!(log.lost, 0);
    }

    /// A log whose last line was torn (a crash, an older agent) is cut back on open: the next
    /// line does not continue it.
    #[test]
    fn a_torn_tail_is_cut_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        std::fs::write(&path, "{\"t_ms\":1}\n{\"t_ms\":2,\"pa").unwrap();
        let mut log = DecisionLog::open(&path, 1 << 30).unwrap();
        log.write_line("{\"t_ms\":3}");
        log.flush();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"t_ms\":1}\n{\"t_ms\":3}\n"
        );
    }
}
