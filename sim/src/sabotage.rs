//! Deliberately broken behaviours, to see the checker fail: the lock sessions of the real
//! adapter broken on purpose (a wrapper of its session seam, [`SabotagedSessions`], and for
//! sharded runs [`StaleSurveySessions`]), an operator whose resign loses its hold-off, a
//! sharded service whose work does not hold its term, and the simulated server's own. A run
//! that checks the real adapter switches none on; the adapter itself has no sabotage in it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plexsphere_leader::LockKey;
use plexsphere_leader::session::{BoxFuture, LockSession, QueryError, Row, SessionSource};

use crate::setup::{DriverSabotage, Mechanism};

/// The lock sessions of a replica's pool with one [`DriverSabotage`] of its sessions in them;
/// every other statement goes through as it is.
#[derive(Debug)]
pub(crate) struct SabotagedSessions {
    inner: Arc<dyn SessionSource>,
    sabotage: DriverSabotage,
    /// The leader's check statement of this election, to recognise it.
    verify: String,
    /// How long [`DriverSabotage::KeepTermOnFailedPing`] and
    /// [`DriverSabotage::KeepLeaseOnFailedRenewal`] wait for an answer.
    patience: Duration,
    /// The lease renewal of this election before and after its holder, to recognise it.
    renewal: (String, String),
}

impl SabotagedSessions {
    /// `inner`'s sessions for the election of `key` at check interval `interval`, broken by
    /// `sabotage`.
    pub(crate) fn new(
        inner: impl SessionSource,
        sabotage: DriverSabotage,
        key: LockKey,
        interval: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(inner),
            sabotage,
            verify: plexsphere_leader::sql::verify(key),
            patience: interval / 2,
            renewal: renewal_around_holder(key, interval),
        }
    }
}

/// The renewal statement `sql::lease::renew` builds for `key` with the default TTL (three
/// intervals), split around its holder: what every renewal of the election begins and ends
/// with (read from the builder, so a change of the statement cannot silently disarm the
/// sabotage).
fn renewal_around_holder(key: LockKey, interval: Duration) -> (String, String) {
    let ttl = interval * plexsphere_leader_core::LEASE_TTL_INTERVALS;
    let ttl_ms = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX);
    let schema = plexsphere_leader::sql::lease::DEFAULT_SCHEMA;
    let built = plexsphere_leader::sql::lease::renew(schema, key, HOLDER_MARK, ttl_ms);
    match built.split_once(HOLDER_MARK) {
        Some((before, after)) => (before.to_owned(), after.to_owned()),
        None => (built, String::new()),
    }
}

/// Whether `statement` is a survey of `sql::candidacy`, a standby's (`publishes`) or the
/// leader's, of either mechanism: recognised by how the builders begin them (read from the
/// builders, so a change of the statements cannot silently disarm the sabotages).
fn is_survey(statement: &str, publishes: bool) -> bool {
    use plexsphere_leader::rank::{Candidate, FloorStep, Rank, Version};
    use plexsphere_leader::sql::candidacy;
    let key = LockKey::DEFAULT;
    let mine = Candidate {
        rank: Rank::of_version(Version::new(0, 0, 0)),
        live_for: Duration::ZERO,
    };
    let table = candidacy::candidate_table(plexsphere_leader::sql::lease::DEFAULT_SCHEMA);
    let (sessions, rows) = if publishes {
        (
            candidacy::survey_sessions(
                key,
                Some((mine, "x")),
                (candidacy::FLOOR_TABLE, FloorStep::Off),
            ),
            candidacy::survey_rows(
                &table,
                key,
                "x",
                Some(mine),
                (candidacy::FLOOR_TABLE, FloorStep::Off),
            ),
        )
    } else {
        (
            candidacy::survey_sessions(key, None, (candidacy::FLOOR_TABLE, FloorStep::Off)),
            candidacy::survey_rows(
                &table,
                key,
                "x",
                None,
                (candidacy::FLOOR_TABLE, FloorStep::Off),
            ),
        )
    };
    // The common beginnings: up to the first parameter.
    let begins = |built: &str, before: &str| {
        built
            .split_once(before)
            .is_some_and(|(head, _)| statement.starts_with(head))
    };
    if publishes {
        begins(&sessions, "concat(") || begins(&rows, " AS t (")
    } else {
        begins(&sessions, " FROM pg_stat_activity") || begins(&rows, "), gone")
    }
}

/// A holder no replica has, to find where the builder writes the holder.
const HOLDER_MARK: &str = "plexsphere-sabotage-holder-mark";

impl SessionSource for SabotagedSessions {
    fn acquire(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn LockSession>, plexsphere_leader::session::CheckError>> {
        Box::pin(async move {
            let session = self.inner.acquire().await?;
            Ok(Box::new(SabotagedSession {
                session: Some(session),
                source: Arc::clone(&self.inner),
                sabotage: self.sabotage,
                verify: self.verify.clone(),
                patience: self.patience,
                renewal: self.renewal.clone(),
                backend_pid: None,
            }) as Box<dyn LockSession>)
        })
    }

    /// The exclusion proof's own session, unsabotaged: a sabotage breaks the election's
    /// statements, not the proof's.
    fn open_outside_pool(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn LockSession>, plexsphere_leader::session::CheckError>> {
        self.inner.open_outside_pool()
    }
}

/// One session of [`SabotagedSessions`]. `session` is `None` once
/// [`DriverSabotage::ReturnGrantedToPool`] gave it back at the detach.
struct SabotagedSession {
    session: Option<Box<dyn LockSession>>,
    source: Arc<dyn SessionSource>,
    sabotage: DriverSabotage,
    verify: String,
    patience: Duration,
    renewal: (String, String),
    /// The backend granted the lock, from the detach.
    backend_pid: Option<i32>,
}

impl SabotagedSession {
    /// The grant statement's answer of a refusal.
    fn refused(&self) -> Vec<Row> {
        let pid = self.backend_pid.unwrap_or_default().to_string();
        let refused = plexsphere_leader::sql::outcome::REFUSED.to_owned();
        vec![vec![Some(refused), Some(pid)]]
    }

    /// The check's answer of a session that holds the lock.
    fn holding(&self) -> Vec<Row> {
        let pid = self.backend_pid.unwrap_or_default().to_string();
        let granted = plexsphere_leader::sql::outcome::GRANTED.to_owned();
        vec![vec![
            Some(pid),
            Some("f".into()),
            Some("t".into()),
            Some(granted),
        ]]
    }

    /// Runs `statement` on this session or, when it went back to the pool, on any pooled one.
    async fn pass(&self, statement: &str) -> Result<Vec<Row>, QueryError> {
        match &self.session {
            Some(session) => session.query(statement).await,
            None => {
                let session = self.source.acquire().await.map_err(QueryError::Failed)?;
                session.query(statement).await
            }
        }
    }
}

impl LockSession for SabotagedSession {
    fn query<'a>(&'a self, statement: &'a str) -> BoxFuture<'a, Result<Vec<Row>, QueryError>> {
        Box::pin(async move {
            let check = statement == self.verify;
            match self.sabotage {
                DriverSabotage::NeverPing if check => Ok(self.holding()),
                DriverSabotage::ReturnGrantedToPool if check => {
                    self.pass("SELECT 1").await?;
                    Ok(self.holding())
                }
                DriverSabotage::KeepTermOnFailedPing if check => {
                    let _answer = tokio::time::timeout(self.patience, self.pass(statement)).await;
                    Ok(self.holding())
                }
                // The queued grant statement (`pg_advisory_lock`, not `pg_try_advisory_lock`).
                DriverSabotage::LockTimeoutAsRefusal
                    if statement.contains(" pg_advisory_lock(") =>
                {
                    match self.pass(statement).await {
                        Err(QueryError::LockTimeout(_)) => Ok(self.refused()),
                        answer => answer,
                    }
                }
                DriverSabotage::KeepLeaseOnFailedRenewal
                    if statement.starts_with(&self.renewal.0)
                        && statement.ends_with(&self.renewal.1) =>
                {
                    let answer = tokio::time::timeout(self.patience, self.pass(statement)).await;
                    match answer {
                        Ok(Ok(rows)) if !rows.is_empty() => Ok(rows),
                        // Renewed, says the wrapper: one row of `RETURNING 1`.
                        _ => Ok(vec![vec![Some("1".to_owned())]]),
                    }
                }
                // The server's refusal of the probe never reaches the elector: it passed.
                DriverSabotage::IgnoreUnfit if statement == crate::setup::UNFIT_PROBE => {
                    let _refused = self.pass(statement).await;
                    Ok(Vec::new())
                }
                // The leader's survey, of either mechanism: it publishes nothing.
                DriverSabotage::NeverYield if is_survey(statement, false) => {
                    self.pass(statement).await?;
                    Ok(Vec::new())
                }
                // A standby's survey: published, but nobody better is found.
                DriverSabotage::NeverDefer if is_survey(statement, true) => {
                    self.pass(statement).await?;
                    Ok(Vec::new())
                }
                DriverSabotage::SkipIdleSessionTimeout
                    if statement.contains("'idle_session_timeout'") =>
                {
                    let rows = self.pass(statement).await?;
                    self.pass("SET idle_session_timeout = 0").await?;
                    Ok(rows)
                }
                _ => self.pass(statement).await,
            }
        })
    }

    fn detach(mut self: Box<Self>, backend_pid: i32) -> Box<dyn LockSession> {
        self.backend_pid = Some(backend_pid);
        self.session = match (self.sabotage, self.session.take()) {
            // Back to the pool, lock and all.
            (DriverSabotage::ReturnGrantedToPool, _) => None,
            (_, session) => session.map(|session| session.detach(backend_pid)),
        };
        self
    }

    fn close(self: Box<Self>) {
        if let Some(session) = self.session {
            session.close();
        }
    }

    fn ended(&self) -> BoxFuture<'_, ()> {
        match &self.session {
            Some(session) => session.ended(),
            None => Box::pin(std::future::pending()),
        }
    }
}

/// The lock sessions of a sharded replica with [`ShardSabotage::KeepShardsOnFailedSurvey`](crate::setup::ShardSabotage::KeepShardsOnFailedSurvey)
/// in them: every other statement goes through as it is.
#[derive(Debug)]
pub(crate) struct StaleSurveySessions {
    inner: Arc<dyn SessionSource>,
    /// How the check statement of this space begins (the advisory survey whole, or a lease
    /// member's renewal up to its member id), to recognise it.
    check: String,
    /// How long a check may take before the last good rows answer it.
    patience: Duration,
    /// A lease member's last good renewal, shared by its pooled sessions (each statement
    /// borrows one); `None` for the advisory lock, whose one member session remembers its own.
    shared: Option<Arc<Mutex<Option<Vec<Row>>>>>,
}

impl StaleSurveySessions {
    /// `inner`'s sessions for the space of `count` shards of `class` held by `mechanism` at
    /// check interval `interval`.
    pub(crate) fn new(
        inner: impl SessionSource,
        class: i32,
        count: u32,
        interval: Duration,
        mechanism: Mechanism,
    ) -> Self {
        let (check, shared) = match mechanism {
            Mechanism::Advisory => (
                plexsphere_leader::shard_sql::survey(
                    class,
                    count,
                    plexsphere_leader::rank::FloorStep::Off,
                ),
                None,
            ),
            Mechanism::Lease => (renewal_of_space(class, interval), Some(Arc::default())),
        };
        Self {
            inner: Arc::new(inner),
            check,
            patience: interval / 2,
            shared,
        }
    }
}

/// How every renewal of lease space `class` with the default TTL (three intervals) begins:
/// the statement `shard_sql::lease::renew` builds, up to its member id (read from the builder,
/// so a change of the statement cannot silently disarm the sabotage).
fn renewal_of_space(class: i32, interval: Duration) -> String {
    const MEMBER: &str = " AND member = ";
    let ttl = interval * plexsphere_leader_core::LEASE_TTL_INTERVALS;
    let ttl_ms = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX);
    let schema = plexsphere_leader::sql::lease::DEFAULT_SCHEMA;
    let member = plexsphere_leader::sharded::MemberId::new(0);
    let built = plexsphere_leader::shard_sql::lease::renew(schema, class, member, "", ttl_ms);
    match built.split_once(MEMBER) {
        Some((before, _)) => format!("{before}{MEMBER}"),
        None => built,
    }
}

impl SessionSource for StaleSurveySessions {
    fn acquire(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn LockSession>, plexsphere_leader::session::CheckError>> {
        Box::pin(async move {
            let session = self.inner.acquire().await?;
            Ok(Box::new(StaleSurveySession {
                session,
                check: self.check.clone(),
                patience: self.patience,
                last: self.shared.clone().unwrap_or_default(),
            }) as Box<dyn LockSession>)
        })
    }

    fn cancel_kept(&self) {
        self.inner.cancel_kept();
    }

    /// The exclusion proof's own session, unsabotaged: a sabotage breaks the election's
    /// statements, not the proof's.
    fn open_outside_pool(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn LockSession>, plexsphere_leader::session::CheckError>> {
        self.inner.open_outside_pool()
    }
}

/// One session of [`StaleSurveySessions`]: remembers its last good check (with its source,
/// for a lease member).
struct StaleSurveySession {
    session: Box<dyn LockSession>,
    check: String,
    patience: Duration,
    last: Arc<Mutex<Option<Vec<Row>>>>,
}

impl StaleSurveySession {
    fn last(&self) -> Option<Vec<Row>> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl LockSession for StaleSurveySession {
    fn query<'a>(&'a self, statement: &'a str) -> BoxFuture<'a, Result<Vec<Row>, QueryError>> {
        Box::pin(async move {
            if !statement.starts_with(&self.check) {
                return self.session.query(statement).await;
            }
            let answer = tokio::time::timeout(self.patience, self.session.query(statement)).await;
            match (answer, self.last()) {
                (Ok(Ok(rows)), _) => {
                    *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(rows.clone());
                    Ok(rows)
                }
                (_, Some(stale)) => Ok(stale),
                (Ok(Err(error)), None) => Err(error),
                // Nothing to pretend with: the elector's own deadline ends the wait.
                (Err(_elapsed), None) => std::future::pending().await,
            }
        })
    }

    fn detach(self: Box<Self>, backend_pid: i32) -> Box<dyn LockSession> {
        let Self {
            session,
            check,
            patience,
            last,
        } = *self;
        Box::new(Self {
            session: session.detach(backend_pid),
            check,
            patience,
            last,
        })
    }

    fn close(self: Box<Self>) {
        self.session.close();
    }

    fn ended(&self) -> BoxFuture<'_, ()> {
        self.session.ended()
    }
}
