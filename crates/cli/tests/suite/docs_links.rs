//! Docs that cannot rot silently: every relative link and every `path/file.rs` named in
//! README.md and docs/ exists, and the README's command list is the binary's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every page under docs/, with their text.
fn pages() -> Vec<(PathBuf, String)> {
    let root = repo();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The targets of markdown links, `[text](target)`.
fn link_targets(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find([')', ' ', '\n']).unwrap_or(rest.len());
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

/// Code spans naming a Rust file by a path (`crates/agent/src/runtime/mod.rs`, `sensors/probe.rs`).
fn rust_paths(text: &str) -> Vec<String> {
    // Fences would shift the parity of single backticks: read them as line breaks.
    text.replace("```", "\n")
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".rs") && s.contains('/'))
        .filter(|s| !s.contains(['<', '*', '{', ' ', '\n']))
        .map(str::to_string)
        .collect()
}

/// Every tracked file below the repository root (a path named by its tail is found here).
fn tracked_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if name == "target" || name == ".git" || name == "node_modules" {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.display().to_string());
            }
        }
    }
    out
}

#[test]
fn every_relative_link_and_named_rust_file_exists() {
    let root = repo();
    let files = tracked_files(&root);
    let mut broken = Vec::new();
    for (page, text) in pages() {
        let dir = page.parent().expect("a page has a folder");
        let shown = page
            .strip_prefix(&root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let path = target.split('#').next().unwrap_or("");
            if !path.is_empty() && !dir.join(path).exists() {
                broken.push(format!("{shown}: link ({target})"));
            }
        }
        for path in rust_paths(&text) {
            let found = root.join(&path).exists()
                || dir.join(&path).exists()
                || files.iter().any(|f| f.ends_with(&format!("/{path}")));
            if !found {
                broken.push(format!("{shown}: `{path}` names no file"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken reference(s) in README.md and docs/:\n  {}",
        broken.len(),
        broken.join("\n  ")
    );
}

/// The README's "The commands" block names each of the binary's subcommands once, and no other.
#[test]
fn the_readme_lists_the_binarys_commands() {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .arg("--help")
        .output()
        .expect("running headroom --help");
    let help = String::from_utf8_lossy(&out.stdout);
    // clap's "Commands:" section: one indented `name  description` line each.
    let mut binary: Vec<String> = help
        .split("Commands:")
        .nth(1)
        .expect("headroom --help has a Commands: section")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    binary.sort();
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let block = readme
        .split("## The commands")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("README.md has a `## The commands` section with a code block");
    let mut listed: Vec<String> = block
        .lines()
        .filter_map(|l| l.strip_prefix("headroom "))
        .flat_map(|l| {
            let names = l.split("  ").next().unwrap_or("");
            names
                .split('|')
                .map(|n| n.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|n| !n.is_empty())
        .collect();
    listed.sort();
    assert_eq!(
        listed, binary,
        "README.md's command list differs from `headroom --help`"
    );
}

#[test]
fn the_link_finder_finds_links_and_paths() {
    let text = "see [a](docs/a.md#x) and [b](https://x) in `crates/x/src/y.rs`, `not a path.rs`";
    assert_eq!(link_targets(text), vec!["docs/a.md#x", "https://x"]);
    assert_eq!(rust_paths(text), vec!["crates/x/src/y.rs"]);
}
