//! Which event loop a run uses: io_uring where the kernel allows it, epoll otherwise, with the
//! reason when it falls back (and `--engine` to choose).

use serde::{Deserialize, Serialize};

use crate::error::LoadError;

/// `--engine`: what the user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineChoice {
    /// io_uring when the kernel allows it, else epoll (the reason is printed and recorded): the
    /// default. On the M/M/1 fixture its intervals cover as often as epoll's at ρ = 0.5 and 0.9
    /// (docs/load.md), with the client's overhead a third of epoll's.
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// epoll, without probing io_uring.
    Epoll,
}

impl std::str::FromStr for EngineChoice {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self, LoadError> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(EngineChoice::IoUring),
            "epoll" => Ok(EngineChoice::Epoll),
            other => Err(LoadError::invalid(
                "--engine",
                other,
                "expected auto, io_uring or epoll",
            )),
        }
    }
}

/// The event loop a run actually uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Epoll,
    IoUring,
}

impl EngineKind {
    /// The name in results and messages.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Epoll => "epoll",
            EngineKind::IoUring => "io_uring",
        }
    }
}

/// The engine chosen for a run, and why io_uring was not when it fell back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSelection {
    pub kind: EngineKind,
    pub fallback_reason: Option<String>,
}

/// Environment variable that makes the io_uring probe fail as if the kernel answered with the
/// given errno name (`EPERM`, `ENOSYS`, `EACCES`, `EINVAL`): how tests check the fallback on a
/// kernel that allows io_uring.
pub const SIMULATE_IO_URING_ERROR_ENV: &str = "HEADROOM_LOAD_SIMULATE_IO_URING_ERROR";

/// Resolves `--engine`: probes io_uring (a ring set up as the workers set theirs, with a buffer
/// ring) unless epoll was asked for; falls back to epoll with the reason under `Auto`, fails
/// under `IoUring`.
pub fn choose_engine(choice: EngineChoice) -> Result<EngineSelection, LoadError> {
    if choice == EngineChoice::Epoll {
        return Ok(EngineSelection {
            kind: EngineKind::Epoll,
            fallback_reason: None,
        });
    }
    match probe() {
        Ok(()) => Ok(EngineSelection {
            kind: EngineKind::IoUring,
            fallback_reason: None,
        }),
        Err(reason) if choice == EngineChoice::Auto => Ok(EngineSelection {
            kind: EngineKind::Epoll,
            fallback_reason: Some(reason.to_string()),
        }),
        Err(reason) => Err(LoadError::invalid(
            "--engine",
            "io_uring",
            format!("{reason} (--engine epoll or auto runs without it)"),
        )),
    }
}

/// Why io_uring cannot be used here: what the kernel answered, whether a test simulated it,
/// and the sysctl that may explain it.
#[derive(Debug, thiserror::Error)]
#[error("io_uring unavailable: {source}{}{}", simulated.as_ref().map(|n| format!(" (simulated by {SIMULATE_IO_URING_ERROR_ENV}={n})")).unwrap_or_default(), sysctl.as_ref().map(|v| format!("; kernel.io_uring_disabled = {v}")).unwrap_or_default())]
pub struct UringUnavailable {
    #[source]
    source: std::io::Error,
    simulated: Option<String>,
    sysctl: Option<String>,
}

/// Why io_uring cannot be used here, or Ok.
fn probe() -> Result<(), UringUnavailable> {
    let simulated = std::env::var(SIMULATE_IO_URING_ERROR_ENV)
        .ok()
        .filter(|v| !v.is_empty());
    let result = match simulated.as_deref() {
        Some(name) => Err(simulated_error(name)),
        None => super::uring::probe(),
    };
    result.map_err(|source| UringUnavailable {
        source,
        simulated,
        sysctl: headroom_host::sysctl::io_uring_disabled(std::path::Path::new("/"))
            .ok()
            .map(|v| v.to_string()),
    })
}

fn simulated_error(name: &str) -> std::io::Error {
    let errno = match name {
        "EPERM" => libc::EPERM,
        "ENOSYS" => libc::ENOSYS,
        "EACCES" => libc::EACCES,
        "EINVAL" => libc::EINVAL,
        _ => libc::EPERM,
    };
    std::io::Error::from_raw_os_error(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_parse() {
        assert_eq!("auto".parse::<EngineChoice>().unwrap(), EngineChoice::Auto);
        assert_eq!(
            "io_uring".parse::<EngineChoice>().unwrap(),
            EngineChoice::IoUring
        );
        assert_eq!(
            "epoll".parse::<EngineChoice>().unwrap(),
            EngineChoice::Epoll
        );
        let e = "kqueue".parse::<EngineChoice>().unwrap_err();
        assert!(e.to_string().contains("\"kqueue\" for --engine"), "{e}");
    }

    #[test]
    fn the_default_is_auto() {
        assert_eq!(EngineChoice::default(), EngineChoice::Auto);
        assert_eq!(crate::LoadOptions::default().engine, EngineChoice::Auto);
    }

    #[test]
    fn epoll_needs_no_probe() {
        let s = choose_engine(EngineChoice::Epoll).unwrap();
        assert_eq!(s.kind, EngineKind::Epoll);
        assert_eq!(s.fallback_reason, None);
    }
}
