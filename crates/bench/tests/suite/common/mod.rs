//! Setup shared by the bench's integration tests.

use std::path::Path;

use headroom_bench::experiments::Experiment;
use headroom_bench::record::{Options, Session};

/// Opens a recording session in `dir` with progress lines discarded.
pub fn quiet_session(exp: Experiment, opts: Options, dir: &Path) -> Session<'static> {
    let progress: &'static mut dyn FnMut(&str) = Box::leak(Box::new(|_: &str| {}));
    Session::open(exp, opts, dir, progress).unwrap()
}
