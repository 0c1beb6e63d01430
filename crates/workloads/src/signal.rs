//! SIGTERM/SIGINT → a stop flag, so servers and antagonists shut down cleanly when signalled.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Installs handlers for SIGTERM and SIGINT that set the returned flag (process-wide; calling it
/// again is harmless).
pub fn install_stop_flag() -> Result<&'static AtomicBool, nix::Error> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only performs an atomic store, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(&STOP)
}

/// Whether a stop signal has arrived (false until [`install_stop_flag`] was called and a signal
/// came).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
