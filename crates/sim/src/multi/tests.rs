//! A server with three services: `multi` bounds BE by the tightest service where `hybrid`,
//! protecting the first, lets the others violate; runs are deterministic.

use super::*;
use crate::model::ServerModel;
use crate::trace::LoadTrace;

/// A relaxed first service, a tight second one (its p99 is 50 µs with BE off, 130 µs at the
/// edge with BE on), a slow third one: the evidence day of docs/simulation.md.
pub(crate) fn three() -> Vec<ServiceSpec> {
    ServicesFile::from_toml_str(
        r#"
[[service]]
name = "web"
service_us = 25
service_cv = 0.6
slo_us = 2000
share = 0.4
[[service]]
name = "kv"
service_us = 10
service_cv = 0.5
slo_us = 130
share = 0.3
offset_h = -3
priority = 1
[[service]]
name = "search"
service_us = 100
service_cv = 1.0
slo_us = 3000
share = 0.3
offset_h = 3
"#,
    )
    .expect("valid")
    .service
}

fn run(kind: PolicyKind, hours: f64) -> MultiOutcome {
    let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    let server = ServerSpec {
        cores: 16,
        seed: 7,
        start_s: 12.0 * 3600.0,
        duration_s: hours * 3600.0,
    };
    run_multi_server(&setup, &three(), &server, kind, true).expect("runs")
}

#[test]
fn multi_protects_every_service_where_hybrid_protects_the_first() {
    let multi = run(PolicyKind::Multi, 6.0);
    let hybrid = run(PolicyKind::Hybrid, 6.0);
    let kv = |o: &MultiOutcome| o.services[1].violations;
    assert!(
        kv(&multi) < kv(&hybrid),
        "kv violating windows: multi {} vs hybrid {}",
        kv(&multi),
        kv(&hybrid)
    );
    assert!(multi.emu_mean > multi.lc_load_mean, "BE ran under multi");
    let bound_by_kv = multi
        .records
        .iter()
        .filter(|w| w.binding.as_deref() == Some("kv"))
        .count();
    assert!(bound_by_kv > 0, "kv binds some decisions");
}

#[test]
fn a_multi_service_run_is_deterministic() {
    let a = run(PolicyKind::Multi, 0.5);
    let b = run(PolicyKind::Multi, 0.5);
    assert_eq!(a, b);
    assert_eq!(a.windows, 120);
    assert_eq!(a.services.len(), 3);
}

