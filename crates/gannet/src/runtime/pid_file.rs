//! The `pid` file, and its `.oldbin` name during a binary upgrade (`runtime::upgrade`).
//!
//! As nginx: the master writes its pid at start; SIGUSR2 renames the file to `PID.oldbin`
//! before starting the new binary, which then writes its own pid under the usual name, so
//! `gannet -s` and scripts reach the new master while the old one is still there. If the
//! new binary exits, the old master renames its file back. A master removes only the file
//! that is its own at exit (`PID.oldbin` while a new binary runs), never the new master's.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub struct PidFile {
    path: PathBuf,
    /// Renamed to `.oldbin`: a new binary's master owns `path`.
    old: bool,
}

impl PidFile {
    /// Write this process's pid to `path`.
    pub fn write(path: &Path) -> Result<PidFile, String> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|e| format!("open() \"{}\" failed ({e})", path.display()))?;
        Ok(PidFile {
            path: path.to_path_buf(),
            old: false,
        })
    }

    fn oldbin(&self) -> PathBuf {
        let mut s = OsString::from(self.path.as_os_str());
        s.push(".oldbin");
        PathBuf::from(s)
    }

    /// A new binary is about to start: make room for its pid file.
    pub fn rename_oldbin(&mut self) -> Result<(), String> {
        let to = self.oldbin();
        std::fs::rename(&self.path, &to).map_err(|e| {
            format!(
                "rename() \"{}\" to \"{}\" failed ({e})",
                self.path.display(),
                to.display()
            )
        })?;
        self.old = true;
        Ok(())
    }

    /// The new binary is gone: the file is this master's again under its usual name.
    pub fn back(&mut self) {
        if !self.old {
            return;
        }
        let from = self.oldbin();
        match std::fs::rename(&from, &self.path) {
            Ok(()) => self.old = false,
            Err(e) => crate::errlog::log(
                crate::errlog::Level::Alert,
                format_args!(
                    "rename() \"{}\" back to \"{}\" failed ({e})",
                    from.display(),
                    self.path.display()
                ),
            ),
        }
    }

    /// At exit: remove the file this master owns.
    pub fn remove(self) {
        let p = if self.old { self.oldbin() } else { self.path };
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldbin_rename_and_back() {
        let dir = std::env::temp_dir().join(format!("gannet-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gannet.pid");
        let old = dir.join("gannet.pid.oldbin");
        let mut f = PidFile::write(&path).unwrap();
        f.rename_oldbin().unwrap();
        assert!(!path.exists() && old.exists());
        // The new binary's master writes its own file; ours is left alone at exit.
        std::fs::write(&path, "1\n").unwrap();
        f.back();
        assert!(path.exists() && !old.exists());
        f.rename_oldbin().unwrap();
        std::fs::write(&path, "1\n").unwrap();
        f.remove();
        assert!(!old.exists());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
