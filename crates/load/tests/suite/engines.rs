//! The io_uring and epoll engines against the M/M/1 fixture: the same schedule gives the same
//! measurement (both near the analytic quantiles, each inside the other's reach), and each run
//! records the engine that ran. Coverage over many runs is the ci_coverage example's job
//! (`--engine`), figures in docs/load.md.

use headroom_load::engine::{choose_engine, EngineChoice, EngineKind};
use headroom_load::stats::batch::mm1_quantile_us;
use headroom_load::testkit::Mm1Server;
use headroom_load::{run_report, LoadOptions};

fn run(engine: EngineChoice) -> headroom_load::LoadReport {
    // ρ = 0.5 at μ = 1000/s.
    let server = Mm1Server::start(1000.0, 1).expect("start");
    let opts = LoadOptions {
        servers: vec![server.addr().to_string()],
        qps: 500,
        time_s: 4.0,
        warmup_s: 0.5,
        connections: 4,
        depth: 256,
        noload: true,
        seed: Some(11),
        engine,
        ..LoadOptions::default()
    };
    run_report(&opts, &mut |_| {}).expect("run")
}

#[test]
fn both_engines_measure_the_mm1_fixture_alike() {
    if choose_engine(EngineChoice::Auto).unwrap().kind != EngineKind::IoUring {
        eprintln!("SKIP both_engines_measure_the_mm1_fixture_alike: io_uring unavailable here");
        return;
    }
    let p50 = mm1_quantile_us(500.0, 1000.0, 0.5);
    let p99 = mm1_quantile_us(500.0, 1000.0, 0.99);
    let mut medians = Vec::new();
    for (choice, name) in [
        (EngineChoice::Epoll, "epoll"),
        (EngineChoice::IoUring, "io_uring"),
    ] {
        let r = run(choice);
        let read = &r.result.read;
        eprintln!(
            "M/M/1 rho 0.5, {name}: p50 {:.0} us (CI {:.0}..{:.0}; analytic {p50:.0}), p99 {:.0} us (CI {:.0}..{:.0}; analytic {p99:.0}), send lag p99 {:.1} us",
            read.p50_us,
            read.p50_ci_us[0],
            read.p50_ci_us[1],
            read.p99_us,
            read.p99_ci_us[0],
            read.p99_ci_us[1],
            r.result.client.send_lag_p99_us
        );
        assert_eq!(r.result.client.engine.as_deref(), Some(name));
        assert_eq!(r.result.client.engine_fallback_reason, None);
        assert_eq!(r.result.errors, 0, "{name}");
        // Loose bounds on one run: a loaded machine delays the fixture and the client alike (the
        // comparison of the two engines below is the point).
        assert!(
            read.p50_us > 0.75 * p50 && read.p50_us < 1.6 * p50,
            "{name}: p50 {} vs analytic {p50}",
            read.p50_us
        );
        assert!(
            read.p99_us > 0.6 * p99 && read.p99_us < 1.6 * p99,
            "{name}: p99 {} vs analytic {p99}",
            read.p99_us
        );
        medians.push(read.p50_us);
    }
    let (a, b) = (medians[0], medians[1]);
    assert!(
        (a - b).abs() < 0.3 * p50,
        "epoll p50 {a} us and io_uring p50 {b} us differ by more than 30% of the analytic {p50}"
    );
}
