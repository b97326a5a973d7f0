//! Main-context settings of the worker process, as nginx's core module has them: `user`,
//! `worker_rlimit_core`, `working_directory` and `env`. The master applies none of them to
//! itself; `runtime::privileges` applies them in the worker process it forks, before any
//! worker thread starts.
//!
//! `user` is resolved (getpwnam / getgrnam) when the config loads, in the master, so a name
//! that does not exist is a config error with its file:line, and a reload picks up a
//! changed account. As in nginx, `user` only means something when gannet starts as root:
//! otherwise it is accepted with a warning and ignored, and the group defaults to the one
//! named like the user. Started as root without `user`, the workers run as nginx's
//! compiled-in default: `nobody`, in group `nogroup` (or `nobody` where there is no
//! `nogroup`), never as root.

use gannet_conf::registry::{Args, Ctx, Spec};
use gannet_conf::{setters, ConfError, Directive};
use std::ffi::{CStr, CString};
use std::io;
use std::path::{Path, PathBuf};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "user",
        ctx: Ctx::MAIN,
        args: Args::Between(1, 2),
        block: false,
    },
    Spec {
        name: "worker_rlimit_core",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "working_directory",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
    Spec {
        name: "env",
        ctx: Ctx::MAIN,
        args: Args::Exactly(1),
        block: false,
    },
];

/// The account the worker process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// For initgroups (the supplementary groups are the user's, from the group database).
    pub name: CString,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
}

#[derive(Debug, Clone, Default)]
pub struct ProcessConf {
    /// The account the workers run as: `user`, resolved, or the default; `None` when
    /// gannet does not run as root.
    pub user: Option<Account>,
    /// Whether a `user` directive was seen (a second one is an error, even if ignored).
    user_seen: bool,
    /// `worker_rlimit_core`: RLIMIT_CORE (soft and hard) of the worker process, in bytes.
    pub rlimit_core: Option<u64>,
    /// `working_directory`: the worker process's current directory (where cores go).
    pub working_directory: Option<PathBuf>,
    /// `env` entries as written: `NAME` keeps that variable, `NAME=VALUE` sets it; the
    /// worker process's environment holds only these (and TZ).
    pub env: Vec<String>,
    /// Warnings to log when the config starts (`user` ignored without root).
    pub warnings: Vec<String>,
}

impl ProcessConf {
    /// Apply one of [`DIRECTIVES`]; Ok(false) when `d` is not one of them.
    pub fn set(&mut self, d: &Directive, prefix: &Path) -> Result<bool, ConfError> {
        match d.name.as_str() {
            "user" => {
                if self.user_seen {
                    return Err(d.error("\"user\" directive is duplicate"));
                }
                self.user_seen = true;
                // SAFETY: geteuid has no preconditions and cannot fail.
                if unsafe { libc::geteuid() } != 0 {
                    self.warnings.push(format!(
                        "the \"user\" directive makes sense only if the master process runs \
                         with super-user privileges, ignored in {}",
                        d.loc
                    ));
                    return Ok(true);
                }
                self.user = Some(user_directive(d)?);
            }
            "worker_rlimit_core" => self.rlimit_core = Some(setters::offset_arg(d, 0)?),
            "working_directory" => self.working_directory = Some(prefix.join(&d.args[0])),
            "env" => self.env.push(d.args[0].clone()),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// After the main context: started as root without `user`, the default account
    /// (nginx's `ngx_core_module_init_conf`); its lookup failing is an error without a line.
    pub fn finish(&mut self) -> Result<(), ConfError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if self.user_seen || unsafe { libc::geteuid() } != 0 {
            return Ok(());
        }
        // nginx's configure picks the group the same way (auto/unix).
        let group = match group_id(c"nogroup") {
            Ok(Some(_)) => "nogroup",
            _ => "nobody",
        };
        self.user = Some(account("nobody", group).map_err(ConfError::bare)?);
        Ok(())
    }
}

/// `user NAME [GROUP]`: NAME's uid; GROUP's gid, or that of the group named NAME (nginx
/// does not take the user's primary group from passwd).
fn user_directive(d: &Directive) -> Result<Account, ConfError> {
    let group = d.args.get(1).unwrap_or(&d.args[0]);
    account(&d.args[0], group).map_err(|e| d.error(e))
}

/// The account named `user` in group `group`, or nginx's message for the failed lookup.
fn account(user: &str, group: &str) -> Result<Account, String> {
    let cname = |s: &str| CString::new(s).map_err(|_| format!("invalid name \"{s}\""));
    let name = cname(user)?;
    let group_name = cname(group)?;
    let failed = |call: &str, what: &str, e: Option<io::Error>| match e {
        Some(e) => format!("{call}(\"{what}\") failed ({e})"),
        None => format!("{call}(\"{what}\") failed"),
    };
    let uid = match user_id(&name) {
        Ok(Some(uid)) => uid,
        Ok(None) => return Err(failed("getpwnam", user, None)),
        Err(e) => return Err(failed("getpwnam", user, Some(e))),
    };
    let gid = match group_id(&group_name) {
        Ok(Some(gid)) => gid,
        Ok(None) => return Err(failed("getgrnam", group, None)),
        Err(e) => return Err(failed("getgrnam", group, Some(e))),
    };
    Ok(Account { name, uid, gid })
}

/// Room for one passwd / group record's strings; doubled on ERANGE.
const RECORD_BUF: usize = 4096;

/// The uid of user `name`, `None` if there is no such user.
fn user_id(name: &CStr) -> io::Result<Option<libc::uid_t>> {
    let mut buf: Vec<libc::c_char> = vec![0; RECORD_BUF];
    loop {
        // SAFETY: passwd is plain data (integers and pointers), valid when zeroed.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: `name` is NUL-terminated; `pwd`, `buf` (with its true length) and `found`
        // are valid for writes for the whole call; the strings written into `buf` are not
        // read after it.
        let r = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        match r {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some(pwd.pw_uid)),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            // ENOENT, ESRCH, EBADF, EPERM: "not found" for some NSS modules.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// The gid of group `name`, `None` if there is no such group.
fn group_id(name: &CStr) -> io::Result<Option<libc::gid_t>> {
    let mut buf: Vec<libc::c_char> = vec![0; RECORD_BUF];
    loop {
        // SAFETY: group is plain data (integers and pointers), valid when zeroed.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: as in `user_id`: every pointer is valid for the call and `buf`'s length is
        // its true length.
        let r = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut grp,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        match r {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some(grp.gr_gid)),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves() {
        assert_eq!(user_id(c"root").unwrap(), Some(0));
        assert_eq!(group_id(c"root").unwrap(), Some(0));
        assert_eq!(user_id(c"no-such-user-gannet").unwrap(), None);
        assert_eq!(group_id(c"no-such-group-gannet").unwrap(), None);
    }
}
