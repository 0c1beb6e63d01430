//! Errors of the tools' own benchmarks: each names the file, process or value at fault.

/// Anything that stops `headroom bench loadgen|host|agent|prober`.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A file, process or socket the benchmark uses that the system refused: `what` names it
    /// (`creating /tmp/x`, `starting the spinner on CPU 1`).
    #[error("{what}: {source}")]
    System {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// JSON the benchmark reads (a child's result) or writes that does not parse or encode.
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A command run to completion that failed, with its stderr.
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
    /// What the host must offer for this benchmark (root, CPUs) and does not.
    #[error("{tool} needs {need}")]
    Needs { tool: &'static str, need: String },
    /// A measurement that could not be taken (a process that did not stop, an agent that
    /// exited, a figure missing from a child's output), with what was seen.
    #[error("{0}")]
    Measurement(String),
    /// The memcached `bench loadgen` measures against.
    #[error("starting memcached (apt-get install memcached): {0}")]
    Memcached(#[source] headroom_load::readiness::SpawnError),
    /// One case of a benchmark that runs several.
    #[error("case {case}: {source}")]
    Case {
        case: &'static str,
        #[source]
        source: Box<ToolError>,
    },
    /// The host layer (cgroups, BPF, /proc readers): names the path.
    #[error(transparent)]
    Host(#[from] headroom_host::HostError),
    /// A group path the benchmark builds.
    #[error(transparent)]
    Value(#[from] headroom_types::ValueError),
    /// The experiments' runner (serve, agent and load as subprocesses).
    #[error(transparent)]
    Bench(#[from] crate::BenchError),
}

pub type Result<T, E = ToolError> = std::result::Result<T, E>;

/// Names what a failed system call or JSON step was doing (`.context("creating DIR")`).
pub(crate) trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for std::io::Result<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|source| ToolError::System {
            what: what.into(),
            source,
        })
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| ToolError::System {
            what: what(),
            source,
        })
    }
}

impl<T> Context<T> for serde_json::Result<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|source| ToolError::Json {
            what: what.into(),
            source,
        })
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| ToolError::Json {
            what: what(),
            source,
        })
    }
}
