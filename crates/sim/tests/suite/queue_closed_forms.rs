//! The queue model with no BE against the analytic response-time percentiles (M/M/1, M/M/k via
//! Erlang C), each checked by an exact per-request simulation of the same queue.

use headroom_sim::des::{percentile, simulate_mgk};
use headroom_sim::host::SimHost;
use headroom_sim::model::{BeKind, ServerModel};
use headroom_sim::queue::{erlang_c, ResponseTail, ServiceDist};
use headroom_types::allocation::Allocation;

const REQUESTS: usize = 1_000_000;

/// p99 of M/M/k's response time from Erlang C, by bisection on the closed-form tail
/// P(T > t) = e^{-μt} + C·μ/(kμ−λ−μ)·(e^{-μt} − e^{-(kμ−λ)t}) (written out here, not the model's).
fn mmk_p99_closed_form(k: u32, lambda: f64, mu: f64) -> f64 {
    let c = erlang_c(k, lambda / mu);
    let theta = k as f64 * mu - lambda;
    let tail = |t: f64| {
        if (theta - mu).abs() < 1e-12 {
            (-mu * t).exp() + c * mu * t * (-mu * t).exp()
        } else {
            (-mu * t).exp() + c * mu / (theta - mu) * ((-mu * t).exp() - (-theta * t).exp())
        }
    };
    let (mut lo, mut hi) = (0.0, 1.0 / mu);
    while tail(hi) > 0.01 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if tail(mid) > 0.01 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[test]
fn mm1_model_and_simulation_match_the_closed_form() {
    let mean = 100.0;
    for rho in [0.3, 0.6, 0.8] {
        let lambda = rho / mean;
        let want = (100.0f64).ln() / (1.0 / mean - lambda);
        let model = ResponseTail::mgk(1.0, lambda, ServiceDist::with_mean_cv(mean, 1.0))
            .unwrap()
            .quantile(0.99);
        let mut sim = simulate_mgk(
            1,
            lambda,
            &ServiceDist::with_mean_cv(mean, 1.0),
            REQUESTS,
            10_000,
            7,
        );
        let measured = percentile(&mut sim, 0.99);
        eprintln!("M/M/1 rho {rho}: closed {want:.1} model {model:.1} simulated {measured:.1}");
        assert!(
            (model - want).abs() / want < 0.002,
            "model {model} vs {want}"
        );
        assert!(
            (measured - want).abs() / want < 0.08,
            "simulated {measured} vs {want}"
        );
    }
}

#[test]
fn mmk_model_and_simulation_match_erlang_c() {
    let mean = 50.0;
    for (k, rho) in [(4u32, 0.7), (16, 0.8), (16, 0.9)] {
        let lambda = rho * k as f64 / mean;
        let want = mmk_p99_closed_form(k, lambda, 1.0 / mean);
        let service = ServiceDist::with_mean_cv(mean, 1.0);
        let model = ResponseTail::mgk(k as f64, lambda, service)
            .unwrap()
            .quantile(0.99);
        let mut sim = simulate_mgk(k, lambda, &service, REQUESTS, 10_000, 11);
        let measured = percentile(&mut sim, 0.99);
        eprintln!("M/M/{k} rho {rho}: closed {want:.1} model {model:.1} simulated {measured:.1}");
        assert!(
            (model - want).abs() / want < 0.002,
            "model {model} vs {want}"
        );
        assert!(
            (measured - want).abs() / want < 0.08,
            "simulated {measured} vs {want}"
        );
    }
}

#[test]
fn mgk_approximation_is_close_to_exact_simulation() {
    // M/G/k with a less variable service time (Allen–Cunneen): an approximation, so a wider band
    let mean = 25.0;
    for (k, rho, cv) in [(8u32, 0.8, 0.6), (16, 0.9, 0.6), (16, 0.7, 2.0)] {
        let lambda = rho * k as f64 / mean;
        let service = ServiceDist::with_mean_cv(mean, cv);
        let model = ResponseTail::mgk(k as f64, lambda, service)
            .unwrap()
            .quantile(0.99);
        let mut sim = simulate_mgk(k, lambda, &service, REQUESTS, 10_000, 3);
        let measured = percentile(&mut sim, 0.99);
        eprintln!("M/G/{k} rho {rho} cv {cv}: model {model:.1} simulated {measured:.1}");
        assert!(
            (model - measured).abs() / measured < 0.2,
            "model {model} vs simulated {measured}"
        );
    }
}

#[test]
fn simhost_alone_is_the_plain_queue() {
    // SimHost with BE frozen adds nothing to the queue: its tail is M/G/k's
    let model = ServerModel::default();
    let mut host = SimHost::new(&model, 16, &BeKind::default(), 5.0);
    host.apply(&Allocation::default().disabled());
    let qps = 400_000.0;
    let tick = host.evaluate(qps);
    let plain = ResponseTail::mgk(
        16.0,
        qps / 1e6,
        ServiceDist::with_mean_cv(model.lc.service_us, model.lc.service_cv),
    )
    .unwrap();
    assert!((tick.tail.quantile(0.99) - plain.quantile(0.99)).abs() < 1e-6);
    assert_eq!(tick.be_norm, 0.0);
    assert!((tick.idle - (16.0 - qps * model.lc.service_us / 1e6)).abs() < 1e-9);
}

/// Host stalls as a share of time (server vacations): the closed form's share of requests that
/// meet one, time share / (1 − ρ), against an exact simulation of a server the host stops; the
/// share-of-requests form, which ignores the backlog a stall leaves, is far off at high load.
#[test]
fn stalls_as_a_share_of_time_match_a_simulated_server_that_the_host_stops() {
    use headroom_sim::des::simulate_mg1_with_stalls;
    use headroom_sim::queue::StallForm;
    let (mean, f, stall_mean) = (10.0, 0.005, 500.0);
    let service = ServiceDist::with_mean_cv(mean, 1.0);
    for rho in [0.2, 0.6] {
        let lambda = rho / mean;
        let mut sim =
            simulate_mg1_with_stalls(lambda, &service, f, stall_mean, 4_000_000, 10_000, 5);
        let plain = ResponseTail::mgk(1.0, lambda, service).unwrap();
        for q in [0.99, 0.999] {
            let measured = percentile(&mut sim, q);
            let by_time = plain.with_stall(StallForm::Time, f, stall_mean).quantile(q);
            let by_requests = plain
                .with_stall(StallForm::Requests, f, stall_mean)
                .quantile(q);
            eprintln!(
                "rho {rho} q {q}: simulated {measured:.0} µs, time form {by_time:.0}, request form {by_requests:.0}"
            );
            assert!(
                (by_time - measured).abs() / measured < 0.2,
                "rho {rho} q {q}: time form {by_time} vs simulated {measured}"
            );
            if rho > 0.5 {
                assert!(
                    (by_requests - measured).abs() / measured > 0.3,
                    "rho {rho} q {q}: the request form {by_requests} should miss {measured}"
                );
            }
        }
    }
}
