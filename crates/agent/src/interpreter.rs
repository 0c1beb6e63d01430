//! What the kernel runs for a program file before the file itself: the interpreter its `#!`
//! line names (and, for `env`, the program env runs), or an ELF file's `PT_INTERP` (its
//! dynamic loader). Read plainly or not at all: a `#!` line not UTF-8, or an `env` line whose
//! program env would find some other way than the words say (an `-S` string with quotes,
//! `\`, `$`, a `NAME=value` before the program), is refused by name, never guessed at (pass
//! 20: each ran uid 65534's file as root through a root script).

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What runs `path`: an interpreter, and for `#!…/env` the program env runs.
#[derive(Debug, PartialEq, Eq)]
pub struct Next {
    pub interp: PathBuf,
    pub env_program: Option<String>,
}

/// How many bytes of a `#!` line the kernel reads (`BINPRM_BUF_SIZE`).
const HEAD: u64 = 256;

/// What runs `path` ([`Next`]), `None` when nothing but the file (no `#!`, an ELF file with no
/// `PT_INTERP`, not a regular file: a FIFO is never opened), or why the agent cannot tell.
pub fn next(path: &Path) -> Result<Option<Next>, String> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(None); // left to the runnable check and the exec
    };
    let mut head = Vec::with_capacity(HEAD as usize);
    if (&file).take(HEAD).read_to_end(&mut head).is_err() {
        return Ok(None);
    }
    if head.starts_with(b"\x7fELF") {
        return elf_interp(&file, &head).map(|interp| {
            interp.map(|interp| Next {
                interp,
                env_program: None,
            })
        });
    }
    let Some(line) = head.strip_prefix(b"#!") else {
        return Ok(None);
    };
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line)
        .map_err(|_| "its #! line is not UTF-8: the agent cannot read which interpreter it names; name the interpreter in plain text".to_string())?;
    // The kernel's split: the interpreter up to a space or tab, the rest one argument.
    let line = line.trim_matches([' ', '\t']);
    let (interp, rest) = line.split_once([' ', '\t']).unwrap_or((line, ""));
    if interp.is_empty() {
        return Ok(None);
    }
    let interp = PathBuf::from(interp);
    let env_program = match interp.file_name().is_some_and(|n| n == "env") {
        true => env_program(rest)?,
        false => None,
    };
    Ok(Some(Next {
        interp,
        env_program,
    }))
}

/// The program `#!…/env REST` runs (its first word not an option, past `-S`), or why the
/// words do not say it plainly.
fn env_program(rest: &str) -> Result<Option<String>, String> {
    let split = rest
        .split([' ', '\t'])
        .any(|w| w.starts_with("-S") || w.starts_with("--split-string"));
    if split {
        if let Some(c) = rest.chars().find(|c| matches!(c, '\'' | '"' | '\\' | '$')) {
            return Err(format!(
                "its #! line gives env -S a string with {c:?} (quoting, escapes or variables): the agent cannot tell which program env runs; name it plainly"
            ));
        }
    }
    let mut skip_next = false;
    for w in rest.split([' ', '\t']).filter(|w| !w.is_empty()) {
        let w = w.strip_prefix("-S").unwrap_or(w);
        if std::mem::take(&mut skip_next) || w.is_empty() {
            continue;
        }
        if w.contains('=') {
            return Err(format!(
                "its #! line gives env {w:?} before the program (a NAME=value or an option's value): the agent cannot tell which program env runs; name it plainly"
            ));
        }
        if w.starts_with('-') {
            // env's options that take the next word: -u NAME, -C DIR
            skip_next = matches!(w, "-u" | "--unset" | "-C" | "--chdir");
            continue;
        }
        return Ok(Some(w.to_string()));
    }
    Ok(None)
}

/// The most program headers read (the kernel takes at most 64 KiB of them).
const MAX_PHDRS: usize = 1024;
/// The longest `PT_INTERP` the kernel takes (`PATH_MAX`).
const MAX_INTERP: u64 = 4096;

/// The `PT_INTERP` path of the ELF file whose first bytes are `head`, `None` when it has
/// none (a static program, the loader itself), or why its headers cannot be read.
fn elf_interp(file: &std::fs::File, head: &[u8]) -> Result<Option<PathBuf>, String> {
    let bad = |what: &str| {
        format!(
            "its ELF headers cannot be read ({what}): the agent cannot tell which loader runs it"
        )
    };
    let (wide, big) = match (head.get(4), head.get(5)) {
        (Some(1), Some(1)) => (false, false),
        (Some(1), Some(2)) => (false, true),
        (Some(2), Some(1)) => (true, false),
        (Some(2), Some(2)) => (true, true),
        _ => return Err(bad("class or byte order")),
    };
    let num = |b: &[u8], at: usize, len: usize| -> Option<u64> {
        let b = b.get(at..at + len)?;
        let word = |v: u64, &x: &u8| (v << 8) | u64::from(x);
        Some(match big {
            true => b.iter().fold(0, word),
            false => b.iter().rev().fold(0, word),
        })
    };
    // e_phoff, e_phentsize, e_phnum; in a program header p_type, p_offset, p_filesz.
    let (phoff, phentsize, phnum, off, filesz, word) = match wide {
        true => (
            num(head, 0x20, 8),
            num(head, 0x36, 2),
            num(head, 0x38, 2),
            8,
            0x20,
            8,
        ),
        false => (
            num(head, 0x1c, 4),
            num(head, 0x2a, 2),
            num(head, 0x2c, 2),
            4,
            0x10,
            4,
        ),
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return Err(bad("short header"));
    };
    let size = if wide { 56 } else { 32 };
    if phentsize != size || phnum as usize > MAX_PHDRS {
        return Err(bad("program header size or count"));
    }
    let mut table = vec![0u8; (size * phnum) as usize];
    file.read_exact_at(&mut table, phoff)
        .map_err(|e| bad(&format!("program headers: {e}")))?;
    for ph in table.chunks_exact(size as usize) {
        if num(ph, 0, 4) != Some(3) {
            continue; // not PT_INTERP
        }
        let (Some(at), Some(len)) = (num(ph, off, word), num(ph, filesz, word)) else {
            return Err(bad("PT_INTERP"));
        };
        if !(2..=MAX_INTERP).contains(&len) {
            return Err(bad("PT_INTERP length"));
        }
        let mut path = vec![0u8; len as usize];
        file.read_exact_at(&mut path, at)
            .map_err(|e| bad(&format!("PT_INTERP: {e}")))?;
        if path.pop() != Some(0) || path.contains(&0) {
            return Err(bad("PT_INTERP not one NUL-ended path"));
        }
        use std::os::unix::ffi::OsStringExt;
        return Ok(Some(PathBuf::from(std::ffi::OsString::from_vec(path))));
    }
    Ok(None)
}
