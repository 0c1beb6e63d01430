//! A server with three services: `multi` bounds BE by the tightest service where `hybrid`,
//! protecting the first, lets the others violate; runs are deterministic.

use super::*;
use crate::model::ServerModel;
use crate::trace::LoadTrace;

/// A relaxed first service, a tight second one, a slow third one: the evidence day of
/// docs/simulation.md, read from the file the page's command names.
pub(crate) fn three() -> Vec<ServiceSpec> {
    ServicesFile::from_toml_str(include_str!("../../data/three-services.toml"))
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

/// The evidence day (docs/simulation.md), as `headroom sim fleet --servers 1 --hours 24
/// --cores 16 --services crates/sim/data/three-services.toml` runs it: under `multi` no
/// service has a violating window and EMU is at least 85%; `hybrid`, protecting `web` only,
/// lets `kv` violate. `--nocapture` prints the table.
#[test]
fn the_three_service_day_meets_every_slo_under_multi() {
    let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    let spec = FleetSpec {
        servers: 1,
        hours: 24.0,
        cores: vec![16],
        seed: 1,
        policies: DEFAULT_POLICIES.to_vec(),
    };
    let services = three();
    let fleets = run_multi_fleet(&setup, &services, &spec, &|_, _| {}).expect("runs");
    print!("{}", report::text_table(&services, &fleets));
    let by = |p: &str| fleets.iter().find(|f| f.policy == p).expect("ran");
    let multi = by("multi");
    assert_eq!(multi.violations(), vec![0, 0, 0]);
    assert!(multi.emu_mean() >= 0.85, "EMU {}", multi.emu_mean());
    assert!(by("hybrid").violations()[1] > 0, "hybrid lets kv violate");
    assert_eq!(multi.windows(), 5760);
}
