//! `plexsphere-leader verify`: which election mechanism works through an endpoint, and why.
//!
//! [`observe`] asks the endpoint, read-only, what each mechanism depends on: the library's own
//! exclusion proof ([`plexsphere_leader::status::prove_exclusion`], the proof an advisory run
//! makes before its first attempt: whether the endpoint multiplexes sessions and whether its
//! advisory lock excludes), whether `idle_session_timeout` can be set, whether the server is in
//! recovery or the session read-only, the lease tables and this role's privileges on them, the
//! offset between the client's and the server's clocks and the round trip of each mechanism's
//! check. [`judge`] turns what it observed into a [`Judgement`] per mechanism (go or no-go, the
//! reason and the fix); [`render_text`] and [`render_json`] print them.
//!
//! Nothing is created or changed on the server: the proof's short-lived advisory key (released
//! before it ends) and a transaction-local `set_config` are all it takes; every statement is
//! a simple-protocol query, so it runs through any pooler.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use plexsphere_leader::LockKey;
use plexsphere_leader::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use plexsphere_leader::session::{CheckError, PoolSessions};
use plexsphere_leader::sql::{self, quote_literal};
use plexsphere_leader::status::prove_exclusion;
use plexsphere_leader_core::LockFinding;
use plexsphere_leader_core::proof::{SecondSession, Verdict};
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};

/// How long the proof's second session may take to answer, at most (half the remaining
/// `--timeout` when that is shorter): an elector gives it half an interval.
pub const SECOND_WITHIN: Duration = Duration::from_secs(5);

/// How many times each round trip is timed; the median is reported.
const SAMPLES: usize = 5;

/// The advisory mechanism's check (`sql::verify`) without its re-entrant try of the
/// election's lock, which would take the lock of a live election, and without its stamp: the
/// same round trip, the same kind of answer.
fn advisory_check() -> String {
    format!(
        "SELECT pg_backend_pid(), pg_is_in_recovery(), current_setting('{}', true)",
        sql::SESSION_MARKER
    )
}

/// What the server says about itself and this session, in one row.
const SERVER_FACTS: &str = "SELECT current_setting('server_version_num'), \
     current_setting('server_version'), pg_is_in_recovery(), \
     current_setting('transaction_read_only'), current_user, current_database(), \
     inet_server_port()";

/// The setting an advisory grant bounds its session with, set for the statement's implicit
/// transaction only.
const IDLE_SESSION_TIMEOUT: &str = "SELECT set_config('idle_session_timeout', '20000', true)";

/// The server's clock, as unix seconds with microseconds.
const SERVER_CLOCK: &str = "SELECT date_part('epoch', clock_timestamp())";

/// The mechanism a service is configured with (`verify --mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mechanism {
    /// The session advisory lock (the default): a direct or session-mode endpoint.
    Advisory,
    /// The lease row (`Config::lease`): any endpoint, transaction-mode poolers included.
    Lease,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Self::Advisory => "advisory",
            Self::Lease => "lease",
        }
    }
}

/// What the exclusion proof concluded
/// ([`PoolProof::verdict`](plexsphere_leader_core::proof::PoolProof::verdict)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// Two server sessions of their own, and the lock refused the second while the first held
    /// it.
    Proven,
    /// One server session only, the first's own: a second client was queued for it while the
    /// first answered (a session-mode pooler with one server session). An elector leads here;
    /// the lock's exclusion could not be tested with one server session.
    ProvenAlone,
    /// The advisory lock cannot elect one leader here, for this finding.
    Refuted(LockFinding),
    /// Nothing was proven, for this reason (an elector tries again at its next check).
    Inconclusive(String),
    /// A statement of the proof failed with this error.
    Failed(String),
}

impl Proof {
    /// Whether the proof found that the endpoint multiplexes sessions (`Some(true)`), found
    /// two sessions of their own (`Some(false)`), or could not tell (`None`).
    pub fn multiplexed(&self) -> Option<bool> {
        match self {
            Self::Proven | Self::ProvenAlone => Some(false),
            Self::Refuted(finding) => Some(finding.proves_multiplexing()),
            Self::Inconclusive(_) | Self::Failed(_) => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Proven | Self::ProvenAlone => "proven",
            Self::Refuted(_) => "refuted",
            Self::Inconclusive(_) => "inconclusive",
            Self::Failed(_) => "failed",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::Proven => "two server sessions of their own; the lock refused the second \
                             while the first held it"
                .to_owned(),
            Self::ProvenAlone => "one server session, the first's own: a second client waited \
                                  for it while the first answered (the lock's exclusion cannot \
                                  be tested with one server session)"
                .to_owned(),
            Self::Refuted(finding) => finding.to_string(),
            Self::Inconclusive(why) => format!("proved nothing: {why}"),
            Self::Failed(error) => format!("failed: {error}"),
        }
    }
}

/// A lease table and what this role may do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTable {
    /// The table's name, qualified with its schema.
    pub name: String,
    /// Whether every lease election needs it (the lease and fence tables); the others serve
    /// ranked replicas only (`Config::version`).
    pub required: bool,
    /// Whether it exists (a table in the schema).
    pub exists: bool,
    /// `SELECT`, `INSERT` and `UPDATE` on it, in that order: what the claim, the renewal and
    /// the release need.
    pub privileges: [bool; 3],
}

impl LeaseTable {
    /// The privileges it lacks, by name.
    pub fn missing(&self) -> Vec<&'static str> {
        ["SELECT", "INSERT", "UPDATE"]
            .into_iter()
            .zip(self.privileges)
            .filter_map(|(name, held)| (!held).then_some(name))
            .collect()
    }
}

/// The lease schema and this role's privileges on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaAccess {
    /// `USAGE`: the statements can name its tables.
    pub usage: bool,
    /// `CREATE`: `lease::setup` can create the tables with this role.
    pub create: bool,
}

/// A client port that differs from the port the server listens on: something forwards the
/// connection (a pooler, a proxy, a port forward).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    /// The port the DSN connects to.
    pub client_port: u16,
    /// The port the server's backend says it accepted the connection on.
    pub server_port: u16,
}

/// The server's clock minus the client's, read at the midpoint of the fastest of several
/// round trips.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockOffset {
    /// Server minus client, in milliseconds (positive: the server's clock is ahead).
    pub offset_ms: f64,
    /// Half that round trip: the offset is known to within it.
    pub uncertainty: Duration,
}

/// Everything [`observe`] learned about an endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The database the session is on.
    pub database: String,
    /// The session's role (`current_user`).
    pub user: String,
    /// `server_version`, as the server spells it.
    pub server_version: String,
    /// `server_version_num` (150004 for 15.4).
    pub server_version_num: u32,
    /// `pg_is_in_recovery()`: a hot standby.
    pub in_recovery: bool,
    /// `transaction_read_only` of a new transaction (a role's or database's
    /// `default_transaction_read_only`, or a standby).
    pub read_only: bool,
    /// Whether `idle_session_timeout` can be set, or the server's error.
    pub idle_session_timeout: Result<(), String>,
    /// The exclusion proof's conclusion.
    pub proof: Proof,
    /// How long the proof took.
    pub proof_took: Duration,
    /// The connection is forwarded (the server's port is not the DSN's), when that shows.
    pub forwarded: Option<Forwarded>,
    /// The offset between the clocks.
    pub clock: ClockOffset,
    /// The median round trip of the advisory mechanism's check.
    pub advisory_round_trip: Duration,
    /// The median round trip of a read of the lease row, when the lease table can be read.
    pub lease_round_trip: Option<Duration>,
    /// The lease schema asked about.
    pub schema: String,
    /// The schema's privileges, `None` when it does not exist.
    pub schema_access: Option<SchemaAccess>,
    /// The lease tables.
    pub lease_tables: Vec<LeaseTable>,
    /// The election's check interval (`--check-interval`), for the pooler's advice.
    pub check_interval: Duration,
    /// How long the whole verification took.
    pub took: Duration,
}

/// A mechanism's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// Whether the mechanism can elect one leader through this endpoint.
    pub go: bool,
    /// Why.
    pub reason: String,
    /// What to do about a no-go.
    pub fix: Option<String>,
    /// What else an operator should know.
    pub notes: Vec<String>,
}

impl Judgement {
    fn go(reason: impl Into<String>) -> Self {
        Self {
            go: true,
            reason: reason.into(),
            fix: None,
            notes: Vec::new(),
        }
    }

    fn no_go(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            go: false,
            reason: reason.into(),
            fix: Some(fix.into()),
            notes: Vec::new(),
        }
    }
}

/// Why [`observe`] could not finish.
#[derive(Debug)]
#[non_exhaustive]
pub enum VerifyError {
    /// The DSN is invalid, the connection failed, or a statement every mechanism depends on
    /// failed.
    Query(CheckError),
    /// No session within the DSN's `connect_timeout`, which was smaller than `--timeout`.
    ConnectTimedOut(Duration),
    /// The verification did not finish within `--timeout` (the first duration), while it
    /// waited for this.
    TimedOut(Duration, &'static str),
    /// The server answered something a PostgreSQL server does not.
    Unexpected(String),
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Query(cause) => write!(f, "verify: {cause}"),
            Self::ConnectTimedOut(after) => write!(
                f,
                "verify: no connection within {after:?} (the DSN's connect_timeout)"
            ),
            Self::TimedOut(after, waiting_for) => write!(
                f,
                "verify: not finished within {after:?}: no answer to {waiting_for}; raise \
                 --timeout if the server is slow"
            ),
            Self::Unexpected(what) => write!(f, "verify: unexpected answer: {what}"),
        }
    }
}

impl std::error::Error for VerifyError {}

impl From<tokio_postgres::Error> for VerifyError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Query(error.into())
    }
}

/// What to ask: the election and its lease schema.
#[derive(Debug, Clone)]
pub struct Target {
    /// The election's key (the lease row read for the lease's round trip).
    pub key: LockKey,
    /// The lease tables' schema.
    pub schema: String,
    /// The election's check interval.
    pub check_interval: Duration,
}

/// Asks the endpoint of `dsn` (no TLS) everything [`judge`] needs, all within `timeout`
/// (connecting also within the DSN's `connect_timeout` when that is smaller). Read-only; the
/// connections are closed when it returns.
///
/// # Errors
/// [`VerifyError::Query`] when the DSN is invalid, the connection fails or a statement every
/// mechanism depends on fails; [`VerifyError::ConnectTimedOut`] and
/// [`VerifyError::TimedOut`] when the bounds ran out; [`VerifyError::Unexpected`] for an
/// answer of another shape.
pub async fn observe(
    dsn: &str,
    target: &Target,
    timeout: Duration,
) -> Result<Observed, VerifyError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let config =
        tokio_postgres::Config::from_str(dsn).map_err(|error| VerifyError::Query(error.into()))?;
    let bound = crate::connect_bound(&config, timeout);
    let connected = tokio::time::timeout(bound.limit(), config.connect(NoTls)).await;
    let (client, connection) = match connected {
        Ok(connected) => connected?,
        Err(_elapsed) => {
            return Err(match bound {
                crate::ConnectBound::Dsn(limit) => VerifyError::ConnectTimedOut(limit),
                crate::ConnectBound::Command(limit) => {
                    VerifyError::TimedOut(limit, "the connection's startup")
                }
            });
        }
    };
    let driver = tokio::spawn(connection);
    let asked = tokio::time::timeout_at(deadline, ask(&client, &config, target)).await;
    // Closed before the proof, so that the proof's two sessions are all this command holds
    // (a session-mode pooler's pool of two then suffices).
    drop(client);
    let _ = driver.await;
    let mut observed = asked.map_err(|_elapsed| {
        VerifyError::TimedOut(
            timeout,
            "the questions on the first connection (a pooler whose server sessions are all in \
             use queues it)",
        )
    })??;
    let second_within = SECOND_WITHIN.min(deadline.saturating_duration_since(Instant::now()) / 2);
    let proving = Instant::now();
    observed.proof = tokio::time::timeout_at(deadline, prove(&config, second_within))
        .await
        .map_err(|_elapsed| {
            VerifyError::TimedOut(
                timeout,
                "the exclusion proof's first pooled connection (a pooler whose server sessions \
                 are all in use queues it)",
            )
        })?;
    observed.proof_took = proving.elapsed();
    observed.took = started.elapsed();
    Ok(observed)
}

/// Every question but the proof, on `client` (the proof's fields are left for [`observe`]).
async fn ask(
    client: &Client,
    config: &tokio_postgres::Config,
    target: &Target,
) -> Result<Observed, VerifyError> {
    let facts = first_row(client, SERVER_FACTS).await?;
    let idle_session_timeout = client
        .simple_query(IDLE_SESSION_TIMEOUT)
        .await
        .map(drop)
        .map_err(|error| CheckError::from(error).to_string());
    let clock = clock_offset(client).await?;
    let advisory_round_trip = median_round_trip(client, &advisory_check()).await?;
    let (schema_access, lease_tables) = lease_access(client, &target.schema).await?;
    let readable = lease_tables
        .first()
        .is_some_and(|table| table.exists && table.privileges[0])
        && schema_access.is_some_and(|access| access.usage);
    let lease_round_trip = if readable {
        let who = sql::lease::who_holds(&target.schema, target.key);
        Some(median_round_trip(client, &who).await?)
    } else {
        None
    };
    Ok(Observed {
        database: text(&facts, 5)?,
        user: text(&facts, 4)?,
        server_version: text(&facts, 1)?,
        server_version_num: number(&facts, 0)?,
        in_recovery: text(&facts, 2)? == "t",
        read_only: text(&facts, 3)? == "on",
        idle_session_timeout,
        proof: Proof::Inconclusive("the proof did not run".to_owned()),
        proof_took: Duration::ZERO,
        forwarded: forwarded(config, facts.get(6).cloned().flatten()),
        clock,
        advisory_round_trip,
        lease_round_trip,
        schema: target.schema.clone(),
        schema_access,
        lease_tables,
        check_interval: target.check_interval,
        took: Duration::ZERO,
    })
}

/// The library's exclusion proof on a pool of one connection of `config` (the second session
/// is opened outside it, as an elector's is).
async fn prove(config: &tokio_postgres::Config, second_within: Duration) -> Proof {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = match Pool::builder(manager).max_size(1).build() {
        Ok(pool) => pool,
        Err(error) => return Proof::Failed(error.to_string()),
    };
    let sessions = PoolSessions::new(pool.clone());
    let proof = match prove_exclusion(&sessions, second_within).await {
        Ok(proof) => match (
            matches!(proof.second, SecondSession::QueuedBehindFirst { .. }),
            proof.verdict(),
        ) {
            (true, Verdict::Proven) => Proof::ProvenAlone,
            (_, Verdict::Proven) => Proof::Proven,
            (_, Verdict::Refuted(finding)) => Proof::Refuted(finding),
            (_, Verdict::Inconclusive(why)) => Proof::Inconclusive(why.to_string()),
        },
        Err(error) => Proof::Failed(error.to_string()),
    };
    drop(sessions);
    pool.close();
    proof
}

/// The server's clock against the client's, at the midpoint of the fastest of [`SAMPLES`]
/// reads.
async fn clock_offset(client: &Client) -> Result<ClockOffset, VerifyError> {
    let mut best: Option<(Duration, f64)> = None;
    for _ in 0..SAMPLES {
        let sent = SystemTime::now();
        let timer = Instant::now();
        let row = first_row(client, SERVER_CLOCK).await?;
        let round_trip = timer.elapsed();
        let server: f64 = text(&row, 0)?
            .parse()
            .map_err(|_| VerifyError::Unexpected("the server's clock".to_owned()))?;
        let midpoint = (sent + round_trip / 2)
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        let offset_ms = (server - midpoint) * 1000.0;
        if best.is_none_or(|(fastest, _)| round_trip < fastest) {
            best = Some((round_trip, offset_ms));
        }
    }
    let (round_trip, offset_ms) = best.unwrap_or_default();
    Ok(ClockOffset {
        offset_ms,
        uncertainty: round_trip / 2,
    })
}

/// The median of [`SAMPLES`] round trips of `statement`.
async fn median_round_trip(client: &Client, statement: &str) -> Result<Duration, VerifyError> {
    let mut times = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let timer = Instant::now();
        client.simple_query(statement).await?;
        times.push(timer.elapsed());
    }
    times.sort_unstable();
    Ok(times[SAMPLES / 2])
}

/// The lease schema's privileges (`None`: no such schema) and each lease table's.
async fn lease_access(
    client: &Client,
    schema: &str,
) -> Result<(Option<SchemaAccess>, Vec<LeaseTable>), VerifyError> {
    let quoted = quote_literal(schema);
    let access = rows(
        client,
        &format!(
            "SELECT has_schema_privilege(oid, 'USAGE'), has_schema_privilege(oid, 'CREATE') \
             FROM pg_catalog.pg_namespace WHERE nspname = {quoted}"
        ),
    )
    .await?
    .first()
    .map(|row| SchemaAccess {
        usage: flag(row, 0),
        create: flag(row, 1),
    });
    let tables = rows(client, &lease_tables_query(&quoted)).await?;
    let tables = tables
        .iter()
        .map(|row| {
            Ok(LeaseTable {
                name: format!("{schema}.{}", text(row, 0)?),
                required: flag(row, 1),
                exists: flag(row, 2),
                privileges: [flag(row, 3), flag(row, 4), flag(row, 5)],
            })
        })
        .collect::<Result<_, VerifyError>>()?;
    Ok((access, tables))
}

/// Each lease table of the schema `quoted_schema` (a SQL literal): its name, whether every
/// lease election needs it, whether it exists and this role's `SELECT`, `INSERT`, `UPDATE`.
fn lease_tables_query(quoted_schema: &str) -> String {
    let (lease, fence) = (sql::lease::LEASE_TABLE, sql::FENCE_TABLE);
    let (candidate, floor) = (sql::candidacy::CANDIDATE_TABLE, sql::candidacy::FLOOR_TABLE);
    format!(
        "SELECT t.name, t.n <= 2, c.oid IS NOT NULL, \
         coalesce(has_table_privilege(c.oid, 'SELECT'), false), \
         coalesce(has_table_privilege(c.oid, 'INSERT'), false), \
         coalesce(has_table_privilege(c.oid, 'UPDATE'), false) \
         FROM unnest(ARRAY['{lease}', '{fence}', '{candidate}', '{floor}']) \
         WITH ORDINALITY AS t(name, n) \
         LEFT JOIN pg_catalog.pg_namespace s ON s.nspname = {quoted_schema} \
         LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = s.oid AND c.relname = t.name \
         AND c.relkind IN ('r', 'p') ORDER BY t.n"
    )
}

/// The forwarding the server's port shows: the DSN names one TCP port and the server listens
/// on another.
fn forwarded(config: &tokio_postgres::Config, server_port: Option<String>) -> Option<Forwarded> {
    let server_port = server_port?.parse::<u16>().ok()?;
    let tcp = config
        .get_hosts()
        .iter()
        .all(|host| matches!(host, tokio_postgres::config::Host::Tcp(_)));
    let client_port = match config.get_ports() {
        [] => 5432,
        [port] => *port,
        _ => return None,
    };
    (tcp && client_port != server_port).then_some(Forwarded {
        client_port,
        server_port,
    })
}

type Row = Vec<Option<String>>;

async fn rows(client: &Client, statement: &str) -> Result<Vec<Row>, VerifyError> {
    let messages = client.simple_query(statement).await?;
    plexsphere_leader::session::text_rows(messages).map_err(VerifyError::Query)
}

async fn first_row(client: &Client, statement: &str) -> Result<Row, VerifyError> {
    rows(client, statement)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| VerifyError::Unexpected(format!("no row for {statement}")))
}

fn text(row: &Row, index: usize) -> Result<String, VerifyError> {
    row.get(index)
        .cloned()
        .flatten()
        .ok_or_else(|| VerifyError::Unexpected(format!("no column {index}")))
}

fn number(row: &Row, index: usize) -> Result<u32, VerifyError> {
    text(row, index)?
        .parse()
        .map_err(|_| VerifyError::Unexpected(format!("column {index} is not a number")))
}

fn flag(row: &Row, index: usize) -> bool {
    row.get(index).cloned().flatten().as_deref() == Some("t")
}

/// The verdicts of both mechanisms: advisory, then lease.
pub fn judge(observed: &Observed) -> (Judgement, Judgement) {
    (judge_advisory(observed), judge_lease(observed))
}

/// The fix for a server in recovery, or a read-only session, for both mechanisms.
fn writable(observed: &Observed) -> Option<Judgement> {
    if observed.in_recovery {
        return Some(Judgement::no_go(
            "the server is in recovery (a hot standby): the election's statements are \
             refused there",
            "point the DSN at the primary (libpq's target_session_attrs=read-write picks it \
             among several hosts)",
        ));
    }
    observed.read_only.then(|| {
        Judgement::no_go(
            format!(
                "the session is read-only (transaction_read_only is on: \
                 default_transaction_read_only of role {:?} or of the database): a leader \
                 could not write, so the election is refused",
                observed.user
            ),
            format!(
                "use a read-write role, or ALTER ROLE {} SET default_transaction_read_only = off",
                observed.user
            ),
        )
    })
}

/// The advisory lock's verdict: the exclusion proof, then the session's state.
pub fn judge_advisory(observed: &Observed) -> Judgement {
    let lease_fix = "elect with the lease (Config::lease(Duration::ZERO), `verify --mechanism \
                     lease`), or point the advisory lock at a direct or session-mode endpoint";
    let mut judgement = match &observed.proof {
        Proof::Refuted(finding) if finding.proves_multiplexing() => Judgement::no_go(
            format!(
                "this endpoint multiplexes sessions (a transaction- or statement-mode pooler): {finding}"
            ),
            lease_fix,
        ),
        Proof::Refuted(finding) => Judgement::no_go(
            format!("the advisory lock does not exclude here: {finding}"),
            "elect with the lease (Config::lease(Duration::ZERO), `verify --mechanism lease`)",
        ),
        Proof::Inconclusive(why) => Judgement::no_go(
            format!("the exclusion proof proved nothing: {why}"),
            "let the endpoint accept a second connection (connection limits, pool size), \
             then verify again",
        ),
        Proof::Failed(error) => Judgement::no_go(
            format!("the exclusion proof failed: {error}"),
            "see the error; the role needs EXECUTE on pg_try_advisory_lock and \
             pg_advisory_unlock",
        ),
        Proof::Proven | Proof::ProvenAlone => match writable(observed) {
            Some(refused) => refused,
            None => match &observed.idle_session_timeout {
                Err(error) => Judgement::no_go(
                    format!(
                        "idle_session_timeout cannot be set (PostgreSQL {}): {error}; the \
                         grant bounds the lock session with it",
                        observed.server_version
                    ),
                    "upgrade to PostgreSQL 14 or newer, or elect with the lease",
                ),
                Ok(()) => Judgement::go(
                    "two sessions of their own, and the advisory lock refused the second while \
                     the first held it; the grant can bound its session (idle_session_timeout)",
                ),
            },
        },
    };
    if let Some(forwarded) = observed.forwarded
        && judgement.go
    {
        judgement.notes.push(format!(
            "the connection is forwarded (DSN port {}, server port {}): a session-mode pooler \
             must reset sessions (server_reset_query = DISCARD ALL), or a vanished leader's lock \
             stays on its pooled server session",
            forwarded.client_port, forwarded.server_port
        ));
    }
    judgement
}

/// The lease's verdict: the session's state, then the lease tables and their privileges.
pub fn judge_lease(observed: &Observed) -> Judgement {
    let mut judgement = writable(observed).unwrap_or_else(|| lease_tables_verdict(observed));
    if let Some(forwarded) = observed.forwarded {
        judgement.notes.push(format!(
            "the connection is forwarded (DSN port {}, server port {}): behind PgBouncer a \
             server restart loses every lease unless the restart plus server_login_retry \
             (PgBouncer's default 15 s) stays below one check interval ({:?}); set \
             server_login_retry = 1",
            forwarded.client_port, forwarded.server_port, observed.check_interval
        ));
    }
    if judgement.go && observed.proof.multiplexed() == Some(true) {
        judgement.notes.push(
            "this endpoint multiplexes sessions: the lease is the mechanism for it (one \
             autocommit statement per check)"
                .to_owned(),
        );
    }
    judgement
}

fn lease_tables_verdict(observed: &Observed) -> Judgement {
    let schema = &observed.schema;
    let setup = format!(
        "run plexsphere_leader::lease::setup_in(&client, {schema:?}) once (or \
         lease::setup_statement({schema:?}) from a migration) with a role that has CREATE on \
         schema {schema}"
    );
    let Some(access) = observed.schema_access else {
        return Judgement::no_go(
            format!("schema {schema} does not exist"),
            format!("CREATE SCHEMA {schema}, then {setup}"),
        );
    };
    if !access.usage {
        return Judgement::no_go(
            format!("role {:?} lacks USAGE on schema {schema}", observed.user),
            format!("GRANT USAGE ON SCHEMA {schema} TO {}", observed.user),
        );
    }
    let required = observed.lease_tables.iter().filter(|table| table.required);
    let missing: Vec<&str> = required
        .clone()
        .filter(|table| !table.exists)
        .map(|table| table.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Judgement::no_go(
            format!("the lease tables are missing: {}", missing.join(", ")),
            setup,
        );
    }
    let lacking: Vec<String> = required
        .filter(|table| !table.missing().is_empty())
        .map(|table| format!("{} on {}", table.missing().join(", "), table.name))
        .collect();
    if !lacking.is_empty() {
        let tables: Vec<&str> = observed
            .lease_tables
            .iter()
            .filter(|table| table.required)
            .map(|table| table.name.as_str())
            .collect();
        return Judgement::no_go(
            format!("role {:?} lacks {}", observed.user, lacking.join("; ")),
            format!(
                "GRANT SELECT, INSERT, UPDATE ON {} TO {}",
                tables.join(", "),
                observed.user
            ),
        );
    }
    Judgement::go(format!(
        "the lease tables exist in schema {schema} and role {:?} may read and write them",
        observed.user
    ))
}

/// The verdict for the configured mechanism.
pub fn configured(mechanism: Mechanism, advisory: &Judgement, lease: &Judgement) -> bool {
    match mechanism {
        Mechanism::Advisory => advisory.go,
        Mechanism::Lease => lease.go,
    }
}

fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

fn yes_no(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

/// The `text` answer: a headline with the configured mechanism's verdict, what the endpoint
/// showed, then a block per mechanism.
pub fn render_text(observed: &Observed, mechanism: Mechanism) -> String {
    let (advisory, lease) = judge(observed);
    let go = configured(mechanism, &advisory, &lease);
    let mut lines = vec![format!(
        "verify database {:?} for the {} mechanism: {} ({:.0} ms)",
        observed.database,
        mechanism.name(),
        if go { "GO" } else { "NO-GO" },
        millis(observed.took),
    )];
    let idle = match &observed.idle_session_timeout {
        Ok(()) => "settable".to_owned(),
        Err(error) => format!("cannot be set: {error}"),
    };
    let forwarded = observed.forwarded.map_or_else(
        || "not seen (the server's port is the DSN's, or a Unix socket)".to_owned(),
        |f| {
            format!(
                "yes: DSN port {}, server port {} (a pooler or proxy)",
                f.client_port, f.server_port
            )
        },
    );
    lines.extend([
        "  endpoint".to_owned(),
        format!(
            "    server:               PostgreSQL {}, {}, role {:?}",
            observed.server_version,
            if observed.in_recovery {
                "in recovery: a hot standby"
            } else {
                "primary"
            },
            observed.user
        ),
        format!(
            "    session:              {}",
            if observed.read_only {
                "read-only"
            } else {
                "read-write"
            }
        ),
        format!("    idle_session_timeout: {idle}"),
        format!(
            "    multiplexed:          {}",
            yes_no(observed.proof.multiplexed())
        ),
        format!(
            "    exclusion proof:      {} in {:.1} ms: {}",
            observed.proof.label(),
            millis(observed.proof_took),
            observed.proof.detail()
        ),
        format!("    forwarded:            {forwarded}"),
        format!(
            "    clock offset:         server - client = {:+.1} ms (± {:.1} ms)",
            observed.clock.offset_ms,
            millis(observed.clock.uncertainty)
        ),
        format!("  lease tables (schema {})", observed.schema),
    ]);
    for table in &observed.lease_tables {
        lines.push(table_line(table));
    }
    lines.push(String::new());
    let round_trips = [
        Some(observed.advisory_round_trip),
        observed.lease_round_trip,
    ];
    for ((name, judgement), round_trip) in [("advisory", &advisory), ("lease", &lease)]
        .into_iter()
        .zip(round_trips)
    {
        lines.push(format!(
            "  {name:<9}{:<7}check round trip {}",
            if judgement.go { "GO" } else { "NO-GO" },
            round_trip.map_or_else(|| "-".to_owned(), |rt| format!("{:.2} ms", millis(rt)))
        ));
        lines.push(format!("    why:  {}", judgement.reason));
        if let Some(fix) = &judgement.fix {
            lines.push(format!("    fix:  {fix}"));
        }
        for note in &judgement.notes {
            lines.push(format!("    note: {note}"));
        }
    }
    lines.join("\n")
}

fn table_line(table: &LeaseTable) -> String {
    let state = if !table.exists {
        "missing".to_owned()
    } else if table.missing().is_empty() {
        "present, SELECT INSERT UPDATE".to_owned()
    } else {
        format!("present, lacks {}", table.missing().join(" "))
    };
    let role = if table.required {
        ""
    } else {
        " (ranked replicas only)"
    };
    format!("    {:<40} {state}{role}", table.name)
}

/// The `json` answer: one object with the configured mechanism's verdict (`go`), what the
/// endpoint showed, and both mechanisms' verdicts.
pub fn render_json(observed: &Observed, mechanism: Mechanism) -> String {
    let (advisory, lease) = judge(observed);
    let go = configured(mechanism, &advisory, &lease);
    let verdict = |judgement: &Judgement, round_trip: Option<Duration>| {
        serde_json::json!({
            "go": judgement.go,
            "reason": judgement.reason,
            "fix": judgement.fix,
            "notes": judgement.notes,
            "round_trip_ms": round_trip.map(millis),
        })
    };
    let tables: Vec<serde_json::Value> = observed
        .lease_tables
        .iter()
        .map(|table| {
            serde_json::json!({
                "table": table.name,
                "required": table.required,
                "exists": table.exists,
                "select": table.privileges[0],
                "insert": table.privileges[1],
                "update": table.privileges[2],
            })
        })
        .collect();
    serde_json::json!({
        "database": observed.database,
        "mechanism": mechanism.name(),
        "go": go,
        "took_ms": millis(observed.took),
        "endpoint": {
            "server_version": observed.server_version,
            "server_version_num": observed.server_version_num,
            "user": observed.user,
            "in_recovery": observed.in_recovery,
            "read_only": observed.read_only,
            "idle_session_timeout": observed.idle_session_timeout.is_ok(),
            "idle_session_timeout_error": observed.idle_session_timeout.as_ref().err(),
            "multiplexed": observed.proof.multiplexed(),
            "forwarded": observed.forwarded.map(|f| serde_json::json!({
                "client_port": f.client_port,
                "server_port": f.server_port,
            })),
            "clock_offset_ms": (observed.clock.offset_ms * 1000.0).round() / 1000.0,
            "clock_uncertainty_ms": millis(observed.clock.uncertainty),
        },
        "exclusion_proof": {
            "verdict": observed.proof.label(),
            "detail": observed.proof.detail(),
            "took_ms": millis(observed.proof_took),
        },
        "lease_schema": {
            "name": observed.schema,
            "exists": observed.schema_access.is_some(),
            "usage": observed.schema_access.map(|access| access.usage),
            "create": observed.schema_access.map(|access| access.create),
        },
        "lease_tables": tables,
        "advisory": verdict(&advisory, Some(observed.advisory_round_trip)),
        "lease": verdict(&lease, observed.lease_round_trip),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, required: bool, exists: bool) -> LeaseTable {
        LeaseTable {
            name: format!("public.{name}"),
            required,
            exists,
            privileges: [exists; 3],
        }
    }

    /// A direct PostgreSQL 15 primary, read-write, with the lease tables and every privilege.
    fn direct() -> Observed {
        Observed {
            database: "app".into(),
            user: "app".into(),
            server_version: "15.4".into(),
            server_version_num: 150_004,
            in_recovery: false,
            read_only: false,
            idle_session_timeout: Ok(()),
            proof: Proof::Proven,
            proof_took: Duration::from_millis(12),
            forwarded: None,
            clock: ClockOffset {
                offset_ms: 1.5,
                uncertainty: Duration::from_micros(200),
            },
            advisory_round_trip: Duration::from_micros(400),
            lease_round_trip: Some(Duration::from_micros(500)),
            schema: "public".into(),
            schema_access: Some(SchemaAccess {
                usage: true,
                create: true,
            }),
            lease_tables: vec![
                table("plexsphere_leader_lease", true, true),
                table("plexsphere_leader_fence", true, true),
                table("plexsphere_leader_candidate", false, false),
            ],
            check_interval: Duration::from_secs(5),
            took: Duration::from_millis(40),
        }
    }

    #[test]
    fn a_direct_primary_is_go_for_both() {
        let (advisory, lease) = judge(&direct());
        assert!(advisory.go && lease.go, "{advisory:?} {lease:?}");
        assert_eq!(advisory.fix, None);
        assert!(lease.notes.is_empty());
    }

    #[test]
    fn a_multiplexing_pooler_is_no_go_for_the_lock_and_names_the_lease() {
        let observed = Observed {
            proof: Proof::Refuted(LockFinding::PoolSharesBackend { backend_pid: 7 }),
            forwarded: Some(Forwarded {
                client_port: 6432,
                server_port: 5432,
            }),
            ..direct()
        };
        let (advisory, lease) = judge(&observed);
        assert!(!advisory.go);
        assert!(
            advisory.reason.contains("multiplexes sessions"),
            "{advisory:?}"
        );
        assert!(advisory.fix.unwrap().contains("Config::lease"));
        assert!(lease.go);
        assert!(lease.notes[0].contains("server_login_retry"), "{lease:?}");
        assert!(lease.notes[1].contains("multiplexes sessions"), "{lease:?}");
    }

    #[test]
    fn a_lock_that_does_not_exclude_is_no_go_for_the_lock_only() {
        let observed = Observed {
            proof: Proof::Refuted(LockFinding::LockNotExclusive {
                first: 1,
                second: 2,
            }),
            ..direct()
        };
        let (advisory, lease) = judge(&observed);
        assert!(!advisory.go && lease.go);
        assert!(advisory.reason.contains("does not exclude"), "{advisory:?}");
    }

    #[test]
    fn recovery_and_read_only_are_no_go_for_both_with_their_fix() {
        let standby = Observed {
            in_recovery: true,
            read_only: true,
            ..direct()
        };
        for judgement in <[Judgement; 2]>::from(judge(&standby)) {
            assert!(!judgement.go);
            assert!(judgement.reason.contains("in recovery"), "{judgement:?}");
            assert!(judgement.fix.unwrap().contains("target_session_attrs"));
        }
        let read_only = Observed {
            read_only: true,
            ..direct()
        };
        for judgement in <[Judgement; 2]>::from(judge(&read_only)) {
            assert!(!judgement.go);
            assert!(judgement.reason.contains("read-only"), "{judgement:?}");
            assert!(
                judgement
                    .fix
                    .unwrap()
                    .contains("default_transaction_read_only")
            );
        }
    }

    #[test]
    fn missing_tables_privileges_and_settings_each_name_their_fix() {
        let mut observed = direct();
        observed.lease_tables[1] = table("plexsphere_leader_fence", true, false);
        let lease = judge_lease(&observed);
        assert_eq!(
            lease.reason,
            "the lease tables are missing: public.plexsphere_leader_fence"
        );
        assert!(lease.fix.unwrap().contains("lease::setup_in"));
        observed.lease_tables[1] = LeaseTable {
            privileges: [true, false, false],
            ..table("plexsphere_leader_fence", true, true)
        };
        let lease = judge_lease(&observed);
        assert_eq!(
            lease.reason,
            "role \"app\" lacks INSERT, UPDATE on public.plexsphere_leader_fence"
        );
        assert_eq!(
            lease.fix.as_deref(),
            Some(
                "GRANT SELECT, INSERT, UPDATE ON public.plexsphere_leader_lease, \
                 public.plexsphere_leader_fence TO app"
            )
        );
        observed.schema_access = None;
        assert!(judge_lease(&observed).reason.contains("does not exist"));
        let old = Observed {
            idle_session_timeout: Err("unrecognized configuration parameter".into()),
            ..direct()
        };
        let advisory = judge_advisory(&old);
        assert!(!advisory.go && advisory.fix.unwrap().contains("PostgreSQL 14"));
    }

    #[test]
    fn the_answers_carry_the_configured_verdict() {
        let observed = Observed {
            proof: Proof::Inconclusive("no second session".into()),
            ..direct()
        };
        let text = render_text(&observed, Mechanism::Advisory);
        assert!(
            text.starts_with("verify database \"app\" for the advisory mechanism: NO-GO"),
            "{text}"
        );
        assert!(text.contains("multiplexed:          unknown"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render_json(&observed, Mechanism::Lease)).expect("json");
        assert_eq!(json["go"], true);
        assert_eq!(json["advisory"]["go"], false);
        assert_eq!(json["exclusion_proof"]["verdict"], "inconclusive");
        assert_eq!(json["lease"]["round_trip_ms"], 0.5);
        assert_eq!(json["endpoint"]["clock_offset_ms"], 1.5);
    }
}
