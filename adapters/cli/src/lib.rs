//! The `plexsphere-leader` command line: `plexsphere-leader status [--dsn <DSN>]
//! [--key CLASSID:OBJID] [--format text|json] [--timeout 10s]` prints who leads an election,
//! since when and from which client address, read from the server's views only
//! ([`status::who_leads`]). The DSN comes from `--dsn` or from the environment variable
//! `PLEXSPHERE_DSN` (so that a password need not show in `ps`).
//!
//! `plexsphere-leader shards --shards K [--class C] [--mechanism advisory|lease] [--schema S]
//! [--dsn <DSN>] [--format text|json]` prints who owns which shards of a shard space
//! ([`status::shard_owners`]; with `--mechanism lease`, [`status::lease_shard_owners`]); it
//! exits 0 when every shard is owned and 1 when some is not.
//!
//! `plexsphere-leader lease [--dsn <DSN>] [--key CLASSID:OBJID] [--schema public] [--format text|json]` prints
//! who holds a lease election's lease ([`Config::lease`](plexsphere_leader::Config::lease)) and
//! until when ([`status::lease_holder`]); it exits 0 while the lease is held and 1 when it is
//! not (expired, released, or never claimed).
//!
//! `plexsphere-leader verify [--mechanism advisory|lease] [--schema public] [--dsn <DSN>]
//! [--format text|json | --json] [--timeout 30s]` tells which mechanism can elect one leader
//! through an endpoint, and why ([`verify`]): the library's exclusion proof, recovery and
//! read-only sessions, `idle_session_timeout`, the lease tables and their privileges, the
//! clocks' offset and each mechanism's check round trip. It exits 0 when the configured
//! mechanism (`--mechanism`, advisory by default) can run there, 1 when it cannot.
//!
//! Exit codes: [`EXIT_LEADER`] (0) a replica leads, [`EXIT_NO_LEADER`] (1) none does,
//! [`EXIT_ERROR`] (2) the question could not be answered (bad arguments, connection or query
//! failure, no answer within the timeout). The DSN is never printed.
#![forbid(unsafe_code)]

pub mod candidates;
mod format;
pub mod lease;
pub mod shards;
pub mod verify;

pub use format::{format_duration, format_utc};

use std::ffi::OsString;
use std::io::Write;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};

use plexsphere_leader::LockKey;
use plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
use plexsphere_leader::status::{self, LeaderStatus, Since, StatusError};

/// How long `status` waits for the connection and the answer, unless `--timeout` says.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Exit code: a replica leads the election.
pub const EXIT_LEADER: u8 = 0;
/// Exit code: no replica leads the election (no session holds its lock).
pub const EXIT_NO_LEADER: u8 = 1;
/// Exit code: an error (bad arguments, connection or query failure).
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "plexsphere-leader",
    version,
    about = "Operate plexsphere-leader elections from the server's views",
    after_help = "Exit codes: 0 a replica leads (shards: every shard is owned; verify: the \
                  configured mechanism can run), 1 no replica leads (shards: some shard is \
                  not; verify: it cannot), 2 error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where and how every subcommand asks: the database, the output format and the timeout.
#[derive(Debug, Args)]
struct Endpoint {
    /// The database of the election or shard space, as a libpq-style DSN or URL
    /// (`host=db user=ops dbname=app` or `postgresql://ops@db/app`). No TLS.
    #[arg(long, env = "PLEXSPHERE_DSN", hide_env_values = true)]
    dsn: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// How long to wait for the connection and the answer together (`10s`, `500ms`, `2`
    /// for seconds); a server that accepts the connection and never answers fails after
    /// it with exit 2. A `connect_timeout` in the DSN (whole seconds, per host) bounds
    /// connecting on its own: the smaller of the two wins for connecting.
    #[arg(long, default_value = "10s", value_parser = parse_timeout)]
    timeout: Duration,
}

/// The election a subcommand asks about.
#[derive(Debug, Args)]
struct Election {
    /// The election's key; either half may be negative (`--key -17:4`).
    #[arg(
        long,
        default_value_t = LockKey::DEFAULT,
        value_name = "CLASSID:OBJID",
        allow_hyphen_values = true
    )]
    key: LockKey,
    /// The election's check interval (`Config::check_interval`): a ranked standby's candidacy
    /// is listed while it published it within two intervals.
    #[arg(long, default_value = "5s", value_parser = parse_timeout, value_name = "DURATION")]
    check_interval: Duration,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print who leads an election, since when and from which client address.
    Status {
        #[command(flatten)]
        election: Election,
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// Print who holds a lease election's lease and until when (the lease mechanism).
    Lease {
        #[command(flatten)]
        election: Election,
        /// The schema of the election's lease tables (`Config::lease_schema`).
        #[arg(long, default_value = plexsphere_leader::lease::DEFAULT_SCHEMA)]
        schema: String,
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// Print who owns which shards of a shard space (sharded leadership).
    Shards {
        /// The number of shards of the space (`K`: shards are `0..K`).
        #[arg(long)]
        shards: u32,
        /// The space's class id (may be negative).
        #[arg(
            long,
            default_value_t = DEFAULT_SHARD_CLASS,
            allow_hyphen_values = true
        )]
        class: i32,
        /// How the space is held: advisory locks (`pg_locks`), or leases (the member and owner
        /// rows of `ShardConfig::lease`, in `--schema`).
        #[arg(long, value_enum, default_value_t = Held::Advisory)]
        mechanism: Held,
        /// The schema of a lease space's tables (`ShardConfig::lease_schema`).
        #[arg(long, default_value = plexsphere_leader::lease::DEFAULT_SCHEMA)]
        schema: String,
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// Tell which mechanism can elect one leader through this endpoint, and why: a verdict
    /// (go or no-go, the reason and the fix) per mechanism. Read-only.
    #[command(
        after_help = "Exit codes: 0 the configured mechanism (--mechanism) can run through \
                      this endpoint, 1 it cannot, 2 error (connection, timeout)."
    )]
    Verify {
        /// The election's key (the lease row whose read is timed); either half may be
        /// negative.
        #[arg(
            long,
            default_value_t = LockKey::DEFAULT,
            value_name = "CLASSID:OBJID",
            allow_hyphen_values = true
        )]
        key: LockKey,
        /// The election's check interval (`Config::check_interval`): behind a pooler, a
        /// server restart plus the pooler's login retry must stay below it for a lease to
        /// survive the restart.
        #[arg(long, default_value = "5s", value_parser = parse_timeout, value_name = "DURATION")]
        check_interval: Duration,
        /// The mechanism the service is configured with: it decides the exit code.
        #[arg(long, value_enum, default_value_t = verify::Mechanism::Advisory)]
        mechanism: verify::Mechanism,
        /// The schema of the election's lease tables (`Config::lease_schema`).
        #[arg(long, default_value = plexsphere_leader::lease::DEFAULT_SCHEMA)]
        schema: String,
        /// The same as `--format json`.
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// The endpoint the service uses, as a libpq-style DSN or URL (`host=db user=ops
        /// dbname=app` or `postgresql://ops@pooler:6432/app`). No TLS.
        #[arg(long, env = "PLEXSPHERE_DSN", hide_env_values = true)]
        dsn: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// How long the whole verification may take (connect, every question, the exclusion
        /// proof); `30s`, `500ms`, `2` for seconds.
        #[arg(long, default_value = "30s", value_parser = parse_timeout)]
        timeout: Duration,
    },
}

/// How a shard space is held (`shards --mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Held {
    /// Advisory locks: the holders are the backends of `pg_locks`.
    Advisory,
    /// Leases: the holders are the live member rows.
    Lease,
}

/// How `status` prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Lines for people.
    Text,
    /// One JSON object on one line.
    Json,
}

/// Runs the command line `args` (the program name first), writing the answer to `out` and
/// errors to `err`; returns the exit code. What the binary's `main` does, callable in-process.
pub async fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            // `--help` and `--version` are answers (exit 0); anything else is a usage error.
            return if error.use_stderr() {
                let _ = write!(err, "{}", error.render());
                EXIT_ERROR
            } else {
                let _ = write!(out, "{}", error.render());
                0
            };
        }
    };
    match cli.command {
        Command::Verify {
            key,
            check_interval,
            mechanism,
            schema,
            json,
            dsn,
            format,
            timeout,
        } => {
            let format = if json { Format::Json } else { format };
            let target = verify::Target {
                key,
                schema,
                check_interval,
            };
            verify_command(out, err, &dsn, &target, mechanism, format, timeout).await
        }
        Command::Status {
            election: Election {
                key,
                check_interval,
            },
            endpoint:
                Endpoint {
                    dsn,
                    format,
                    timeout,
                },
        } => {
            let database = database_of(&dsn);
            let live = check_interval * 2;
            let asked = ask_within(&dsn, timeout, |client| async move {
                let leader = status::who_leads(&client, key).await?;
                let published = status::Published::Sessions;
                let candidates = status::candidates(&client, key, published, live).await?;
                Ok((leader, candidates))
            })
            .await;
            conclude(
                out,
                err,
                asked,
                |(leader, found)| match format {
                    Format::Text => {
                        candidates::append_text(render_text(key, &database, leader.as_ref()), found)
                    }
                    Format::Json => candidates::append_json(
                        &render_json(key, &database, leader.as_ref()),
                        found,
                    ),
                },
                |(leader, _)| leader.is_some(),
            )
        }
        Command::Lease {
            election: Election {
                key,
                check_interval,
            },
            schema,
            endpoint:
                Endpoint {
                    dsn,
                    format,
                    timeout,
                },
        } => {
            let database = database_of(&dsn);
            let live = check_interval * 2;
            let asked = ask_within(&dsn, timeout, |client| async move {
                let lease = status::lease_holder(&client, &schema, key).await?;
                let published = status::Published::Rows { schema: &schema };
                // A lease set up before ranks existed has no candidate table: no candidates.
                let candidates = status::candidates(&client, key, published, live)
                    .await
                    .unwrap_or_default();
                Ok((lease, candidates))
            })
            .await;
            conclude(
                out,
                err,
                asked,
                |(lease, found)| match format {
                    Format::Text => candidates::append_text(
                        lease::render_text(key, &database, lease.as_ref()),
                        found,
                    ),
                    Format::Json => candidates::append_json(
                        &lease::render_json(key, &database, lease.as_ref()),
                        found,
                    ),
                },
                |(lease, _)| lease.as_ref().is_some_and(|lease| lease.held),
            )
        }
        Command::Shards {
            shards,
            class,
            mechanism,
            schema,
            endpoint:
                Endpoint {
                    dsn,
                    format,
                    timeout,
                },
        } => {
            let database = database_of(&dsn);
            let rows = match query_owners(&dsn, class, shards, mechanism, &schema, timeout).await {
                Ok(rows) => rows,
                Err(QueryStatusError::Status(error)) => {
                    let _ = writeln!(err, "plexsphere-leader {error}");
                    return EXIT_ERROR;
                }
                Err(QueryStatusError::ConnectTimedOut(after)) => {
                    let _ = writeln!(
                        err,
                        "plexsphere-leader shards: no connection within {after:?} (the DSN's \
                         connect_timeout)"
                    );
                    return EXIT_ERROR;
                }
                Err(QueryStatusError::TimedOut(after)) => {
                    let _ = writeln!(err, "plexsphere-leader shards: no answer within {after:?}");
                    return EXIT_ERROR;
                }
            };
            let space = shards::Space::new(class, shards, &database, rows);
            let text = match format {
                Format::Text => space.render_text(),
                Format::Json => space.render_json(),
            };
            if writeln!(out, "{text}").is_err() {
                return EXIT_ERROR;
            }
            if space.unowned().is_empty() {
                EXIT_LEADER
            } else {
                EXIT_NO_LEADER
            }
        }
    }
}

/// `verify`: the verdicts on `out`, [`EXIT_LEADER`] when `mechanism` can run,
/// [`EXIT_NO_LEADER`] when it cannot, [`EXIT_ERROR`] when the endpoint could not be asked.
async fn verify_command(
    out: &mut dyn Write,
    err: &mut dyn Write,
    dsn: &str,
    target: &verify::Target,
    mechanism: verify::Mechanism,
    format: Format,
    timeout: Duration,
) -> u8 {
    let observed = match verify::observe(dsn, target, timeout).await {
        Ok(observed) => observed,
        Err(error) => {
            let _ = writeln!(err, "plexsphere-leader {error}");
            return EXIT_ERROR;
        }
    };
    let text = match format {
        Format::Text => verify::render_text(&observed, mechanism),
        Format::Json => verify::render_json(&observed, mechanism),
    };
    if writeln!(out, "{text}").is_err() {
        return EXIT_ERROR;
    }
    let (advisory, lease) = verify::judge(&observed);
    if verify::configured(mechanism, &advisory, &lease) {
        EXIT_LEADER
    } else {
        EXIT_NO_LEADER
    }
}

/// The end of `status` and `lease`: the answer, rendered by `render`, on `out`, and
/// [`EXIT_LEADER`] when `held` says it is held, [`EXIT_NO_LEADER`] otherwise; an error (whose
/// text starts `status: `) on `err`, or an `out` that cannot be written, is [`EXIT_ERROR`].
fn conclude<T>(
    out: &mut dyn Write,
    err: &mut dyn Write,
    asked: Result<T, QueryStatusError>,
    render: impl FnOnce(&T) -> String,
    held: impl FnOnce(&T) -> bool,
) -> u8 {
    match asked {
        Ok(answer) => {
            if writeln!(out, "{}", render(&answer)).is_err() {
                return EXIT_ERROR;
            }
            if held(&answer) {
                EXIT_LEADER
            } else {
                EXIT_NO_LEADER
            }
        }
        Err(error) => {
            // Its text is the whole chain of causes, each once (no `source()`).
            let _ = writeln!(err, "plexsphere-leader {error}");
            EXIT_ERROR
        }
    }
}

async fn query_owners(
    dsn: &str,
    class: i32,
    count: u32,
    mechanism: Held,
    schema: &str,
    timeout: Duration,
) -> Result<Vec<plexsphere_leader::status::OwnerRow>, QueryStatusError> {
    let schema = schema.to_owned();
    ask_within(dsn, timeout, |client| async move {
        match mechanism {
            Held::Advisory => status::shard_owners(&client, class, count).await,
            Held::Lease => status::lease_shard_owners(&client, &schema, class, count).await,
        }
    })
    .await
}

/// Connects with `dsn` and runs `ask` on the client, all within `timeout` (connecting also
/// within the DSN's `connect_timeout` when that is smaller); the connection is closed either
/// way.
async fn ask_within<T, F, Fut>(dsn: &str, timeout: Duration, ask: F) -> Result<T, QueryStatusError>
where
    F: FnOnce(std::sync::Arc<Client>) -> Fut,
    Fut: std::future::Future<Output = Result<T, StatusError>>,
{
    let deadline = Instant::now() + timeout;
    let (client, driver) = connect_within(dsn, timeout).await?;
    let client = std::sync::Arc::new(client);
    let asked = async {
        let answer = ask(std::sync::Arc::clone(&client)).await;
        drop(client);
        let _ = driver.await;
        answer
    };
    match tokio::time::timeout_at(deadline, asked).await {
        Ok(answer) => answer.map_err(QueryStatusError::Status),
        Err(_elapsed) => Err(QueryStatusError::TimedOut(timeout)),
    }
}

/// Why [`query_status_within`] had no answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum QueryStatusError {
    /// The DSN is invalid, the connection failed or the query did.
    Status(StatusError),
    /// No session within the DSN's `connect_timeout` (counted per host the DSN names), which
    /// was smaller than the timeout: a server that accepts TCP and never answers the startup.
    ConnectTimedOut(Duration),
    /// Neither failed nor answered within the timeout (a server that accepts TCP and never
    /// answers, a network that drops everything).
    TimedOut(Duration),
}

impl std::fmt::Display for QueryStatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status(error) => error.fmt(f),
            Self::ConnectTimedOut(after) => write!(
                f,
                "status: no connection within {after:?} (the DSN's connect_timeout); raise \
                 connect_timeout if the server is slow"
            ),
            Self::TimedOut(after) => write!(
                f,
                "status: no answer within {after:?} (connect and query); raise --timeout if \
                 the server is slow"
            ),
        }
    }
}

impl std::error::Error for QueryStatusError {}

/// Connects with `dsn` (no TLS) and asks [`status::who_leads`], all within `timeout`;
/// connecting alone is also bounded by the DSN's `connect_timeout` when that is smaller.
///
/// # Errors
/// [`QueryStatusError::Status`] when the DSN is invalid, the connection fails or the query
/// does; [`QueryStatusError::ConnectTimedOut`] when no session came within the DSN's
/// `connect_timeout`; [`QueryStatusError::TimedOut`] when no answer came within `timeout`.
/// The connection is closed either way.
pub async fn query_status_within(
    dsn: &str,
    key: LockKey,
    timeout: Duration,
) -> Result<Option<LeaderStatus>, QueryStatusError> {
    ask_within(dsn, timeout, |client| async move {
        status::who_leads(&client, key).await
    })
    .await
}

/// The driver task of a connection: it ends when the client is dropped.
type Driver = JoinHandle<Result<(), tokio_postgres::Error>>;

/// Connects with `dsn` (no TLS, startup and authentication included) within the smaller of
/// `timeout` and the DSN's `connect_timeout`, and spawns the connection's driver.
async fn connect_within(
    dsn: &str,
    timeout: Duration,
) -> Result<(Client, Driver), QueryStatusError> {
    let config = tokio_postgres::Config::from_str(dsn)
        .map_err(|error| QueryStatusError::Status(error.into()))?;
    let bound = connect_bound(&config, timeout);
    match tokio::time::timeout(bound.limit(), config.connect(NoTls)).await {
        Ok(Ok((client, connection))) => Ok((client, tokio::spawn(connection))),
        Ok(Err(error)) => Err(QueryStatusError::Status(error.into())),
        Err(_elapsed) => Err(bound.elapsed()),
    }
}

/// What bounds connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectBound {
    /// The whole command's `--timeout`.
    Command(Duration),
    /// The DSN's `connect_timeout`, once per host, smaller than `--timeout`.
    Dsn(Duration),
}

impl ConnectBound {
    pub(crate) fn limit(self) -> Duration {
        match self {
            Self::Command(limit) | Self::Dsn(limit) => limit,
        }
    }

    fn elapsed(self) -> QueryStatusError {
        match self {
            Self::Command(limit) => QueryStatusError::TimedOut(limit),
            Self::Dsn(limit) => QueryStatusError::ConnectTimedOut(limit),
        }
    }
}

/// The smaller of `timeout` and the DSN's `connect_timeout`. tokio-postgres applies
/// `connect_timeout` to the TCP connect of each address only, so a server that completes the
/// handshake and never answers the startup would otherwise hold the command until `timeout`;
/// libpq counts it per host tried, and so does this bound.
pub(crate) fn connect_bound(config: &tokio_postgres::Config, timeout: Duration) -> ConnectBound {
    let hosts = config
        .get_hosts()
        .len()
        .max(config.get_hostaddrs().len())
        .max(1);
    let per_dsn = config
        .get_connect_timeout()
        .map(|per_host| per_host.saturating_mul(u32::try_from(hosts).unwrap_or(u32::MAX)));
    match per_dsn {
        Some(limit) if limit < timeout => ConnectBound::Dsn(limit),
        _ => ConnectBound::Command(timeout),
    }
}

/// `10s`, `500ms`, `1.5s` or a plain number of seconds; more than zero.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 0.001)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1.0)
    } else {
        (text, 1.0)
    };
    let seconds = number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|value| value.is_finite() && *value > 0.0)
        .ok_or_else(|| format!("{text:?} is not a positive duration like 10s or 500ms"))?;
    Duration::try_from_secs_f64(seconds * scale).map_err(|error| error.to_string())
}

/// The database the DSN names (the user's name when it names none, as libpq does).
fn database_of(dsn: &str) -> String {
    tokio_postgres::Config::from_str(dsn)
        .ok()
        .and_then(|config| config.get_dbname().or(config.get_user()).map(str::to_owned))
        .unwrap_or_default()
}

/// The `text` answer: one headline, then indented details.
pub fn render_text(key: LockKey, database: &str, leader: Option<&LeaderStatus>) -> String {
    let Some(leader) = leader else {
        return format!("election {key} on database {database:?}: no replica leads");
    };
    let name = leader
        .identity
        .as_deref()
        .or(leader.application_name.as_deref())
        .unwrap_or("?");
    let since = match leader.since {
        Since::Granted(at) => format!(
            "{} (leading for {}; grant time in application_name, server clock)",
            format_utc(at),
            leading_for(leader)
        ),
        Since::SessionStart(at) => format!(
            "at or before {} (leading for at least {}; no grant time in application_name, \
             the session's backend_start is a lower bound)",
            format_utc(at),
            leading_for(leader)
        ),
        Since::Unknown => "unknown (no grant time in application_name, and backend_start is \
                           not visible to this role)"
            .to_owned(),
    };
    let client = match (&leader.client_addr, leader.client_port) {
        (Some(addr), Some(port)) if port >= 0 => format!("{addr}:{port}"),
        (Some(addr), _) => addr.clone(),
        (None, Some(-1)) => "local (Unix socket)".to_owned(),
        (None, _) => "not visible to this role (needs pg_read_all_stats)".to_owned(),
    };
    let queued = if leader.waiting.is_empty() {
        "none".to_owned()
    } else {
        let pids: Vec<String> = leader.waiting.iter().map(i32::to_string).collect();
        format!("pids {}", pids.join(", "))
    };
    format!(
        "election {key} on database {database:?}: led by {name:?}\n  \
         since:   {since}\n  \
         backend: pid {pid}, user {user}\n  \
         client:  {client}\n  \
         queued:  {queued}",
        pid = leader.pid,
        user = leader.user.as_deref().unwrap_or("?"),
    )
}

fn leading_for(leader: &LeaderStatus) -> String {
    leader
        .leading_for()
        .map_or_else(|| "?".to_owned(), format_duration)
}

/// The `json` answer: one object, `leader` null when no replica leads.
pub fn render_json(key: LockKey, database: &str, leader: Option<&LeaderStatus>) -> String {
    let leader = leader.map(|leader| {
        let (source, since) = match leader.since {
            Since::Granted(at) => ("granted", Some(at)),
            Since::SessionStart(at) => ("session_start", Some(at)),
            Since::Unknown => ("unknown", None),
        };
        serde_json::json!({
            "pid": leader.pid,
            "identity": leader.identity,
            "application_name": leader.application_name,
            "since": since.map(format_utc),
            "since_unix": since.map(unix_seconds),
            "since_source": source,
            "leading_for_seconds": leader.leading_for().map(|d| d.as_secs()),
            "client_addr": leader.client_addr,
            "client_port": leader.client_port,
            "user": leader.user,
            "waiting": leader.waiting,
            "server_now": format_utc(leader.server_now),
        })
    });
    serde_json::json!({
        "key": key.to_string(),
        "database": database,
        "leader": leader,
    })
    .to_string()
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn leader() -> LeaderStatus {
        let now = UNIX_EPOCH + Duration::from_secs(1_795_966_879);
        LeaderStatus {
            key: LockKey::DEFAULT,
            pid: 4242,
            application_name: Some("scheduler@web-1 since 1795966800".to_owned()),
            identity: Some("scheduler@web-1".to_owned()),
            since: Since::Granted(now - Duration::from_secs(79)),
            client_addr: Some("10.0.0.5".to_owned()),
            client_port: Some(53_422),
            user: Some("app".to_owned()),
            waiting: vec![4243],
            server_now: now,
        }
    }

    #[test]
    fn timeouts_read_as_seconds_or_milliseconds() {
        assert_eq!(parse_timeout("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["0", "-1s", "soon", "", "infs"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_smaller_of_timeout_and_the_dsns_connect_timeout_bounds_connecting() {
        let bound = |dsn: &str, timeout: u64| {
            let config = tokio_postgres::Config::from_str(dsn).unwrap();
            connect_bound(&config, Duration::from_secs(timeout))
        };
        let secs = Duration::from_secs;
        assert_eq!(bound("host=a", 10), ConnectBound::Command(secs(10)));
        assert_eq!(
            bound("host=a connect_timeout=1", 30),
            ConnectBound::Dsn(secs(1))
        );
        assert_eq!(
            bound("host=a connect_timeout=20", 5),
            ConnectBound::Command(secs(5))
        );
        assert_eq!(
            bound("host=a,b connect_timeout=2", 30),
            ConnectBound::Dsn(secs(4))
        );
        assert_eq!(
            bound("host=a connect_timeout=0", 5),
            ConnectBound::Command(secs(5))
        );
        assert_eq!(
            bound("postgresql://x@a/db?connect_timeout=3", 10),
            ConnectBound::Dsn(secs(3))
        );
    }

    #[test]
    fn the_dsn_may_come_from_the_environment_only() {
        let parsed = Cli::try_parse_from(["plexsphere-leader", "status"]);
        let has_env = std::env::var_os("PLEXSPHERE_DSN").is_some();
        assert_eq!(
            parsed.is_ok(),
            has_env,
            "no --dsn: only PLEXSPHERE_DSN supplies it"
        );
        let Command::Status {
            endpoint: Endpoint { timeout, .. },
            ..
        } = Cli::try_parse_from(["plexsphere-leader", "status", "--dsn", "host=x"])
            .unwrap()
            .command
        else {
            panic!("status parses as status");
        };
        assert_eq!(timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn the_text_answer_names_the_leader_since_when_and_from_where() {
        assert_eq!(
            render_text(LockKey::DEFAULT, "app", Some(&leader())),
            "election 1886156915:1 on database \"app\": led by \"scheduler@web-1\"\n  \
             since:   2026-11-29T15:40:00Z (leading for 1m 19s; grant time in \
             application_name, server clock)\n  \
             backend: pid 4242, user app\n  \
             client:  10.0.0.5:53422\n  \
             queued:  pids 4243"
        );
        assert_eq!(
            render_text(LockKey::new(7, 8), "app", None),
            "election 7:8 on database \"app\": no replica leads"
        );
    }

    #[test]
    fn the_json_answer_is_one_object() {
        let value: serde_json::Value =
            serde_json::from_str(&render_json(LockKey::DEFAULT, "app", Some(&leader())))
                .expect("json");
        assert_eq!(value["key"], "1886156915:1");
        assert_eq!(value["leader"]["identity"], "scheduler@web-1");
        assert_eq!(value["leader"]["since_unix"], 1_795_966_800);
        assert_eq!(value["leader"]["since_source"], "granted");
        assert_eq!(value["leader"]["leading_for_seconds"], 79);
        let none: serde_json::Value =
            serde_json::from_str(&render_json(LockKey::DEFAULT, "app", None)).expect("json");
        assert!(none["leader"].is_null());
    }

    #[test]
    fn verify_takes_json_as_an_alias_of_format_json_and_defaults_to_advisory() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(
                ["plexsphere-leader", "verify", "--dsn", "host=x"]
                    .iter()
                    .chain(args),
            )
        };
        let Command::Verify {
            json,
            mechanism,
            timeout,
            ..
        } = parse(&["--json"]).unwrap().command
        else {
            panic!("verify parses as verify");
        };
        assert!(json);
        assert_eq!(mechanism, verify::Mechanism::Advisory);
        assert_eq!(timeout, Duration::from_secs(30));
        assert!(parse(&["--json", "--format", "text"]).is_err());
        assert!(parse(&["--mechanism", "lease", "--format", "json"]).is_ok());
        assert!(parse(&["--mechanism", "lock"]).is_err());
    }

    #[tokio::test]
    async fn bad_arguments_exit_2_and_help_exits_0() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(["plexsphere-leader", "status"], &mut out, &mut err).await;
        assert_eq!(code, EXIT_ERROR);
        assert!(String::from_utf8_lossy(&err).contains("--dsn"));
        let code = run(
            ["plexsphere-leader", "status", "--dsn", "x", "--key", "1"],
            &mut out,
            &mut err,
        )
        .await;
        assert_eq!(code, EXIT_ERROR);
        let mut help = Vec::new();
        let code = run(["plexsphere-leader", "--help"], &mut help, &mut err).await;
        assert_eq!(code, 0);
        assert!(String::from_utf8_lossy(&help).contains("Exit codes"));
    }
}

/// Compiles the package README's example.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
