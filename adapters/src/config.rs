//! What an [`Elector`](crate::Elector) is built from.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::Pool;
use plexsphere_leader_core::{AcquireMode, CheckInterval, Options};
use prometheus::Registry;

use crate::error::ConfigError;

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
///
/// Logging goes through `tracing` (target `plexsphere_leader`); instrument the `run` future with
/// a span to add context. The pool must reach PostgreSQL 14 or newer directly or through a
/// session-mode pooler: a transaction-mode pooler cannot carry a session lock.
#[derive(Clone)]
pub struct Config {
    pub(crate) pool: Pool,
    pub(crate) check_interval: Duration,
    pub(crate) registry: Option<Registry>,
    pub(crate) acquire_mode: AcquireMode,
    pub(crate) stop_grace: Option<Duration>,
    pub(crate) fencing: bool,
    pub(crate) sabotage: Option<crate::sabotage::Sabotage>,
}

impl Config {
    /// A configuration with the spec's defaults for `pool`.
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            check_interval: Duration::ZERO,
            registry: None,
            acquire_mode: AcquireMode::Poll,
            stop_grace: None,
            fencing: false,
            sabotage: None,
        }
    }

    /// Sets the check interval; `Duration::ZERO` means the default of 5 s. Validated by
    /// [`Elector::new`](crate::Elector::new): from 1 ms to `i32::MAX / 4` ms.
    #[must_use]
    pub fn check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    /// Registers the `plexsphere_background_leader` gauge on `registry`. An elector built on a
    /// registry that already has the gauge of another elector writes that same series.
    #[must_use]
    pub fn registry(mut self, registry: &Registry) -> Self {
        self.registry = Some(registry.clone());
        self
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

    /// How long a graceful stop waits, after the term ended (every term token cancelled), for
    /// leader work still holding a [`Term`](crate::Term) to return before it unlocks: the
    /// standby that takes over never overlaps with work that honours cancellation. Default one
    /// check interval; zero unlocks at once (the spec's behaviour). Validated by
    /// [`Elector::new`](crate::Elector::new): at most two check intervals, since the lock
    /// session is idle meanwhile and must stay within its `idle_session_timeout`.
    #[must_use]
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = Some(grace);
        self
    }

    /// Fencing: the new leader advances a per-key epoch in the table `plexsphere_leader_fence`
    /// on its lock session before its term begins, and [`Term::epoch`](crate::Term::epoch)
    /// returns it. The table must exist: run [`fencing::setup`](crate::fencing::setup) (or
    /// [`FENCE_SETUP`](crate::sql::FENCE_SETUP)) once; without it no replica leads and each
    /// check logs the missing table.
    #[must_use]
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = enabled;
        self
    }

    /// The validated options of the core election.
    pub(crate) fn options(&self) -> Result<Options, ConfigError> {
        let interval = CheckInterval::new(self.check_interval)?;
        let options = Options::new(interval)
            .acquire(self.acquire_mode)
            .fencing(self.fencing);
        Ok(match self.stop_grace {
            Some(grace) => options.stop_grace(grace)?,
            None => options,
        })
    }
}

#[cfg(feature = "sabotage")]
impl Config {
    /// Test-only: breaks the driver on purpose (feature `sabotage`).
    #[must_use]
    pub fn sabotage(mut self, sabotage: crate::sabotage::Sabotage) -> Self {
        self.sabotage = Some(sabotage);
        self
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("pool_max_size", &self.pool.status().max_size)
            .field("check_interval", &self.check_interval)
            .field("registry", &self.registry.is_some())
            .field("acquire_mode", &self.acquire_mode)
            .field("stop_grace", &self.stop_grace)
            .field("fencing", &self.fencing)
            .finish()
    }
}
