//! Temporary files for request bodies, made so that nothing is left behind: opened with
//! `O_TMPFILE` (a file with no name at all), or, where the filesystem cannot do that,
//! created under a fresh name (nginx's ten digits, in its level folders) and unlinked at
//! once. Files that are to keep their name (a DAV `PUT`'s body, `client_body_in_file_only`)
//! are made the same way and left in place for the caller. The folder is made on first use
//! if it is missing. Failures come back with nginx's wording for the error log (`open()
//! "..." failed (13: Permission denied)`).

use crate::modules::client_body::TempPath;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An open temporary file and the name the log gives it: the folder for a nameless file,
/// else the name it had.
pub struct TempFile {
    pub file: File,
    pub name: PathBuf,
}

/// A new, empty, already unlinked file in `tp`, or the log line saying why not.
pub fn create(tp: &TempPath) -> Result<TempFile, String> {
    match nameless(&tp.dir) {
        Ok(file) => {
            return Ok(TempFile {
                file,
                name: tp.dir.clone(),
            })
        }
        // The folder is missing: made (as nginx makes its temp paths), then tried again.
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if let Err(e) = make_dirs(&tp.dir) {
                return Err(crate::errlog::failed("mkdir()", &tp.dir, &e));
            }
            match nameless(&tp.dir) {
                Ok(file) => {
                    return Ok(TempFile {
                        file,
                        name: tp.dir.clone(),
                    })
                }
                Err(e) if !unsupported(&e) => {
                    return Err(crate::errlog::failed("open()", &tp.dir, &e))
                }
                Err(_) => {}
            }
        }
        Err(e) if !unsupported(&e) => return Err(crate::errlog::failed("open()", &tp.dir, &e)),
        Err(_) => {}
    }
    create_unlinked_named(tp)
}

fn nameless(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

/// `O_TMPFILE` is refused by filesystems (and kernels) without it, in these ways.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
    )
}

fn make_dirs(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The fallback: a fresh name, created exclusively, then unlinked (also what a config that
/// reads `$request_body_file` gets: the file then has a name to give, as in nginx).
pub fn create_unlinked_named(tp: &TempPath) -> Result<TempFile, String> {
    let t = create_named(tp)?;
    std::fs::remove_file(&t.name).map_err(|e| crate::errlog::failed("unlink()", &t.name, &e))?;
    Ok(t)
}

/// A new, empty file in `tp` under a fresh name (nginx's ten digits, in its level
/// folders), left in place: for a body that is to be renamed into place (a DAV `PUT`).
/// The caller unlinks it if it is not.
pub fn create_named(tp: &TempPath) -> Result<TempFile, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Other workers and processes use the same folder: a taken name is skipped.
    for _ in 0..64 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) + u64::from(std::process::id()) * 100_000;
        let path = hashed_name(tp, n % 10_000_000_000);
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(p)
        };
        let file = match open(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let parent = path.parent().unwrap_or(&tp.dir);
                make_dirs(parent).map_err(|e| crate::errlog::failed("mkdir()", parent, &e))?;
                open(&path)
            }
            r => r,
        };
        match file {
            Ok(file) => return Ok(TempFile { file, name: path }),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(crate::errlog::failed("open()", &path, &e)),
        }
    }
    Err(format!(
        "no free temporary file name in \"{}\"",
        tp.dir.display()
    ))
}

/// nginx's layout: a ten-digit name, in folders named for its last digits (level 1 the
/// last ones, level 2 those before them...).
fn hashed_name(tp: &TempPath, n: u64) -> PathBuf {
    let name = format!("{n:010}");
    let mut path = tp.dir.clone();
    let mut end = name.len();
    for &l in &tp.levels {
        let start = end.saturating_sub(usize::from(l));
        path.push(&name[start..end]);
        end = start;
    }
    path.push(&name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_hashed_into_levels_as_nginx() {
        let tp = TempPath {
            dir: PathBuf::from("/t"),
            levels: vec![1, 2],
        };
        assert_eq!(
            hashed_name(&tp, 1234567),
            PathBuf::from("/t/7/56/0001234567")
        );
    }

    #[test]
    fn os_errors_read_as_nginx_writes_them() {
        let e = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(
            crate::errlog::failed("pwrite()", Path::new("/x"), &e),
            "pwrite() \"/x\" failed (28: No space left on device)"
        );
    }

    #[test]
    fn a_file_is_made_in_a_missing_folder_and_leaves_nothing() {
        let base = std::env::temp_dir().join(format!("gannet-temp-{}", std::process::id()));
        let tp = TempPath {
            dir: base.join("a/b"),
            levels: vec![1],
        };
        let t = create(&tp).expect("temp file");
        drop(t);
        let left: Vec<_> = std::fs::read_dir(&tp.dir)
            .expect("folder made")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_file())
            .collect();
        assert!(left.is_empty());
        let _ = std::fs::remove_dir_all(&base);
    }
}
