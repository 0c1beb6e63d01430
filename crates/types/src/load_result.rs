//! `headroom load --json` result (DESIGN.md "Result JSON"): produced by headroom-load.
