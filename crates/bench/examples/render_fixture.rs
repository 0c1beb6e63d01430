//! Renders the colocation and interference fixtures into DIR (to look at the report layout).
fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: render_fixture DIR"));
    headroom_bench::fixture::write_colocation(&dir.join("colocation")).unwrap();
    headroom_bench::study::report(&dir.join("colocation")).unwrap();
    headroom_bench::fixture::write_sweep(
        &dir.join("interference"),
        headroom_bench::experiments::Experiment::Interference,
        &["alone", "llc-0.25", "dram", "spin-os"],
        &[0.1, 0.3, 0.5, 0.7, 0.9],
    )
    .unwrap();
    headroom_bench::study::report(&dir.join("interference")).unwrap();
}
