//! Deliberately broken behaviours, to see the checker fail: the lock sessions of the real
//! adapter broken on purpose (a wrapper of its session seam, [`SabotagedSessions`], and for
//! sharded runs [`StaleSurveySessions`]), an operator whose resign loses its hold-off, a
//! sharded service whose work does not hold its term, and the simulated server's own. A run
//! that checks the real adapter switches none on; the adapter itself has no sabotage in it.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plexsphere_leader::LockKey;
use plexsphere_leader::session::{BoxFuture, LockSession, QueryError, Row, SessionSource};

/// One broken behaviour of the replica's software: its lock sessions, or its operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverSabotage {
    /// The leader never verifies its session: every check reports success without a query.
    NeverPing,
    /// The granted session goes back to the pool instead of being taken out of it, and the
    /// leader's check runs `SELECT 1` on any pooled session: the lock stays on an idle pooled
    /// session.
    ReturnGrantedToPool,
    /// The grant does not keep `idle_session_timeout` (it is set back to 0 right after), so an
    /// orphaned lock session lives until TCP gives up.
    SkipIdleSessionTimeout,
    /// A failed or unanswered check is reported as a success: the leader keeps its term.
    KeepTermOnFailedPing,
    /// A resign request loses its hold-off: the resigner may take the lock straight back.
    ResignWithoutHoldOff,
    /// A queued wait that failed with 55P03 (its `lock_timeout`) is answered as a plain
    /// refusal, so the elector skips its release-if-held and returns the session to the pool:
    /// a lock granted in the instant the wait timed out (PostgreSQL's grant-at-timeout race)
    /// stays on an idle pooled session of a replica that does not lead.
    LockTimeoutAsRefusal,
}

/// One broken behaviour of a sharded replica's software (sharded runs only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardSabotage {
    /// The service's unit of shard work gives its term handle back as it starts and works on
    /// without it, so a handover unlocks the shard while the old owner's work still runs: the
    /// old term's work no longer ends before the unlock.
    WorkOutlivesTerm,
    /// A survey that fails or does not answer within half an interval is answered with the
    /// rows of the session's last good survey, so a replica cut off from the server keeps
    /// believing it owns its shards (the sharded twin of
    /// [`DriverSabotage::KeepTermOnFailedPing`]).
    KeepShardsOnFailedSurvey,
}

/// One deliberately broken behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sabotage {
    /// A broken behaviour of the replica's software ([`DriverSabotage`]).
    Driver(DriverSabotage),
    /// A broken behaviour of a sharded replica's software ([`ShardSabotage`]).
    Shard(ShardSabotage),
    /// Both simulated servers read the fence row `FOR SHARE` without locking it
    /// ([`ServerConfig::with_row_locks`](plexsphere_leader_pgsim::ServerConfig::with_row_locks)), so a
    /// new leader's epoch advance does not wait for an old leader's fenced transaction: the
    /// fence-holds property must catch it in fencing runs.
    FenceWithoutRowLock,
}

impl Sabotage {
    /// Every sabotage, for the CLI and the checker-must-fail test.
    pub const ALL: [Self; 7] = [
        Self::Driver(DriverSabotage::NeverPing),
        Self::Driver(DriverSabotage::ReturnGrantedToPool),
        Self::Driver(DriverSabotage::SkipIdleSessionTimeout),
        Self::Driver(DriverSabotage::KeepTermOnFailedPing),
        Self::Driver(DriverSabotage::ResignWithoutHoldOff),
        Self::Driver(DriverSabotage::LockTimeoutAsRefusal),
        Self::FenceWithoutRowLock,
    ];

    /// Every sabotage of a sharded run (`--sharded --sabotage NAME`).
    pub const SHARDED: [Self; 2] = [
        Self::Shard(ShardSabotage::WorkOutlivesTerm),
        Self::Shard(ShardSabotage::KeepShardsOnFailedSurvey),
    ];

    /// The CLI name (`--sabotage NAME`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shard(ShardSabotage::WorkOutlivesTerm) => "shard-work-outlives-term",
            Self::Shard(ShardSabotage::KeepShardsOnFailedSurvey) => "keep-shards-on-failed-survey",
            Self::Driver(DriverSabotage::NeverPing) => "never-ping",
            Self::Driver(DriverSabotage::ReturnGrantedToPool) => "return-granted-to-pool",
            Self::Driver(DriverSabotage::SkipIdleSessionTimeout) => "skip-idle-session-timeout",
            Self::Driver(DriverSabotage::KeepTermOnFailedPing) => "keep-term-on-failed-ping",
            Self::Driver(DriverSabotage::ResignWithoutHoldOff) => "resign-without-hold-off",
            Self::Driver(DriverSabotage::LockTimeoutAsRefusal) => "lock-timeout-as-refusal",
            Self::FenceWithoutRowLock => "fence-without-row-lock",
        }
    }

    /// The sabotage named `name`, if any (of either list).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::SHARDED)
            .find(|sabotage| sabotage.name() == name)
    }

    /// Whether it breaks a sharded run ([`Sabotage::SHARDED`]) rather than a single election.
    pub const fn is_sharded(self) -> bool {
        matches!(self, Self::Shard(_))
    }

    /// The replica's software sabotage, if this is one.
    pub(crate) fn driver(self) -> Option<DriverSabotage> {
        match self {
            Self::Driver(driver) => Some(driver),
            Self::Shard(_) | Self::FenceWithoutRowLock => None,
        }
    }

    /// The sharded replica's software sabotage, if this is one.
    pub(crate) fn shard(self) -> Option<ShardSabotage> {
        match self {
            Self::Shard(shard) => Some(shard),
            Self::Driver(_) | Self::FenceWithoutRowLock => None,
        }
    }
}

impl fmt::Display for Sabotage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The lock sessions of a replica's pool with one [`DriverSabotage`] of its sessions in them;
/// every other statement goes through as it is.
#[derive(Debug)]
pub(crate) struct SabotagedSessions {
    inner: Arc<dyn SessionSource>,
    sabotage: DriverSabotage,
    /// The leader's check statement of this election, to recognise it.
    verify: String,
    /// How long [`DriverSabotage::KeepTermOnFailedPing`] waits for an answer.
    patience: Duration,
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
        }
    }
}

impl SessionSource for SabotagedSessions {
    fn acquire(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn LockSession>, plexsphere_leader::CheckError>> {
        Box::pin(async move {
            let session = self.inner.acquire().await?;
            Ok(Box::new(SabotagedSession {
                session: Some(session),
                source: Arc::clone(&self.inner),
                sabotage: self.sabotage,
                verify: self.verify.clone(),
                patience: self.patience,
                backend_pid: None,
            }) as Box<dyn LockSession>)
        })
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

/// The lock sessions of a sharded replica with [`ShardSabotage::KeepShardsOnFailedSurvey`]
/// in them: every other statement goes through as it is.
#[derive(Debug)]
pub(crate) struct StaleSurveySessions {
    inner: Arc<dyn SessionSource>,
    /// The survey statement of this space, to recognise it.
    survey: String,
    /// How long a survey may take before the last good rows answer it.
    patience: Duration,
}

impl StaleSurveySessions {
    /// `inner`'s sessions for the space of `count` shards of `class` at check interval
    /// `interval`.
    pub(crate) fn new(
        inner: impl SessionSource,
        class: i32,
        count: u32,
        interval: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(inner),
            survey: plexsphere_leader::shard_sql::survey(class, count),
            patience: interval / 2,
        }
    }
}

impl SessionSource for StaleSurveySessions {
    fn acquire(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn LockSession>, plexsphere_leader::CheckError>> {
        Box::pin(async move {
            let session = self.inner.acquire().await?;
            Ok(Box::new(StaleSurveySession {
                session,
                survey: self.survey.clone(),
                patience: self.patience,
                last: Mutex::new(None),
            }) as Box<dyn LockSession>)
        })
    }

    fn cancel_kept(&self) {
        self.inner.cancel_kept();
    }
}

/// One session of [`StaleSurveySessions`]: remembers its last good survey.
struct StaleSurveySession {
    session: Box<dyn LockSession>,
    survey: String,
    patience: Duration,
    last: Mutex<Option<Vec<Row>>>,
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
            if statement != self.survey {
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
            survey,
            patience,
            last,
        } = *self;
        Box::new(Self {
            session: session.detach(backend_pid),
            survey,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for sabotage in Sabotage::ALL.into_iter().chain(Sabotage::SHARDED) {
            assert_eq!(Sabotage::from_name(sabotage.name()), Some(sabotage));
        }
        assert_eq!(Sabotage::from_name("nope"), None);
    }
}
