//! Who leads an election, read from the server's own views (`pg_locks` joined with
//! `pg_stat_activity`), so that an operator needs neither a replica nor its clock.
//!
//! The leader's lock session carries `<identity> since <unix seconds>` in its
//! `application_name` (written by the grant statement, from the server's clock; see
//! [`Config::identity`](crate::Config::identity)). [`who_leads`] runs `sql::who_leads` (feature
//! `wire`) and reads it back.
//!
//! Visibility: `pg_locks` and every session's `application_name` are visible to any role, so
//! the leader's pid, identity and grant time always are. `backend_start`, `client_addr` and
//! `client_port` of a session of another role are NULL unless the reader is a superuser, a
//! member of that role, or a member of `pg_read_all_stats`: then [`LeaderStatus::client_addr`]
//! is `None` and a missing grant time has no lower bound ([`Since::Unknown`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::CheckError;
use crate::key::LockKey;
use crate::session::{LockSession, Row};
use crate::sql;

pub use crate::shard_sql::OwnerRow;

/// Runs the exclusion proof ([`plexsphere_leader_core::proof`]) on `sessions` once, exactly as
/// a run of the advisory lock does before its first attempt: one pooled session and one
/// opened outside the pool ([`SessionSource::open_outside_pool`](crate::session::SessionSource::open_outside_pool)), the second given
/// `second_within` to answer. Returns what the two answered; its
/// [`verdict`](plexsphere_leader_core::proof::PoolProof::verdict) says whether the advisory
/// lock can elect one leader through `sessions`. For operators' tools (`plexsphere-leader
/// verify`); an elector runs it by itself. Cancel-safe: dropped, it closes what it holds.
///
/// # Errors
/// The first session could not be borrowed, or a statement of the lock test failed (what it
/// borrowed is then closed).
pub async fn prove_exclusion(
    sessions: &dyn crate::session::SessionSource,
    second_within: std::time::Duration,
) -> Result<plexsphere_leader_core::proof::PoolProof<CheckError>, CheckError> {
    crate::connection::pool::prove(sessions, second_within).await
}

mod candidates;
mod lease;

#[cfg(feature = "deadpool")]
pub use self::candidates::candidates;
pub(crate) use self::candidates::candidates_on;
pub use self::candidates::{CandidateStatus, Published};
pub use self::lease::LeaseStatus;
#[cfg(feature = "deadpool")]
pub use self::lease::lease_holder;
pub(crate) use self::lease::lease_holder_on;

/// The leader of one election, as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderStatus {
    /// The election's key.
    pub key: LockKey,
    /// The backend of the leader's lock session.
    pub pid: i32,
    /// The session's `application_name` as it is (`None` when the session's row was gone
    /// from `pg_stat_activity`).
    pub application_name: Option<String>,
    /// The leader's identity, from an `application_name` of the form `<identity> since
    /// <unix seconds>`; `None` when the name has another form (a lock taken by something other
    /// than this crate, or a name changed since).
    pub identity: Option<String>,
    /// Since when the leader leads.
    pub since: Since,
    /// The session's client address (`None` over a Unix socket, or when not visible).
    pub client_addr: Option<String>,
    /// The session's client port (`-1` over a Unix socket, `None` when not visible).
    pub client_port: Option<i32>,
    /// The session's role (`None` when the session's row was gone).
    pub user: Option<String>,
    /// The backends waiting in the lock's queue (standbys in
    /// [`AcquireMode::Queue`](crate::config::AcquireMode::Queue)), by pid.
    pub waiting: Vec<i32>,
    /// The server's clock when it answered.
    pub server_now: SystemTime,
}

/// Since when a leader leads, and how sure that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// The grant time in the lock session's `application_name`: the server's clock when the
    /// lock was taken, to the second.
    Granted(SystemTime),
    /// No grant time in `application_name`: the session's `backend_start`, a lower bound (a
    /// pooled session may have been opened long before it took the lock).
    SessionStart(SystemTime),
    /// Neither is known (the session belongs to another role and the reader lacks
    /// `pg_read_all_stats`, or its row was gone).
    Unknown,
}

impl Since {
    /// The time, exact or a lower bound; `None` when unknown.
    pub fn at(self) -> Option<SystemTime> {
        match self {
            Self::Granted(at) | Self::SessionStart(at) => Some(at),
            Self::Unknown => None,
        }
    }
}

impl LeaderStatus {
    /// For how long the leader has led at [`server_now`](Self::server_now) (at least that long
    /// for [`Since::SessionStart`]); `None` when unknown.
    pub fn leading_for(&self) -> Option<Duration> {
        let since = self.since.at()?;
        Some(
            self.server_now
                .duration_since(since)
                .unwrap_or(Duration::ZERO),
        )
    }
}

/// Why [`who_leads`] could not answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum StatusError {
    /// No session could be had, or the query failed (connection broken, permission denied,
    /// an answer of another shape).
    Query(CheckError),
    /// The server answered several granted rows for one key, which PostgreSQL never does: the
    /// query ran through something that is not one PostgreSQL server.
    SeveralHolders(usize),
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The check error's text is its whole chain of causes: no `source()` repeats it.
            Self::Query(cause) => write!(f, "status: {cause}"),
            Self::SeveralHolders(count) => write!(
                f,
                "status: {count} sessions hold the lock at once; is this one PostgreSQL server?"
            ),
        }
    }
}

impl std::error::Error for StatusError {}

impl<E: Into<CheckError>> From<E> for StatusError {
    fn from(error: E) -> Self {
        Self::Query(error.into())
    }
}

/// Who leads the election `key` in `client`'s current database: `None` when no session holds
/// the lock (standbys may still be queued for it). One statement (`sql::who_leads`, feature
/// `wire`) over the simple query protocol, so it also works through a transaction-mode pooler.
///
/// # Errors
/// [`StatusError::Query`] when the query fails; [`StatusError::SeveralHolders`] when the answer
/// is impossible for one server. Cancel-safe (dropping the future abandons the query).
#[cfg(feature = "deadpool")]
pub async fn who_leads(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<Option<LeaderStatus>, StatusError> {
    let messages = client.simple_query(&sql::who_leads(key)).await?;
    status_of(key, &crate::session::text_rows(messages)?)
}

/// Who owns what in the shard space `class` of `count` shards, in `client`'s current database:
/// one [`OwnerRow`] per backend holding a lock of the space (members
/// and foreign holders), ascending by pid; empty when nobody does. One statement
/// (`shard_sql::owners`, feature `wire`) over the simple query protocol; it takes no lock.
///
/// # Errors
/// [`StatusError::Query`] when the query fails or answers rows of another shape.
/// Cancel-safe.
#[cfg(feature = "deadpool")]
pub async fn shard_owners(
    client: &tokio_postgres::Client,
    class: i32,
    count: u32,
) -> Result<Vec<crate::shard_sql::OwnerRow>, StatusError> {
    let messages = client
        .simple_query(&crate::shard_sql::owners(class, count))
        .await?;
    let rows = crate::session::text_rows(messages)?;
    crate::shard_sql::parse_owners(&rows).map_err(|error| {
        StatusError::Query(CheckError::UnexpectedReply {
            statement: "owners",
            detail: error.to_string(),
        })
    })
}

/// [`shard_owners`] for a space held by leases
/// ([`ShardConfig::lease`](crate::sharded::ShardConfig::lease)) with its tables in `schema`: one
/// [`OwnerRow`] per live member row, ascending by member id (its
/// `pid` field is the member id, its `name` the member's holder, `<identity> <nonce>`, and its
/// `rank` the one published before it), with
/// the shards its owner rows name; a shard of no row is free. One statement
/// (`shard_sql::lease::survey`, feature `wire`); it takes no lock.
///
/// # Errors
/// As [`shard_owners`]; a missing table (the space was never set up) is SQLSTATE 42P01.
/// Cancel-safe.
#[cfg(feature = "deadpool")]
pub async fn lease_shard_owners(
    client: &tokio_postgres::Client,
    schema: &str,
    class: i32,
    count: u32,
) -> Result<Vec<crate::shard_sql::OwnerRow>, StatusError> {
    let messages = client
        .simple_query(&crate::shard_sql::lease::survey(
            schema,
            class,
            count,
            plexsphere_leader_core::rank::FloorStep::Off,
        ))
        .await?;
    let rows = crate::session::text_rows(messages)?;
    let members = crate::shard_sql::lease::parse_survey(&rows).map_err(|error| {
        StatusError::Query(CheckError::UnexpectedReply {
            statement: "lease survey",
            detail: error.to_string(),
        })
    })?;
    Ok(members
        .into_iter()
        .map(|row| {
            crate::shard_sql::OwnerRow::named(row.member, Some(&row.holder), true, row.shards)
        })
        .collect())
}

/// [`who_leads`] on a session of any backend (what
/// [`Elector::who_leads`](crate::Elector::who_leads) runs on a session of its source).
///
/// # Errors
/// As [`who_leads`].
pub(crate) async fn who_leads_on(
    session: &dyn LockSession,
    key: LockKey,
) -> Result<Option<LeaderStatus>, StatusError> {
    let rows = session
        .query(&sql::who_leads(key))
        .await
        .map_err(crate::session::QueryError::into_cause)?;
    status_of(key, &rows)
}

/// The columns of [`sql::who_leads`], in order.
mod column {
    pub(super) const PID: usize = 0;
    pub(super) const GRANTED: usize = 1;
    pub(super) const APPLICATION_NAME: usize = 2;
    pub(super) const LEADING_SINCE: usize = 3;
    pub(super) const BACKEND_START_US: usize = 4;
    pub(super) const CLIENT_ADDR: usize = 5;
    pub(super) const CLIENT_PORT: usize = 6;
    pub(super) const USENAME: usize = 7;
    pub(super) const SERVER_NOW_US: usize = 8;
    pub(super) const COUNT: usize = 9;
}

fn status_of(key: LockKey, rows: &[Row]) -> Result<Option<LeaderStatus>, StatusError> {
    let mut holders = Vec::new();
    let mut waiting = Vec::new();
    for row in rows {
        if row.len() != column::COUNT {
            return Err(unexpected(format!("{} columns", row.len())).into());
        }
        if text(row, column::GRANTED)? == "t" {
            holders.push(row);
        } else {
            waiting.push(number(row, column::PID)?);
        }
    }
    let holder = match holders.as_slice() {
        [] => return Ok(None),
        [holder] => *holder,
        several => return Err(StatusError::SeveralHolders(several.len())),
    };
    let application_name = holder[column::APPLICATION_NAME].clone();
    let identity = application_name
        .as_deref()
        .and_then(crate::identity::parse_application_name)
        .map(|(identity, _)| identity.to_owned());
    let granted = optional::<u64>(holder, column::LEADING_SINCE)?
        .map(|seconds| UNIX_EPOCH + Duration::from_secs(seconds));
    let started = optional::<i64>(holder, column::BACKEND_START_US)?.map(unix_micros);
    let since = match (granted, started) {
        (Some(at), _) => Since::Granted(at),
        (None, Some(at)) => Since::SessionStart(at),
        (None, None) => Since::Unknown,
    };
    Ok(Some(LeaderStatus {
        key,
        pid: number(holder, column::PID)?,
        application_name,
        identity,
        since,
        client_addr: holder[column::CLIENT_ADDR].clone(),
        client_port: optional(holder, column::CLIENT_PORT)?,
        user: holder[column::USENAME].clone(),
        waiting,
        server_now: unix_micros(number(holder, column::SERVER_NOW_US)?),
    }))
}

fn unexpected(detail: String) -> CheckError {
    CheckError::UnexpectedReply {
        statement: "the who-leads query",
        detail,
    }
}

fn text(row: &Row, index: usize) -> Result<&str, CheckError> {
    row[index]
        .as_deref()
        .ok_or_else(|| unexpected(format!("NULL in column {index}")))
}

fn number<T: std::str::FromStr>(row: &Row, index: usize) -> Result<T, CheckError> {
    let value = text(row, index)?;
    value
        .parse()
        .map_err(|_| unexpected(format!("{value:?} in column {index}")))
}

fn optional<T: std::str::FromStr>(row: &Row, index: usize) -> Result<Option<T>, CheckError> {
    match row[index] {
        Some(_) => number(row, index).map(Some),
        None => Ok(None),
    }
}

/// The instant `micros` microseconds after (or before) the unix epoch.
fn unix_micros(micros: i64) -> SystemTime {
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// Splits a leader's `application_name`, `<identity> since <unix seconds>`, into the identity
/// and the grant time; `None` for a name of another form. The last ` since ` counts, so an
/// identity may contain the word.
pub fn parse_application_name(name: &str) -> Option<(&str, SystemTime)> {
    let (identity, seconds) = crate::identity::parse_application_name(name)?;
    Some((
        identity,
        UNIX_EPOCH.checked_add(Duration::from_secs(seconds))?,
    ))
}
