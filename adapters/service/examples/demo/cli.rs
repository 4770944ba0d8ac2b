//! The demo's command line: a stable contract that other tools script.

use std::time::Duration;

use clap::Parser;
use plexsphere_leader::LockKey;
use plexsphere_leader::config::{AcquireMode, CheckInterval, LEASE_TTL_INTERVALS};

/// The environment variable naming the database, when `--dsn` is not given.
pub(crate) const DSN_ENV: &str = "PLEXSPHERE_DSN";

/// Set by the demo on the replica processes it starts: the replica's index.
pub(crate) const REPLICA_ENV: &str = "PLEXSPHERE_DEMO_REPLICA";

/// Set by the demo with `--rollout` on the replica processes it starts: the release number
/// the replica ranks itself by (`Config::version`).
pub(crate) const VERSION_ENV: &str = "PLEXSPHERE_DEMO_VERSION";

/// The signed event bus's nonce TTL: the freshness window of `sse-nonce-sweep`, and its period.
pub(crate) const SSE_NONCE_TTL_ENV: &str = "PLEXSPHERE_SSE_NONCE_TTL";

/// The nonce TTL when [`SSE_NONCE_TTL_ENV`] is unset or blank.
pub(crate) const DEFAULT_SSE_NONCE_TTL: Duration = Duration::from_secs(300);

/// The nonce TTL from `$PLEXSPHERE_SSE_NONCE_TTL`; see [`sse_nonce_ttl`].
pub(crate) fn sse_nonce_ttl_from_env() -> Result<Duration, String> {
    sse_nonce_ttl(std::env::var(SSE_NONCE_TTL_ENV).ok().as_deref())
}

/// The nonce TTL from the variable's `value`: [`DEFAULT_SSE_NONCE_TTL`] when unset or blank,
/// else a duration in the form of `--check-interval` (e.g. `30s`, `5m`), at least 1 ms.
pub(crate) fn sse_nonce_ttl(value: Option<&str>) -> Result<Duration, String> {
    let Some(text) = value.filter(|text| !text.trim().is_empty()) else {
        return Ok(DEFAULT_SSE_NONCE_TTL);
    };
    let ttl = parse_duration(text).map_err(|e| format!("{SSE_NONCE_TTL_ENV}: {e}"))?;
    if ttl < Duration::from_millis(1) {
        return Err(format!("{SSE_NONCE_TTL_ENV}: {text:?} is below 1ms"));
    }
    Ok(ttl)
}

/// A multi-replica service whose replicas elect one background leader through a PostgreSQL
/// session advisory lock and run the leader-gated background loops of the spec.
#[derive(Debug, Clone, Parser)]
#[command(name = "demo", version, about, long_about = None)]
pub(crate) struct Args {
    /// How many replicas to run, each a separate OS process.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) replicas: u16,

    /// The election's check interval, and the period of every ticked loop (e.g. 500ms, 2s, 1m).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) check_interval: Duration,

    /// The database (URL or key=value); else $PLEXSPHERE_DSN; else 127.0.0.1:5432 as user
    /// postgres, database postgres; else a throwaway cluster from the local PostgreSQL binaries.
    #[arg(long)]
    pub(crate) dsn: Option<String>,

    /// Replica i serves /readyz, /livez, /metrics and /status on port P+i (i from 0).
    #[arg(long, default_value_t = 8080)]
    pub(crate) http_port: u16,

    /// The election's lock key, CLASSID:OBJID (two int4s): demos with different keys on one
    /// database are independent elections, each with its own leader.
    #[arg(long, default_value_t = LockKey::DEFAULT, allow_hyphen_values = true)]
    pub(crate) key: LockKey,

    /// How a standby asks for the lock: `poll` tries it every interval (the spec), `queue`
    /// waits in the server's lock queue and takes over within milliseconds of a release.
    #[arg(long, value_enum, default_value_t = Acquire::Poll)]
    pub(crate) acquire: Acquire,

    /// What the replicas hold: `advisory`, the session advisory lock (the spec), or `lease`, a
    /// lease row (`Config::lease`, for a transaction-mode pooler such as PgBouncer's
    /// `pool_mode = transaction`; its tables are created at start). `/status` shows who holds
    /// the lease and until when.
    #[arg(long, value_enum, default_value_t = Mechanism::Advisory)]
    pub(crate) mechanism: Mechanism,

    /// Give every term a fencing epoch from the `plexsphere_leader_fence` table (created at
    /// start); `/status` shows the epoch.
    #[arg(long)]
    pub(crate) fencing: bool,

    /// Exit cleanly after this long (e.g. 30s); runs until Ctrl-C or SIGTERM without it.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Spread the ticked loops' sweeps over the replicas: every replica also runs a sharded
    /// elector of K shards (item id mod K), sweeps the items of the shards it owns, and serves
    /// on `/` a live page of who owns which shards. With `--mechanism lease` the space is held
    /// by leases too (member and owner rows), so it runs behind a transaction-mode pooler.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(plexsphere_leader::sharded::MAX_SHARDS)))]
    pub(crate) shards: Option<u32>,

    /// A rolling deploy once the replicas are up: every replica ranks itself by its version
    /// (`Config::version`, 1.0.0 at start), then the demo replaces them one at a time with
    /// version 1.1.0, new first (a new replica starts in one spare slot, port P+N, and once the
    /// new version leads an old one stops), printing each leadership move
    /// (`event=leadership-moved`: who led, who leads now, its version, the end cause) and a
    /// summary (`event=rollout-done`), and keeps running.
    #[arg(long)]
    pub(crate) rollout: bool,
}

impl Args {
    /// The command line checked as a whole before any replica starts, in the flags' own words:
    /// `--check-interval` as the elector validates it (`0s` is the default, 5s, and is shown
    /// as such), and the combinations the election refuses.
    ///
    /// # Errors
    /// The first refusal, naming the flags and what to use instead.
    pub(crate) fn validated(mut self) -> Result<Self, String> {
        let interval = CheckInterval::new(self.check_interval).map_err(|error| {
            format!(
                "--check-interval {:?}: {}",
                self.check_interval,
                error.to_string().trim_start_matches("check_interval ")
            )
        })?;
        self.check_interval = interval.get();
        if self.mechanism == Mechanism::Lease && self.acquire == Acquire::Queue {
            return Err(
                "--mechanism lease takes no --acquire queue (a lease has no \
                        server-side queue to wait in): use --acquire poll"
                    .into(),
            );
        }
        Ok(self)
    }

    /// How long a standby takes, at most, to lead after the leader is killed: one interval
    /// polling the advisory lock (the leader's session ends with its process), a round trip
    /// when queued, and the lease's TTL plus one interval with the lease (nothing tells the
    /// server that a lease holder died).
    pub(crate) fn takeover_bound(&self) -> String {
        match (self.mechanism, self.acquire) {
            (Mechanism::Lease, _) => format!(
                "{:?} (the lease's TTL of {LEASE_TTL_INTERVALS} intervals, plus one)",
                self.check_interval * (LEASE_TTL_INTERVALS + 1)
            ),
            (Mechanism::Advisory, Acquire::Queue) => "a few milliseconds".into(),
            (Mechanism::Advisory, Acquire::Poll) => format!("{:?}", self.check_interval),
        }
    }
}

/// `--mechanism`: what the election holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mechanism {
    /// The session advisory lock (the spec).
    Advisory,
    /// A lease row (`Config::lease` with the default TTL of three intervals).
    Lease,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Advisory => "advisory",
            Self::Lease => "lease",
        })
    }
}

/// `--acquire`: the elector's [`AcquireMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Acquire {
    /// Try the lock every check interval (the spec's behaviour).
    Poll,
    /// Wait in the server's lock queue.
    Queue,
}

impl From<Acquire> for AcquireMode {
    fn from(acquire: Acquire) -> Self {
        match acquire {
            Acquire::Poll => Self::Poll,
            Acquire::Queue => Self::Queue,
        }
    }
}

impl std::fmt::Display for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Poll => "poll",
            Self::Queue => "queue",
        })
    }
}

/// Parses a duration written as one or more `<number><unit>` parts, units `ns`, `us`, `ms`, `s`,
/// `m`, `h`, `d`; the number may have a fraction (`1.5s`). Examples: `500ms`, `2s`, `1m30s`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{text:?}: missing unit (use e.g. 500ms, 2s, 1m)"))?;
        if number_len == 0 {
            return Err(format!("{text:?}: expected a number at {rest:?}"));
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("{text:?}: bad number {:?}", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            unit => {
                return Err(format!(
                    "{text:?}: unknown unit {unit:?} (ns, us, ms, s, m, h, d)"
                ));
            }
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_the_documented_forms_parse() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("2s"), Ok(ms(2000)));
        assert_eq!(parse_duration("5s"), Ok(ms(5000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration("200ms"), Ok(ms(200)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn durations_without_a_unit_or_with_junk_are_refused() {
        for bad in ["", "5", "s", "5x", "1..2s", "-1s", "ms5"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_nonce_ttl_defaults_to_five_minutes_and_the_variable_overrides_it() {
        assert_eq!(sse_nonce_ttl(None), Ok(Duration::from_secs(300)));
        assert_eq!(sse_nonce_ttl(Some("")), Ok(Duration::from_secs(300)));
        assert_eq!(sse_nonce_ttl(Some("  ")), Ok(Duration::from_secs(300)));
        assert_eq!(sse_nonce_ttl(Some("2s")), Ok(Duration::from_secs(2)));
        assert_eq!(sse_nonce_ttl(Some("1m30s")), Ok(Duration::from_secs(90)));
        assert_eq!(sse_nonce_ttl(Some("1h")), Ok(Duration::from_secs(3600)));
        for bad in ["5", "5x", "0s", "0.5us", "-1m"] {
            let error = sse_nonce_ttl(Some(bad)).unwrap_err();
            assert!(
                error.starts_with("PLEXSPHERE_SSE_NONCE_TTL: "),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let args = Args::try_parse_from(["demo"]).unwrap();
        assert_eq!(args.replicas, 3);
        assert_eq!(args.check_interval, Duration::from_secs(5));
        assert_eq!(args.http_port, 8080);
        assert_eq!(args.dsn, None);
        assert_eq!(args.duration, None);
        assert_eq!(args.key, LockKey::DEFAULT);
        assert_eq!(args.acquire, Acquire::Poll);
        assert!(!args.fencing);
        assert!(!args.rollout);
        assert_eq!(args.mechanism, Mechanism::Advisory);
        assert!(Args::try_parse_from(["demo", "--rollout"]).unwrap().rollout);
        let lease = Args::try_parse_from(["demo", "--mechanism", "lease"]).unwrap();
        assert_eq!(lease.mechanism, Mechanism::Lease);
        assert!(Args::try_parse_from(["demo", "--mechanism", "lock"]).is_err());
        let args = Args::try_parse_from([
            "demo",
            "--replicas",
            "2",
            "--check-interval",
            "200ms",
            "--dsn",
            "host=127.0.0.1 user=postgres",
            "--http-port",
            "9000",
            "--duration",
            "3s",
            "--key",
            "-7:2",
            "--acquire",
            "queue",
            "--fencing",
        ])
        .unwrap();
        assert_eq!(args.replicas, 2);
        assert_eq!(args.check_interval, Duration::from_millis(200));
        assert_eq!(args.dsn.as_deref(), Some("host=127.0.0.1 user=postgres"));
        assert_eq!(args.http_port, 9000);
        assert_eq!(args.duration, Some(Duration::from_secs(3)));
        assert_eq!(args.key, LockKey::new(-7, 2));
        assert_eq!(AcquireMode::from(args.acquire), AcquireMode::Queue);
        assert!(args.fencing);
        assert!(Args::try_parse_from(["demo", "--acquire", "wait"]).is_err());
    }

    fn validated(args: &[&str]) -> Result<Args, String> {
        Args::try_parse_from(std::iter::once("demo").chain(args.iter().copied()))
            .unwrap()
            .validated()
    }

    #[test]
    fn the_command_line_is_refused_in_its_own_flags_before_any_replica_starts() {
        let short = validated(&["--check-interval", "10ms"]).unwrap_err();
        assert!(
            short.starts_with("--check-interval 10ms: 10ms is below the minimum of 50ms"),
            "{short}"
        );
        let long = validated(&["--check-interval", "30d"]).unwrap_err();
        assert!(long.starts_with("--check-interval 2592000s: "), "{long}");
        let queued = validated(&["--mechanism", "lease", "--acquire", "queue"]).unwrap_err();
        assert!(
            queued.contains("--acquire queue") && queued.ends_with("use --acquire poll"),
            "{queued}"
        );
        assert!(!queued.contains("AcquireMode"), "{queued}");
        // Zero is the default, and is shown as what runs.
        let zero = validated(&["--check-interval", "0s"]).unwrap();
        assert_eq!(zero.check_interval, Duration::from_secs(5));
        assert!(validated(&["--mechanism", "lease"]).is_ok());
        assert!(validated(&["--acquire", "queue"]).is_ok());
    }

    #[test]
    fn the_takeover_hint_gives_each_mechanism_its_bound() {
        let hint = |args: &[&str]| validated(args).unwrap().takeover_bound();
        assert_eq!(hint(&["--check-interval", "1s"]), "1s");
        assert_eq!(
            hint(&["--check-interval", "1s", "--mechanism", "lease"]),
            "4s (the lease's TTL of 3 intervals, plus one)"
        );
        assert_eq!(hint(&["--acquire", "queue"]), "a few milliseconds");
    }
}
