//! Whether a user besides the trusted ones could have written a file, from its owner, group and
//! mode: owned by someone else, writable by all, or writable by a group other than root's. The
//! one rule behind the agent's config file, the programs it runs as root and the LC's pid file,
//! and the kubeconfig and every file and command it names; each caller words its own refusal.
//! Also the words for a file that is not a regular one, which those callers refuse first.

/// Who else could write the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtherWriter {
    /// Owned by this uid, not a trusted one.
    Owner(u32),
    /// Mode (`& 0o7777`) with `o+w`.
    Everyone { mode: u32 },
    /// Mode with `g+w`, its group not root's.
    Group { gid: u32, mode: u32 },
}

/// Who else could write a file owned by `uid`:`gid` with `mode`, when `trusted` are the uids
/// that may own it (root always may).
pub fn other_writer(uid: u32, gid: u32, mode: u32, trusted: &[u32]) -> Option<OtherWriter> {
    let mode = mode & 0o7777;
    if uid != 0 && !trusted.contains(&uid) {
        Some(OtherWriter::Owner(uid))
    } else if mode & 0o002 != 0 {
        Some(OtherWriter::Everyone { mode })
    } else if mode & 0o020 != 0 && gid != 0 {
        Some(OtherWriter::Group { gid, mode })
    } else {
        None
    }
}

/// What a file that is not a regular file is, in a refusal's words ("a FIFO"): a FIFO or a
/// device where a pid file or a kubeconfig belongs blocked or grew a reader without end.
pub fn special_file_kind(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_then_all_then_a_non_root_group() {
        assert_eq!(other_writer(0, 0, 0o100644, &[]), None);
        assert_eq!(
            other_writer(0, 0, 0o664, &[]),
            None,
            "root's group may write"
        );
        assert_eq!(other_writer(7, 7, 0o644, &[7]), None);
        assert_eq!(other_writer(7, 0, 0o644, &[]), Some(OtherWriter::Owner(7)));
        assert_eq!(
            other_writer(0, 0, 0o100666, &[]),
            Some(OtherWriter::Everyone { mode: 0o666 })
        );
        assert_eq!(
            other_writer(0, 65534, 0o664, &[]),
            Some(OtherWriter::Group {
                gid: 65534,
                mode: 0o664
            })
        );
    }
}
