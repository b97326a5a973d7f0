//! The `*_temp_path` folders, made when the config loads, before any worker starts, as
//! nginx's `ngx_create_paths`: each is made with mode 0700 if missing (its parent must
//! exist, as in nginx: otherwise gannet does not start) and, when gannet starts as root,
//! given to the workers' account and kept readable, writable and searchable by it. The
//! workers run as another account then, which could not make them under a root-owned
//! prefix. The embedded default (serve the current directory) makes none: it proxies
//! nothing, and the folder it serves stays as it was; a worker makes a missing folder on
//! first use (`conn::temp_file`).

use super::Config;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Make (and hand over) every temp folder of `cfg`; `Err` is nginx's emerg message.
pub fn create(cfg: &Config) -> Result<(), String> {
    let uid = cfg.process.user.as_ref().map(|u| u.uid);
    for dir in &cfg.temp_dirs {
        prepare(dir, uid)?;
    }
    Ok(())
}

fn prepare(dir: &Path, uid: Option<libc::uid_t>) -> Result<(), String> {
    let failed = |call: &str, e: std::io::Error| crate::errlog::failed(call, dir, &e);
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(failed("mkdir()", e)),
    }
    let Some(uid) = uid else { return Ok(()) };
    let meta = std::fs::metadata(dir).map_err(|e| failed("stat()", e))?;
    if meta.uid() != uid {
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| format!("invalid path \"{}\"", dir.display()))?;
        // SAFETY: `path` is NUL-terminated and outlives the call; gid -1 leaves the group.
        if unsafe { libc::chown(path.as_ptr(), uid, libc::gid_t::MAX) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "chown(\"{}\", {uid}) failed ({})",
                dir.display(),
                crate::errlog::errno_text(&e)
            ));
        }
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700))
            .map_err(|e| failed("chmod()", e))?;
    }
    Ok(())
}
