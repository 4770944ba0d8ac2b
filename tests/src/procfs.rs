//! Readers of `/proc`: a throwaway cluster's CPU time and its backends' memory, for the
//! benchmarks.

use std::time::Duration;

use crate::Cluster;

/// CPU time so far of the cluster's postmaster and all its children, live
/// (`/proc/<pid>/schedstat`) and exited (the postmaster's `cutime + cstime`).
pub fn cluster_cpu(cluster: &Cluster) -> Duration {
    let Some(postmaster) = postmaster_pid(cluster) else {
        return Duration::ZERO;
    };
    let mut total = cpu_of(postmaster) + reaped_children(postmaster);
    for pid in children_of(postmaster) {
        total += cpu_of(pid);
    }
    total
}

/// The pid of the cluster's postmaster, from `postmaster.pid`.
pub fn postmaster_pid(cluster: &Cluster) -> Option<u32> {
    let pidfile = cluster.dir().join("data").join("postmaster.pid");
    std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
}

/// The live children of `parent` (from `/proc/*/stat`).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// The anonymous memory of `pids` (`Pss_Anon` of `/proc/<pid>/smaps_rollup`: each page
/// divided among the processes mapping it), summed, in kB: a backend's own memory (its caches
/// and work memory), without the shared buffers and lock table every backend maps.
pub fn anonymous_kb(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|pid| {
            let rollup =
                std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            rollup
                .lines()
                .find_map(|l| l.strip_prefix("Pss_Anon:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn cpu_of(pid: u32) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .map_or(Duration::ZERO, Duration::from_nanos)
}

fn reaped_children(pid: u32) -> Duration {
    let fields = || -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        // After the command: state is field 3, cutime field 16, cstime field 17.
        Some(rest.get(13)?.parse::<u64>().ok()? + rest.get(14)?.parse::<u64>().ok()?)
    };
    // In USER_HZ = 100 ticks per second on Linux.
    fields().map_or(Duration::ZERO, |ticks| Duration::from_millis(ticks * 10))
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces and parentheses: the fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
