//! A network device as sysfs describes it (`<root>/sys/class/net/<device>`; `root` is `/` on
//! the live host, a fake tree in tests), and the kernel's timestamps on a socket
//! ([`timestamps`]).

use std::path::Path;

use crate::error::{HostError, IoOp, Result};

pub mod timestamps;

/// The link speed of `device`, Mbit/s (`sys/class/net/<device>/speed`). A device that reports
/// none (a virtual one: -1, or the file unreadable while the link is down) is an error naming
/// the file and what it held.
pub fn link_speed_mbit(root: &Path, device: &str) -> Result<u64> {
    if device.is_empty() || device.contains('/') || device == "." || device == ".." {
        return Err(HostError::Invalid {
            what: "network device",
            value: device.to_owned(),
            reason: "not a device name".to_owned(),
        });
    }
    let path = root.join("sys/class/net").join(device).join("speed");
    let text =
        std::fs::read_to_string(&path).map_err(|e| HostError::io(IoOp::Read, &path, None, e))?;
    match text.trim().parse::<i64>() {
        Ok(v) if v > 0 => Ok(v as u64),
        _ => Err(HostError::Parse {
            path,
            content: text.trim().to_owned(),
            reason: "no link speed (virtual device?)".to_owned(),
        }),
    }
}

/// The uid of the process at the other end of a Unix socket (SO_PEERCRED), `None` when the
/// kernel does not say (the control socket then refuses the peer).
pub fn peer_uid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|cred| cred.uid())
}

/// Connects to the stream socket at `path` without waiting for the server: a listener whose
/// backlog is full and that never accepts (a stopped agent, a hostile server) answers
/// `WouldBlock` at once, where a blocking connect waited for ever (ninth hostile pass: an
/// agent's start hung before anything was made, with no word). The stream returned blocks.
pub fn connect_unix_now(path: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Sets the mode of the socket file at `path`, never through a link: in a directory another
/// user can write, a link put at the path between the bind and a `chmod` by path had root
/// change the mode of the link's target (tenth hostile pass, by reading). Opened with
/// `O_PATH | O_NOFOLLOW`, checked to be a socket, and changed through `/proc/self/fd` (as
/// glibc's `fchmodat(AT_SYMLINK_NOFOLLOW)` does, which glibc before 2.32 refuses outright).
pub fn chmod_socket(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_NOFOLLOW).bits())
        .open(path)?;
    if !file.metadata()?.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "not a socket (replaced after the bind, a link?): its mode left alone",
        ));
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    std::fs::set_permissions(
        format!("/proc/self/fd/{fd}"),
        std::fs::Permissions::from_mode(mode),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_mode_is_never_set_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        chmod_socket(&sock, 0o600).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&sock), 0o600);
        let victim = d.path().join("victim");
        std::fs::write(&victim, "x").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = d.path().join("link.sock");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(chmod_socket(&link, 0o600).is_err());
        assert!(chmod_socket(&victim, 0o600).is_err(), "not a socket");
        assert_eq!(mode(&victim), 0o644, "the link's target kept its mode");
    }

    #[test]
    fn the_link_speed_is_read_from_sysfs_under_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for (dev, speed) in [("eth0", "10000\n"), ("veth1", "-1\n")] {
            let d = r.join("sys/class/net").join(dev);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("speed"), speed).unwrap();
        }
        assert_eq!(link_speed_mbit(r, "eth0").unwrap(), 10_000);
        let err = link_speed_mbit(r, "veth1").unwrap_err().to_string();
        assert!(
            err.contains("sys/class/net/veth1/speed") && err.contains("\"-1\""),
            "{err}"
        );
        assert!(link_speed_mbit(r, "nope").unwrap_err().is_not_found());
        assert!(matches!(
            link_speed_mbit(r, "../eth0"),
            Err(HostError::Invalid { .. })
        ));
    }
}
