//! Listing the pods once through a bounded client, against a hostile server on 127.0.0.1: the
//! helper the list tests share (it was copied in kube_lows.rs, hostile_pass_11.rs and
//! list_bounds.rs). Here rather than in headroom-hostile-server, which would need kube-rs,
//! k8s-openapi and tokio, and headroom-kube itself (a dev-dependency cycle).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use headroom_hostile_server::{error_chain, kubeconfig};
use headroom_kube::watch::{client_bounded, ApiBounds};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// The pods listed (their count) or the error's whole chain, with the default bounds and a 60 s
/// hang guard.
pub fn once(port: u16) -> Result<usize, String> {
    once_with(port, ApiBounds::default(), Duration::from_secs(60)).0
}

/// The same with `bounds`, and `guard` as the hang guard (far past any bound tried); how long
/// it took beside.
pub fn once_with(
    port: u16,
    bounds: ApiBounds,
    guard: Duration,
) -> (Result<usize, String>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Instant::now();
    let got = rt.block_on(async {
        let client = client_bounded(Some(&config), bounds)
            .await
            .map_err(|e| e.to_string())?;
        let api: Api<Pod> = Api::all(client);
        match tokio::time::timeout(guard, api.list(&ListParams::default())).await {
            Ok(r) => r.map(|l| l.items.len()).map_err(|e| error_chain(&e)),
            Err(_) => Err(format!(
                "no answer within {} s (unbounded)",
                guard.as_secs()
            )),
        }
    });
    (got, t.elapsed())
}
