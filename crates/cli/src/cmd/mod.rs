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
