//! How the replicas of a single election hold leadership; the harness asks the mechanism for
//! every choice that depends on it instead of matching on it.

use std::fmt;
use std::time::Duration;

use plexsphere_leader::Config;
use plexsphere_leader::fencing::{FenceClient, FenceError};

use super::{Params, Space};

/// How the replicas of a single election hold leadership (`--mechanism`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The session advisory lock (the spec's): a lock session per leader.
    #[default]
    Advisory,
    /// The lease row of `Config::lease(Duration::ZERO)` (TTL three intervals), one autocommit
    /// statement per check on any pooled connection; always polls.
    Lease,
}

impl Mechanism {
    /// The CLI name (`--mechanism advisory|lease`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Advisory => "advisory",
            Self::Lease => "lease",
        }
    }

    /// The mechanism the CLI names `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Advisory, Self::Lease]
            .into_iter()
            .find(|mechanism| mechanism.name() == name)
    }

    /// The seed space of its single-election runs.
    pub const fn space(self) -> Space {
        match self {
            Self::Advisory => Space::Advisory,
            Self::Lease => Space::Lease,
        }
    }

    /// Whether a leader's hold lives on its lock session, which the server ends with the
    /// session and which can queue (the advisory lock: the orphan bound and the stranded lock
    /// apply), rather than in a row that expires on the server's clock and follows a failover
    /// (the lease: its end is a free moment, its headroom is measured, a stopped leader must
    /// have released it, it always polls).
    pub const fn holds_session(self) -> bool {
        matches!(self, Self::Advisory)
    }

    /// Whether every term has an epoch: with fencing, or always for a lease (its claim
    /// advances the fence row); the setup runs and the fence checks apply then.
    pub const fn has_epochs(self, fencing: bool) -> bool {
        fencing || !self.holds_session()
    }

    /// What the replicas hold, in a violation: `the lock`, or `the lease`.
    pub const fn held_thing(self) -> &'static str {
        match self {
            Self::Advisory => "the lock",
            Self::Lease => "the lease",
        }
    }

    /// Largest overlap of two replicas acting as leader: 2·I + T (+ slack) for the lock; none
    /// for the lease, whose leader ends its term 0.1·TTL (more than T) before the lease can
    /// expire, and whose successor's claim waits for fenced transactions.
    pub fn overlap_bound(self, params: &Params) -> Duration {
        match self {
            Self::Advisory => params.overlap_bound(),
            Self::Lease => Duration::ZERO,
        }
    }

    /// Largest delay from the loss of what a term rests on to the term's end: 2·I (+ slack)
    /// after the lock's session is lost; none after the lease ended on the server.
    pub fn detection_bound(self, params: &Params) -> Duration {
        match self {
            Self::Advisory => params.detection_bound(),
            Self::Lease => Duration::ZERO,
        }
    }

    /// The lease's TTL its electors are configured with (`Duration::ZERO`: the default, three
    /// intervals), for one election and a shard space alike; `None` for the advisory lock.
    pub const fn lease_ttl(self) -> Option<Duration> {
        match self {
            Self::Advisory => None,
            Self::Lease => Some(Duration::ZERO),
        }
    }

    /// The elector's config under it.
    pub fn configure(self, config: Config) -> Config {
        match self.lease_ttl() {
            Some(ttl) => config.lease(ttl),
            None => config,
        }
    }

    /// The flag that selects it on the command line after `--sharded` (none for the default).
    pub const fn sharded_flag(self) -> &'static str {
        match self {
            Self::Advisory => "",
            Self::Lease => " --mechanism lease",
        }
    }

    /// The setup of a run with epochs: the fence table, or the lease and fence tables (of a
    /// lease shard space when `sharded`).
    ///
    /// # Errors
    /// The setup's own.
    pub(crate) async fn set_up(
        self,
        client: &impl FenceClient,
        sharded: bool,
    ) -> Result<(), FenceError> {
        match (self, sharded) {
            (Self::Advisory, _) => plexsphere_leader::fencing::setup(client).await,
            (Self::Lease, false) => plexsphere_leader::lease::setup(client).await,
            (Self::Lease, true) => {
                let schema = plexsphere_leader::lease::DEFAULT_SCHEMA;
                plexsphere_leader::lease::setup_shards(client, schema).await
            }
        }
    }
}

impl Space {
    /// How the space's runs hold leadership.
    pub const fn mechanism(self) -> Mechanism {
        match self {
            Self::Lease
            | Self::Pause
            | Self::ShardedLease
            | Self::ShardedPause
            | Self::RolloutLease => Mechanism::Lease,
            Self::Advisory | Self::Sharded | Self::Rollout => Mechanism::Advisory,
        }
    }

    /// The sharded space of `mechanism`.
    pub const fn sharded(mechanism: Mechanism) -> Self {
        if mechanism.holds_session() {
            Self::Sharded
        } else {
            Self::ShardedLease
        }
    }

    /// The rollout space of `mechanism` (`--rollout`).
    pub const fn rollout(mechanism: Mechanism) -> Self {
        if mechanism.holds_session() {
            Self::Rollout
        } else {
            Self::RolloutLease
        }
    }

    /// Whether its runs are rolling deploys of ranked replicas.
    pub const fn is_rollout(self) -> bool {
        matches!(self, Self::Rollout | Self::RolloutLease)
    }

    /// Whether its runs are sharded.
    pub const fn is_sharded(self) -> bool {
        matches!(
            self,
            Self::Sharded | Self::ShardedLease | Self::ShardedPause
        )
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
