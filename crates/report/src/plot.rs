//! Draws a [`Figure`] as an SVG string with plotters' SVG backend (inline in the HTML report).

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::error::{ReportError, Result};
use crate::figure::Figure;

/// The plot's own size; the legend is a column to its right, as wide as its longest label.
pub const WIDTH: u32 = 760;
pub const HEIGHT: u32 = 420;
const LEGEND_ROW: i32 = 20;

/// One colour per policy / configuration, the same in every plot of every report.
pub fn color_of(key: &str) -> RGBColor {
    match key {
        "alone" | "lc-alone" => RGBColor(0x22, 0x22, 0x22),
        "none" => RGBColor(0xd6, 0x27, 0x28),
        "hybrid" => RGBColor(0x2c, 0xa0, 0x2c),
        "blind" => RGBColor(0x1f, 0x77, 0xb4),
        "heracles" => RGBColor(0x94, 0x67, 0xbd),
        "static-cores" => RGBColor(0xff, 0x7f, 0x0e),
        "static-cycles" => RGBColor(0x8c, 0x56, 0x4b),
        "weights" => RGBColor(0xe3, 0x77, 0xc2),
        "slo" => RGBColor(0x00, 0x00, 0x00),
        other => {
            // Any other key: a stable pick from a palette distinct from the policy colours above.
            const PALETTE: [RGBColor; 8] = [
                RGBColor(0x17, 0xbe, 0xcf),
                RGBColor(0xbc, 0xbd, 0x22),
                RGBColor(0x39, 0x3b, 0x79),
                RGBColor(0x63, 0x79, 0x39),
                RGBColor(0x8c, 0x6d, 0x31),
                RGBColor(0x84, 0x3c, 0x39),
                RGBColor(0x7b, 0x41, 0x73),
                RGBColor(0x52, 0x54, 0xa3),
            ];
            let h = other
                .bytes()
                .fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619));
            PALETTE[(h as usize) % PALETTE.len()]
        }
    }
}

/// CSS hex form of [`color_of`], for legends and tables in HTML.
pub fn css_color(key: &str) -> String {
    let c = color_of(key);
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

fn plot_err(fig: &Figure, e: impl std::fmt::Display) -> ReportError {
    ReportError::Plot {
        figure: fig.id.clone(),
        detail: e.to_string(),
    }
}

/// The figure as a standalone `<svg>` element.
pub fn render_svg(fig: &Figure) -> Result<String> {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for s in &fig.series {
        for p in &s.points {
            if p.x.is_finite() && p.y.is_finite() {
                xs.push(p.x);
                ys.push(p.y);
                ys.extend(p.lo.iter().chain(p.hi.iter()).filter(|v| v.is_finite()));
            }
        }
    }
    if let Some(slo) = fig.slo {
        ys.push(slo);
    }
    let (x0, x1) = padded_range(&xs, false);
    let mut svg = String::new();
    {
        let entries = legend_entries(fig);
        let legend_w = legend_width(&entries);
        let canvas =
            SVGBackend::with_string(&mut svg, (WIDTH + legend_w, HEIGHT)).into_drawing_area();
        canvas.fill(&WHITE).map_err(|e| plot_err(fig, e))?;
        // The legend beside the plot, never over its data.
        let (root, legend) = canvas.split_horizontally(WIDTH);
        draw_legend(fig, &legend, &entries)?;
        if fig.log_y {
            let pos: Vec<f64> = ys.iter().copied().filter(|v| *v > 0.0).collect();
            let (y0, y1) = padded_range(&pos, true);
            draw(fig, &root, x0..x1, (y0..y1).log_scale())?;
        } else {
            let (y0, y1) = padded_range(&ys, false);
            // Quantities that cannot be negative start at 0, never below it.
            let nonneg = ys.iter().all(|v| *v >= 0.0);
            let y0 = if nonneg { 0.0 } else { y0.min(0.0) };
            let y1 = if y1 <= y0 { y0 + 1.0 } else { y1 };
            draw(fig, &root, x0..x1, y0..y1)?;
        }
        canvas.present().map_err(|e| plot_err(fig, e))?;
    }
    Ok(svg)
}

/// One legend row: label, colour, dashed.
type LegendEntry = (String, RGBColor, bool);

fn legend_entries(fig: &Figure) -> Vec<LegendEntry> {
    let slo = fig
        .slo
        .map(|slo| (format!("SLO {}", trim_num(slo)), color_of("slo"), true));
    slo.into_iter()
        .chain(
            fig.series
                .iter()
                .map(|s| (s.name.clone(), color_of(&s.color_key), s.dashed)),
        )
        .collect()
}

/// Room for a 13 px label (about 7.5 px a character) after its 26 px line sample.
fn legend_width(entries: &[LegendEntry]) -> u32 {
    let longest = entries.iter().map(|e| e.0.chars().count()).max();
    longest.map_or(0, |n| (40 + n as u32 * 15 / 2).min(320))
}

fn draw_legend<DB: DrawingBackend>(
    fig: &Figure,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[LegendEntry],
) -> Result<()> {
    for (i, (label, color, dashed)) in entries.iter().enumerate() {
        let y = 44 + i as i32 * LEGEND_ROW;
        let style = ShapeStyle::from(color).stroke_width(2);
        let segments: &[(i32, i32)] = if *dashed {
            &[(4, 11), (15, 22), (26, 30)]
        } else {
            &[(4, 30)]
        };
        for &(a, b) in segments {
            area.draw(&PathElement::new(vec![(a, y), (b, y)], style))
                .map_err(|e| plot_err(fig, e))?;
        }
        area.draw(&Text::new(
            label.clone(),
            (36, y - 7),
            ("sans-serif", 13).into_font(),
        ))
        .map_err(|e| plot_err(fig, e))?;
    }
    Ok(())
}

fn padded_range(v: &[f64], log: bool) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.5, hi * 1.5)
    } else if hi - lo < 1e-12 {
        (lo - 1.0, hi + 1.0)
    } else {
        let pad = (hi - lo) * 0.06;
        (lo - pad, hi + pad)
    }
}

fn draw<DB, Y>(
    fig: &Figure,
    root: &DrawingArea<DB, plotters::coord::Shift>,
    x: std::ops::Range<f64>,
    y: Y,
) -> Result<()>
where
    DB: DrawingBackend,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(&fig.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(RangedCoordf64::from(x.clone()), y)
        .map_err(|e| plot_err(fig, e))?;
    chart
        .configure_mesh()
        .x_desc(fig.x_label.as_str())
        .y_desc(fig.y_label.as_str())
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
        .x_label_formatter(&|v| axis_num(*v))
        .y_label_formatter(&|v| axis_num(*v))
        .draw()
        .map_err(|e| plot_err(fig, e))?;

    if let Some(slo) = fig.slo {
        let style = ShapeStyle::from(&color_of("slo")).stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x.start, slo), (x.end, slo)],
                8,
                5,
                style,
            ))
            .map_err(|e| plot_err(fig, e))?;
    }

    for s in &fig.series {
        let color = color_of(&s.color_key);
        let line_style = ShapeStyle::from(&color).stroke_width(2);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.x.is_finite() && p.y.is_finite() && (!fig_log(fig) || p.y > 0.0))
            .map(|p| (p.x, p.y))
            .collect();
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts, 6, 4, line_style))
                .map_err(|e| plot_err(fig, e))?;
        } else {
            chart
                .draw_series(LineSeries::new(pts, line_style))
                .map_err(|e| plot_err(fig, e))?;
        }
        // Spread over repeats as a vertical bar, then the marker: filled when the load generator's
        // self-checks passed, hollow when they failed.
        for p in s
            .points
            .iter()
            .filter(|p| p.x.is_finite() && p.y.is_finite())
        {
            if let (Some(lo), Some(hi)) = (p.lo, p.hi) {
                if lo.is_finite() && hi.is_finite() && (!fig_log(fig) || lo > 0.0) {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(p.x, lo), (p.x, hi)],
                            ShapeStyle::from(&color).stroke_width(1),
                        )))
                        .map_err(|e| plot_err(fig, e))?;
                }
            }
            if fig_log(fig) && p.y <= 0.0 {
                continue;
            }
            let marker = if p.valid {
                Circle::new((p.x, p.y), 3, ShapeStyle::from(&color).filled())
            } else {
                Circle::new((p.x, p.y), 4, ShapeStyle::from(&color).stroke_width(2))
            };
            chart
                .draw_series(std::iter::once(marker))
                .map_err(|e| plot_err(fig, e))?;
        }
    }
    Ok(())
}

fn fig_log(fig: &Figure) -> bool {
    fig.log_y
}

/// Tick labels: no needless decimals, thousands as "k".
fn axis_num(v: f64) -> String {
    let a = v.abs();
    if a >= 10_000.0 {
        format!("{}k", trim_num((v / 1000.0 * 10.0).round() / 10.0))
    } else if a >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A number without a needless fraction ("500", "0.25").
pub fn trim_num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figure::{Series, XY};

    #[test]
    fn the_legend_is_beside_the_plot_not_over_its_data() {
        // Data in the top-left corner, where the legend used to be drawn.
        let series = |name: &str, key: &str| Series {
            name: name.into(),
            color_key: key.into(),
            dashed: false,
            points: (0..10)
                .map(|i| XY::new(i as f64, 100.0 - i as f64))
                .collect(),
        };
        let fig = Figure {
            id: "t".into(),
            title: "t".into(),
            caption: String::new(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_y: false,
            slo: Some(50.0),
            series: vec![
                series("none + spin", "none"),
                series("hybrid + spin", "hybrid"),
            ],
        };
        let svg = render_svg(&fig).unwrap();
        for label in ["SLO 50", "none + spin", "hybrid + spin"] {
            let at = svg.find(&format!(">\n{label}\n</text>")).expect(label);
            let tag = &svg[svg[..at].rfind("<text").unwrap()..at];
            let x: u32 = tag
                .split("x=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .and_then(|s| s.parse().ok())
                .expect(tag);
            assert!(x >= WIDTH, "{label} drawn at x = {x}, inside the plot");
        }
        assert!(svg.contains(&format!(
            "width=\"{}\"",
            WIDTH + legend_width(&legend_entries(&fig))
        )));
    }
}
