//! What /proc says about a process and the machine: CPU ticks, steal time, memory, context
//! switches and the open-files limit; and the runtime a subcommand's own work runs on.

use std::process::Command;

use crate::error::Result;

/// The threads a subcommand's runtime drives its own work (load, clients) with.
pub enum Threads {
    /// One: the load generator stays on one core, as the tables say.
    Current,
    /// Two workers, for the benchmarks that hold many connections or processes at once.
    Two,
    /// One worker per core (tokio's default).
    PerCore,
}

/// A runtime with I/O and timers, of `threads`.
pub fn runtime(threads: Threads) -> Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Threads::Current => tokio::runtime::Builder::new_current_thread(),
        Threads::Two => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        Threads::PerCore => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build().map_err(|e| format!("runtime: {e}"))
}

/// utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat).
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
    // The command name (field 2) is in parentheses and may itself contain spaces or ')';
    // the fields after the last ')' start at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: no field {n}"))
    };
    Ok(field(14)? + field(15)?)
}

/// The machine's steal time (CPU time the hypervisor gave to other guests), in clock
/// ticks summed over all CPUs, and the number of CPUs (`/proc/stat`). On a shared VM a
/// neighbour's burst shows up here, and in every latency measured meanwhile.
pub fn steal_ticks() -> Result<(u64, usize)> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| format!("cannot read /proc/stat: {e}"))?;
    let total = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse().ok())
        .ok_or("/proc/stat: no steal field on the cpu line")?;
    let cpus = stat
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Ok((total, cpus.max(1)))
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read /proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/status has no {field}"))
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The soft `Max open files` limit of this process (children inherit it).
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Context switches (voluntary + involuntary) over every thread of a process: at low
/// concurrency, wake-ups rather than parsing dominate a proxy's CPU time, and this shows it.
pub fn ctx_switches(pid: u32) -> Result<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("cannot list /proc/{pid}/task: {e}"))?;
    let mut total = 0;
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read; it is then simply not counted.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        total += status
            .lines()
            .filter_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

/// Clock ticks per second for /proc times. Without libc there is no sysconf; `getconf`
/// answers it, and Linux has reported 100 (USER_HZ) to user space on every common
/// architecture for decades, so that is the fallback.
pub fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// The calling thread's time on a CPU so far, in nanoseconds (the first field of
/// `/proc/thread-self/schedstat`): unlike wall time, it leaves out what a neighbour's
/// process took of the core meanwhile.
pub fn thread_cpu_ns() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .map_err(|e| format!("/proc/thread-self/schedstat: {e}"))?;
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("/proc/thread-self/schedstat: unexpected {text:?}"))
}
