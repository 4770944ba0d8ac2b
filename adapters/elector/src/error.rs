//! Errors of the elector.

use plexsphere_leader_core::{IntervalError, StopGraceTooLong};

/// Why a check (connection acquire, grant statement, ping, unlock) failed. The election logs it
/// as the cause and carries on; it never contains the DSN or a password.
///
/// Its `Display` is the whole chain of causes (`error connecting to server: Connection refused`,
/// `db error: FATAL: role "x" does not exist`), so a log line says what went wrong; `source()`
/// is therefore `None`, and [`CheckError::db_error`] gives the server's error, if any.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckError {
    /// The pool could not hand out a connection (server unreachable, authentication refused, pool
    /// closed or timed out). Feature `deadpool`.
    #[cfg(feature = "deadpool")]
    Pool(deadpool_postgres::PoolError),
    /// The statement failed on the server or the connection broke. Feature `deadpool`.
    #[cfg(feature = "deadpool")]
    Query(tokio_postgres::Error),
    /// The server answered something other than the one boolean or integer expected (for
    /// example a transaction-mode pooler or a proxy in the way).
    UnexpectedReply {
        /// Which statement.
        statement: &'static str,
        /// What came back.
        detail: String,
    },
    /// The grant statement found the server in recovery (a hot standby): the lock is only
    /// taken on a primary.
    InRecovery,
    /// The lock connection closed on its own (noticed by the session watch).
    SessionEnded,
    /// The grant statement found its session read-only (`transaction_read_only` is on: the
    /// role's or the database's `default_transaction_read_only`): a leader on it could not do
    /// any write, so the lock is not taken on it. Permanent (SQLSTATE `25006`'s advice).
    ReadOnly,
    /// Lease mechanism: the claim found the election's key in another schema's lease table
    /// ([`Config::lease_schema`](crate::Config::lease_schema) differs between replicas, or
    /// the tables were set up in two schemas): one key is one election, so this replica does
    /// not claim while another schema holds it. Always permanent.
    ElectionElsewhere {
        /// This replica's lease schema.
        schema: String,
        /// The schemas that hold the key, `", "`-separated.
        elsewhere: String,
        /// The election's key.
        key: crate::key::LockKey,
    },
    /// The server refused the fitness probe
    /// ([`Config::fitness_probe`](crate::Config::fitness_probe)): this replica cannot do the
    /// leader's work, so it does not lead until the probe passes. Always permanent.
    Unfit {
        /// The probe's statement.
        probe: String,
        /// The server's refusal, with its SQLSTATE.
        error: Box<CheckError>,
    },
    /// A failure of another session backend ([`Config::with_sessions`](crate::Config::with_sessions)):
    /// its error, with the SQLSTATE when the server reported one.
    Backend {
        /// The server's SQLSTATE (`55P03`, `57P01`, …), when the server reported the error.
        sqlstate: Option<String>,
        /// The backend's error.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CheckError {
    /// A failure of another session backend, with the server's SQLSTATE if it reported one.
    pub fn backend(
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        sqlstate: Option<String>,
    ) -> Self {
        Self::Backend {
            sqlstate,
            error: error.into(),
        }
    }

    /// The SQLSTATE of the error the server reported, if this is one, whatever the backend.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Self::Backend { sqlstate, .. } => sqlstate.as_deref(),
            Self::ReadOnly => Some("25006"),
            Self::Unfit { error, .. } => error.sqlstate(),
            #[cfg(feature = "deadpool")]
            _ => self.db_error().map(|db| db.code().code()),
            #[cfg(not(feature = "deadpool"))]
            _ => None,
        }
    }

    /// The error the server reported (SQLSTATE, message), if this is one of tokio-postgres.
    /// Feature `deadpool`.
    #[cfg(feature = "deadpool")]
    pub fn db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        match self {
            Self::Pool(deadpool_postgres::PoolError::Backend(error)) | Self::Query(error) => {
                error.as_db_error()
            }
            _ => None,
        }
    }
}

/// What to grant for a 42501 whose message names the kind of object (`permission denied for
/// table …`): the privilege of that kind; `None` when the message names none.
fn privilege_advice(message: &str) -> Option<&'static str> {
    const KINDS: [(&str, &str); 4] = [
        (
            "permission denied for table",
            "grant the role the table privileges the election needs (the lease: GRANT SELECT, \
             INSERT, UPDATE ON plexsphere_leader_lease, plexsphere_leader_fence TO <role>)",
        ),
        (
            "permission denied for schema",
            "grant the role the schema's privileges (GRANT USAGE ON SCHEMA <schema> TO <role>; \
             CREATE too for a setup that makes the tables)",
        ),
        (
            "permission denied for database",
            "grant the role the database (GRANT CONNECT ON DATABASE <database> TO <role>)",
        ),
        (
            "permission denied for function",
            "grant the role the function (GRANT EXECUTE ON FUNCTION <function> TO <role>)",
        ),
    ];
    KINDS
        .iter()
        .find(|(said, _)| message.contains(said))
        .map(|(_, advice)| *advice)
}

/// The SQLSTATEs of configuration errors that retrying alone will not fix, and what to do.
const PERMANENT: [(&str, &str); 8] = [
    (
        "3D000",
        "create the database, or fix dbname in the connection settings",
    ),
    (
        "28000",
        "check the role name and pg_hba.conf (the server refused this role or host)",
    ),
    (
        "28P01",
        "check the password of the role in the connection settings",
    ),
    (
        "42501",
        "grant the missing privilege (for a database: GRANT CONNECT ON DATABASE)",
    ),
    (
        "42P01",
        "run the setup step of the missing table (fencing::setup for the fence table, \
         lease::setup for the lease tables)",
    ),
    ("3F000", "create the schema, or fix the search_path"),
    (
        "42883",
        "the server lacks a function the election needs: PostgreSQL 14 or newer",
    ),
    (
        "25006",
        "the role's sessions are read-only (default_transaction_read_only, or a hot standby): \
         connect to the primary as a role that may write",
    ),
];

/// The advice for a permanent SQLSTATE, `None` for a transient one.
fn permanent_advice(code: &str) -> Option<&'static str> {
    PERMANENT
        .iter()
        .find(|(permanent, _)| *permanent == code)
        .map(|(_, advice)| *advice)
}

impl CheckError {
    /// Whether retrying alone can fix this failure: [`FailureClass::Permanent`] for a database
    /// that does not exist, a role that may not connect, a wrong password, a missing privilege
    /// or table, a read-only session (SQLSTATE `3D000`, `28000`, `28P01`, `42501`, `42P01`,
    /// `3F000`, `42883`, `25006`);
    /// [`FailureClass::Transient`] otherwise.
    ///
    /// [`FailureClass::Permanent`]: plexsphere_leader_core::failures::FailureClass::Permanent
    /// [`FailureClass::Transient`]: plexsphere_leader_core::failures::FailureClass::Transient
    pub fn class(&self) -> plexsphere_leader_core::failures::FailureClass {
        use plexsphere_leader_core::failures::FailureClass;
        if self.advice().is_some() {
            FailureClass::Permanent
        } else {
            FailureClass::Transient
        }
    }

    /// What to do about a permanent failure ([`class`](Self::class)), with the server's own
    /// `HINT` when it sent one; `None` for a transient failure.
    pub fn advice(&self) -> Option<String> {
        if let Self::ElectionElsewhere {
            schema,
            elsewhere,
            key,
        } = self
        {
            return Some(format!(
                "give every replica of the election the same Config::lease_schema; if the \
                 election no longer runs in {elsewhere}, delete its row there (DELETE FROM \
                 <that schema>.plexsphere_leader_lease WHERE classid = {} AND objid = {}) and \
                 this replica claims in {schema}",
                key.class_id, key.obj_id
            ));
        }
        if let Self::Unfit { error, .. } = self {
            let what = match (error.sqlstate(), error.server_hint()) {
                (Some(code @ "25006"), _) => permanent_advice(code).unwrap_or_default().to_owned(),
                (_, Some(hint)) => {
                    format!("{hint}; grant this replica's role what the probe's statement needs")
                }
                _ => "grant this replica's role what the probe's statement needs (a missing \
                      privilege: GRANT … TO <role>), or point it at a server where it can do \
                      the work"
                    .to_owned(),
            };
            return Some(format!(
                "{what}; until the probe passes this replica does not lead (it probes again at \
                 every check)"
            ));
        }
        let code = self.sqlstate()?;
        let ours = permanent_advice(code)?;
        let ours = match code {
            "42501" => privilege_advice(&self.to_string()).unwrap_or(ours),
            _ => ours,
        };
        Some(match self.server_hint() {
            Some(hint) => format!("{hint}; {ours}"),
            None => (*ours).to_owned(),
        })
    }

    /// The server's `HINT`, when the error came from the server with one.
    fn server_hint(&self) -> Option<&str> {
        #[cfg(feature = "deadpool")]
        {
            self.db_error().and_then(|db| db.hint())
        }
        #[cfg(not(feature = "deadpool"))]
        {
            None
        }
    }
}

impl CheckError {
    /// Whether this error means the session itself ended: the connection closed, or the server
    /// ended the session (SQLSTATE class `57P`: terminated by an administrator, a crash,
    /// `idle_session_timeout`, a dropped database).
    #[cfg(feature = "deadpool")]
    pub(crate) fn ends_session(&self) -> bool {
        match self {
            Self::SessionEnded => true,
            #[cfg(feature = "deadpool")]
            Self::Query(error) => {
                error.is_closed()
                    || error
                        .as_db_error()
                        .is_some_and(|db| db.code().code().starts_with("57P"))
            }
            _ => false,
        }
    }
}

#[cfg(feature = "deadpool")]
impl From<deadpool_postgres::PoolError> for CheckError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        Self::Pool(error)
    }
}

#[cfg(feature = "deadpool")]
impl From<tokio_postgres::Error> for CheckError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Query(error)
    }
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(feature = "deadpool")]
            Self::Pool(deadpool_postgres::PoolError::Backend(error)) => {
                f.write_str("new connection: ")?;
                write_chain(f, error)
            }
            #[cfg(feature = "deadpool")]
            Self::Pool(error) => write_chain(f, error),
            #[cfg(feature = "deadpool")]
            Self::Query(error) => write_chain(f, error),
            Self::UnexpectedReply { statement, detail } => {
                write!(f, "unexpected answer to {statement}: {detail}")
            }
            Self::InRecovery => f.write_str(
                "the server is in recovery (a hot standby): the leader lock is only taken on \
                 the primary",
            ),
            Self::ReadOnly => f.write_str(
                "the session is read-only (transaction_read_only is on): a leader could not \
                 write, so the leader lock is not taken on it",
            ),
            Self::ElectionElsewhere {
                schema, elsewhere, ..
            } => write!(
                f,
                "the election of this key already runs in schema {elsewhere}, not in this \
                 replica's lease schema {schema}: a second election under the same key would \
                 give it two leaders, so this replica does not claim"
            ),
            Self::Unfit { probe, error } => {
                write!(
                    f,
                    "the fitness probe `{}` was refused: {error}",
                    one_line(probe)
                )
            }
            Self::SessionEnded => f.write_str(
                "the lock session's connection closed (the server terminated the backend, \
                 restarted or failed over, or the socket was reset)",
            ),
            Self::Backend { error, .. } => write_chain(f, error.as_ref()),
        }
    }
}

impl std::error::Error for CheckError {}

/// Writes `error` and each of its sources, `": "`-separated, skipping a source whose text the
/// previous message already contains.
fn write_chain(f: &mut std::fmt::Formatter<'_>, error: &dyn std::error::Error) -> std::fmt::Result {
    let mut previous = error.to_string();
    f.write_str(&one_line(&previous))?;
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !previous.contains(&text) {
            write!(f, ": {}", one_line(&text))?;
        }
        previous = text;
        source = cause.source();
    }
    Ok(())
}

/// `text` on one line: a server's `DETAIL` or `HINT` comes after a newline, which would split a
/// log line in two; each line break becomes `"; "`.
fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\n') {
        std::borrow::Cow::Owned(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        )
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// An [`Elector`](crate::Elector) could not be built from its [`Config`](crate::Config). Its
/// text says what is wrong, cause included, once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `check_interval` is out of range (below 50 ms, or four intervals do not fit
    /// `idle_session_timeout`).
    #[error(transparent)]
    CheckInterval(#[from] IntervalError),
    /// The metrics (the `plexsphere_background_leader` gauge and the `plexsphere_leader_*`
    /// metrics) could not be registered: another collector uses one of the names, or the
    /// registry refused them.
    #[cfg(feature = "prometheus")]
    #[error("registry: cannot register the elector's metrics: {0}")]
    Metrics(prometheus::Error),
    /// `stop_grace` is longer than two check intervals.
    #[error(transparent)]
    StopGrace(#[from] StopGraceTooLong),
    /// `resign_hold_off` is longer than the longest hold-off the election takes.
    #[error(
        "resign hold-off {given:?} is longer than {max:?}: make the replica ineligible instead"
    )]
    HoldOff {
        /// The hold-off asked for.
        given: std::time::Duration,
        /// The longest accepted.
        max: std::time::Duration,
    },
    /// The configured identity is empty, not printable ASCII, or too long for
    /// `application_name`.
    #[error("identity: {0}")]
    Identity(crate::identity::IdentityError),
    /// The lease TTL is shorter than two check intervals or longer than the server takes.
    #[error(transparent)]
    LeaseTtl(#[from] plexsphere_leader_core::LeaseTtlError),
    /// The lease schema ([`Config::lease_schema`](crate::Config::lease_schema)) is not a plain
    /// lowercase identifier (`[a-z_][a-z0-9_]*`, at most 63 bytes).
    #[error(
        "lease schema {0:?} is not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 63 \
         bytes)"
    )]
    LeaseSchema(String),
    /// The fitness probe ([`Config::fitness_probe`](crate::Config::fitness_probe)) is blank.
    #[error("the fitness probe is blank: name a statement that must succeed, or set none")]
    FitnessProbe,
    /// The version of [`Config::version`](crate::Config::version) is not a release number.
    #[error("version: {0}")]
    Version(#[from] plexsphere_leader_core::rank::VersionError),
    /// [`Config::version_floor`](crate::Config::version_floor) is on without a
    /// [`Config::version`](crate::Config::version): a floor compares versions.
    #[error("the version floor needs this replica's version: set Config::version")]
    FloorWithoutVersion,
    /// The lease mechanism was asked for with the queued acquire mode: a lease has no
    /// server-side queue.
    #[error("the lease mechanism takes no queued acquire mode: use AcquireMode::Poll")]
    LeaseQueued,
    /// An option of a sharded election is out of range (no shard, too many, a move limit of
    /// zero, a stop grace longer than two intervals).
    #[error(transparent)]
    Shards(#[from] plexsphere_leader_core::shards::ShardOptionsError),
}

// The variants whose text includes their cause have no `source()`: a chain printer would print
// the cause twice.
impl From<crate::identity::IdentityError> for ConfigError {
    fn from(error: crate::identity::IdentityError) -> Self {
        Self::Identity(error)
    }
}

/// Why [`Elector::run`](crate::Elector::run) or
/// [`ShardedElector::run`](crate::sharded::ShardedElector::run) returned an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Another `run` of the same elector is in progress; this call changed nothing.
    #[error("the elector is already running: never run two `run` calls at once")]
    AlreadyRunning,
    /// A sharded election found the server's lock table too small for its shards and members
    /// (checked as the lock session joins); nothing was taken, and the session is closed.
    #[error(transparent)]
    LockTableTooSmall(#[from] plexsphere_leader_core::shards::LockTableTooSmall),
    /// The leader's check proved that the pool multiplexes server sessions between clients (a
    /// transaction- or statement-mode pooler: PgBouncer or Supavisor in transaction mode), which
    /// cannot carry a session advisory lock: the run demoted, closed its session and stopped.
    /// Connect directly or through a session-mode pooler, or elect with the lease mechanism
    /// (`Config::lease`).
    #[error(
        "the pool multiplexes server sessions, so it cannot carry a session advisory lock \
         ({0}): connect directly or through a session-mode pooler, or use the lease mechanism \
         (Config::lease)"
    )]
    SessionsMultiplexed(plexsphere_leader_core::LockFinding),
    /// The exclusion proof ([`plexsphere_leader_core::proof`]), run before the first attempt,
    /// found two sessions on two server backends both granted the same advisory lock key: the
    /// server's session advisory locks do not exclude (a PostgreSQL-compatible database whose
    /// lock functions are stubs, or functions replaced on this database), so every replica
    /// would lead. No term began on this replica; the sessions are closed. Elect with the
    /// lease mechanism (`Config::lease`).
    #[error(
        "this server's session advisory locks do not exclude ({0}): no replica may lead by \
         them; elect with the lease mechanism (Config::lease)"
    )]
    LockNotExclusive(plexsphere_leader_core::LockFinding),
}

impl RunError {
    /// The error of a run that [`Action::Fail`](plexsphere_leader_core::Action::Fail)ed with
    /// `finding`: [`LockNotExclusive`](Self::LockNotExclusive) for a lock that grants two
    /// sessions, [`SessionsMultiplexed`](Self::SessionsMultiplexed) for every other finding
    /// (each proves a pool that multiplexes sessions).
    pub(crate) fn of_finding(finding: plexsphere_leader_core::LockFinding) -> Self {
        match finding {
            plexsphere_leader_core::LockFinding::LockNotExclusive { .. } => {
                Self::LockNotExclusive(finding)
            }
            _ => Self::SessionsMultiplexed(finding),
        }
    }

    /// Whether running again cannot help: the pool multiplexes sessions, the server's lock does
    /// not exclude, or the server's lock table is too small for the shard space (a supervisor should not restart such a run);
    /// `false` for [`RunError::AlreadyRunning`], a mistake of the caller that changed nothing.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::AlreadyRunning => false,
            Self::LockTableTooSmall(_)
            | Self::SessionsMultiplexed(_)
            | Self::LockNotExclusive(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_leader_core::failures::FailureClass;

    #[test]
    fn a_missing_privilege_gets_the_advice_of_its_kind_of_object() {
        let denied = |what: &str| {
            CheckError::backend(
                std::io::Error::other(format!("ERROR: permission denied for {what} x")),
                Some("42501".into()),
            )
            .advice()
            .unwrap()
        };
        assert!(denied("table").contains("ON plexsphere_leader_lease"));
        assert!(denied("schema").contains("USAGE ON SCHEMA"));
        assert!(denied("database").contains("CONNECT ON DATABASE"));
        let other = CheckError::backend(std::io::Error::other("nope"), Some("42501".into()));
        assert!(
            other
                .advice()
                .unwrap()
                .contains("grant the missing privilege")
        );
    }

    #[test]
    fn configuration_errors_are_permanent_with_advice_and_the_rest_transient() {
        for code in [
            "3D000", "28000", "28P01", "42501", "42P01", "3F000", "42883", "25006",
        ] {
            let error = CheckError::backend(std::io::Error::other("x"), Some(code.into()));
            assert_eq!(error.class(), FailureClass::Permanent, "{code}");
            assert!(
                error.advice().is_some_and(|advice| !advice.is_empty()),
                "{code}"
            );
        }
        for code in [Some("57P01"), Some("53300"), Some("55P03"), None] {
            let error = CheckError::backend(std::io::Error::other("x"), code.map(str::to_owned));
            assert_eq!(error.class(), FailureClass::Transient, "{code:?}");
            assert_eq!(error.advice(), None);
        }
        assert_eq!(CheckError::SessionEnded.class(), FailureClass::Transient);
    }

    /// Prints `error` and its sources the way `anyhow`'s `{:#}` or an error reporter does.
    fn chain(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }

    #[test]
    fn every_error_prints_its_cause_once() {
        let identity = ConfigError::from(crate::identity::validate("").unwrap_err());
        let interval = ConfigError::from(
            plexsphere_leader_core::CheckInterval::new(std::time::Duration::from_micros(1))
                .unwrap_err(),
        );
        let backend = CheckError::backend(std::io::Error::other("reset by peer"), None);
        #[allow(unused_mut, reason = "one more with the prometheus feature")]
        let mut errors: Vec<(Box<dyn std::error::Error>, &str)> = vec![
            (Box::new(identity), "empty"),
            (Box::new(interval), "1µs"),
            (Box::new(backend), "reset by peer"),
        ];
        #[cfg(feature = "prometheus")]
        errors.push((
            Box::new(ConfigError::Metrics(prometheus::Error::Msg("taken".into()))),
            "taken",
        ));
        let multiline = CheckError::backend(
            std::io::Error::other("db error: ERROR: boom\nDETAIL: Key (id)=(1) exists.\n"),
            None,
        );
        assert_eq!(
            multiline.to_string(),
            "db error: ERROR: boom; DETAIL: Key (id)=(1) exists."
        );
        for (error, cause) in &errors {
            let error = error.as_ref();
            let text = chain(error);
            assert_eq!(text.matches(*cause).count(), 1, "{text}");
        }
    }
}
