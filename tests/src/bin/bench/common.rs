//! What both benchmarks use: the runtime, the machine line, duration arguments, percentiles and
//! the table's number formats.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use plexsphere_leader_tests::clock::monotonic_ns;
use plexsphere_leader_tests::{base_config, connect};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `bench` on a runtime of two worker threads; its error goes to stderr and exits 1.
pub(crate) fn block_on(bench: impl Future<Output = Result<(), BoxError>>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(bench),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The whole chain: a server's error is "db error" with its message as the source.
            let mut message = e.to_string();
            let mut source = e.source();
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("bench: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Prints `# {title}` and the machine: cores, CPU model, kernel, server version, load average.
pub(crate) async fn print_machine(title: &str) -> Result<(), BoxError> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let client = connect(&base_config()?).await?;
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    println!("# {title}\n");
    println!(
        "machine: {cores} cores, {model}, Linux {}; PostgreSQL {version}; load average {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(())
}

/// A duration argument: `250ms`, `2s`, `1.5s`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("not a duration: {text} (use ms or s)");
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().map(Duration::from_millis).map_err(|_| bad());
    }
    let secs: f64 = text
        .strip_suffix('s')
        .ok_or_else(bad)?
        .parse()
        .map_err(|_| bad())?;
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// A whole number of seconds: `10`.
pub(crate) fn seconds(text: &str) -> Result<Duration, String> {
    text.parse()
        .map(Duration::from_secs)
        .map_err(|_| format!("not a count of seconds: {text}"))
}

/// Sleeps a pseudo-random part of one interval, so that what follows lands at any phase of the
/// electors' checks.
pub(crate) async fn random_phase(interval: Duration) {
    let phase = monotonic_ns() % u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    tokio::time::sleep(Duration::from_nanos(phase)).await;
}

/// Nearest-rank percentile; zero when there is nothing.
pub(crate) fn percentile(values: &[Duration], p: usize) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub(crate) fn median(values: &[Duration]) -> Duration {
    percentile(values, 50)
}

/// Whole milliseconds.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Milliseconds to a tenth.
pub(crate) fn fine_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_ms_and_s() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert!(duration("5").is_err());
        assert!(duration("xs").is_err());
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let values: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 50), Duration::from_millis(5));
        assert_eq!(percentile(&values, 99), Duration::from_millis(10));
        assert_eq!(percentile(&values, 100), Duration::from_millis(10));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
