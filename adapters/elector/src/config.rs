//! What an [`Elector`](crate::Elector) is built from: [`Config`] and the values and limits it
//! takes (the check interval, the acquire mode, the stop grace, the identity), with their
//! validation errors.

use std::fmt;
use std::time::Duration;

use std::sync::Arc;

use plexsphere_leader_core::Options;
use plexsphere_leader_core::rank::Rank;

pub use crate::clock::{Clock, TokioClock};
pub use crate::identity::{IdentityError, MAX_IDENTITY_LEN};
pub use crate::key::ParseLockKeyError;
pub use plexsphere_leader_core::{
    AcquireMode, CheckInterval, DEFAULT_CHECK_INTERVAL, IntervalError, LEASE_TTL_INTERVALS,
    MAX_CHECK_INTERVAL, MAX_HOLD_OFF, MAX_STOP_GRACE_INTERVALS, MIN_CHECK_INTERVAL,
    StopGraceTooLong, UNLOCK_BUDGET,
};

mod common;

pub(crate) use self::common::{Common, common_setters};
use crate::error::ConfigError;
use crate::key::LockKey;
use crate::session::SessionSource;

/// The configuration of an [`Elector`](crate::Elector): the spec's `leader.Config`.
///
/// | field            | default                                 | purpose |
/// |------------------|-----------------------------------------|---------|
/// | `pool`           | required ([`Config::new`])              | supplies the connections the lock is tried on |
/// | `check_interval` | 5 s; `Duration::ZERO` means the default | how often a standby tries the lock and the leader verifies it, and how long each check may take |
/// | `registry`       | none: no gauge                          | receives the `plexsphere_background_leader` gauge |
/// | `acquire_mode`   | [`AcquireMode::Poll`] (the spec)        | poll the lock every interval, or wait in the server's lock queue |
/// | `stop_grace`     | one check interval; at most two         | how long a graceful stop waits for leader work before it unlocks |
/// | `fencing`        | off                                     | give every term an epoch from the `plexsphere_leader_fence` table |
/// | `lease`          | off: the session advisory lock          | hold a lease row instead, for a transaction-mode pooler ([`Config::lease`]) |
/// | `eligible`       | `true`                                  | whether this replica may lead at all ([`Elector::set_eligible`](crate::Elector::set_eligible) changes it) |
/// | `fitness_probe`  | none: a read-only session is the only unfit one | a statement that must succeed before this replica leads, and after each of its checks ([`Config::fitness_probe`]) |
/// | `version`, `priority` | none: unranked                     | this replica's rank: the leader yields to a better-ranked live candidate ([`Config::version`]) |
/// | `preempt_window` | two check intervals                     | how long a better candidate is live, and a leader leads, before it yields |
/// | `version_floor`, `below_version_floor` | off              | no replica older than the newest that has led leads, unless allowed (a deliberate rollback) ([`Config::version_floor`]) |
/// | `resign_hold_off`| two check intervals                     | how long [`Elector::resign`](crate::Elector::resign) keeps the replica from trying the lock |
/// | `work_deadline`  | none                                    | report (and optionally abort) leader work still running this long after its term ended |
/// | `key`            | [`LockKey::DEFAULT`], `(1886156915, 1)` | the advisory lock: electors with the same key elect one leader |
/// | `identity`       | `<service>@<host>` (executable stem, hostname) | written with the grant time into the lock session's `application_name` |
/// | `clock`          | [`TokioClock`]                          | the monotonic clock the election runs on (a test seam, [`Config::clock`]) |
///
/// Logging goes through `tracing` (target `plexsphere_leader`), inside a span `election` with the
/// fields `key`, `identity` and `pid`, so that two elections in one process, and the replicas of
/// one host in merged logs, log distinguishable lines; instrument the `run` future with a span
/// of your own to add context. The pool must reach PostgreSQL 14 or newer directly or through a
/// session-mode pooler: a transaction-mode pooler cannot carry a session lock.
///
/// ```
/// use std::time::Duration;
/// use plexsphere_leader::{Config, LockKey, config::AcquireMode};
///
/// # fn example(pool: deadpool_postgres::Pool) -> Config {
/// Config::new(pool)
///     .check_interval(Duration::from_secs(2)) // checks, and the handover bound
///     .acquire_mode(AcquireMode::Queue)       // wait in the server's lock queue
///     .key(LockKey::new(LockKey::DEFAULT.class_id, 7)) // one election per shard
///     .identity("billing@web-3")              // shown in `application_name`
/// # }
/// ```
#[derive(Clone)]
pub struct Config {
    /// What both modes hold alike.
    pub(crate) common: Common,
    pub(crate) acquire_mode: AcquireMode,
    pub(crate) eligible: bool,
    pub(crate) fitness_probe: Option<String>,
    pub(crate) resign_hold_off: Option<Duration>,
    pub(crate) key: LockKey,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) preempt_window: Option<Duration>,
}

/// What happens to leader work still running
/// [`Config::work_deadline`](crate::Config::work_deadline) after its term ended: `Report` logs
/// it at WARN (naming the work) and counts it; `Abort` reports it, then drops the work run through [`Elector::run_if_leader`](crate::Elector::run_if_leader) (and the
/// launchers built on it) at its next await point, and `run_if_leader` returns `Ok(false)`.
/// Work holding a [`Term`](crate::Term) taken directly can only be reported.
pub use plexsphere_leader_core::OnOverdue;

impl Config {
    /// A configuration with the spec's defaults for `pool` (the spec's `leader.Config{Pool}`):
    /// [`PoolSessions::new`](crate::session::PoolSessions::new) over it. A pool built with
    /// [`ObservedConnect`](crate::session::ObservedConnect) lets the leader hear of its lock
    /// session's end at once.
    #[cfg(feature = "deadpool")]
    pub fn new(pool: deadpool_postgres::Pool) -> Self {
        Self::with_sessions(crate::session::PoolSessions::new(pool))
    }

    /// A configuration with the spec's defaults whose lock sessions come from `sessions`: another
    /// driver's pool ([`PoolSessions`](crate::session::PoolSessions) with its own [`SessionEnds`](crate::session::SessionEnds),
    /// the sqlx backend), or a wrapper of one.
    pub fn with_sessions(sessions: impl SessionSource) -> Self {
        Self {
            common: Common::new(sessions, Duration::ZERO),
            acquire_mode: AcquireMode::Poll,
            eligible: true,
            fitness_probe: None,
            resign_hold_off: None,
            key: LockKey::DEFAULT,
            clock: Arc::new(TokioClock),
            preempt_window: None,
        }
    }

    crate::config::common_setters! {
        /// Ranks this replica by its release number (`"1.4.2"`, `"v2.0.0-rc.1"`; see
        /// [`Version`](crate::rank::Version)), so that a rolling deploy moves
        /// leadership once, to the newest version: a standby publishes its rank and defers while a
        /// better-ranked replica is a live candidate, and the leader yields
        /// ([`TermEndCause::Yielded`](crate::TermEndCause::Yielded)) once the best candidate
        /// outranks it and has been live for the [window](Config::preempt_window), by its ordered
        /// stop: the queued grant goes to that candidate. Replicas of equal rank never yield to one
        /// another; unset (and no [`priority`](Config::priority)), nothing is published or read
        /// and the election behaves as without ranks. With the advisory lock the candidacy is
        /// published in the standby's `application_name` (read from `pg_stat_activity`: replicas
        /// of one role see each other); with a lease, in the unlogged table
        /// `plexsphere_leader_candidate` that [`lease::setup`](crate::lease::setup) creates.
        /// Validated by [`Elector::new`](crate::Elector::new) ([`ConfigError::Version`]).
        version(version: impl Into<String>) => version = Some(version.into());
        /// The operator's priority in the rank ([`Config::version`]): a higher priority is
        /// preferred whatever the versions (default 0). Setting it alone ranks this replica with
        /// version 0.
        priority(priority: u32) => priority = Some(priority);
        /// The version floor (opt-in, with [`Config::version`]): every leader records its version as
        /// the floor when it is newer, and a replica older than the floor never leads (it says so
        /// once at WARN with both versions, and [`Elector::is_below_version_floor`](crate::Elector::is_below_version_floor)
        /// answers yes), so a rollback cannot elect an older binary by accident. The table must
        /// exist ([`floor`](crate::floor)). Validated by [`Elector::new`](crate::Elector::new): a
        /// floor needs a version ([`ConfigError::FloorWithoutVersion`]).
        version_floor(on: bool) => version_floor = on;
        /// A deliberate rollback: with the [floor](Config::version_floor) on, this replica leads
        /// even though a newer version has led, and its leader sets the floor to its own version.
        below_version_floor(allowed: bool) => below_version_floor = allowed;
    }

    /// The stabilization window of a ranked election ([`Config::version`]): a better candidate
    /// must have been live this long before the leader yields to it, and a leader leads at
    /// least this long before it yields, so leadership moves at most once per window. Default
    /// two check intervals; `Duration::ZERO` means the default.
    #[must_use]
    pub fn preempt_window(mut self, window: Duration) -> Self {
        self.preempt_window = Some(window);
        self
    }

    /// The validated rank, when the replica is ranked.
    pub(crate) fn rank(&self) -> Result<Option<Rank>, ConfigError> {
        self.common.rank()
    }

    /// How a standby asks for the lock. [`AcquireMode::Queue`] waits in the server's lock queue
    /// (`pg_advisory_lock` under a transaction-local `lock_timeout` of one interval, repeated),
    /// so a standby leads about a millisecond after the lock is released instead of at its next
    /// check. It keeps one pooled connection per standby busy all the time, and each waiting
    /// statement holds a snapshot for up to one interval (delaying vacuum's cleanup horizon and
    /// `CREATE INDEX CONCURRENTLY` by as much). The pool needs one connection more than the
    /// service's own use.
    #[must_use]
    pub fn acquire_mode(mut self, mode: AcquireMode) -> Self {
        self.acquire_mode = mode;
        self
    }

    /// Whether this replica may lead (default `true`). An ineligible replica takes part in the
    /// election without ever trying the lock, for example a canary; change it at run time with
    /// [`Elector::set_eligible`](crate::Elector::set_eligible).
    #[must_use]
    pub fn eligible(mut self, eligible: bool) -> Self {
        self.eligible = eligible;
        self
    }

    /// A statement that proves this replica can do the leader's work, for example
    /// `SELECT 1 FROM orders LIMIT 0` (the privilege to read a table the work reads) or
    /// `SELECT has_table_privilege('orders', 'INSERT') OR 1/0 = 1` (one it writes). It runs over
    /// the simple query protocol before each attempt to take the lock or lease (on the very
    /// connection that then tries the lock) and after each of the leader's checks that proved
    /// it (on the lock session; with a lease, on a pooled connection). When the server refuses
    /// it (an error with an SQLSTATE), the replica is unfit: it logs once at ERROR, with
    /// advice, why ([`CheckError::Unfit`](crate::error::CheckError::Unfit), also in
    /// [`Elector::check_failure`](crate::Elector::check_failure)), makes no attempt until a
    /// probe passes, and a leader ends its term ([`TermEndCause::Unfit`](plexsphere_leader_core::TermEndCause::Unfit))
    /// and releases as a resign would. [`Elector::is_fit`](crate::Elector::is_fit) and the
    /// `plexsphere_leader_eligible` gauge say so meanwhile. A probe that does not answer (the
    /// connection broke, no answer within the check) says nothing of fitness: it fails the
    /// check as the check's own statement would. Keep it short: a standby runs it every check
    /// interval. Without a probe only a read-only session is refused (the grant statement
    /// checks `transaction_read_only`; the lease's claim, a write, fails there with 25006).
    /// Validated by [`Elector::new`](crate::Elector::new): not blank.
    #[must_use]
    pub fn fitness_probe(mut self, statement: impl Into<String>) -> Self {
        self.fitness_probe = Some(statement.into());
        self
    }

    /// The validated fitness probe.
    pub(crate) fn validated_fitness_probe(&self) -> Result<Option<String>, ConfigError> {
        match &self.fitness_probe {
            Some(probe) if probe.trim().is_empty() => Err(ConfigError::FitnessProbe),
            probe => Ok(probe.clone()),
        }
    }

    /// How long [`Elector::resign`](crate::Elector::resign) keeps this replica from trying the
    /// lock again, counted from the request. Default two check intervals, so that a standby's
    /// next check (at most one interval away) finds the lock free first. Validated by
    /// [`Elector::new`](crate::Elector::new): at most [`MAX_HOLD_OFF`] (seven days).
    #[must_use]
    pub fn resign_hold_off(mut self, hold_off: Duration) -> Self {
        self.resign_hold_off = Some(hold_off);
        self
    }

    /// The resign hold-off, validated.
    pub(crate) fn validated_hold_off(
        &self,
        interval: CheckInterval,
    ) -> Result<Duration, ConfigError> {
        let hold_off = self.resign_hold_off.unwrap_or(interval.default_hold_off());
        if hold_off > MAX_HOLD_OFF {
            return Err(ConfigError::HoldOff {
                given: hold_off,
                max: MAX_HOLD_OFF,
            });
        }
        Ok(hold_off)
    }

    /// The election's advisory lock key (default [`LockKey::DEFAULT`]). Replicas with the same
    /// key on the same database elect one leader; give each independent election (a shard, a
    /// second service on the same database) its own key. With fencing on, the fence row is the
    /// key's too.
    #[must_use]
    pub fn key(mut self, key: LockKey) -> Self {
        self.key = key;
        self
    }

    /// Runs the election on `clock` instead of tokio's ([`TokioClock`]): every instant the core
    /// is given and every deadline it sleeps until. A seam for tests (the simulation runs lease
    /// holders whose clocks run fast or slow); a service has no reason to set it. What the
    /// adapter measures for itself (check latencies, [`Leadership`](crate::Leadership)'s instants)
    /// stays on tokio's clock.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    crate::config::common_setters! {
        /// Sets the check interval; `Duration::ZERO` means the default of 5 s. Validated by
        /// [`Elector::new`](crate::Elector::new): from [`MIN_CHECK_INTERVAL`] (50 ms) to
        /// [`MAX_CHECK_INTERVAL`] (`i32::MAX / 4` ms).
        check_interval(interval: Duration) => interval = interval;
        /// Registers the `plexsphere_background_leader` gauge and the per-key metrics on `registry`
        /// (feature `prometheus`, on by default). An elector built on a registry that already has
        /// them from another elector writes the same collectors, its own `key` series.
        #[cfg(feature = "prometheus")]
        registry(registry: &prometheus::Registry) => registry = Some(registry.clone());
        /// Also records the same metrics (names, labels, help) through the `metrics` crate's
        /// facade, on the recorder installed when the elector is built (feature `metrics`): for
        /// services that export with `metrics-exporter-prometheus`, OpenTelemetry or another
        /// recorder and keep no Prometheus registry. Install the recorder before
        /// [`Elector::new`](crate::Elector::new).
        #[cfg(feature = "metrics")]
        metrics_facade(on: bool) => metrics_facade = on;
        /// How long a graceful stop waits, after the term ended (every term token cancelled), for
        /// leader work still holding a [`Term`](crate::Term) to return before it unlocks: the
        /// standby that takes over never overlaps with work that honours cancellation. Default one
        /// check interval; zero unlocks at once (the spec's behaviour). Validated by
        /// [`Elector::new`](crate::Elector::new): at most two check intervals, since the lock
        /// session is idle meanwhile and must stay within its `idle_session_timeout`.
        stop_grace(grace: Duration) => stop_grace = Some(grace);
        /// Fencing: the new leader advances a per-key epoch in the table `plexsphere_leader_fence`
        /// on its lock session before its term begins, and [`Term::epoch`](crate::Term::epoch)
        /// returns it. The table must exist: run [`fencing::setup`](crate::fencing::setup) (or
        /// [`FENCE_SETUP`](crate::sql::FENCE_SETUP)) once; without it no replica leads and each
        /// check logs the missing table.
        fencing(enabled: bool) => fencing = enabled;
        /// A hard deadline for leader work after its term ended (any cause: lost, stopped,
        /// resigned). Work still holding a [`Term`](crate::Term) `deadline` after the end is logged
        /// at WARN (`leader: background work still running after the work deadline: <names>`) and
        /// counted, and with [`OnOverdue::Abort`] aborted. The deadline is a timer of the election
        /// itself: when [`run`](crate::Elector::run) finishes first (a graceful stop whose work
        /// outlived the stop grace), the work still running is reported, and aborted, as the run
        /// finishes. At most seven days; longer is shortened to it. Off by default.
        work_deadline(deadline: Duration, on_overdue: OnOverdue) => work_deadline = Some((deadline, on_overdue));
        /// What this replica is called in the lock session's `application_name` while it leads:
        /// `<identity> since <unix seconds of the grant, server clock>`. Default `<service>@<host>`
        /// (the executable's file stem and the hostname, made to fit). Validated by
        /// [`Elector::new`](crate::Elector::new): printable ASCII, 1 to [`MAX_IDENTITY_LEN`] bytes.
        identity(identity: impl Into<String>) => identity = Some(identity.into());
        /// Holds a lease row instead of the session advisory lock: the mechanism for a pool that
        /// cannot carry a session lock (PgBouncer or Supavisor in transaction mode, RDS Proxy
        /// without pinning). Every check is one autocommit statement on any pooled connection; the
        /// lease lasts `ttl` on the server's clock (`Duration::ZERO`: three check intervals, the
        /// advisory mechanism's orphan bound), and the leader trusts it for nine tenths of that
        /// after sending its last successful renewal. Every term gets the lease's epoch as its
        /// fencing epoch. The tables must exist: run [`lease::setup`](crate::lease::setup) once per
        /// database. Validated by [`Elector::new`](crate::Elector::new): a TTL of at least two
        /// intervals, and [`AcquireMode::Poll`] (a lease has no server-side queue). See the
        /// reference documentation's Lease mechanism section for its bounds.
        ///
        /// ```no_run
        /// # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
        /// use std::time::Duration;
        /// use plexsphere_leader::{Config, Elector, lease};
        ///
        /// // `pool` reaches the database through a transaction-mode pooler (a pooled URL).
        /// lease::setup(&pool.get().await?).await?; // once per database; idempotent
        /// let elector = Elector::new(Config::new(pool).lease(Duration::ZERO))?; // TTL: 3 intervals
        /// # let _ = elector; Ok(()) }
        /// ```
        lease(ttl: Duration) => lease_ttl = Some(ttl);
        /// The schema of the lease's tables ([`Config::lease`]): `public` by default
        /// ([`DEFAULT_SCHEMA`](crate::lease::DEFAULT_SCHEMA)). Every lease statement names its
        /// tables with it, so that every replica of an election reaches the same rows whatever its
        /// connection's `search_path`; give every replica of an election the same schema, and run
        /// [`lease::setup_in`](crate::lease::setup_in) with it. Validated by
        /// [`Elector::new`](crate::Elector::new): a plain lowercase identifier
        /// ([`ConfigError::LeaseSchema`]).
        lease_schema(schema: impl Into<String>) => lease_schema = schema.into();
    }

    /// The validated lease schema.
    pub(crate) fn validated_lease_schema(&self) -> Result<String, ConfigError> {
        self.common.validated_lease_schema()
    }

    /// The validated options of the core election.
    pub(crate) fn options(&self) -> Result<Options, ConfigError> {
        let interval = CheckInterval::new(self.common.interval)?;
        let mut options = Options::new(interval)
            .acquire(self.acquire_mode)
            .fencing(self.common.fencing)
            .eligible(self.eligible)
            // Before its first grant a run proves that its pool's sessions are its own, so
            // that a transaction-mode pooler is refused before any term.
            .prove_pool(true)
            .probe_fitness(self.fitness_probe.is_some());
        if let Some((after, on_overdue)) = self.common.work_deadline {
            options = options.work_deadline(after, on_overdue);
        }
        if let Some(rank) = self.rank()? {
            options = options.preference(rank);
        }
        options = options
            .version_floor(self.common.version_floor)
            .below_floor(self.common.below_version_floor);
        if let Some(window) = self.preempt_window {
            options = options.preempt_window(window);
        }
        if let Some(lease) = self.common.lease(interval)? {
            if self.acquire_mode != AcquireMode::Poll {
                return Err(ConfigError::LeaseQueued);
            }
            options = options.lease(lease);
        }
        Ok(match self.common.stop_grace {
            Some(grace) => options.stop_grace(grace)?,
            None => options,
        })
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("sessions", &self.common.sessions)
            .field("check_interval", &self.common.interval)
            .field("acquire_mode", &self.acquire_mode)
            .field("stop_grace", &self.common.stop_grace)
            .field("fencing", &self.common.fencing)
            .field("lease_ttl", &self.common.lease_ttl)
            .field("lease_schema", &self.common.lease_schema)
            .field("eligible", &self.eligible)
            .field("fitness_probe", &self.fitness_probe)
            .field("resign_hold_off", &self.resign_hold_off)
            .field("work_deadline", &self.common.work_deadline)
            .field("key", &self.key)
            .field("version", &self.common.version)
            .field("priority", &self.common.priority)
            .field("preempt_window", &self.preempt_window)
            .field("version_floor", &self.common.version_floor)
            .field("below_version_floor", &self.common.below_version_floor)
            .field("identity", &self.common.identity)
            .field("clock", &self.clock)
            .finish()
    }
}
