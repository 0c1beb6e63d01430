//! What `sim fleet --services F` writes: a text table (violating windows per service, EMU), and
//! in the output directory `services.csv` (one row per policy × server × service) and
//! `multi.json` (every server's totals).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::SimError;
use crate::multi::{MultiFleet, ServiceSpec};

/// The per-policy table: violating windows of each service, windows, EMU, BE.
pub fn text_table(services: &[ServiceSpec], fleets: &[MultiFleet]) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:<10}", "policy");
    for svc in services {
        let _ = write!(s, " {:>14}", format!("{} viol.", svc.name));
    }
    let _ = writeln!(s, " {:>8} {:>8} {:>8}", "windows", "EMU", "BE norm");
    for f in fleets {
        let _ = write!(s, "{:<10}", f.policy);
        for v in f.violations() {
            let _ = write!(s, " {v:>14}");
        }
        let per_server = f.windows() / f.servers.len().max(1) as u64;
        let _ = writeln!(
            s,
            " {:>8} {:>7.1}% {:>8.3}",
            per_server,
            100.0 * f.emu_mean(),
            f.be_norm_mean()
        );
    }
    s
}

/// Writes `services.csv` and `multi.json` into `dir`; returns their paths.
pub fn write_multi_report(
    dir: &Path,
    services: &[ServiceSpec],
    fleets: &[MultiFleet],
    invocation: &str,
) -> Result<Vec<PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::io(dir, e))?;
    let mut csv = String::from(
        "policy,server,cores,service,windows,violating_windows,p99_max_us,load_mean,emu_mean,be_norm_mean\n",
    );
    for f in fleets {
        for o in &f.servers {
            for s in &o.services {
                let _ = writeln!(
                    csv,
                    "{},{},{},{},{},{},{:.1},{:.4},{:.4},{:.4}",
                    f.policy,
                    o.server,
                    o.cores,
                    s.name,
                    s.windows,
                    s.violations,
                    s.p99_max_us,
                    s.load_mean,
                    o.emu_mean,
                    o.be_norm_mean
                );
            }
        }
    }
    let csv_path = dir.join("services.csv");
    std::fs::write(&csv_path, csv).map_err(|e| SimError::io(&csv_path, e))?;
    let json = serde_json::json!({
        "invocation": invocation,
        "services": services,
        "policies": fleets.iter().map(|f| serde_json::json!({
            "policy": f.policy,
            "violating_windows": services.iter().zip(f.violations())
                .map(|(s, v)| (s.name.clone(), v)).collect::<std::collections::BTreeMap<_, _>>(),
            "windows": f.windows(),
            "emu_mean": f.emu_mean(),
            "be_norm_mean": f.be_norm_mean(),
            "servers": f.servers,
        })).collect::<Vec<_>>(),
    });
    let json_path = dir.join("multi.json");
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    std::fs::write(&json_path, text).map_err(|e| SimError::io(&json_path, e))?;
    Ok(vec![csv_path, json_path])
}
