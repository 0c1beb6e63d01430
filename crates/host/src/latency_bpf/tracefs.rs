//! Tracepoints as tracefs describes them: where `events/` is, a tracepoint's id (what
//! `perf_event_open` attaches to) and its record's field offsets (its `format` file), so the
//! programs read the fields where this kernel puts them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{HostError, IoOp, Result};

use super::program::Layout;

/// The hooks the sensor needs: (subsystem, event, what it is for).
pub const HOOKS: [(&str, &str, &str); 3] = [
    ("tcp", "tcp_probe", "request arrival (Linux 4.16+)"),
    ("sock", "sock_send_length", "the LC's reply (Linux 6.3+)"),
    (
        "sock",
        "inet_sock_set_state",
        "connection close (Linux 4.16+)",
    ),
];

/// Where tracefs is mounted, under `root`.
const MOUNTS: [&str; 2] = ["sys/kernel/tracing", "sys/kernel/debug/tracing"];

/// The `events/` directory of a mounted tracefs under `root` (`/` in production).
pub fn events_dir(root: &Path) -> Option<PathBuf> {
    MOUNTS
        .iter()
        .map(|m| root.join(m).join("events"))
        .find(|d| d.is_dir())
}

/// The `events/` directory, mounting tracefs at `/sys/kernel/tracing` first where the
/// directory exists but nothing is mounted there (as distributions do at boot).
pub fn events_dir_or_mount() -> Result<PathBuf> {
    if let Some(d) = events_dir(Path::new("/")) {
        return Ok(d);
    }
    let target = Path::new("/sys/kernel/tracing");
    if target.is_dir() {
        nix::mount::mount(
            Some("tracefs"),
            target,
            Some("tracefs"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(|e| HostError::Unavailable {
            what: "tracefs".into(),
            reason: format!(
                "not mounted, and mounting it at {} failed: {e}",
                target.display()
            ),
        })?;
    }
    events_dir(Path::new("/")).ok_or_else(|| HostError::Unavailable {
        what: "tracefs".into(),
        reason: "neither /sys/kernel/tracing nor /sys/kernel/debug/tracing has events/ \
                 (CONFIG_FTRACE off?)"
            .into(),
    })
}

/// One field of a trace record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: usize,
    pub size: usize,
}

/// The fields of a `format` file by name (`field:__u16 sport;\toffset:64;\tsize:2;...`).
pub fn parse_format(text: &str) -> HashMap<String, Field> {
    let mut fields = HashMap::new();
    for line in text.lines() {
        let mut decl = None;
        let (mut offset, mut size) = (None, None);
        for part in line.trim().split(';') {
            let part = part.trim();
            if let Some(d) = part.strip_prefix("field:") {
                decl = Some(d);
            } else if let Some(o) = part.strip_prefix("offset:") {
                offset = o.parse().ok();
            } else if let Some(s) = part.strip_prefix("size:") {
                size = s.parse().ok();
            }
        }
        let (Some(decl), Some(offset), Some(size)) = (decl, offset, size) else {
            continue;
        };
        // the name is the declaration's last word, less any array suffix
        let name = decl
            .rsplit(|c: char| c.is_whitespace() || c == '*')
            .next()
            .unwrap_or("")
            .split('[')
            .next()
            .unwrap_or("");
        if !name.is_empty() {
            fields.insert(name.to_owned(), Field { offset, size });
        }
    }
    fields
}

/// A tracepoint's directory, or why it is missing.
pub fn tracepoint_dir(events: &Path, sys: &str, event: &str) -> Result<PathBuf> {
    let dir = events.join(sys).join(event);
    if dir.join("id").is_file() {
        Ok(dir)
    } else {
        let what = HOOKS
            .iter()
            .find(|(s, e, _)| *s == sys && *e == event)
            .map_or("", |h| h.2);
        Err(HostError::Unavailable {
            what: format!("tracepoint {sys}:{event}"),
            reason: format!("{} does not exist on this kernel ({what})", dir.display()),
        })
    }
}

/// The id `perf_event_open` takes for `sys:event`.
pub fn tracepoint_id(events: &Path, sys: &str, event: &str) -> Result<u64> {
    let path = tracepoint_dir(events, sys, event)?.join("id");
    let text =
        std::fs::read_to_string(&path).map_err(|e| HostError::io(IoOp::Read, &path, None, e))?;
    text.trim().parse().map_err(|_| HostError::Parse {
        path,
        content: text.clone(),
        reason: "not a tracepoint id".into(),
    })
}

fn field(fields: &HashMap<String, Field>, path: &Path, name: &str, sizes: &[usize]) -> Result<i16> {
    let f = fields.get(name).ok_or_else(|| HostError::Parse {
        path: path.to_path_buf(),
        content: String::new(),
        reason: format!("no field {name:?}"),
    })?;
    if !sizes.contains(&f.size) || f.offset % f.size != 0 || f.offset > i16::MAX as usize {
        return Err(HostError::Parse {
            path: path.to_path_buf(),
            content: format!("offset {} size {}", f.offset, f.size),
            reason: format!("field {name:?} is not an aligned field of {sizes:?} bytes"),
        });
    }
    Ok(f.offset as i16)
}

fn format_of(events: &Path, sys: &str, event: &str) -> Result<(PathBuf, HashMap<String, Field>)> {
    let path = tracepoint_dir(events, sys, event)?.join("format");
    let text =
        std::fs::read_to_string(&path).map_err(|e| HostError::io(IoOp::Read, &path, None, e))?;
    Ok((path, parse_format(&text)))
}

/// The programs' field offsets on this kernel.
pub fn layout(events: &Path) -> Result<Layout> {
    let (path, f) = format_of(events, "tcp", "tcp_probe")?;
    let (probe_sport, probe_data_len, probe_skaddr, probe_snd_nxt) = (
        field(&f, &path, "sport", &[2])?,
        field(&f, &path, "data_len", &[2])?,
        field(&f, &path, "skaddr", &[8])?,
        field(&f, &path, "snd_nxt", &[4])?,
    );
    let (path, f) = format_of(events, "sock", "sock_send_length")?;
    let (send_sk, send_ret) = (
        field(&f, &path, "sk", &[8])?,
        field(&f, &path, "ret", &[4])?,
    );
    let (path, f) = format_of(events, "sock", "inet_sock_set_state")?;
    Ok(Layout {
        probe_sport,
        probe_data_len,
        probe_skaddr,
        probe_snd_nxt,
        send_sk,
        send_ret,
        state_skaddr: field(&f, &path, "skaddr", &[8])?,
        state_newstate: field(&f, &path, "newstate", &[4])?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP_PROBE: &str = "name: tcp_probe\nID: 2273\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr[28];\toffset:8;\tsize:28;\tsigned:0;\n\
\tfield:__u16 sport;\toffset:64;\tsize:2;\tsigned:0;\n\
\tfield:__u16 data_len;\toffset:76;\tsize:2;\tsigned:0;\n\
\tfield:__u32 snd_nxt;\toffset:80;\tsize:4;\tsigned:0;\n\
\tfield:const void * skaddr;\toffset:128;\tsize:8;\tsigned:0;\n\n\
print fmt: \"family=%s\", REC->family\n";

    #[test]
    fn a_format_file_gives_each_fields_offset_and_size() {
        let f = parse_format(TCP_PROBE);
        assert_eq!(
            f["sport"],
            Field {
                offset: 64,
                size: 2
            }
        );
        assert_eq!(
            f["saddr"],
            Field {
                offset: 8,
                size: 28
            }
        );
        assert_eq!(
            f["skaddr"],
            Field {
                offset: 128,
                size: 8
            }
        );
        assert_eq!(f["common_type"], Field { offset: 0, size: 2 });
        assert_eq!(f.len(), 6);
    }

    #[test]
    fn the_layout_comes_from_the_files_and_a_missing_hook_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path();
        let write = |sys: &str, ev: &str, text: &str| {
            let d = events.join(sys).join(ev);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("format"), text).unwrap();
            std::fs::write(d.join("id"), "7\n").unwrap();
        };
        write("tcp", "tcp_probe", TCP_PROBE);
        write(
            "sock",
            "inet_sock_set_state",
            "\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
             \tfield:int newstate;\toffset:20;\tsize:4;\tsigned:1;\n",
        );
        let err = layout(events).unwrap_err().to_string();
        assert!(
            err.contains("sock:sock_send_length") && err.contains("6.3"),
            "{err}"
        );
        write(
            "sock",
            "sock_send_length",
            "\tfield:void * sk;\toffset:8;\tsize:8;\tsigned:0;\n\
             \tfield:int ret;\toffset:20;\tsize:4;\tsigned:1;\n",
        );
        let l = layout(events).unwrap();
        assert_eq!(
            (
                l.probe_sport,
                l.probe_data_len,
                l.probe_skaddr,
                l.probe_snd_nxt
            ),
            (64, 76, 128, 80)
        );
        assert_eq!((l.send_sk, l.send_ret), (8, 20));
        assert_eq!((l.state_skaddr, l.state_newstate), (8, 20));
        assert_eq!(tracepoint_id(events, "tcp", "tcp_probe").unwrap(), 7);
    }

    #[test]
    fn a_field_of_the_wrong_width_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tcp/tcp_probe");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("id"), "1").unwrap();
        std::fs::write(
            d.join("format"),
            TCP_PROBE.replace(
                "size:2;\tsigned:0;\n\tfield:__u16 data_len",
                "size:4;\tsigned:0;\n\tfield:__u16 data_len",
            ),
        )
        .unwrap();
        let err = layout(dir.path()).unwrap_err().to_string();
        assert!(err.contains("sport"), "{err}");
    }
}
