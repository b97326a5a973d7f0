//! Where and how eagerly a worker thread runs: `worker_cpu_affinity` (sched_setaffinity on
//! the thread) and `worker_priority` (its nice value; Linux keeps one per thread). Applied
//! by each worker thread to itself as it starts. A refusal is logged and the worker runs
//! anyway, as nginx does.

use crate::config::main_conf::{CpuAffinity, MainConf};
use crate::errlog::{self, Level};

/// The CPUs worker `w` is bound to, if the config binds it; `allowed` gives the CPUs the
/// process may use, which `auto` without a mask goes round.
fn cpus_for(
    affinity: &CpuAffinity,
    w: usize,
    allowed: impl FnOnce() -> Vec<usize>,
) -> Option<Vec<usize>> {
    match affinity {
        CpuAffinity::Auto(mask) => {
            let cpus = mask.clone().unwrap_or_else(allowed);
            (!cpus.is_empty()).then(|| vec![cpus[w % cpus.len()]])
        }
        CpuAffinity::Masks(masks) => masks.get(w).or(masks.last()).cloned(),
    }
}

/// The CPUs the calling thread may run on now (the process's, as `taskset` or a cgroup
/// set them: nginx's `auto` takes every CPU, which would bind a worker outside them).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data, valid when zeroed; sched_getaffinity writes at most
    // the size given; CPU_ISSET reads it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

/// Bind the calling thread, worker `w`, and set its priority, as `main` says.
pub fn apply(main: &MainConf, w: usize) {
    if let Some(cpus) = main
        .cpu_affinity
        .as_ref()
        .and_then(|a| cpus_for(a, w, allowed_cpus))
    {
        if let Err(e) = bind_to(&cpus) {
            errlog::log(
                Level::Alert,
                format_args!("sched_setaffinity({cpus:?}) failed for worker {w} ({e})"),
            );
        }
    }
    if let Some(n) = main.priority {
        // SAFETY: gettid has no preconditions; setpriority only reads its arguments, and
        // PRIO_PROCESS with a thread id sets that thread's nice value on Linux.
        let r = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, n)
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            errlog::log(
                Level::Alert,
                format_args!("setpriority({n}) failed for worker {w} ({e})"),
            );
        }
    }
}

fn bind_to(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data, valid when zeroed; CPU_SET is given indices the
    // config limited to CPU_SETSIZE; sched_setaffinity reads the set for its given size, and
    // pid 0 means the calling thread.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_and_cpus() {
        let none = Vec::new;
        let masks = CpuAffinity::Masks(vec![vec![0], vec![1, 3]]);
        assert_eq!(cpus_for(&masks, 0, none), Some(vec![0]));
        assert_eq!(cpus_for(&masks, 1, none), Some(vec![1, 3]));
        assert_eq!(
            cpus_for(&masks, 5, none),
            Some(vec![1, 3]),
            "the last mask for the rest"
        );
        let auto = CpuAffinity::Auto(Some(vec![2, 5]));
        assert_eq!(cpus_for(&auto, 0, none), Some(vec![2]));
        assert_eq!(cpus_for(&auto, 1, none), Some(vec![5]));
        assert_eq!(cpus_for(&auto, 2, none), Some(vec![2]));
        assert_eq!(cpus_for(&CpuAffinity::Auto(Some(vec![])), 0, none), None);
        let all = CpuAffinity::Auto(None);
        assert_eq!(cpus_for(&all, 3, || vec![4, 6]), Some(vec![6]));
        assert!(allowed_cpus().contains(&cpus_for(&all, 0, allowed_cpus).unwrap()[0]));
    }
}
