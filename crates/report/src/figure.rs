//! The study's output: figures (line charts) and tables, independent of how they are drawn.

use serde::{Deserialize, Serialize};

/// One point of a series: the median `y` with its spread (`lo`..`hi`) over repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XY {
    pub x: f64,
    pub y: f64,
    pub lo: Option<f64>,
    pub hi: Option<f64>,
    /// False when a repeat's load-generator self-checks failed: drawn hollow, flagged in the CSV.
    pub valid: bool,
}

impl XY {
    pub fn new(x: f64, y: f64) -> XY {
        XY {
            x,
            y,
            lo: None,
            hi: None,
            valid: true,
        }
    }
}

/// A named line; `color_key` picks the colour (the policy name) so a policy keeps its colour in
/// every plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    pub color_key: String,
    pub dashed: bool,
    pub points: Vec<XY>,
}

/// A line chart with labelled axes (units in the labels) and an optional SLO line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// File-name safe id: `<id>.csv`, `<id>.json`.
    pub id: String,
    pub title: String,
    pub caption: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    /// Horizontal line at the SLO (in y units), labelled.
    pub slo: Option<f64>,
    pub series: Vec<Series>,
}

/// How a table cell is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shade {
    None,
    /// Heracles Fig. 1: ≤ 100% of the SLO.
    Ok,
    /// 100–120% of the SLO.
    Warn,
    /// > 120% of the SLO.
    Bad,
    /// `n` of `of` windows violated the SLO (n > 0): a red that deepens with the share, so
    /// 1 of 9 reads paler than 9 of 9.
    Violated {
        n: u64,
        of: u64,
    },
}

impl Shade {
    /// SLO-violating windows, `n` of `of`: [`Shade::Ok`] when none.
    pub fn of_violations(n: u64, of: u64) -> Shade {
        if n == 0 {
            Shade::Ok
        } else {
            Shade::Violated { n, of }
        }
    }

    /// The Heracles Fig. 1 colouring of a latency given as percent of the SLO.
    pub fn of_slo_pct(pct: f64) -> Shade {
        if !pct.is_finite() {
            Shade::Bad
        } else if pct <= 100.0 {
            Shade::Ok
        } else if pct <= 120.0 {
            Shade::Warn
        } else {
            Shade::Bad
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub text: String,
    pub value: Option<f64>,
    pub shade: Shade,
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell {
            text: s.into(),
            value: None,
            shade: Shade::None,
        }
    }

    pub fn num(v: Option<f64>, decimals: usize) -> Cell {
        Cell {
            text: v.map_or("–".to_string(), |v| format!("{v:.decimals$}")),
            value: v,
            shade: Shade::None,
        }
    }

    pub fn shaded(mut self, shade: Shade) -> Cell {
        self.shade = shade;
        self
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub id: String,
    pub title: String,
    pub caption: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

/// Everything the format step renders for one run directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Study {
    pub summary: headroom_types::summary::Summary,
    pub figures: Vec<Figure>,
    pub tables: Vec<Table>,
    /// Findings in words, measured (e.g. "hybrid: 0 of 40 windows violated").
    pub findings: Vec<String>,
    /// The exact subprocess commands the raw results were recorded with (deduplicated).
    #[serde(default)]
    pub commands: Vec<String>,
}
