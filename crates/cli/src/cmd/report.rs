//! `headroom report DIR`: re-studies and re-renders an experiment directory without re-running it.

use std::path::PathBuf;

/// Flags of `headroom report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A run directory written by `headroom bench`, `headroom demo` or `headroom sim fleet`
    pub dir: PathBuf,
    /// Also load report.html in headless Chromium and check every plot is there
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !args.dir.join("manifest.json").is_file() {
        return Err(super::usage(format!(
            "headroom report: {} is not a run directory (no manifest.json)",
            args.dir.display()
        )));
    }
    let files = if headroom_sim::report::is_fleet_dir(&args.dir) {
        headroom_sim::report::rerender_fleet_report(&args.dir).map_err(|e| {
            if e.is_bad_input() {
                super::usage(format!("headroom report: {e}"))
            } else {
                anyhow::Error::new(e)
            }
        })?
    } else {
        headroom_bench::study::report(&args.dir).map_err(|e| match e {
            // A run directory whose files are not what a run writes: the user's input.
            headroom_bench::BenchError::Input(_)
            | headroom_bench::BenchError::Report(headroom_report::ReportError::Input(_)) => {
                super::usage(format!("headroom report: {e}"))
            }
            other => anyhow::Error::new(other),
        })?
    };
    println!("report:  {}", files.html.display());
    println!("summary: {}", files.summary_json.display());
    println!("         {}", files.summary_md.display());
    println!(
        "data:    {} CSV/JSON files in {}",
        files.data.len(),
        args.dir.join("figures").display()
    );
    if args.check {
        let Some(chromium) = headroom_report::browser::find_chromium() else {
            anyhow::bail!("--check: chromium is not installed (Debian: apt-get install chromium)");
        };
        let dom = headroom_report::browser::dump_dom(&chromium, &files.html)?;
        let check = headroom_report::browser::check_dom(&dom);
        let expected = files
            .data
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .count();
        println!(
            "chromium: page loaded: {}, {} plots (<svg>) in the DOM",
            check.has_title, check.svg_count
        );
        if !check.has_title || check.svg_count == 0 || check.svg_count > expected {
            anyhow::bail!("chromium check failed for {}", files.html.display());
        }
    }
    Ok(())
}
