//! The elector services embed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use plexsphere_leader_core::StuckLeader;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::Config;
use crate::driver::Driver;
use crate::driver::single::Single;
use crate::error::{ConfigError, RunError};
use crate::key::LockKey;
use crate::leadership::{Leadership, Resignation, TermWaitError};
use crate::metrics::ElectionMetrics;
use crate::shared::{OneLeader, Shared};
use crate::term::Term;

/// Elects one background leader among the replicas of a service through a PostgreSQL session
/// advisory lock (by default `(1886156915, 1)`, see [`Config::key`]) or, behind a transaction-
/// mode pooler, a lease row ([`Config::lease`]), and tells the service whether this replica
/// leads.
///
/// Every replica runs one `Elector` ([`run`](Self::run)); the replica whose session holds the
/// lock is the leader, the others are standbys that try again every check interval. Cloning an
/// `Elector` gives another handle on the same election.
///
/// ```no_run
/// use plexsphere_leader::{Config, Elector};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// let elector = Elector::new(Config::new(pool))?;
/// let shutdown = CancellationToken::new();
/// let election = tokio::spawn({
///     let (elector, shutdown) = (elector.clone(), shutdown.clone());
///     async move { elector.run(shutdown).await }
/// });
/// // Periodic work that only the leader does, stopped when leadership ends:
/// let ran = elector
///     .run_if_leader(&shutdown, |term| async move {
///         term.cancelled().await; // ... or finish earlier ...
///         Ok::<_, std::io::Error>(())
///     })
///     .await?;
/// shutdown.cancel(); // a leader ends its term, unlocks and closes its session
/// election.await??;
/// # let _ = ran; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Elector {
    inner: Arc<Shared<OneLeader>>,
}

impl Elector {
    /// Builds an elector (the spec's `leader.New`). Nothing is connected until
    /// [`run`](Self::run).
    ///
    /// # Errors
    /// [`ConfigError::CheckInterval`] when the interval is below 50 ms
    /// ([`MIN_CHECK_INTERVAL`](crate::config::MIN_CHECK_INTERVAL)) or four intervals exceed
    /// what `idle_session_timeout` holds; [`ConfigError::LeaseTtl`] when a lease's TTL is
    /// shorter than two intervals; [`ConfigError::LeaseQueued`] for a lease with the queued
    /// acquire mode; [`ConfigError::StopGrace`] when the stop grace is
    /// longer than two intervals; [`ConfigError::Identity`] when the configured identity is
    /// empty, not printable ASCII or too long; [`ConfigError::HoldOff`] when the resign hold-off
    /// is too long; [`ConfigError::FitnessProbe`] when the fitness probe is blank;
    /// [`ConfigError::Metrics`] when the metrics cannot be registered.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        let options = config.options()?;
        let hold_off = config.validated_hold_off(options.interval())?;
        let identity = config.common.resolved_identity()?;
        let lease_schema = config.validated_lease_schema()?;
        let fitness_probe = config.validated_fitness_probe()?.map(Arc::from);
        let metrics = ElectionMetrics::for_config(&config)?;
        if let Some(metrics) = &metrics {
            metrics.set_eligible(config.eligible);
        }
        let naming = crate::shared::Naming {
            key: config.key,
            identity,
            lease_schema,
            fitness_probe,
        };
        let inner = Shared::<OneLeader>::new(
            config.common.sessions,
            options,
            naming,
            config.clock,
            metrics,
            hold_off,
        );
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Takes part in the election until `shutdown` is cancelled (the spec's `Run`).
    ///
    /// It checks once at once, then every check interval: a standby borrows a pooled connection
    /// and tries the lock (refused: the connection goes back untouched; granted: it is taken out
    /// of the pool, the replica leads and a term begins); the leader verifies its lock on its
    /// own session (same backend, lock held, not in recovery: `sql::verify`), and a failed
    /// verdict, an error or no answer within one interval demotes it. Connection and
    /// query failures are logged at WARN (`leader: acquire lock connection: <cause>`) and retried
    /// at the next check; `run` does not return for them.
    ///
    /// On cancellation the leader ends its term first, then releases what it holds under a
    /// 2-second budget that outlives `shutdown` (`pg_advisory_unlock` and closing its session;
    /// with a lease, a statement that expires its row), and returns `Ok(())`; a standby
    /// returns at once. With a lease ([`Config::lease`](crate::Config::lease)) a standby's
    /// check is a claim of the lease row and the leader's a renewal, each on a connection
    /// borrowed for that statement alone. A panic unwinding through `run`, or dropping its future (task
    /// abort), ends the term as lost ([`LossReason::Panicked`](crate::LossReason::Panicked) or
    /// [`Dropped`](crate::LossReason::Dropped)) and closes the connection
    /// without unlocking (the server then releases the lock), logging
    /// `background leader lock abandoned after a panic` when the replica led. `run` may be
    /// called again after it returned, panicked or was dropped.
    ///
    /// # Errors
    /// [`RunError::AlreadyRunning`] when another `run` of this elector is in progress;
    /// [`RunError::SessionsMultiplexed`] when the leader's check proved that the pool hands the
    /// lock session's statements to other server sessions (a transaction-mode pooler): the
    /// term ended as lost, the session was closed, and no later check could succeed through that
    /// pool (use [`Config::lease`](crate::Config::lease)); [`RunError::LockNotExclusive`] when
    /// the exclusion proof, before the first attempt, found the server's advisory lock granted
    /// to two sessions at once (no term began).
    ///
    /// Before its first attempt (and again after a lost term) a run proves that the pool's
    /// sessions are its own and that the server's lock excludes
    /// ([`plexsphere_leader_core::proof`]): one pooled connection and one short-lived session
    /// of its own, opened outside the pool and closed at once. A proof that proves nothing (no
    /// second session within half an interval, or it failed) is logged at WARN and tried again
    /// at the next check, and the replica makes no attempt until one passes.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RunError> {
        // Every line the election logs carries its key and identity, so that two elections in
        // one process (shards, a second service) log distinguishable lines.
        let span = tracing::info_span!(
            target: "plexsphere_leader",
            "election",
            key = %self.inner.key(),
            identity = %self.inner.identity(),
            pid = std::process::id(),
        );
        let single = Single::new(Arc::clone(&self.inner));
        let driver = span.in_scope(|| Driver::start(single))?;
        self.inner.run_ended(None);
        let outcome = driver.run(shutdown).instrument(span).await;
        // Published, so that `next_term` and every subscriber learn at once that no term can
        // come from this run.
        self.inner.run_ended(outcome.err());
        outcome
    }

    /// The current term (the spec's `Term(parent)`): `Some` on the leader, with a token that is
    /// cancelled when `parent` is cancelled or the term ends, whichever comes first; `None` on a
    /// standby. Dropping the [`Term`] cancels its token.
    pub fn term(&self, parent: &CancellationToken) -> Option<Term> {
        self.inner.current_term()?.handle(parent)
    }

    /// Runs one unit of background work on the leader (the spec's `Do`). `work` receives the
    /// term's token, so it can stop when leadership ends.
    ///
    /// | situation                                  | `work` called | result |
    /// |--------------------------------------------|---------------|--------|
    /// | standby                                    | no            | `Ok(false)` |
    /// | leader, leadership held until `work` returns | yes         | `Ok(true)`, or `work`'s error |
    /// | leader, term ended while `work` ran        | yes           | `Ok(false)`, logged at INFO; `work`'s result is discarded |
    ///
    /// A demotion never counts as a failure. A `parent` cancelled while `work` ran does not
    /// change the result while the term holds: `work`'s own `Ok(true)` or error comes back (a
    /// caller's deadline never hides a real error); when the parent was cancelled first and the
    /// term then ended too, the result is `Ok(false)` and nothing is logged (the term's
    /// [`cause`](Term::cause) is `ParentCancelled`). A panic in `work` propagates to the caller; the term's
    /// token handed to it is cancelled as the panic unwinds. With
    /// [`Config::work_deadline`](crate::Config::work_deadline) and [`OnOverdue::Abort`](crate::config::OnOverdue::Abort), `work`
    /// still running that long after its term ended is dropped and the result is `Ok(false)`.
    ///
    /// # Errors
    /// `work`'s own error, when the term held until it returned.
    pub async fn run_if_leader<T, E, Fut: Future<Output = Result<T, E>>>(
        &self,
        parent: &CancellationToken,
        work: impl FnOnce(CancellationToken) -> Fut,
    ) -> Result<bool, E> {
        crate::term::run_in(self.term(parent), work).await
    }

    /// Whether this replica holds the lock (the spec's `IsLeader`): an atomic read, callable from
    /// any thread; the same answer as [`leadership`](Self::leadership)`().is_leader()`.
    pub fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// The latest published [`Leadership`]: the open term, if any, and how the last one ended.
    pub fn leadership(&self) -> Leadership {
        self.inner.leadership()
    }

    /// A receiver of the published [`Leadership`], updated every time a term of this replica
    /// begins or ends (before the term's tokens are cancelled, so work that sees its token
    /// cancelled also sees the new value). Await `changed()` instead of polling
    /// [`is_leader`](Self::is_leader).
    ///
    /// A watch keeps the latest value only: a term lost and a new one begun between two reads
    /// show as a new term id, never as a missed change. Receivers never close while the
    /// `Elector` lives.
    ///
    /// ```no_run
    /// # async fn example(elector: plexsphere_leader::Elector) {
    /// let mut leadership = elector.subscribe();
    /// loop {
    ///     let now = *leadership.borrow_and_update();
    ///     match (now.term(), now.last_end()) {
    ///         (Some(term), _) => println!("leading in term {}", term.id),
    ///         (None, Some(end)) => println!("standby: term {} ended: {}", end.id, end.cause),
    ///         (None, None) => println!("standby"),
    ///     }
    ///     if leadership.changed().await.is_err() {
    ///         break;
    ///     }
    /// }
    /// # }
    /// ```
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.inner.subscribe()
    }

    /// Waits until this replica leads and returns the open [`Term`], whose token is a child of
    /// `parent` ([`term`](Self::term)); at once when it already leads. Wakes on the published
    /// leadership, never by polling. It does not start the election: [`run`](Self::run) must be
    /// running (or start later) for a term to come; once a run has ended with an error, it
    /// answers with that error at once instead of waiting for a term that cannot come.
    ///
    /// ```no_run
    /// # async fn example(elector: plexsphere_leader::Elector) -> Result<(), Box<dyn std::error::Error>> {
    /// use plexsphere_leader::leadership::TermWaitError;
    /// let shutdown = tokio_util::sync::CancellationToken::new();
    /// loop {
    ///     let term = match elector.next_term(&shutdown).await {
    ///         Ok(term) => term,
    ///         Err(TermWaitError::Cancelled) => break, // shutting down
    ///         Err(failed) => return Err(failed.into()), // the run ended: say why
    ///     };
    ///     // ... lead until term.token() is cancelled ...
    ///     let why = term.ended().await;
    ///     println!("term {} ended: {why}", term.id());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`TermWaitError::Cancelled`] once `parent` is cancelled before a term began;
    /// [`TermWaitError::RunFailed`] with the run's error once [`run`](Self::run) returned one
    /// ([`Leadership::run_failed`]), until `run` is called again. Cancel-safe.
    pub async fn next_term(&self, parent: &CancellationToken) -> Result<Term, TermWaitError> {
        let mut published = self.subscribe();
        loop {
            if parent.is_cancelled() {
                return Err(TermWaitError::Cancelled);
            }
            if let Some(term) = self.term(parent) {
                return Ok(term);
            }
            if let Some(error) = published.borrow_and_update().run_failed() {
                return Err(TermWaitError::RunFailed(error));
            }
            tokio::select! {
                () = parent.cancelled() => return Err(TermWaitError::Cancelled),
                changed = published.changed() => {
                    if changed.is_err() {
                        // Unreachable while `self` holds the sender; wait for the parent.
                        parent.cancelled().await;
                    }
                }
            }
        }
    }

    /// The validated check interval.
    pub fn check_interval(&self) -> Duration {
        self.inner.interval().get()
    }

    /// Asks this replica to give up leadership for the configured
    /// [`resign_hold_off`](crate::Config::resign_hold_off) (see [`resign_for`](Self::resign_for)).
    pub fn resign(&self) -> Resignation {
        self.resign_for(self.inner.hold_off())
    }

    /// Asks this replica to give up leadership and not to try the lock for `hold_off` (at most
    /// [`MAX_HOLD_OFF`](crate::config::MAX_HOLD_OFF); longer is shortened to it), so that another
    /// replica takes over. A leader ends its term ([`TermEndCause::Resigned`](crate::TermEndCause::Resigned)), gives its work
    /// the stop grace, releases the lock with `pg_advisory_unlock` (a lease: expires its row),
    /// logs `leader: released background leader lock after resigning` (`… lease …`) and stays
    /// a standby; a
    /// standby abandons a check in progress and sits the hold-off out. Returns at once; the
    /// release happens on the task running [`run`](Self::run). Ignored while a stop or an
    /// earlier resign is releasing the lock.
    pub fn resign_for(&self, hold_off: Duration) -> Resignation {
        self.inner.resign(hold_off)
    }

    /// Makes this replica eligible to lead, or not (for example a canary). An ineligible
    /// replica never tries the lock; a leader made ineligible resigns as with
    /// [`resign`](Self::resign) and stays out until made eligible again. The setting outlives
    /// runs; [`Config::eligible`](crate::Config::eligible) gives the initial one.
    pub fn set_eligible(&self, eligible: bool) {
        if let Some(metrics) = self.inner.metrics() {
            metrics.set_eligible(eligible && self.is_fit());
        }
        self.inner.set_eligible(eligible);
    }

    /// Whether this replica may lead: the last [`set_eligible`](Self::set_eligible) once the
    /// running election applied it.
    pub fn is_eligible(&self) -> bool {
        self.inner.election().is_eligible()
    }

    /// Whether this replica can do the leader's work as far as it knows: `false` from the
    /// server's refusal of its fitness probe ([`Config::fitness_probe`](crate::Config::fitness_probe))
    /// until a probe passes again ([`check_failure`](Self::check_failure) says why). Always
    /// `true` without a probe, and between runs.
    pub fn is_fit(&self) -> bool {
        !self.inner.election().is_unfit()
    }

    /// The election's advisory lock key ([`Config::key`]).
    pub fn key(&self) -> LockKey {
        self.inner.key()
    }

    /// The schema of the lease's tables ([`Config::lease_schema`], default `public`): where a
    /// lease's fenced writes check its epoch (`fencing::check_in`).
    pub fn lease_schema(&self) -> &str {
        self.inner.lease_schema()
    }

    /// The identity the lock session's `application_name` carries while this replica leads
    /// ([`Config::identity`], or the default `<service>@<host>`).
    pub fn identity(&self) -> &str {
        self.inner.identity()
    }

    /// Who leads this elector's election, asked of the server on a connection of the
    /// elector's pool ([`status::who_leads`](crate::status::who_leads)); `None` when no
    /// session holds the lock.
    ///
    /// # Errors
    /// [`StatusError`](crate::status::StatusError) when no connection can be had or the query
    /// fails. Cancel-safe: dropping the future returns the connection to the pool.
    pub async fn who_leads(
        &self,
    ) -> Result<Option<crate::status::LeaderStatus>, crate::status::StatusError> {
        let session = self.inner.sessions().acquire().await?;
        crate::status::who_leads_on(&*session, self.inner.key()).await
    }

    /// Who holds this elector's lease (the lease mechanism, [`Config::lease`]), asked of the
    /// server on a connection of the elector's pool
    /// ([`status::lease_holder`](crate::status::lease_holder)); `None` when no replica ever
    /// claimed it.
    ///
    /// # Errors
    /// [`StatusError`](crate::status::StatusError) when no connection can be had or the query
    /// fails (for example, the lease table does not exist). Cancel-safe.
    pub async fn lease_holder(
        &self,
    ) -> Result<Option<crate::status::LeaseStatus>, crate::status::StatusError> {
        let session = self.inner.sessions().acquire().await?;
        crate::status::lease_holder_on(&*session, self.inner.lease_schema(), self.inner.key()).await
    }

    /// The live candidates of this elector's election, asked of the server on a connection of
    /// the elector's pool ([`status::candidates`](crate::status::candidates)): each ranked
    /// standby that published its rank within the last two check intervals, one per identity,
    /// best rank first (this replica's own candidacy included while it is a standby).
    ///
    /// # Errors
    /// [`StatusError`](crate::status::StatusError) when no connection can be had or the survey
    /// fails. Cancel-safe.
    pub async fn candidates(
        &self,
    ) -> Result<Vec<crate::status::CandidateStatus>, crate::status::StatusError> {
        let session = self.inner.sessions().acquire().await?;
        let published = if self.holds_a_lease() {
            crate::status::Published::Rows {
                schema: self.inner.lease_schema(),
            }
        } else {
            crate::status::Published::Sessions
        };
        let live = self.inner.interval().get() * crate::sql::candidacy::LIVE_INTERVALS;
        crate::status::candidates_on(&*session, self.inner.key(), published, live).await
    }

    /// This replica's rank ([`Config::version`], [`Config::priority`]); `None` unranked.
    pub fn rank(&self) -> Option<crate::rank::Rank> {
        self.inner.options().rank_of()
    }

    /// The rank of the better candidate this standby defers to, while it defers
    /// ([`Config::version`]).
    pub fn deferring_to(&self) -> Option<crate::rank::Rank> {
        let now = self.inner.clock().now();
        self.inner.election().deferring_to(now)
    }

    /// Whether this replica's last survey found it older than the version floor
    /// ([`Config::version_floor`]): it does not lead ([`check_failure`](Self::check_failure)
    /// is not set by it; the WARN record names both versions).
    pub fn is_below_version_floor(&self) -> bool {
        self.inner.election().is_below_floor()
    }

    /// Whether this elector holds a lease instead of the advisory lock ([`Config::lease`]).
    pub fn holds_a_lease(&self) -> bool {
        self.inner.holds_a_lease()
    }

    /// The latest failed check of the current run of failed checks, in full (class, count,
    /// since when, the error and, for a permanent failure, what to do); `None` when the last
    /// check succeeded. A permanent failure (a database that does not exist, a role that may
    /// not connect, a wrong password) is logged at ERROR once, then at WARN at most once a
    /// minute; the election keeps retrying. [`Leadership::check_failing`](crate::Leadership::check_failing)
    /// publishes its class as an event. With a lease ([`Config::lease`]) a leader's failed
    /// renewal is a failed check too (its term goes on while the lease is trusted), and a claim
    /// or renewal that works ends the run.
    pub fn check_failure(&self) -> Option<crate::leadership::CheckFailure> {
        self.inner.check_failure()
    }

    /// Whether the election is still driven (stuck-leader liveness): `Err` when this replica
    /// believes it leads but its last successful check (or its grant) is older than
    /// [`STUCK_AFTER_INTERVALS`](crate::leadership::STUCK_AFTER_INTERVALS) check intervals — its runtime or
    /// thread is blocked, or its `run` future is no longer polled. A standby, a replica that is
    /// not running, and a leader whose checks succeed are live. Cheap: an atomic load and a
    /// mutex read.
    ///
    /// This is for liveness only: never make readiness depend on it or on leadership.
    ///
    /// # Errors
    /// [`StuckLeader`] with the age of the last check and the bound.
    pub fn liveness(&self) -> Result<(), StuckLeader> {
        // The core's verdict (`Election::stuck`), on the driver's clock.
        self.inner.liveness()
    }

    /// The longest a graceful stop of [`run`](Self::run) takes when this replica leads: the
    /// stop grace for its work, then the 2-second unlock budget. Give whatever waits for `run`
    /// to return after cancelling it (a supervisor's shutdown bound) at least this long, or the
    /// unlock is cut short and the lock left to `idle_session_timeout`.
    pub fn stop_budget(&self) -> Duration {
        self.inner.stop_budget()
    }
}
