//! What an [`Elector`](crate::Elector) is built from.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::Pool;
use prometheus::Registry;

/// The configuration of an [`Elector`](crate::Elector): the spec's `leader.Config`.
///
/// | field            | default                                 | purpose |
/// |------------------|-----------------------------------------|---------|
/// | `pool`           | required ([`Config::new`])              | supplies the connections the lock is tried on |
/// | `check_interval` | 5 s; `Duration::ZERO` means the default | how often a standby tries the lock and the leader verifies it, and how long each check may take |
/// | `registry`       | none: no gauge                          | receives the `plexsphere_background_leader` gauge |
///
/// Logging goes through `tracing` (target `plexsphere_leader`); instrument the `run` future with
/// a span to add context. The pool must reach PostgreSQL 14 or newer directly or through a
/// session-mode pooler: a transaction-mode pooler cannot carry a session lock.
#[derive(Clone)]
pub struct Config {
    pub(crate) pool: Pool,
    pub(crate) check_interval: Duration,
    pub(crate) registry: Option<Registry>,
    pub(crate) sabotage: Option<crate::sabotage::Sabotage>,
}

impl Config {
    /// A configuration with the spec's defaults for `pool`.
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            check_interval: Duration::ZERO,
            registry: None,
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
            .finish()
    }
}
