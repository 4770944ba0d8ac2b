//! What the configurations of both modes hold alike ([`Config`](crate::Config) and
//! [`ShardConfig`](crate::sharded::ShardConfig)): where the lock sessions come from, the check
//! interval, the stop grace, the identity, fencing, the work deadline and the metrics' sinks.
//! Each mode's builder methods set these and document them for its own audience.

use std::sync::Arc;
use std::time::Duration;

use plexsphere_leader_core::OnOverdue;
use plexsphere_leader_core::rank::{Rank, Version};

use crate::error::ConfigError;
use crate::session::SessionSource;

/// The builder methods of the settings in [`Common`], for a configuration with a `common` field:
/// each entry is `name(args) => field = value;` under the docs (and `cfg`) its configuration
/// gives it, and becomes `#[must_use] pub fn name(mut self, args) -> Self`.
macro_rules! common_setters {
    ($($(#[$attr:meta])* $name:ident($($arg:ident: $ty:ty),*) => $field:ident = $value:expr;)*) => {
        $(
            $(#[$attr])*
            #[must_use]
            pub fn $name(mut self, $($arg: $ty),*) -> Self {
                self.common.$field = $value;
                self
            }
        )*
    };
}
pub(crate) use common_setters;

/// The settings every mode has (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Common {
    /// Where the lock sessions come from.
    pub(crate) sessions: Arc<dyn SessionSource>,
    /// The check interval as given (validated when the elector is built).
    pub(crate) interval: Duration,
    pub(crate) stop_grace: Option<Duration>,
    pub(crate) identity: Option<String>,
    pub(crate) fencing: bool,
    pub(crate) work_deadline: Option<(Duration, OnOverdue)>,
    #[cfg(feature = "prometheus")]
    pub(crate) registry: Option<prometheus::Registry>,
    pub(crate) metrics_facade: bool,
    /// The lease's TTL when the lease mechanism holds the leadership (`Duration::ZERO`: the
    /// default of three intervals); `None`: the session advisory lock.
    pub(crate) lease_ttl: Option<Duration>,
    /// The schema of the lease's tables.
    pub(crate) lease_schema: String,
    /// The rank's version as given (validated when the elector is built).
    pub(crate) version: Option<String>,
    pub(crate) priority: Option<u32>,
    pub(crate) version_floor: bool,
    pub(crate) below_version_floor: bool,
}

impl Common {
    /// The defaults with sessions from `sessions` and the interval `interval`: no stop grace
    /// (the mode's default), the default identity, no fencing, no work deadline, no metrics.
    pub(crate) fn new(sessions: impl SessionSource, interval: Duration) -> Self {
        Self {
            sessions: Arc::new(sessions),
            interval,
            stop_grace: None,
            identity: None,
            fencing: false,
            work_deadline: None,
            #[cfg(feature = "prometheus")]
            registry: None,
            metrics_facade: false,
            lease_ttl: None,
            lease_schema: crate::sql::lease::DEFAULT_SCHEMA.to_owned(),
            version: None,
            priority: None,
            version_floor: false,
            below_version_floor: false,
        }
    }

    /// The validated identity, or the default one.
    pub(crate) fn resolved_identity(&self) -> Result<String, ConfigError> {
        Ok(crate::identity::resolve(self.identity.as_deref())?)
    }

    /// The validated lease of `interval`, when one is configured: `Duration::ZERO` is the
    /// default of [`LEASE_TTL_INTERVALS`](plexsphere_leader_core::LEASE_TTL_INTERVALS).
    ///
    /// # Errors
    /// [`ConfigError::LeaseTtl`] for a TTL the core refuses.
    pub(crate) fn lease(
        &self,
        interval: plexsphere_leader_core::CheckInterval,
    ) -> Result<Option<plexsphere_leader_core::Lease>, ConfigError> {
        let Some(ttl) = self.lease_ttl else {
            return Ok(None);
        };
        Ok(Some(if ttl.is_zero() {
            plexsphere_leader_core::Lease::default_for(interval)
        } else {
            plexsphere_leader_core::Lease::new(interval, ttl)?
        }))
    }

    /// The validated rank, when the replica is ranked (a version, or a priority alone with
    /// version 0).
    ///
    /// # Errors
    /// [`ConfigError::Version`] for a version that does not parse, and
    /// [`ConfigError::FloorWithoutVersion`] for a floor without a rank.
    pub(crate) fn rank(&self) -> Result<Option<Rank>, ConfigError> {
        if self.version.is_none() && self.priority.is_none() {
            if self.version_floor {
                return Err(ConfigError::FloorWithoutVersion);
            }
            return Ok(None);
        }
        let version = match &self.version {
            Some(text) => Version::parse(text)?,
            None => Version::new(0, 0, 0),
        };
        Ok(Some(Rank {
            priority: self.priority.unwrap_or(0),
            version,
        }))
    }

    /// The validated lease schema.
    pub(crate) fn validated_lease_schema(&self) -> Result<String, ConfigError> {
        let schema = &self.lease_schema;
        let plain = !schema.is_empty()
            && schema.len() <= 63
            && schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !schema.as_bytes()[0].is_ascii_digit();
        if plain {
            Ok(schema.clone())
        } else {
            Err(ConfigError::LeaseSchema(schema.clone()))
        }
    }
}
