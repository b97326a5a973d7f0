//! What the worker process does to itself between fork and its first thread, in nginx's
//! order (`ngx_worker_process_init`): its environment (`env`), its resource limits
//! (`worker_rlimit_nofile`, `worker_rlimit_core`), its identity (`user`: setgid,
//! initgroups, setuid) and its current directory (`working_directory`). Unlike nginx, it
//! is made dumpable again after setuid only when the config asks for core files (see
//! `drop_to`).
//!
//! It runs while the process has a single thread: changing the environment is only sound
//! then, and setuid applies to every thread only if there is one (Linux credentials are
//! per thread; glibc broadcasts them, but nothing here relies on that).

use crate::config::process_conf::ProcessConf;
use crate::config::Config;
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;

/// A failure that must stop the worker process (nginx exits with code 2 for these, and the
/// master does not start it again).
pub struct Fatal(pub String);

/// Apply `config`'s worker-process settings to the calling, single-threaded process.
/// Limits that cannot be set are logged and the worker runs anyway, as in nginx; failing to
/// change user or directory is fatal.
pub fn apply(config: &Config) -> Result<(), Fatal> {
    let p = &config.process;
    set_environment(&p.env);
    if let Some(n) = config.main.rlimit_nofile {
        if let Err(e) = set_limit(libc::RLIMIT_NOFILE, n) {
            crate::errlog::log(
                crate::errlog::Level::Alert,
                format_args!("setrlimit(RLIMIT_NOFILE, {n}) failed ({e})"),
            );
        }
    }
    if let Some(n) = p.rlimit_core {
        if let Err(e) = set_limit(libc::RLIMIT_CORE, n) {
            crate::errlog::log(
                crate::errlog::Level::Alert,
                format_args!("setrlimit(RLIMIT_CORE, {n}) failed ({e})"),
            );
        }
    }
    drop_to(p)?;
    if let Some(dir) = &p.working_directory {
        std::env::set_current_dir(dir)
            .map_err(|e| Fatal(format!("chdir(\"{}\") failed ({e})", dir.display())))?;
    }
    Ok(())
}

/// Soft and hard limit both, as nginx sets them.
fn set_limit(resource: libc::__rlimit_resource_t, n: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n as libc::rlim_t,
        rlim_max: n as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit that outlives the call.
    if unsafe { libc::setrlimit(resource, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Become `user` (when root and configured), keeping nothing of root: the group first (a
/// non-root process may no longer change it), the supplementary groups from the group
/// database, then the uid, which drops every capability.
fn drop_to(p: &ProcessConf) -> Result<(), Fatal> {
    let Some(a) = &p.user else { return Ok(()) };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let os_err = io::Error::last_os_error;
    // SAFETY: setgid takes a plain integer.
    if unsafe { libc::setgid(a.gid) } != 0 {
        return Err(Fatal(format!("setgid({}) failed ({})", a.gid, os_err())));
    }
    // SAFETY: `a.name` is a NUL-terminated string that lives across the call.
    if unsafe { libc::initgroups(a.name.as_ptr(), a.gid) } != 0 {
        return Err(Fatal(format!(
            "initgroups({}, {}) failed ({})",
            a.name.to_string_lossy(),
            a.gid,
            os_err()
        )));
    }
    // SAFETY: setuid takes a plain integer.
    if unsafe { libc::setuid(a.uid) } != 0 {
        return Err(Fatal(format!("setuid({}) failed ({})", a.uid, os_err())));
    }
    // A process that changed uid is not dumpable: no core files, and its /proc entries
    // (environ, mem...) stay root's, so other processes of `user` (PHP-FPM as www-data...)
    // cannot read the keys in its memory. nginx makes it dumpable again always; gannet only
    // when the config asks for cores (`worker_rlimit_core` or `working_directory`).
    if p.rlimit_core.is_some() || p.working_directory.is_some() {
        // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } != 0 {
            crate::errlog::log(
                crate::errlog::Level::Alert,
                format_args!("prctl(PR_SET_DUMPABLE) failed ({})", os_err()),
            );
        }
    }
    Ok(())
}

/// The environment `env` asks for: each `NAME` kept if set, each `NAME=VALUE` set, TZ kept
/// unless listed; everything else removed.
pub fn environment(
    env: &[String],
    current: impl Iterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    let current: Vec<(OsString, OsString)> = current.collect();
    let mut names: Vec<&str> = Vec::new();
    let mut out: Vec<(OsString, OsString)> = Vec::new();
    let tz_listed = env.iter().any(|e| e == "TZ" || e.starts_with("TZ="));
    let kept = env
        .iter()
        .map(String::as_str)
        .chain((!tz_listed).then_some("TZ"));
    for entry in kept {
        let (name, value) = match entry.split_once('=') {
            Some((n, v)) => (n, Some(OsString::from(v))),
            None => (entry, None),
        };
        if names.contains(&name) {
            continue;
        }
        let value = value.or_else(|| {
            current
                .iter()
                .find(|(k, _)| k.as_bytes() == name.as_bytes())
                .map(|(_, v)| v.clone())
        });
        if let Some(v) = value {
            names.push(name);
            out.push((OsString::from(name), v));
        }
    }
    out
}

fn set_environment(env: &[String]) {
    let want: Vec<(OsString, OsString)> = environment(env, std::env::vars_os())
        .into_iter()
        // A name the OS would not take (empty): skip it rather than panic in set_var.
        .filter(|(k, v)| {
            !k.is_empty() && !k.as_bytes().contains(&b'=') && !v.as_bytes().contains(&0)
        })
        .collect();
    for (k, _) in std::env::vars_os() {
        if !want.iter().any(|(w, _)| w == &k) {
            std::env::remove_var(&k);
        }
    }
    // set_var copies each kept string to the heap, so nothing points into the original
    // block any more when `rewrite_original_block` overwrites it.
    for (k, v) in &want {
        std::env::set_var(k, v);
    }
    rewrite_original_block(&want);
}

/// The environment the process was started with stays in its memory (the block at the top
/// of the stack), whatever `environ` says, and /proc/PID/environ shows it, to the worker's
/// user too once the worker is dumpable again: the master's variables would leak to any
/// process of `user`. Overwrite the block with the worker's own environment (the kept
/// variables fit in it unless `env` set long values; else it is only blanked).
fn rewrite_original_block(want: &[(OsString, OsString)]) {
    let Some((start, end)) = original_block() else {
        return;
    };
    let mut block = Vec::new();
    for (k, v) in want {
        block.extend_from_slice(k.as_bytes());
        block.push(b'=');
        block.extend_from_slice(v.as_bytes());
        block.push(0);
    }
    let len = end - start;
    if block.len() > len {
        block.clear();
    }
    block.resize(len, 0);
    // SAFETY: [start, end) is the environment block the kernel set up at exec (reported by
    // /proc/self/stat), mapped and writable for the life of the process. `set_environment`
    // moved every live variable to the heap first, so nothing reads the old strings, and
    // the process is single-threaded here.
    unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), start as *mut u8, len) };
}

/// env_start and env_end from /proc/self/stat (fields 50 and 51).
fn original_block() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(50 - 3);
    let start: usize = fields.next()?.parse().ok()?;
    let end: usize = fields.next()?.parse().ok()?;
    (start != 0 && end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(list: &[&str], current: &[(&str, &str)]) -> Vec<(String, String)> {
        let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        let cur = current
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        environment(&list, cur)
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn only_listed_variables_and_tz() {
        let cur = [("PATH", "/bin"), ("TZ", "UTC"), ("HOME", "/root")];
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(env(&[], &cur), vec![s("TZ", "UTC")]);
        assert_eq!(env(&[], &[("PATH", "/bin")]), vec![]);
        assert_eq!(
            env(&["PATH", "X=1", "MISSING"], &cur),
            vec![s("PATH", "/bin"), s("X", "1"), s("TZ", "UTC")]
        );
        assert_eq!(
            env(&["TZ=Europe/Paris"], &cur),
            vec![s("TZ", "Europe/Paris")]
        );
        assert_eq!(
            env(&["A=", "A=2"], &cur)[0],
            s("A", ""),
            "the first one wins"
        );
    }
}
