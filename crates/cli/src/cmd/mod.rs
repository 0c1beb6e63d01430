//! One module per subcommand; each has `Args` (clap) and `run(Args) -> anyhow::Result<()>`.

pub mod agent;
pub mod antagonist;
pub mod bench;
pub mod ctl;
pub mod demo;
pub mod doctor;
#[cfg(feature = "kube")]
pub mod kube_discover;
pub mod load;
pub mod plan;
pub mod report;
pub mod serve;
pub mod sim;

/// Bad input from the user (a malformed flag value, a bad config): exit code 2, like clap's own
/// usage errors, so scripts can tell "you asked wrongly" from "it failed".
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Wraps a message as a [`UsageError`] inside an `anyhow::Error`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

/// Parses a subcommand's trailing flags with its clap parser: `--help` prints and exits 0, a
/// bad flag is a usage error (exit 2) carrying clap's message.
pub fn parse_flags<T: clap::Parser>(args: &[String]) -> anyhow::Result<T> {
    T::try_parse_from(args).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => e.exit(),
        _ => usage(
            e.to_string()
                .trim_start_matches("error: ")
                .trim_end()
                .to_string(),
        ),
    })
}

/// 2 for usage errors anywhere in the chain, 1 otherwise.
/// The longest run a `--duration`-style flag takes: a year (longer is a typo, and "until
/// stopped" is what leaving the flag out means).
pub const MAX_FLAG_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// A seconds flag as a duration: positive, finite and at most [`MAX_FLAG_SECONDS`], else a usage
/// error naming the flag and the value (`1e300` panicked in `Duration::from_secs_f64`).
pub fn seconds_flag(flag: &str, v: f64) -> anyhow::Result<std::time::Duration> {
    if v.is_finite() && v > 0.0 && v <= MAX_FLAG_SECONDS {
        return Ok(std::time::Duration::from_secs_f64(v));
    }
    Err(usage(format!(
        "{flag} {}: must be a positive number of seconds, at most {MAX_FLAG_SECONDS} (a year); leave it out to run until stopped",
        number(v)
    )))
}

/// A number as a person typed it: `1e300` rather than its 301 digits.
pub fn number(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// The error and its causes in one line, as `{:#}` prints them, less a cause whose text the
/// line already holds: many errors here say their source in their own message (so that it shows
/// wherever they are printed) and also keep it as their source, which `{:#}` then printed twice
/// ("Connection refused (os error 111): Connection refused (os error 111)").
pub fn error_text(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err
        .chain()
        .any(|e| e.downcast_ref::<UsageError>().is_some())
    {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    /// As the libraries' thiserror errors do: the source in the message and kept as the source.
    #[derive(Debug)]
    struct SaysItsSource {
        source: std::io::Error,
    }

    impl std::fmt::Display for SaysItsSource {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot connect to server 127.0.0.1:1: {}", self.source)
        }
    }

    impl std::error::Error for SaysItsSource {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_the_message_already_says_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(111);
        let io_text = io.to_string();
        let err = anyhow::Error::new(SaysItsSource { source: io });
        let line = super::error_text(&err);
        assert_eq!(line.matches(&io_text).count(), 1, "{line}");
        // A context whose cause it does not repeat keeps the cause.
        let err =
            anyhow::Error::new(std::io::Error::from_raw_os_error(2)).context("reading x.toml");
        let line = super::error_text(&err);
        assert!(line.starts_with("reading x.toml: "), "{line}");
        assert!(
            line.contains(&std::io::Error::from_raw_os_error(2).to_string()),
            "{line}"
        );
    }
}
