//! The format step: writes `summary.json`, `summary.md`, `report.html` (self-contained, inline SVG)
//! and `figures/<id>.csv` + `figures/<id>.json` for every figure and table of a [`Study`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{ReportError, Result};
use crate::figure::{Figure, Shade, Study, Table};
use crate::model::Manifest;
use crate::plot;
use crate::store::{write_atomic, write_json_atomic};

/// The files [`write_report`] produced.
#[derive(Debug, Clone)]
pub struct ReportFiles {
    pub html: PathBuf,
    pub summary_json: PathBuf,
    pub summary_md: PathBuf,
    /// CSV and JSON of every figure and table.
    pub data: Vec<PathBuf>,
}

/// Renders everything for one run directory.
pub fn write_report(dir: &Path, manifest: &Manifest, study: &Study) -> Result<ReportFiles> {
    let summary_json = dir.join("summary.json");
    write_json_atomic(&summary_json, &study.summary)?;

    let fig_dir = dir.join("figures");
    std::fs::create_dir_all(&fig_dir).map_err(|e| ReportError::io("creating", &fig_dir, e))?;
    let mut data = Vec::new();
    for fig in &study.figures {
        let csv = fig_dir.join(format!("{}.csv", fig.id));
        write_atomic(&csv, figure_csv(fig).as_bytes())?;
        let json = fig_dir.join(format!("{}.json", fig.id));
        write_json_atomic(&json, fig)?;
        data.push(csv);
        data.push(json);
    }
    for table in &study.tables {
        let csv = fig_dir.join(format!("{}.csv", table.id));
        write_atomic(&csv, table_csv(table).as_bytes())?;
        let json = fig_dir.join(format!("{}.json", table.id));
        write_json_atomic(&json, table)?;
        data.push(csv);
        data.push(json);
    }

    let summary_md = dir.join("summary.md");
    write_atomic(&summary_md, summary_markdown(manifest, study).as_bytes())?;
    let html = dir.join("report.html");
    write_atomic(&html, report_html(manifest, study)?.as_bytes())?;
    Ok(ReportFiles {
        html,
        summary_json,
        summary_md,
        data,
    })
}

/// A CSV document from rows of fields (quoted where a field needs it, by the csv crate).
pub fn csv_document<R, F>(rows: R) -> String
where
    R: IntoIterator<Item = Vec<F>>,
    F: AsRef<[u8]>,
{
    let mut w = csv::WriterBuilder::new()
        .flexible(true)
        .from_writer(Vec::new());
    for row in rows {
        // Writing into memory cannot fail.
        w.write_record(row).expect("CSV into memory");
    }
    String::from_utf8(w.into_inner().expect("CSV into memory")).expect("CSV of UTF-8 fields")
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v}"))
}

/// One row per point: series, x, y (median), lo, hi (spread over repeats), valid.
pub fn figure_csv(fig: &Figure) -> String {
    let header = vec![
        "series".to_string(),
        fig.x_label.clone(),
        fig.y_label.clone(),
        "lo".into(),
        "hi".into(),
        "valid".into(),
    ];
    let rows = fig.series.iter().flat_map(|s| {
        s.points.iter().map(move |p| {
            vec![
                s.name.clone(),
                p.x.to_string(),
                p.y.to_string(),
                opt(p.lo),
                opt(p.hi),
                p.valid.to_string(),
            ]
        })
    });
    csv_document(std::iter::once(header).chain(rows))
}

pub fn table_csv(t: &Table) -> String {
    let rows = t
        .rows
        .iter()
        .map(|row| row.iter().map(|c| c.text.clone()).collect::<Vec<_>>());
    csv_document(std::iter::once(t.columns.clone()).chain(rows))
}

fn num_or_dash(v: Option<f64>, decimals: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.decimals$}"))
}

/// `summary.md`: the SLO, the per-run summary table, the findings and the figure files.
pub fn summary_markdown(m: &Manifest, study: &Study) -> String {
    let s = &study.summary;
    let mut out = String::new();
    let _ = writeln!(out, "# headroom bench {}\n", s.experiment);
    let _ = writeln!(
        out,
        "Machine: {} CPUs, {}, kernel {}. SLO: p{} ≤ {} µs ({}).{}\n",
        m.machine.cpus,
        m.machine.cpu_model,
        m.machine.kernel,
        plot::trim_num(s.percentile),
        plot::trim_num(s.slo_us),
        m.slo_source,
        m.peak_qps
            .map(|p| format!(" Peak LC load: {p:.0} QPS ({}).", m.peak_source))
            .unwrap_or_default()
    );
    out.push_str("| policy | BE | SLO-violating windows | EMU mean | EMU min | worst LC tail (µs) | BE throughput (norm.) |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for r in &s.runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} / {} | {} | {} | {} | {} |",
            r.policy,
            r.be,
            r.slo_violations,
            r.windows,
            num_or_dash(r.emu_mean, 2),
            num_or_dash(r.emu_min, 2),
            num_or_dash(r.lc_p99_us_max, 0),
            num_or_dash(r.be_throughput_norm, 2)
        );
    }
    if !study.findings.is_empty() {
        out.push_str("\n## Findings\n\n");
        for f in &study.findings {
            let _ = writeln!(out, "- {f}");
        }
    }
    for t in &study.tables {
        let _ = writeln!(out, "\n## {}\n", t.title);
        let _ = writeln!(out, "| {} |", t.columns.join(" | "));
        let _ = writeln!(out, "|{}", " --- |".repeat(t.columns.len()));
        for row in &t.rows {
            let cells: Vec<&str> = row.iter().map(|c| c.text.as_str()).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
    }
    out.push_str("\n## Figures\n\n");
    for f in &study.figures {
        let _ = writeln!(
            out,
            "- {}: `figures/{}.csv`, `figures/{}.json`",
            f.title, f.id, f.id
        );
    }
    if !m.notes.is_empty() {
        out.push_str("\n## Notes\n\n");
        for n in &m.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn shade_class(s: Shade) -> String {
    match s {
        Shade::None => String::new(),
        Shade::Ok => " class=\"ok\"".into(),
        Shade::Warn => " class=\"warn\"".into(),
        Shade::Bad => " class=\"bad\"".into(),
        Shade::Violated { n, of } => violation_style(n, of),
    }
}

/// A red from pale (a small share of windows violated) to deep (every window), white text on
/// the deep half.
pub fn violation_style(n: u64, of: u64) -> String {
    let share = if of == 0 {
        1.0
    } else {
        (n as f64 / of as f64).clamp(0.0, 1.0)
    };
    // From #fcd5c8 at a sliver to #a50f15 at all windows.
    let mix = |pale: f64, deep: f64| (pale + (deep - pale) * share).round() as u8;
    let (r, g, b) = (mix(252.0, 165.0), mix(213.0, 15.0), mix(200.0, 21.0));
    let text = if share > 0.45 { "#fff" } else { "#222" };
    format!(" style=\"background:#{r:02x}{g:02x}{b:02x};color:{text}\"")
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}\
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}\
td.ok{background:#c7e9c0}td.warn{background:#fee391}td.bad{background:#fb6a4a;color:#fff}\
figure{margin:1.2em 0}figcaption{font-size:.9em;color:#555;max-width:760px}\
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em;white-space:pre-wrap}\
.swatch{display:inline-block;width:.9em;height:.9em;border-radius:2px;margin-right:.35em;vertical-align:-.1em}\
.notes li{background:#fff4ce;padding:.2em .4em}.lead{font-size:1.05em;color:#444}.findings li{margin:.25em 0}";

/// The self-contained report: everything inline, no scripts, no external resources.
pub fn report_html(m: &Manifest, study: &Study) -> Result<String> {
    let s = &study.summary;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>headroom bench {}</title><style>{CSS}</style></head><body>\n",
        escape(&s.experiment)
    );
    let _ = writeln!(h, "<h1>headroom bench {}</h1>", escape(&s.experiment));
    let _ = writeln!(
        h,
        "<p class=\"lead\">SLO: p{} ≤ <b>{} µs</b> ({}).{}</p>",
        plot::trim_num(s.percentile),
        plot::trim_num(s.slo_us),
        escape(&m.slo_source),
        m.peak_qps
            .map(|p| format!(
                " Peak LC load: <b>{p:.0} QPS</b> ({}).",
                escape(&m.peak_source)
            ))
            .unwrap_or_default()
    );

    h.push_str("<h2>Summary</h2>\n<table><tr><th>policy</th><th>BE</th><th>SLO-violating windows</th><th>EMU mean</th><th>EMU min</th><th>worst LC tail (µs)</th><th>BE throughput (norm.)</th></tr>\n");
    for r in &s.runs {
        let viol_class = shade_class(Shade::of_violations(r.slo_violations, r.windows));
        let _ = writeln!(
            h,
            "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td><td>{}</td><td{viol_class}>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            plot::css_color(&r.policy),
            escape(&r.policy),
            escape(&r.be),
            r.slo_violations,
            r.windows,
            num_or_dash(r.emu_mean, 2),
            num_or_dash(r.emu_min, 2),
            num_or_dash(r.lc_p99_us_max, 0),
            num_or_dash(r.be_throughput_norm, 2)
        );
    }
    h.push_str("</table>\n");
    if !study.findings.is_empty() {
        h.push_str("<ul class=\"findings\">");
        for f in &study.findings {
            let _ = write!(h, "<li>{}</li>", escape(f));
        }
        h.push_str("</ul>\n");
    }

    if !m.notes.is_empty() {
        h.push_str("<h2>Notes</h2><ul class=\"notes\">");
        for n in &m.notes {
            let _ = write!(h, "<li>{}</li>", escape(n));
        }
        h.push_str("</ul>\n");
    }
    // Short tables (the heat map, the per-policy table) read before the plots; long ones after.
    html_tables(&mut h, study.tables.iter().filter(|t| t.rows.len() <= 16));
    if !study.figures.is_empty() {
        h.push_str("<h2>Figures</h2>\n");
    }
    for f in &study.figures {
        let svg = plot::render_svg(f)?;
        let _ = writeln!(
            h,
            "<figure id=\"{}\">{}<figcaption>{} Hollow markers: the load generator's self-checks failed for at least one repeat; bars: min–max over repeats. Data: <code>figures/{}.csv</code>, <code>figures/{}.json</code></figcaption></figure>",
            escape(&f.id),
            strip_xml_decl(&svg),
            escape(&f.caption),
            escape(&f.id),
            escape(&f.id)
        );
    }

    html_tables(&mut h, study.tables.iter().filter(|t| t.rows.len() > 16));

    h.push_str("<h2>Machine</h2>\n<table>");
    let mm = &m.machine;
    for (k, v) in [
        ("CPU", mm.cpu_model.clone()),
        ("CPUs", mm.cpus.to_string()),
        ("kernel", mm.kernel.clone()),
        ("host", mm.hostname.clone()),
        ("load generator CPUs", cpu_list(&mm.loadgen_cpus)),
        ("LC + BE CPUs", cpu_list(&mm.server_cpus)),
        (
            "BE CPUs (antagonists the bench starts)",
            if mm.be_cpus.is_empty() {
                cpu_list(&mm.server_cpus)
            } else {
                cpu_list(&mm.be_cpus)
            },
        ),
    ] {
        let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", k, escape(&v));
    }
    h.push_str("</table>\n");
    if let Some(doc) = &mm.doctor {
        let _ = writeln!(
            h,
            "<details><summary><code>headroom doctor --json</code></summary><pre>{}</pre></details>",
            escape(&serde_json::to_string_pretty(doc).unwrap_or_default())
        );
    } else {
        h.push_str("<p><code>headroom doctor --json</code> was not available when this ran.</p>\n");
    }

    h.push_str("<h2>Parameters</h2>\n<table>");
    for (k, v) in &m.params {
        let _ = write!(
            h,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(k),
            escape(&v.to_string())
        );
    }
    h.push_str("</table>\n");
    h.push_str("<h2>Commands</h2>\n<p>How this directory was made (re-render with <code>headroom report DIR</code>):</p><pre>");
    for inv in &m.invocations {
        let _ = writeln!(h, "{}", escape(inv));
    }
    h.push_str("</pre>\n");
    if !study.commands.is_empty() {
        h.push_str("<p>The subprocesses it ran (setup of each configuration and one load run each; the LC and BE were pinned with <code>taskset</code> as shown):</p><pre>");
        for c in &study.commands {
            let _ = writeln!(h, "{}", escape(c));
        }
        h.push_str("</pre>\n");
    }
    h.push_str("<p>Every subprocess each point ran is listed in its raw result file (<code>points/</code>, <code>runs/</code>, <code>baselines/</code>, field <code>commands</code>).</p>\n");
    h.push_str("</body></html>\n");
    Ok(h)
}

fn html_tables<'a>(h: &mut String, tables: impl Iterator<Item = &'a Table>) {
    for t in tables {
        let _ = writeln!(*h, "<h2 id=\"{}\">{}</h2>", escape(&t.id), escape(&t.title));
        h.push_str("<table><tr>");
        for c in &t.columns {
            let _ = write!(*h, "<th>{}</th>", escape(c));
        }
        h.push_str("</tr>\n");
        for row in &t.rows {
            h.push_str("<tr>");
            for c in row {
                let _ = write!(*h, "<td{}>{}</td>", shade_class(c.shade), escape(&c.text));
            }
            h.push_str("</tr>\n");
        }
        let _ = writeln!(
            *h,
            "</table><p><small>{} Data: <code>figures/{}.csv</code>, <code>figures/{}.json</code></small></p>",
            escape(&t.caption),
            escape(&t.id),
            escape(&t.id)
        );
    }
}

fn strip_xml_decl(svg: &str) -> &str {
    match svg.find("<svg") {
        Some(i) => &svg[i..],
        None => svg,
    }
}

pub fn cpu_list(cpus: &[usize]) -> String {
    if cpus.is_empty() {
        return "–".into();
    }
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_with_commas_quotes_and_newlines_are_quoted() {
        let doc = csv_document([
            vec!["name", "note"],
            vec!["a,b", "say \"hi\""],
            vec!["plain", "two\nlines"],
        ]);
        assert_eq!(
            doc,
            "name,note\n\"a,b\",\"say \"\"hi\"\"\"\nplain,\"two\nlines\"\n"
        );
    }

    fn background(n: u64, of: u64) -> u32 {
        let style = shade_class(Shade::of_violations(n, of));
        let hex = style.split("background:#").nth(1).expect(&style);
        u32::from_str_radix(&hex[..6], 16).unwrap()
    }

    #[test]
    fn violating_windows_deepen_with_their_share() {
        assert_eq!(shade_class(Shade::of_violations(0, 9)), " class=\"ok\"");
        // The green channel falls as the red deepens: 1 of 9 is paler than 5 of 9, than 9 of 9.
        let green = |c: u32| (c >> 8) & 0xff;
        let (one, five, all) = (background(1, 9), background(5, 9), background(9, 9));
        assert!(
            green(one) > green(five) && green(five) > green(all),
            "{one:06x} {five:06x} {all:06x}"
        );
        assert_eq!(all, 0xa50f15);
        assert!(shade_class(Shade::of_violations(9, 9)).contains("color:#fff"));
        assert!(shade_class(Shade::of_violations(1, 9)).contains("color:#222"));
    }
}
