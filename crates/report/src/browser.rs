//! Headless Chromium checks of a rendered report: does the page load, and how many plots does the
//! browser see. Used by the tests and by `headroom report --check`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{ReportError, Result};

/// The first Chromium binary on PATH (`chromium`, then `chromium-browser`, `google-chrome`).
pub fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn base_args(profile: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(std::iter::once(format!(
        "--user-data-dir={}",
        profile.display()
    )))
    .collect()
}

/// Runs chromium with `extra` args on `html`, with a time limit; returns stdout.
fn run_chromium(chromium: &Path, html: &Path, extra: &[String], limit: Duration) -> Result<String> {
    // One profile per run: chromium refuses a profile another instance holds (tests render
    // in parallel threads of one process, so the pid alone does not separate them).
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let profile = std::env::temp_dir().join(format!(
        "headroom-chromium-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let html = std::fs::canonicalize(html).map_err(|e| ReportError::io("resolving", html, e))?;
    let mut cmd = Command::new(chromium);
    cmd.args(base_args(&profile))
        .args(extra)
        .arg(format!("file://{}", html.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let command = format!("{} ... {}", chromium.display(), html.display());
    let mut child = cmd.spawn().map_err(|source| ReportError::Spawn {
        command: command.clone(),
        source,
    })?;
    // Read stdout on a thread so a large DOM cannot fill the pipe and stall the browser.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|source| ReportError::Spawn {
            command: command.clone(),
            source,
        })? {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&profile);
            return Err(ReportError::Command {
                command,
                status: format!("killed after {limit:?}"),
                stderr: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&profile);
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        return Err(ReportError::Command {
            command,
            status: status.to_string(),
            stderr: err.chars().take(2000).collect(),
        });
    }
    Ok(out)
}

/// The DOM Chromium built from `html` (`--dump-dom`).
pub fn dump_dom(chromium: &Path, html: &Path) -> Result<String> {
    run_chromium(
        chromium,
        html,
        &["--dump-dom".to_string()],
        Duration::from_secs(60),
    )
}

/// Writes a PNG screenshot of the page (full width, `height` pixels tall).
pub fn screenshot(chromium: &Path, html: &Path, png: &Path, height: u32) -> Result<()> {
    let png_abs = if png.is_absolute() {
        png.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| ReportError::io("reading the current dir", ".", e))?
            .join(png)
    };
    run_chromium(
        chromium,
        html,
        &[
            format!("--screenshot={}", png_abs.display()),
            format!("--window-size=1200,{height}"),
            "--hide-scrollbars".to_string(),
        ],
        Duration::from_secs(60),
    )?;
    if png_abs.is_file() {
        Ok(())
    } else {
        Err(ReportError::Unavailable(format!(
            "chromium exited without writing {}",
            png_abs.display()
        )))
    }
}

/// What the browser saw of a report.
#[derive(Debug, Clone, PartialEq)]
pub struct DomCheck {
    pub svg_count: usize,
    pub figure_count: usize,
    pub has_title: bool,
}

/// Counts plots in a dumped DOM.
pub fn check_dom(dom: &str) -> DomCheck {
    DomCheck {
        svg_count: dom.matches("<svg").count(),
        figure_count: dom.matches("<figure").count(),
        has_title: dom.contains("<h1>headroom bench"),
    }
}
