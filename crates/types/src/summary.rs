//! `summary.json` of an experiment run directory (DESIGN.md): produced by headroom-bench.
