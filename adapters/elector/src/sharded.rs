//! Sharded leadership: `K` shards balanced over the live replicas, each shard owned by at most
//! one replica at a time, all of a replica's shard locks on one PostgreSQL session.
//!
//! Every replica runs one [`ShardedElector`]. Its lock session holds the member lock
//! `(class, -1)` in shared mode and the locks `(class, s)` of the shards it owns; once per
//! interval one statement reads the space's rows of `pg_locks` (who is a member, who holds
//! which shard), proves this replica's own locks, and the pure core
//! ([`plexsphere_leader_core::shards`]) decides what to take and what to hand over:
//!
//! - every member may own `⌊K/R⌋` shards, and `K mod R` of them one more; free shards are taken
//!   at once up to that cap, in rendezvous order, so a join or a leave moves about `K/R` shards;
//! - a member over its cap hands the excess over once the membership has been stable for the
//!   rebalance delay, a limited number per interval: it ends the shard's term, waits for the
//!   work of that term to return, then unlocks; the new owner takes it at its next survey;
//! - a failed, unanswered or contradicting survey ends the session and every shard with it;
//!   the server releases them, and the other members take them at their next survey.
//!
//! ```no_run
//! use std::time::Duration;
//! use plexsphere_leader::sharded::{ShardConfig, ShardedElector};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let elector = ShardedElector::new(
//!     ShardConfig::new(pool, 1024).check_interval(Duration::from_secs(1)),
//! )?;
//! let shutdown = CancellationToken::new();
//! let run = tokio::spawn({
//!     let elector = elector.clone();
//!     let shutdown = shutdown.clone();
//!     async move { elector.run(shutdown).await }
//! });
//! // A sweep over every tenant: each replica sweeps the tenants of the shards it owns.
//! for shard in elector.ownership().shards.keys() {
//!     elector
//!         .run_if_owner(*shard, &shutdown, |token| async move {
//!             // sweep the tenants with `tenant_id % 1024 == shard`, until `token` is cancelled
//!             Ok::<_, std::io::Error>(())
//!         })
//!         .await?;
//! }
//! shutdown.cancel();
//! run.await??;
//! # Ok(())
//! # }
//! ```

mod config;
mod driver;
mod lease;
pub(crate) mod metrics;
mod shared;
mod statement;
mod view;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use self::driver::Sharded;
use self::metrics::ShardMetrics;
use self::shared::ShardSpace;
use crate::driver::Driver;
use crate::error::{ConfigError, RunError};
use crate::shared::Shared;
use crate::term::Term;

pub use self::config::{DEFAULT_SHARD_CLASS, ShardConfig};
pub use self::view::{Holder, OwnedShard, Ownership, SpaceView, TRANSITIONS_KEPT, Transition};
pub use plexsphere_leader_core::shards::{
    LockTableTooSmall, MAX_SHARDS, MemberId, Shard, ShardOptionsError,
};

/// One replica's part in a shard space. Cloning gives another handle on the same election.
#[derive(Clone)]
pub struct ShardedElector {
    inner: Arc<Shared<ShardSpace>>,
}

impl std::fmt::Debug for ShardedElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedElector")
            .field("class", &self.inner.class())
            .field("shards", &self.inner.options().count())
            .field("identity", &self.inner.identity())
            .finish_non_exhaustive()
    }
}

impl ShardedElector {
    /// A sharded elector with `config`, not running.
    ///
    /// # Errors
    /// [`ConfigError`] for an interval out of range, a shard count outside `1..=MAX_SHARDS`,
    /// a move limit of zero, a stop grace over two intervals, an invalid identity, or metrics
    /// that cannot be registered.
    pub fn new(config: ShardConfig) -> Result<Self, ConfigError> {
        let options = config.options()?;
        let identity = config.common.resolved_identity()?;
        let lease_schema = config.common.validated_lease_schema()?;
        let metrics = ShardMetrics::for_config(&config.common, config.class)?;
        Ok(Self {
            inner: Arc::new(Shared::<ShardSpace>::new(
                config.common.sessions,
                config.class,
                identity,
                lease_schema,
                options,
                metrics,
            )),
        })
    }

    /// Takes part in the space until `shutdown` is cancelled.
    ///
    /// It joins at once (a session from the pool, the member lock, `idle_session_timeout` of
    /// four intervals, the session taken out of the pool), then surveys every interval and
    /// takes or hands over shards as the core decides. Failures of the pool or the session are
    /// logged at WARN and retried at the next interval; every shard's term ends when the
    /// session is lost. On cancellation every term ends
    /// ([`TermEndCause::Stopped`](crate::TermEndCause::Stopped)), their work gets the stop
    /// grace, then `pg_advisory_unlock_all()` runs under a 2-second budget and the session
    /// closes. A panic or a dropped future ends every term as lost and closes the session
    /// without unlocking (the server then releases the locks).
    ///
    /// # Errors
    /// [`RunError::AlreadyRunning`] when another `run` of this elector is in progress;
    /// [`RunError::LockTableTooSmall`] when the server's lock table has no room for the space
    /// (nothing was taken).
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RunError> {
        let span = tracing::info_span!(
            target: "plexsphere_leader",
            "shard_space",
            class = self.inner.class(),
            identity = %self.inner.identity(),
            pid = std::process::id(),
        );
        let sharded = Sharded::new(Arc::clone(&self.inner));
        let driver = span.in_scope(|| Driver::start(sharded))?;
        driver.run(shutdown).instrument(span).await
    }

    /// The latest failed acquire of the lock session in the current run of failures, in full
    /// (class, count, since when, the error and, for a permanent failure, what to do); `None`
    /// once the session registered or surveyed. As for one election
    /// ([`Elector::check_failure`](crate::Elector::check_failure)), a permanent failure is
    /// logged at ERROR once, then at WARN at most once a minute; the run keeps retrying.
    pub fn check_failure(&self) -> Option<crate::leadership::CheckFailure> {
        self.inner.check_failure()
    }

    /// Whether the election is still driven (stuck-owner liveness), as
    /// [`Elector::liveness`](crate::Elector::liveness): `Err` when this replica owns a shard but
    /// its session last proved its locks (the registration, then each survey that showed its
    /// member lock and exactly its shards) more than
    /// [`STUCK_AFTER_INTERVALS`](crate::leadership::STUCK_AFTER_INTERVALS) check intervals ago.
    /// A driven owner surveys every interval, and a survey without answer within one interval
    /// loses the session, so only a blocked runtime or a run future no longer polled gets here.
    /// A replica that owns no shard (not running, or between sessions) is always live.
    ///
    /// This is for liveness only: never make readiness depend on it or on ownership.
    ///
    /// # Errors
    /// [`StuckLeader`](crate::leadership::StuckLeader): how long ago the last proof was, and
    /// the bound.
    pub fn liveness(&self) -> Result<(), crate::leadership::StuckLeader> {
        // The core's verdict (`ShardedElection::stuck`), on the driver's clock.
        self.inner.liveness()
    }

    /// Asks this replica to give up every shard for the default hold-off of two check intervals
    /// (the single election's; see [`resign_for`](Self::resign_for)).
    pub fn resign(&self) -> crate::leadership::Resignation {
        self.resign_for(self.inner.options().interval().default_hold_off())
    }

    /// Asks this replica to give up every shard and stay out of the space for `hold_off` (at
    /// most [`MAX_HOLD_OFF`](crate::config::MAX_HOLD_OFF); longer is shortened to it): every
    /// shard term ends ([`TermEndCause::Resigned`](crate::TermEndCause::Resigned)), the work gets
    /// the stop grace, every lock is released and the session closed, so the other members take
    /// the shards at their next survey; after the hold-off the replica rejoins with a new
    /// session and gets its share again. Returns at once; the release happens on the task
    /// running [`run`](Self::run). Ignored while a stop or an earlier resign is releasing.
    pub fn resign_for(&self, hold_off: Duration) -> crate::leadership::Resignation {
        self.inner.resign(hold_off)
    }

    /// Makes this replica eligible to own shards, or not (for example a canary). An ineligible
    /// replica leaves the space as a resign does and does not rejoin until made eligible again
    /// (it holds no member lock, so the others' shares count it out). The setting outlives runs.
    pub fn set_eligible(&self, eligible: bool) {
        if let Some(metrics) = self.inner.metrics() {
            metrics.eligible(eligible);
        }
        self.inner.set_eligible(eligible);
    }

    /// Whether this replica may own shards: the last [`set_eligible`](Self::set_eligible) once
    /// the running election applied it.
    pub fn is_eligible(&self) -> bool {
        self.inner.election().is_eligible()
    }

    /// Whether this replica's last survey found it older than the space's version floor
    /// ([`ShardConfig::version_floor`]): it owns no shard until the floor is lowered. Always
    /// `false` without a rank or a floor.
    pub fn is_below_version_floor(&self) -> bool {
        self.inner.election().is_below_floor()
    }

    /// Whether this replica owns `shard`: a read of the published ownership.
    pub fn is_owner(&self, shard: impl Into<Shard>) -> bool {
        self.inner.is_owner(shard.into().get())
    }

    /// The current term of `shard` on this replica: `Some` while it owns the shard, with a
    /// token cancelled when `parent` is cancelled or the shard's term ends (lost, handed over,
    /// stopped), whichever comes first. A handover waits until every such handle is dropped
    /// before it unlocks the shard.
    pub fn term(&self, shard: impl Into<Shard>, parent: &CancellationToken) -> Option<Term> {
        self.inner.term_of(shard.into().get())?.handle(parent)
    }

    /// Runs one unit of work for `shard` when this replica owns it: the single election's
    /// [`run_if_leader`](crate::Elector::run_if_leader) table, per shard (`Ok(false)` without
    /// the shard; `work`'s result when the term held; `Ok(false)` when the term ended under it).
    ///
    /// # Errors
    /// `work`'s own error, when the shard's term held until it returned.
    pub async fn run_if_owner<T, E, Fut: Future<Output = Result<T, E>>>(
        &self,
        shard: impl Into<Shard>,
        parent: &CancellationToken,
        work: impl FnOnce(CancellationToken) -> Fut,
    ) -> Result<bool, E> {
        crate::term::run_in(self.term(shard, parent), work).await
    }

    /// The shards this replica owns now: the latest value [`subscribe`](Self::subscribe)
    /// published.
    pub fn ownership(&self) -> Ownership {
        self.inner.ownership()
    }

    /// The ownership, published on every change: await `changed()` instead of polling.
    ///
    /// Every shard term begun or ended publishes, and so does the set of shards being handed
    /// over after each batch of the election's actions, so a handover or a take of several
    /// shards publishes several intermediate states in quick succession. A
    /// `tokio::sync::watch` keeps only the latest value, not a queue: after `changed()`, read it
    /// with `borrow_and_update()` and act on the shards owned then. States published in between
    /// are skipped, and a read that fell inside a batch is followed at once by another
    /// `changed()`, so the last state a subscriber reads is the settled one.
    pub fn subscribe(&self) -> watch::Receiver<Ownership> {
        self.inner.subscribe()
    }

    /// Who owns what, as this replica's last survey saw it (`None` before the first survey).
    pub fn view(&self) -> Option<SpaceView> {
        self.inner.view()
    }

    /// The view, published after every survey.
    pub fn subscribe_view(&self) -> watch::Receiver<Option<SpaceView>> {
        self.inner.subscribe_view()
    }

    /// The last [`TRANSITIONS_KEPT`] shard terms begun or ended on this replica, oldest first.
    pub fn transitions(&self) -> Vec<Transition> {
        self.inner.transitions()
    }

    /// The number of shards of the space.
    pub fn shard_count(&self) -> u32 {
        self.inner.options().count()
    }

    /// The class id of the space.
    pub fn class(&self) -> i32 {
        self.inner.class()
    }

    /// The name this replica shows as.
    pub fn identity(&self) -> &str {
        self.inner.identity()
    }

    /// The check interval.
    pub fn check_interval(&self) -> Duration {
        self.inner.options().interval().get()
    }
}
