//! The agent's reaction log (`HEADROOM_REACTION_LOG`) read back: its answered crossings with the
//! tick's phases, its final counters, and the phase table printed from them.

use std::path::Path;

/// Quantiles of a sample, µs.
pub(super) struct Histogram(Vec<f64>);

impl Histogram {
    pub(super) fn new(mut v: Vec<f64>) -> Histogram {
        v.sort_by(f64::total_cmp);
        Histogram(v)
    }
    fn q(&self, q: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        self.0
            .get(((self.0.len() - 1) as f64 * q).round() as usize)
            .copied()
    }
    pub(super) fn line(&self) -> String {
        let f = |q: f64| self.q(q).map_or("-".into(), |v| format!("{v:.0}"));
        format!(
            "n {:>3}  p50 {:>6} µs  p90 {:>6} µs  p99 {:>6} µs  max {:>6} µs",
            self.0.len(),
            f(0.5),
            f(0.9),
            f(0.99),
            f(1.0)
        )
    }
    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "n": self.0.len(), "p50_us": self.q(0.5), "p90_us": self.q(0.9),
            "p99_us": self.q(0.99), "max_us": self.q(1.0)
        })
    }
}

/// One reaction-log line: an answered crossing and the phases of the tick that answered it,
/// CLOCK_MONOTONIC ns (the fields are listed in `headroom_agent::publish::reaction_log`).
#[derive(Debug, Clone, Default)]
pub(super) struct Row {
    pub(super) crossing: u64,
    pub(super) awake: u64,
    /// The last knob write returned (the tick's end in logs without phases).
    pub(super) written: u64,
    phases: Option<Phases>,
}

#[derive(Debug, Clone, Default)]
struct Phases {
    sensed: u64,
    decided: u64,
    recorded: u64,
    reads: u64,
    read_ns: u64,
    tick_done: u64,
    /// (start, end, knob kind) of each write, in the plan's order.
    writes: Vec<(u64, u64, String)>,
}

/// Most writes shown one by one in the phase table.
const WRITES_SHOWN: usize = 3;

/// Per-phase durations of the answered crossings, µs: (label, sample).
fn phase_samples(rows: &[Row]) -> Vec<(String, Vec<f64>)> {
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1000.0;
    let mut out: Vec<(String, Vec<f64>)> = vec![
        ("event read (crossing → awake)".into(), Vec::new()),
        ("sample (awake → observation)".into(), Vec::new()),
        ("decision (policy)".into(), Vec::new()),
        ("decision log".into(), Vec::new()),
        ("plan (excl. read-back)".into(), Vec::new()),
        ("read-back (all reads)".into(), Vec::new()),
    ];
    for i in 0..WRITES_SHOWN {
        out.push((format!("write {} (+ gap before it)", i + 1), Vec::new()));
    }
    let by_kind_from = out.len() + 2;
    out.push(("crossing → last write done".into(), Vec::new()));
    out.push(("after the writes (publish)".into(), Vec::new()));
    for r in rows {
        let Some(p) = &r.phases else { continue };
        let Some(first) = p.writes.first() else {
            continue;
        };
        out[0].1.push(us(r.crossing, r.awake));
        out[1].1.push(us(r.awake, p.sensed));
        out[2].1.push(us(p.sensed, p.decided));
        out[3].1.push(us(p.decided, p.recorded));
        out[4]
            .1
            .push(us(p.recorded, first.0) - p.read_ns as f64 / 1000.0);
        out[5].1.push(p.read_ns as f64 / 1000.0);
        let mut prev = first.0;
        for (i, w) in p.writes.iter().take(WRITES_SHOWN).enumerate() {
            out[6 + i].1.push(us(prev, w.1));
            prev = w.1;
        }
        out[6 + WRITES_SHOWN].1.push(us(r.crossing, r.written));
        out[7 + WRITES_SHOWN].1.push(us(r.written, p.tick_done));
        // Each write alone by its knob: which file the time goes to.
        for (start, end, kind) in &p.writes {
            let label = format!("  {kind} write alone");
            match out[by_kind_from..].iter_mut().find(|(l, _)| *l == label) {
                Some((_, v)) => v.push(us(*start, *end)),
                None => out.push((label, vec![us(*start, *end)])),
            }
        }
    }
    out.retain(|(_, v)| !v.is_empty());
    out
}

/// Prints the per-phase table and returns it as JSON.
pub(super) fn print_phases(rows: &[Row]) -> serde_json::Value {
    let mut json = serde_json::Map::new();
    let samples = phase_samples(rows);
    if samples.is_empty() {
        println!("  {:>9} phases: none logged", "");
        return serde_json::Value::Object(json);
    }
    let reads: Vec<u64> = rows
        .iter()
        .filter_map(|r| r.phases.as_ref().map(|p| p.reads))
        .collect();
    let writes: Vec<usize> = rows
        .iter()
        .filter_map(|r| r.phases.as_ref().map(|p| p.writes.len()))
        .collect();
    println!(
        "  {:>9} phases (knob reads per tick: max {}; writes per tick: max {}):",
        "",
        reads.iter().max().unwrap_or(&0),
        writes.iter().max().unwrap_or(&0)
    );
    for (label, v) in samples {
        let h = Histogram::new(v);
        println!("  {:>9}   {label:<32} {}", "", h.line());
        json.insert(label, h.json());
    }
    serde_json::Value::Object(json)
}

/// The agent's final counters in its reaction log.
#[derive(Debug, Clone, Copy)]
pub(super) struct LogCounters {
    /// Events its program wrote.
    pub events: u64,
    /// Crossings of `low` the hysteresis held back.
    pub suppressed: u64,
    /// Events the ring buffer had no room for.
    pub overruns: u64,
    /// Falls below `low` that were the agent's own wake-up (read, not answered).
    pub own_wakes: u64,
}

/// The reaction log's lines and the final counters.
pub(super) fn read_log(path: &Path) -> (Vec<Row>, Option<LogCounters>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut rows = Vec::new();
    let mut counters = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n: Vec<Option<u64>> = f.iter().map(|v| v.parse::<u64>().ok()).collect();
        let at = |i: usize| n.get(i).copied().flatten();
        match (f.first(), at(1), at(2), at(3)) {
            (Some(&"counters"), Some(events), Some(suppressed), Some(overruns)) => {
                counters = Some(LogCounters {
                    events,
                    suppressed,
                    overruns,
                    own_wakes: at(4).unwrap_or(0),
                })
            }
            (Some(_), Some(crossing), Some(awake), Some(written)) => {
                let phases = (4..10)
                    .map(at)
                    .collect::<Option<Vec<u64>>>()
                    .map(|p| Phases {
                        sensed: p[0],
                        decided: p[1],
                        recorded: p[2],
                        reads: p[3],
                        read_ns: p[4],
                        tick_done: p[5],
                        writes: (10..f.len().saturating_sub(2))
                            .step_by(3)
                            .filter_map(|i| Some((at(i)?, at(i + 1)?, f[i + 2].to_string())))
                            .collect(),
                    });
                rows.push(Row {
                    crossing,
                    awake,
                    written,
                    phases,
                })
            }
            _ => {}
        }
    }
    (rows, counters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_agent::publish::reaction_log::{phase, ReactionLog};

    #[test]
    fn the_agents_reaction_lines_read_back_with_their_phases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reactions.log");
        let mut log = ReactionLog::to_path(&path);
        assert!(log.enabled());
        let mut stamps = phase::Stamps {
            sensed: 1_030,
            decided: 1_040,
            recorded: 1_050,
            reads: 2,
            read_ns: 7,
            n_writes: 2,
            tick_done: 1_300,
            ..phase::Stamps::default()
        };
        stamps.writes[0] = (1_100, 1_150, "cpu_quota");
        stamps.writes[1] = (1_160, 1_250, "cpuset_cpus");
        log.record("events", 1_000, 1_010, &stamps);
        // A tick that wrote nothing: the tick's end stands for the last write.
        log.record("poll", 2_000, 2_020, &phase::Stamps::default());
        log.record_counters(10, 3, 1, 4);
        log.flush();
        drop(log);

        let (rows, counters) = read_log(&path);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let (r, p) = (&rows[0], rows[0].phases.as_ref().expect("phases"));
        assert_eq!((r.crossing, r.awake, r.written), (1_000, 1_010, 1_250));
        assert_eq!((p.sensed, p.decided, p.recorded), (1_030, 1_040, 1_050));
        assert_eq!((p.reads, p.read_ns, p.tick_done), (2, 7, 1_300));
        assert_eq!(
            p.writes,
            vec![
                (1_100, 1_150, "cpu_quota".to_string()),
                (1_160, 1_250, "cpuset_cpus".to_string())
            ]
        );
        assert!(rows[1].phases.as_ref().unwrap().writes.is_empty());
        let c = counters.expect("counters line");
        assert_eq!(
            (c.events, c.suppressed, c.overruns, c.own_wakes),
            (10, 3, 1, 4)
        );

        // The first row's phases in µs: the event read 10 ns, the plan 50 ns less 7 ns of reads.
        let samples = phase_samples(&rows);
        let get = |label: &str| samples.iter().find(|(l, _)| l.starts_with(label)).unwrap();
        assert_eq!(get("event read").1, vec![0.01]);
        assert!((get("plan").1[0] - 0.043).abs() < 1e-9);
        assert_eq!(get("crossing → last write").1, vec![0.25]);
        assert_eq!(get("  cpuset_cpus write alone").1, vec![0.09]);
    }
}
