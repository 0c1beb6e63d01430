//! deploy/grafana/headroom.json queries only metrics the agent exports: every `headroom_*` name
//! in its PromQL (panels and template variables) is a sample name of the agent's registry
//! (`headroom_agent::publish::metrics`, rendered as Prometheus text: a counter `x` is sampled as
//! `x_total`, a histogram as `x_bucket`/`x_sum`/`x_count`), and the panels the operator docs
//! promise are there.

use std::collections::BTreeSet;
use std::path::PathBuf;

use headroom_agent::publish::metrics::{render, Metrics};

fn dashboard() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/headroom.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The sample names the agent's registry exposes.
fn exported() -> BTreeSet<String> {
    let (metrics, registry) = Metrics::new();
    // Labelled families are rendered once they have a series.
    metrics
        .decisions
        .get_or_create(&vec![("reason".to_owned(), "test".to_owned())])
        .inc();
    metrics.sensor_errors_total("idle", 1);
    // The per-LC-service families (`lc` label), as a tick with two services sets them.
    let services = [
        headroom_agent::publish::metrics::ServiceSlo {
            name: "a".into(),
            slo_us: 500.0,
        },
        headroom_agent::publish::metrics::ServiceSlo {
            name: "b".into(),
            slo_us: 800.0,
        },
    ];
    let obs = headroom_types::observation::Observation {
        lc_groups: vec![
            headroom_types::observation::LcGroupObservation {
                name: "a".into(),
                latency_us: Some(100.0),
                latency_source: Some("probe".into()),
                ..Default::default()
            },
            headroom_types::observation::LcGroupObservation {
                name: "b".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    metrics.observe_services(&services, &obs, Some("a"));
    let text = render(&registry);
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if (parts.next(), parts.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["bucket", "sum", "count"] {
                    names.insert(format!("{name}_{s}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    assert!(
        names.len() > 10,
        "the registry renders its metrics:\n{text}"
    );
    names
}

/// Every PromQL string of the dashboard: targets' `expr` and template variables' queries.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains("headroom_") => {
                        out.push(s.clone())
                    }
                    _ => queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| queries(i, out)),
        _ => {}
    }
}

/// The `headroom_*` identifiers in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("headroom_") {
        let preceded_by_ident = rest[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded_by_ident {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_dashboard_query_uses_an_exported_metric() {
    let exported = exported();
    let mut exprs = Vec::new();
    queries(&dashboard(), &mut exprs);
    assert!(exprs.len() >= 12, "{exprs:?}");
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query with no headroom metric: {expr}");
        for n in names {
            assert!(
                exported.contains(&n),
                "{n} (in `{expr}`) is not exported by the agent; it exports {exported:?}"
            );
            used.insert(n);
        }
    }
    // What docs/operators.md says the dashboard shows.
    for promised in [
        "headroom_lc_latency_us",
        "headroom_lc_slo_us",
        "headroom_lc_slack",
        "headroom_lc_load",
        "headroom_be_cpus",
        "headroom_idle_cpus",
        "headroom_writes_total",
        "headroom_drift_repairs_total",
        "headroom_loop_duration_seconds_bucket",
    ] {
        assert!(used.contains(promised), "no panel queries {promised}");
    }
}

#[test]
fn the_metric_name_scanner_finds_names_and_skips_longer_identifiers() {
    assert_eq!(
        metric_names("rate(headroom_writes_total{instance=~\"$i\"}[1m]) / my_headroom_x"),
        vec!["headroom_writes_total"]
    );
}

#[test]
fn every_panel_uses_the_datasource_variable_and_has_a_unique_id() {
    let d = dashboard();
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate id {}",
            p["id"]
        );
        assert!(!p["targets"].as_array().expect("targets").is_empty());
    }
}
