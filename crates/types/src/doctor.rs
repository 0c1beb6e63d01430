//! `headroom doctor --json` (DESIGN.md): produced by headroom-host.
