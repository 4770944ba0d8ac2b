//! The configuration of a sharded elector.

use std::time::Duration;

use plexsphere_leader_core::shards::ShardOptions;
use plexsphere_leader_core::{CheckInterval, DEFAULT_CHECK_INTERVAL, Mechanism, OnOverdue};

use crate::config::Common;
use crate::error::ConfigError;
use crate::session::SessionSource;

/// The default class id of a shard space: `0x706c7368`, "plsh" in ASCII. Shard `s` is the
/// advisory lock `(1886155624, s)` and the member lock `(1886155624, -1)`.
pub const DEFAULT_SHARD_CLASS: i32 = 0x706c_7368;

/// The configuration of a [`ShardedElector`](super::ShardedElector): where lock sessions come
/// from, the space (class id and shard count) and the timing.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// What both modes hold alike.
    pub(crate) common: Common,
    pub(crate) shards: u32,
    pub(crate) class: i32,
    pub(crate) rebalance_delay: Option<Duration>,
    pub(crate) max_moves: Option<u32>,
    pub(crate) handover_grace: Option<Duration>,
}

impl ShardConfig {
    /// A space of `shards` shards under [`DEFAULT_SHARD_CLASS`], with lock sessions from `pool`
    /// and the spec's default interval (5 s). Build the pool with
    /// [`ObservedConnect`](crate::session::ObservedConnect) so that the end of the lock session
    /// wakes the elector at once.
    #[cfg(feature = "deadpool")]
    pub fn new(pool: deadpool_postgres::Pool, shards: u32) -> Self {
        Self::with_sessions(crate::session::PoolSessions::new(pool), shards)
    }

    /// The same, with sessions from any [`SessionSource`].
    pub fn with_sessions(sessions: impl SessionSource, shards: u32) -> Self {
        Self {
            common: Common::new(sessions, DEFAULT_CHECK_INTERVAL),
            shards,
            class: DEFAULT_SHARD_CLASS,
            rebalance_delay: None,
            max_moves: None,
            handover_grace: None,
        }
    }

    /// The class id of the space: shard `s` is the lock `(class, s)`, the member lock
    /// `(class, -1)`. Two spaces of one database need two class ids; a single election's key
    /// must not use this class.
    #[must_use]
    pub fn class(mut self, class: i32) -> Self {
        self.class = class;
        self
    }

    /// How long the set of members must stay unchanged before shards move for balance, and how
    /// long a cold start waits before its first take (default: one interval).
    #[must_use]
    pub fn rebalance_delay(mut self, delay: Duration) -> Self {
        self.rebalance_delay = Some(delay);
        self
    }

    /// The most shards this replica starts handing over per interval (default: a quarter of
    /// the space, rounded up).
    #[must_use]
    pub fn max_moves(mut self, moves: u32) -> Self {
        self.max_moves = Some(moves);
        self
    }

    /// After how long a handed-over shard whose work still runs is reported at WARN (default:
    /// one interval). The lock is kept until the work returns.
    #[must_use]
    pub fn handover_grace(mut self, grace: Duration) -> Self {
        self.handover_grace = Some(grace);
        self
    }

    crate::config::common_setters! {
        /// The check interval (default 5 s): every replica surveys the space this often.
        check_interval(interval: Duration) => interval = interval;
        /// How long a graceful stop waits for shard work before releasing anyway (default: one
        /// interval; at most two).
        stop_grace(grace: Duration) => stop_grace = Some(grace);
        /// The name this replica shows as (`application_name` of its lock session, and the status
        /// views); default `<service>@<host>` (the executable's file stem and the hostname), as for
        /// [`Config::identity`](crate::Config::identity). The run's log span adds the process id.
        identity(identity: impl Into<String>) => identity = Some(identity.into());
        /// Give every shard term a fencing epoch ([`Term::epoch`](crate::Term::epoch)): right after
        /// a take, the granted shards' rows of `plexsphere_leader_fence` are advanced in one
        /// statement, before their terms begin. A fenced write checks `fencing::check(&tx,
        /// LockKey::new(class, shard), epoch)`. Create the table first
        /// ([`fencing::setup`](crate::fencing::setup)).
        fencing(enabled: bool) => fencing = enabled;
        /// A hard deadline for shard work after its term ended (any cause: lost, handed over,
        /// stopped, resigned), as [`Config::work_deadline`](crate::Config::work_deadline): work
        /// still holding a [`Term`](crate::Term) of that shard term `deadline` after the end is
        /// logged at WARN (`leader: background work still running after the work deadline:
        /// <names>`) and with [`OnOverdue::Abort`] aborted; when
        /// [`run`](super::ShardedElector::run) finishes first, as it finishes. At most seven days;
        /// longer is shortened to it. Off by default.
        work_deadline(deadline: Duration, on_overdue: OnOverdue) => work_deadline = Some((deadline, on_overdue));
        /// Registers the sharded metrics (`plexsphere_shards_*`) on `registry`.
        #[cfg(feature = "prometheus")]
        registry(registry: &prometheus::Registry) => registry = Some(registry.clone());
        /// Also records the sharded metrics (same names and labels) through the `metrics` crate's
        /// facade, on the recorder installed when the elector is built (feature `metrics`), as
        /// [`Config::metrics_facade`](crate::Config::metrics_facade). Install the recorder before
        /// [`ShardedElector::new`](super::ShardedElector::new).
        #[cfg(feature = "metrics")]
        metrics_facade(on: bool) => metrics_facade = on;
        /// Holds the space with leases instead of advisory locks: for a pool that cannot carry a
        /// session lock (PgBouncer or Supavisor in transaction mode, a managed database's pooled
        /// endpoint), and for spaces larger than the server's lock table. Each replica is a
        /// member row renewed every interval (one short statement whatever the shard count) for
        /// `ttl` on the server's clock (`Duration::ZERO`: three intervals); shards are rows
        /// written only when their owner changes, each change advancing the shard's fencing
        /// epoch ([`Term::epoch`](crate::Term::epoch) is always set). A member trusts its shards
        /// for nine tenths of the TTL after sending its last successful renewal; a crashed
        /// member's shards are taken again once its lease expired. The tables must exist: run
        /// [`lease::setup_shards`](crate::lease::setup_shards) once per database. Validated by
        /// [`ShardedElector::new`](super::ShardedElector::new): a TTL of at least two
        /// intervals.
        lease(ttl: Duration) => lease_ttl = Some(ttl);
        /// The schema of the lease's tables ([`ShardConfig::lease`]): `public` by default. Every
        /// statement names its tables with it, whatever the connection's `search_path`; give
        /// every replica of the space the same schema. Validated by
        /// [`ShardedElector::new`](super::ShardedElector::new): a plain lowercase identifier.
        lease_schema(schema: impl Into<String>) => lease_schema = schema.into();
        /// Ranks this replica in the space by its release number (`"1.4.2"`, `"v2.0.0-rc.1"`),
        /// so that a rolling deploy gives the shards an old replica frees to the new versions:
        /// the `K mod R` extra slots and the free shards go to the best-ranked members first
        /// (equal ranks are assigned as without ranks). The rank is published before the
        /// identity in the lock session's `application_name` (with a lease, in the member
        /// row's holder), which the survey already reads: no statement costs more. Validated
        /// by [`ShardedElector::new`](super::ShardedElector::new) ([`ConfigError::Version`]).
        version(version: impl Into<String>) => version = Some(version.into());
        /// The operator's priority in the rank ([`ShardConfig::version`]): a higher priority
        /// is preferred whatever the versions (default 0). Setting it alone ranks this replica
        /// with version 0.
        priority(priority: u32) => priority = Some(priority);
        /// The version floor of the space (opt-in, with [`ShardConfig::version`]): every
        /// ranked member records its version as the floor as it joins, when it is newer, and a
        /// member older than the floor owns no shard (it gives up what it holds, takes none,
        /// says so once at WARN with both versions, and the space is balanced over the
        /// others), so a rolling deploy never runs an old binary's shard work beside a new
        /// one's, and a rollback cannot give shards to an older binary by accident. The floor
        /// is the row `(class, -1)` of `plexsphere_leader_floor`: create it first
        /// ([`floor::setup`](crate::floor::setup); a lease space's
        /// [`lease::setup_shards`](crate::lease::setup_shards) creates its own). Validated by
        /// [`ShardedElector::new`](super::ShardedElector::new): a floor needs a version
        /// ([`ConfigError::FloorWithoutVersion`]).
        version_floor(on: bool) => version_floor = on;
        /// A deliberate rollback: with the [floor](ShardConfig::version_floor) on, this replica
        /// owns shards even though a newer version has joined, and sets the floor to its own
        /// version as it joins (so that the other replicas of its version own shards again).
        below_version_floor(allowed: bool) => below_version_floor = allowed;
    }

    pub(crate) fn options(&self) -> Result<ShardOptions, ConfigError> {
        let interval = CheckInterval::new(self.common.interval)?;
        // The exclusion proof before every join of an advisory space (no effect with a lease).
        let mut options = ShardOptions::new(interval, self.shards)?
            .fencing(self.common.fencing)
            .prove_pool(true);
        if let Some(delay) = self.rebalance_delay {
            options = options.rebalance_delay(delay);
        }
        if let Some(moves) = self.max_moves {
            options = options.max_moves(moves)?;
        }
        if let Some(grace) = self.common.stop_grace {
            options = options.stop_grace(grace)?;
        }
        if let Some(grace) = self.handover_grace {
            options = options.handover_grace(grace);
        }
        if let Some((after, on_overdue)) = self.common.work_deadline {
            options = options.work_deadline(after, on_overdue);
        }
        if let Some(lease) = self.common.lease(interval)? {
            options = options.mechanism(Mechanism::Lease(lease));
        }
        if let Some(rank) = self.common.rank()? {
            options = options.preference(rank);
        }
        Ok(options
            .version_floor(self.common.version_floor)
            .below_floor(self.common.below_version_floor))
    }
}
