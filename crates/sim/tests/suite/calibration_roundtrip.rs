//! Calibration against a ground truth: bench directories whose tails a known model produced
//! (through the same replay of each point the fits use) are calibrated, and the fit must give
//! back that model's parameters — the service time, the wake-up delays with the share of
//! requests that meet them, an antagonist's LLC pressure and a BE kind's speed.

use std::path::Path;

use headroom_bench::fixture::synthetic_load;
use headroom_report::model::{Machine, Manifest, Point, SoloBaseline};
use headroom_report::store::{RunDir, BASELINES, POINTS};
use headroom_sim::calibrate::calibrate;
use headroom_sim::calibrate::replay::{predicted_tail, Placement, Weighting};
use headroom_sim::model::{BeKind, ServerModel};
use headroom_sim::queue::StallForm;

fn truth(stall_fraction: f64, stall_mean_us: f64) -> ServerModel {
    let mut m = ServerModel::default();
    m.server.stall_fraction = stall_fraction;
    m.server.stall_mean_us = stall_mean_us;
    m.lc.service_us = 40.0;
    m.lc.service_cv = 0.7;
    m.sched.delayed_fraction = 0.03;
    m.sched.delay_fair_us = 3000.0;
    m.sched.delay_low_weight_us = 150.0;
    m.sched.delay_idle_us = 100.0;
    m.be.get_mut("llc").unwrap().llc_pressure = 0.4;
    m
}

fn manifest(exp: &str, be_cpus: Vec<usize>) -> Manifest {
    Manifest {
        experiment: exp.into(),
        machine: Machine {
            cpus: 3,
            loadgen_cpus: vec![0],
            server_cpus: vec![1],
            be_cpus,
            ..Machine::default()
        },
        slo_us: 2000.0,
        percentile: 99.0,
        ..Manifest::default()
    }
}

/// One point whose tails are the truth's for the point's placement and weighting.
fn point(series: &str, be: &str, load: f64, tail: impl Fn(f64) -> f64, qps: f64) -> Point {
    let mut l = synthetic_load(qps, 10.0, load, true);
    l.achieved_qps = qps;
    l.p95_us = Some(tail(0.95));
    l.p99_us = Some(tail(0.99));
    l.p999_us = Some(tail(0.999));
    Point {
        id: format!("{series}/{load}/0"),
        series: series.into(),
        be: be.into(),
        load_fraction: load,
        repeat: 0,
        start_unix_ms: 0,
        end_unix_ms: 0,
        load: Some(l),
        error: None,
        be_ops_per_s: None,
        be_norm: None,
        idle_cpu_pct: None,
        steal_pct: None,
        agent: None,
        commands: vec![],
        raw_load: None,
    }
}

fn write(dir: &Path, m: &Manifest, points: &[Point]) -> RunDir {
    let run = RunDir::create(dir).unwrap();
    run.write_manifest(m).unwrap();
    for p in points {
        run.save(POINTS, &p.id, p).unwrap();
    }
    run
}

#[test]
fn calibration_gives_back_the_model_that_made_the_data() {
    let m = roundtrip(&truth(0.0, 0.0), true);
    // no stalls in the truth: none worth a tail's width fitted
    assert!(
        m.server.stall_fraction * m.server.stall_mean_us < 1.0,
        "stalls fitted from data without any: {} of requests, {} µs",
        m.server.stall_fraction,
        m.server.stall_mean_us
    );
}

/// Data with host stalls in them (a VM's: 1.5% of requests, 700 µs on average): the fit must
/// reproduce every tail of every point (each parameter's fit error < 10%, checked in
/// `roundtrip`). It does not give the truth's parameters back: with stalls setting the p99
/// and p99.9, the service time, the stalls and the delays trade off against each other over
/// these tails (fitted here: a stall fraction near 0.14%, the service time 17 µs against 40) —
/// said so in docs/simulation.md.
#[test]
fn calibration_reproduces_the_tails_of_data_with_host_stalls() {
    let m = roundtrip(&truth(0.015, 700.0), false);
    assert!(m.server.stall_fraction.is_finite() && m.server.stall_mean_us.is_finite());
}

/// Data whose stalls are a share of the host's time (a server vacation: at load ρ a share
/// f/(1 − ρ) of requests meet one), calibrated in that form (`--stall-form time`): every tail
/// of the LC-alone points is reproduced (fit error < 10%). Which form fits better is not asked
/// of the default calibration: over p95/p99/p99.9 at six loads the two forms fit these data
/// equally (7.3% each), trading the service time against the stalls (docs/simulation.md).
#[test]
fn calibration_in_the_time_form_reproduces_data_whose_stalls_are_a_share_of_time() {
    let mut t = truth(0.01, 700.0);
    t.server.stall_form = StallForm::Time;
    let m = roundtrip_with(&t, false, StallForm::Time, true);
    assert_eq!(m.server.stall_form, StallForm::Time);
}

/// Calibrates bench directories whose every tail `t` produced; checks what comes back. With
/// stalls in `t` the service time is only weakly identified (the p95 is all the stalls leave
/// it), so `exact_service` is false there and the fit is judged by the tails it reproduces.
fn roundtrip(t: &ServerModel, exact_service: bool) -> ServerModel {
    roundtrip_with(t, exact_service, StallForm::Requests, false)
}

/// `roundtrip`, calibrating the stalls in `form`; with `alone_only`, only the LC-alone fits
/// (`lc.*`, `server.*`) must reproduce their data within 10%.
fn roundtrip_with(
    t: &ServerModel,
    exact_service: bool,
    form: StallForm,
    alone_only: bool,
) -> ServerModel {
    let t = t.clone();
    let tmp = tempfile::tempdir().unwrap();
    let capacity = 1e6 / t.lc.service_us;
    let loads = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6];
    let shared = Placement::from_bench(&[1], &[]);
    let apart = Placement::from_bench(&[1], &[2]);

    let alone: Vec<Point> = loads
        .iter()
        .map(|&l| {
            let qps = l * capacity;
            let tail = |q| predicted_tail(&t, &shared, None, Weighting::Equal, qps, q);
            point("alone", "none", l, tail, qps)
        })
        .collect();
    write(
        &tmp.path().join("lvl"),
        &manifest("latency-vs-load", vec![]),
        &alone,
    );

    let spin = t.be["spin"].clone();
    let mut sched = Vec::new();
    for series in ["equal", "weights-10000:2", "be-cpu.idle"] {
        let w = Weighting::from_series(series).unwrap();
        for &l in &loads[..4] {
            let qps = l * capacity;
            let tail = |q| predicted_tail(&t, &shared, Some(&spin), w, qps, q);
            sched.push(point(series, "spin", l, tail, qps));
        }
    }
    write(
        &tmp.path().join("sched"),
        &manifest("scheduling", vec![]),
        &sched,
    );

    let llc: BeKind = t.be["llc"].clone();
    let mut inter = alone.clone();
    for &l in &loads {
        let qps = l * capacity;
        let tail = |q| predicted_tail(&t, &apart, Some(&llc), Weighting::Equal, qps, q);
        inter.push(point("llc-0.5", "llc:0.5", l, tail, qps));
    }
    let run = write(
        &tmp.path().join("inter"),
        &manifest("interference", vec![2]),
        &inter,
    );
    let solo = SoloBaseline {
        kind: "llc".into(),
        ops_per_s: 4.0e5,
        measured_ops_per_s: 4.0e5,
        ops_per_cpu_s: Some(4.0e5),
        seconds: 5.0,
        commands: vec![],
    };
    run.save(BASELINES, "solo-llc", &solo).unwrap();

    let dirs = ["lvl", "sched", "inter"].map(|d| tmp.path().join(d));
    let fit = calibrate(&dirs, form).unwrap();
    let m = &fit.model;
    let t_idle = t.sched.delay_idle_us;
    let close = |got: f64, want: f64, tol: f64, what: &str| {
        assert!(
            (got - want).abs() <= tol * want,
            "{what}: fitted {got}, truth {want} (tolerance {tol})"
        );
    };
    // With stalls in the truth the service time the p95 leaves is weakly identified, and the
    // fits that read what is left of each tail after it (delays, LLC pressure) inherit that:
    // there the round trip checks the stalls and that every parameter fits its data.
    if exact_service {
        close(m.lc.service_us, 40.0, 0.10, "lc.service_us");
        // the delay grid steps by 26%: a fitted delay is within one step of the truth
        close(m.sched.delay_fair_us, 3000.0, 0.3, "sched.delay_fair_us");
        close(m.sched.delay_idle_us, t_idle, 0.3, "sched.delay_idle_us");
        close(
            m.sched.delayed_fraction,
            0.03,
            0.5,
            "sched.delayed_fraction",
        );
        close(m.be["llc"].llc_pressure, 0.4, 0.1, "be.llc.llc_pressure");
        close(
            m.be["llc"].ops_per_cpu_s,
            4.0e5,
            1e-9,
            "be.llc.ops_per_cpu_s",
        );
    }
    let alone_fit = |k: &str| k.starts_with("lc.") || k.starts_with("server.");
    for p in m
        .calibration
        .params
        .iter()
        .filter(|p| !alone_only || alone_fit(&p.key))
    {
        assert!(
            p.fit_error < 0.10,
            "{} fits its own data to {:.1}%",
            p.key,
            p.fit_error * 100.0
        );
    }
    let keys: Vec<&str> = m
        .calibration
        .params
        .iter()
        .map(|p| p.key.as_str())
        .collect();
    for k in [
        "sched.delay_fair_us",
        "sched.delay_low_weight_us",
        "sched.delay_idle_us",
        "sched.delayed_fraction",
        "be.llc.llc_pressure",
        "be.llc.ops_per_cpu_s",
        "server.stall_fraction",
        "server.stall_mean_us",
    ] {
        assert!(keys.contains(&k), "{k} not in {keys:?}");
    }
    fit.model
}
