//! The kubeconfig tests' start: a client made from a kubeconfig file, in a thread of its own,
//! bounded by 20 s (a FIFO or a hung read must fail the test, not hang it).
#![allow(dead_code)] // not every test that shares this module makes a FIFO

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use headroom_kube::watch::{client_bounded, ApiBounds};
use headroom_kube::KubeError;

/// `client_bounded(path)`'s outcome: "ok", "error (kubeconfig): …" or "error (other): …"; `Err`
/// when it did not end within 20 s.
pub fn start_within_20_s(path: &Path) -> Result<String, String> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(client_bounded(Some(&p), ApiBounds::default()));
        let _ = tx.send(match r {
            Ok(_) => "ok".to_string(),
            Err(e @ KubeError::Kubeconfig { .. }) => format!("error (kubeconfig): {e}"),
            Err(e) => format!("error (other): {e}"),
        });
    });
    rx.recv_timeout(Duration::from_secs(20)).map_err(|e| {
        format!(
            "the start with kubeconfig {} did not end in 20 s: {e}",
            path.display()
        )
    })
}

/// [`start_within_20_s`], a hang failing the test.
pub fn start(path: &Path) -> String {
    start_within_20_s(path).unwrap_or_else(|e| panic!("{e}"))
}

/// A FIFO at `path` (mode 0600).
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}
