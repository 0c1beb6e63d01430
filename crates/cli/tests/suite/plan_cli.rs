//! `headroom plan`: Leverich & Kozyrakis' Table 2 row within 1 point, the operator plan from a
//! TOML file (EMU given or from a summary.json), and bad plan files → exit 2 naming file, line or
//! field.

use crate::support;

use support::{headroom, text};

#[test]
fn paper_table2_within_one_point() {
    let o = headroom(&["plan", "--paper", "leverich", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let paper: Vec<f64> = rows
        .iter()
        .map(|r| r["paper_pct"].as_f64().unwrap())
        .collect();
    assert_eq!(paper, [52.0, 29.0, 18.0, 11.0, 18.0]);
    for r in rows {
        let d = r["computed_pct"].as_f64().unwrap() - r["paper_pct"].as_f64().unwrap();
        assert!(d.abs() <= 1.0, "{r}");
        assert!(r["name"].is_string());
    }
    let o = headroom(&["plan", "--paper", "leverich"]);
    assert!(text(&o).contains("memcached 10% load"), "{}", text(&o));
}

#[test]
fn plan_from_a_summary_and_from_a_given_emu() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("summary.json"),
        r#"{"experiment":"sim-fleet","slo_us":500,"percentile":99,"runs":[
            {"policy":"none","be":"pool","slo_violations":9,"windows":9,"emu_mean":1.2,"emu_min":1.0,"lc_p99_us_max":null,"be_throughput_norm":null},
            {"policy":"hybrid","be":"pool","slo_violations":0,"windows":9,"emu_mean":0.9,"emu_min":0.7,"lc_p99_us_max":null,"be_throughput_norm":null,"lc_load_mean":0.55}]}"#,
    )
    .unwrap();
    let plan = tmp.path().join("plan.toml");
    std::fs::write(
        &plan,
        "[lc]\npeak_qps = 10000000\nqps_per_server = 500000\n[be]\ndemand_servers = 12\n[colocation]\nsummary = \"summary.json\"\n",
    )
    .unwrap();
    let o = headroom(&["plan", "--config", plan.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let a: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(a["lc_servers"], 20);
    assert_eq!(a["mean_load"], 0.55);
    assert_eq!(a["servers_without"], 32);
    // 20 servers × (0.90 − 0.55) = 7 servers' worth of BE on the LC servers: 5 left
    assert_eq!(a["servers_with"], 25);
    assert!(a["tco_saving_usd"].as_f64().unwrap() > 0.0);
    let o = headroom(&["plan", "--config", plan.to_str().unwrap()]);
    assert!(text(&o).contains("with colocation"), "{}", text(&o));
}

#[test]
fn bad_plan_files_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("bad.toml");
    std::fs::write(
        &plan,
        "[lc]\npeak_qps = 1\nqps_per_server = 1\nmean_lod = 0.5\n[be]\ndemand_servers = 1\n[colocation]\nemu = 0.9\n",
    )
    .unwrap();
    let o = headroom(&["plan", "--config", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("bad.toml: line 4: unknown field `mean_lod`"),
        "{}",
        text(&o)
    );

    std::fs::write(
        &plan,
        "[lc]\npeak_qps = 1\nqps_per_server = 0\nmean_load = 0.5\n[be]\ndemand_servers = 1\n[colocation]\nemu = 0.9\n",
    )
    .unwrap();
    let o = headroom(&["plan", "--config", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("lc.qps_per_server = 0"), "{}", text(&o));

    std::fs::write(
        &plan,
        "[lc]\npeak_qps = 1\nqps_per_server = 1\n[be]\ndemand_servers = 1\n[colocation]\nsummary = \"missing.json\"\n",
    )
    .unwrap();
    let o = headroom(&["plan", "--config", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("missing.json"), "{}", text(&o));
    let o = headroom(&["plan"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // Every bad value at once; a fleet too large to count is refused (it overflowed the sum).
    std::fs::write(
        &plan,
        "[lc]\npeak_qps = 1e300\nqps_per_server = 1e-300\nmean_load = 7\n[be]\ndemand_servers = -3\n[colocation]\nemu = 0.9\n",
    )
    .unwrap();
    let o = headroom(&["plan", "--config", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    for says in [
        "3 problems",
        "lc.peak_qps / lc.qps_per_server",
        "lc.mean_load = 7",
        "be.demand_servers = -3",
    ] {
        assert!(text(&o).contains(says), "{says}: {}", text(&o));
    }
}
