//! Directories the agent makes for its own files, noted so that a start that fails removes
//! them again (ninth hostile pass: a refused start left the directories its state lock made).

use std::path::{Path, PathBuf};

/// Makes `dir` and every missing directory above it (0755 less the umask: no one else may
/// write where the agent's sockets live) and returns the ones made, outermost first.
pub(crate) fn make_dirs(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::DirBuilderExt;
    let missing: Vec<PathBuf> = dir
        .ancestors()
        .filter(|d| !d.as_os_str().is_empty())
        .take_while(|d| std::fs::symlink_metadata(d).is_err())
        // (`nope/..` is made by making `nope`; it is never removed as such)
        .filter(|d| d.file_name().is_some())
        .map(Path::to_path_buf)
        .collect();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    Ok(missing.into_iter().rev().collect())
}

/// Removes directories [`make_dirs`] made, innermost first, each only while empty (one that
/// holds anything, a state file kept for the next start included, stays).
pub(crate) fn remove_dirs(made: &[PathBuf]) {
    for d in made.iter().rev() {
        let _ = std::fs::remove_dir(d);
    }
}
