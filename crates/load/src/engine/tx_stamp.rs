//! Arming the kernel's software stamps on a load connection, for both engines: transmit stamps
//! (`SO_TIMESTAMPING`, keyed by byte offset) and receive stamps (`SO_TIMESTAMPNS`). A request is
//! timed from the stamp of the first send whose key reaches its last byte, so pipelined requests
//! that left in one send share its stamp, and a request whose bytes left late (the client's
//! wake-up, a busy CPU, a full socket buffer) is timed from when they did. The socket part (the
//! options, the error queue, the control messages) is `headroom_host::net::timestamps`.
//!
//! Where the kernel refuses the option (or `HEADROOM_LOAD_SIMULATE_TX_STAMP_ERROR` says to act as
//! if it did), requests are timed from the user-space send, and the result says so.

use std::os::fd::RawFd;

use headroom_host::net::timestamps::{enable_timestamping, enable_timestampns, Timestamping};

/// Test hook: an errno name (EPERM, EINVAL, ENOPROTOOPT, EOPNOTSUPP) makes [`enable`] fail so.
pub const SIMULATE_ENV: &str = "HEADROOM_LOAD_SIMULATE_TX_STAMP_ERROR";

fn simulated_error() -> Option<std::io::Error> {
    let name = std::env::var(SIMULATE_ENV).ok()?;
    let errno = match name.trim() {
        "EPERM" => libc::EPERM,
        "EINVAL" => libc::EINVAL,
        "ENOPROTOOPT" => libc::ENOPROTOOPT,
        "EOPNOTSUPP" => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    };
    Some(std::io::Error::from_raw_os_error(errno))
}

/// What [`enable`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Armed {
    /// Transmit stamps are on.
    pub tx: bool,
    /// What the kernel refused (transmit or receive stamps), in words.
    pub refused: Option<String>,
}

/// Asks for a transmit stamp of every send on `fd` (a connected TCP socket nothing was sent on
/// yet: the keys count its bytes from 0) and for receive stamps (`SO_TIMESTAMPNS`).
pub(super) fn enable(fd: RawFd) -> Armed {
    match enable_both(fd) {
        Ok(()) => Armed {
            tx: true,
            refused: None,
        },
        Err((tx, why)) => Armed {
            tx,
            refused: Some(why),
        },
    }
}

fn enable_both(fd: RawFd) -> Result<(), (bool, String)> {
    let rx = enable_timestampns(fd).err();
    if let Some(e) = simulated_error() {
        return Err((
            false,
            format!(
                "setsockopt(SO_TIMESTAMPING, TX_SOFTWARE|OPT_ID|OPT_TSONLY) refused: {e} (simulated by {SIMULATE_ENV})"
            ),
        ));
    }
    enable_timestamping(fd, Timestamping::Tx).map_err(|e| {
        (
            false,
            format!("setsockopt(SO_TIMESTAMPING, TX_SOFTWARE|OPT_ID|OPT_TSONLY) refused: {e}"),
        )
    })?;
    match rx {
        None => Ok(()),
        Some(e) => Err((true, format!("setsockopt(SO_TIMESTAMPNS) refused: {e}"))),
    }
}
