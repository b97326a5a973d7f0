//! File access for the parser: reading the main file, resolving an `include` pattern to the
//! files it names, and reading those files.
//!
//! nginx behaviour kept here: a relative pattern is relative to the conf prefix (the main
//! file's directory), not to the including file; a pattern with `*`, `?` or `[` is a glob
//! whose matches are read in sorted order and that may match nothing (an invalid pattern
//! also matches nothing, as with glob(3)); a plain path that cannot be opened is an error.
//! Additions: directories matched by a glob are skipped (nginx reads them as empty), and
//! only regular files are read, with a size cap, so that a glob reaching `/dev` or `/proc`
//! cannot block or exhaust memory.

use crate::{ConfError, Loc};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest config file read; real ones are kilobytes.
pub const MAX_FILE_SIZE: u64 = 16 << 20;

/// nginx's `open() "PATH" failed (REASON)` message, without Rust's "(os error N)" suffix.
fn open_failed(path: &Path, e: &io::Error) -> String {
    format!("open() \"{}\" failed ({})", path.display(), strip_os(e))
}

/// Read at most MAX_FILE_SIZE bytes; more is an error rather than a truncated config.
fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let file = File::open(path).map_err(|e| open_failed(path, &e))?;
    let mut buf = Vec::new();
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("read() \"{}\" failed ({})", path.display(), strip_os(&e)))?;
    if buf.len() as u64 > MAX_FILE_SIZE {
        return Err(format!(
            "\"{}\" is too large (more than {MAX_FILE_SIZE} bytes)",
            path.display()
        ));
    }
    Ok(buf)
}

/// An io::Error's text without Rust's " (os error N)" suffix, as strerror() gives it.
fn strip_os(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// The main config file; its errors have no location, like nginx's.
pub(crate) fn read_main(path: &Path) -> Result<Vec<u8>, ConfError> {
    read_capped(path).map_err(ConfError::bare)
}

/// An included file; errors point at the `include` directive.
pub(crate) fn read_included(path: &Path, at: &Loc) -> Result<Vec<u8>, ConfError> {
    // Checked before opening: opening a FIFO would block.
    let meta = std::fs::metadata(path).map_err(|e| ConfError::at(at, open_failed(path, &e)))?;
    if !meta.is_file() {
        return Err(ConfError::at(
            at,
            format_args!("\"{}\" is not a regular file", path.display()),
        ));
    }
    read_capped(path).map_err(|m| ConfError::at(at, m))
}

/// The files an include pattern names, in the order to parse them.
pub(crate) fn resolve(base: &Path, pattern: &str) -> Vec<PathBuf> {
    if !pattern.contains(['*', '?', '[']) {
        return vec![base.join(pattern)];
    }
    // The base is literal text even if it contains glob characters.
    let escaped = glob::Pattern::escape(&base.to_string_lossy());
    let full = Path::new(&escaped).join(pattern);
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        // glob(3) does not let `*` match a leading dot; editors' swap files stay out.
        require_literal_leading_dot: true,
    };
    let Ok(paths) = glob::glob_with(&full.to_string_lossy(), opts) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = paths
        .filter_map(Result::ok)
        .filter(|p| !p.is_dir())
        .collect();
    files.sort();
    files
}
