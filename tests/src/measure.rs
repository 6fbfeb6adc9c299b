//! What the benchmarks read off a process and a set of timings: percentiles, a process's CPU
//! ticks and its memory from `/proc/PID`. One copy for every bench in `benches/`.

use std::time::Duration;

/// The `p` (0..=1) percentile of timings sorted ascending (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A duration in milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// User plus system CPU ticks a process has used (`/proc/PID/stat` fields 14 and 15); 0 when
/// it cannot be read.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 are the 12th and 13th after the comm.
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// A `kB` line of `/proc/PID/status` (`VmRSS:`, `VmHWM:`); 0 when it cannot be read.
pub fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or(0)
}
