//! Resumability: a stored result is never recorded again, and a sweep whose points are all stored
//! runs no process at all (here the `headroom` binary does not even exist).

use std::cell::Cell;

use headroom_bench::experiments::Experiment;
use headroom_bench::record::{self, Options, Session};
use headroom_report::model::{LcBaseline, Point};
use headroom_report::store::{RunDir, BASELINES, POINTS};

#[test]
fn get_or_record_skips_existing_results() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(tmp.path()).unwrap();
    let calls = Cell::new(0);
    let record = || {
        calls.set(calls.get() + 1);
        Ok::<_, headroom_bench::BenchError>(42u32)
    };
    let (v, resumed) = dir.get_or_record(POINTS, "a/b:c", record).unwrap();
    assert_eq!((v, resumed), (42, false));
    let (v, resumed) = dir
        .get_or_record(POINTS, "a/b:c", || -> headroom_bench::Result<u32> {
            panic!("must not record a stored point")
        })
        .unwrap();
    assert_eq!((v, resumed), (42, true));
    assert_eq!(calls.get(), 1);
    // Atomic writes leave no temporary files behind.
    let names: Vec<String> = std::fs::read_dir(tmp.path().join(POINTS))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a_b_c.json"]);
}

/// A stored LC baseline (SLO 500 µs, peak 10 000 QPS), so a sweep needs no capacity search.
fn store_lc_baseline(dir: &RunDir) {
    dir.save(
        BASELINES,
        "lc",
        &LcBaseline {
            slo_us: 500.0,
            slo_source: "test".into(),
            peak_qps: 10_000.0,
            peak_source: "test".into(),
            capacity_qps: 10_000.0,
            ..Default::default()
        },
    )
    .unwrap();
}

fn options(bin: &std::path::Path) -> Options {
    let mut o = Options::defaults(Experiment::LatencyVsLoad, true, bin.to_path_buf());
    o.loads = vec![0.1, 0.5];
    o.repeats = 3;
    o
}

#[test]
fn a_fully_stored_sweep_runs_nothing_and_a_partial_one_only_its_missing_points() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let missing_bin = tmp.path().join("no-such-headroom");
    let dir = RunDir::create(&out).unwrap();
    store_lc_baseline(&dir);
    let opts = options(&missing_bin);
    let configs = record::sweep_configs(Experiment::LatencyVsLoad, &opts, false);
    assert_eq!(configs.len(), 1);
    let mut ids = Vec::new();
    for r in 0..3u32 {
        for l in [0.1, 0.5] {
            let id = format!("alone/{:05.1}/r{r}", l * 100.0);
            let p = Point {
                id: id.clone(),
                series: "alone".into(),
                be: "none".into(),
                load_fraction: l,
                repeat: r,
                load: Some(headroom_bench::fixture::synthetic_load(
                    l * 1e4,
                    50.0,
                    l,
                    true,
                )),
                ..Default::default()
            };
            dir.save(POINTS, &id, &p).unwrap();
            ids.push(id);
        }
    }
    let before: Vec<std::time::SystemTime> = ids
        .iter()
        .map(|id| {
            std::fs::metadata(dir.result_path(POINTS, id))
                .unwrap()
                .modified()
                .unwrap()
        })
        .collect();

    let mut lines = Vec::new();
    {
        let mut progress = |l: &str| lines.push(l.to_string());
        let mut s =
            Session::open(Experiment::LatencyVsLoad, opts.clone(), &out, &mut progress).unwrap();
        s.sweep(&configs).unwrap();
        assert_eq!(s.recorded, 0);
        assert_eq!(s.resumed, 6 + 1, "6 points and the LC baseline");
    }
    assert!(
        lines.iter().any(|l| l.contains("all 6 points stored")),
        "{lines:?}"
    );
    for (id, t) in ids.iter().zip(&before) {
        let now = std::fs::metadata(dir.result_path(POINTS, id))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(now, *t, "{id} was rewritten");
    }

    // Remove one point: only that one is attempted (and fails here, as there is no binary); the
    // failure is noted in the manifest and the stored points stay as they were.
    std::fs::remove_file(dir.result_path(POINTS, &ids[3])).unwrap();
    let mut progress = |_: &str| {};
    let mut s = Session::open(Experiment::LatencyVsLoad, opts, &out, &mut progress).unwrap();
    s.sweep(&configs).unwrap();
    assert_eq!(s.resumed, 5 + 1);
    assert_eq!(s.recorded, 0);
    let m = dir.read_manifest().unwrap();
    assert!(
        m.notes.iter().any(|n| n.contains("alone: not measured")),
        "{:?}",
        m.notes
    );
    assert_eq!(dir.all::<Point>(POINTS).unwrap().len(), 5);
    // The report still renders from what is there.
    let files = headroom_bench::study::report(&out).unwrap();
    assert!(files.html.is_file());
}

#[test]
fn isolation_gives_each_load_level_its_own_agent_and_the_os_baselines_one_run() {
    // PerfIso measured each load on its own: a policy's memory (Heracles' 5-minute cooldown) must
    // not carry from one level into the next. With no binary every run fails, and the manifest
    // names each run that was attempted.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let dir = RunDir::create(&out).unwrap();
    store_lc_baseline(&dir);
    let mut opts = Options::defaults(
        Experiment::Isolation,
        true,
        tmp.path().join("no-such-headroom"),
    );
    opts.loads = vec![0.5, 1.0];
    opts.repeats = 1;
    let configs = record::sweep_configs(Experiment::Isolation, &opts, false);
    let with_agent: Vec<&str> = configs
        .iter()
        .filter(|c| c.agent.is_some())
        .map(|c| c.name.as_str())
        .collect();
    assert!(with_agent.contains(&"hybrid"), "{with_agent:?}");
    let mut progress = |_: &str| {};
    let mut s = Session::open(Experiment::Isolation, opts, &out, &mut progress).unwrap();
    s.sweep(&configs).unwrap();
    assert_eq!(s.recorded, 0);
    let notes = dir.read_manifest().unwrap().notes;
    for name in &with_agent {
        for level in ["050", "100"] {
            let run = format!("{name}-{level}: not measured");
            assert!(
                notes.iter().any(|n| n.starts_with(&run)),
                "{run} in {notes:?}"
            );
        }
        assert!(
            !notes.iter().any(|n| n.starts_with(&format!("{name}: "))),
            "{name} ran as one sweep: {notes:?}"
        );
    }
    // Each note quotes its own process's log, not the lines earlier runs appended to it.
    for n in notes.iter().filter(|n| n.contains("not measured")) {
        assert_eq!(n.matches("failed to execute").count(), 1, "{n}");
    }
    for os in configs.iter().filter(|c| c.agent.is_none()) {
        let run = format!("{}: not measured", os.name);
        assert!(
            notes.iter().any(|n| n.starts_with(&run)),
            "{run} in {notes:?}"
        );
    }
}
