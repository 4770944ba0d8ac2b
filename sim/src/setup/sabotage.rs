//! Which deliberately broken behaviour a run switches on (the wrappers that break the
//! adapter's sessions live in the harness's `sabotage` module).

use std::fmt;

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
    /// A resign request loses its hold-off: the resigner may take the lock (in sharded runs,
    /// its shards) straight back. The operator's, so of every run, sharded ones included.
    ResignWithoutHoldOff,
    /// A queued wait that failed with 55P03 (its `lock_timeout`) is answered as a plain
    /// refusal, so the elector skips its release-if-held and returns the session to the pool:
    /// a lock granted in the instant the wait timed out (PostgreSQL's grant-at-timeout race)
    /// stays on an idle pooled session of a replica that does not lead.
    LockTimeoutAsRefusal,
    /// Lease runs: a renewal that fails, finds the row another's, or does not answer within
    /// half an interval is answered as renewed, so the leader trusts its lease past the window
    /// of its last real renewal, while the server lets the lease expire and a standby claims
    /// it (the lease twin of [`DriverSabotage::KeepTermOnFailedPing`]).
    KeepLeaseOnFailedRenewal,
    /// Lease runs: every replica's clock runs 15 % slow
    /// ([`ClockRate::OUTSIDE_MARGIN`](crate::ClockRate::OUTSIDE_MARGIN)), outside the lease's 10 %
    /// margin, so a leader cut off from the server trusts its lease 0.9·TTL/0.85 ≈ 1.06·TTL
    /// after sending its last renewal: past the server's expiry.
    SlowClock,
    /// Fitness runs (`--unfit`): the server's refusal of the unfit replica's fitness probe is
    /// answered as a pass, so the replica that cannot do the work takes the lock or the lease.
    IgnoreUnfit,
    /// Pause runs (`--pause`): the harness reads a replica's belief from its published
    /// leadership, as `is_leader()` answered before it compared the term's trust deadline with
    /// the clock at the moment of the call, so a leader paused past its trust still believes
    /// until its driver runs again.
    PublishedBelief,
    /// Rollout runs (`--rollout`): the leader's survey of the candidates (the statement of
    /// `sql::candidacy` that publishes nothing) is answered with no row, so the leader never
    /// sees a better candidate and never yields.
    NeverYield,
    /// Rollout runs (`--rollout`): a standby's survey (the one that publishes its candidacy)
    /// is answered with no row once published, so a worse standby never defers to a better
    /// candidate and may take leadership the leader yielded to another.
    NeverDefer,
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
    /// [`DriverSabotage::KeepTermOnFailedPing`]). In a lease space the check is the member's
    /// renewal: one that fails or does not answer in time is answered with the member's last
    /// good renewal (`renewed`), so the member trusts its shards past the window of its last
    /// real renewal while the server lets its lease expire and others take its shards.
    KeepShardsOnFailedSurvey,
    /// Lease spaces: the servers' take owns every asked shard, a live member's too
    /// ([`ShardLeaseFlaw::TakesLiveShards`](plexsphere_leader_pgsim::ShardLeaseFlaw)).
    TakeLiveShards,
    /// Lease spaces: the servers' take reaps nobody, so an expired member's shards are never
    /// re-owned ([`ShardLeaseFlaw::NoReap`](plexsphere_leader_pgsim::ShardLeaseFlaw)).
    TakeWithoutReap,
    /// Lease spaces: the servers' take does not advance the taken shards' fence rows, so a
    /// new owner's term carries its predecessor's epoch
    /// ([`ShardLeaseFlaw::KeepsEpochs`](plexsphere_leader_pgsim::ShardLeaseFlaw)).
    TakeWithoutFence,
}

impl ShardSabotage {
    /// The servers' broken take, if this is one.
    pub fn server_flaw(self) -> Option<plexsphere_leader_pgsim::ShardLeaseFlaw> {
        match self {
            Self::TakeLiveShards => Some(plexsphere_leader_pgsim::ShardLeaseFlaw::TakesLiveShards),
            Self::TakeWithoutReap => Some(plexsphere_leader_pgsim::ShardLeaseFlaw::NoReap),
            Self::TakeWithoutFence => Some(plexsphere_leader_pgsim::ShardLeaseFlaw::KeepsEpochs),
            Self::WorkOutlivesTerm | Self::KeepShardsOnFailedSurvey => None,
        }
    }
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

    /// Every sabotage of a lease run's own (`--mechanism lease --sabotage NAME`); the operator's
    /// and the server's ([`DriverSabotage::ResignWithoutHoldOff`],
    /// [`Sabotage::FenceWithoutRowLock`]) apply to lease runs as well.
    pub const LEASE: [Self; 2] = [
        Self::Driver(DriverSabotage::KeepLeaseOnFailedRenewal),
        Self::Driver(DriverSabotage::SlowClock),
    ];

    /// Every sabotage of a lease shard space's own (`--sharded --mechanism lease --sabotage
    /// NAME`): the servers' broken takes. The sharded ones ([`Sabotage::SHARDED`]) and the
    /// operator's apply to lease spaces as well.
    pub const SHARDED_LEASE: [Self; 3] = [
        Self::Shard(ShardSabotage::TakeLiveShards),
        Self::Shard(ShardSabotage::TakeWithoutReap),
        Self::Shard(ShardSabotage::TakeWithoutFence),
    ];

    /// Every sabotage of a fitness run's own (`--unfit --sabotage NAME`).
    pub const FITNESS: [Self; 1] = [Self::Driver(DriverSabotage::IgnoreUnfit)];

    /// Every sabotage of a rollout run's own (`--rollout --sabotage NAME`), of either
    /// mechanism.
    pub const ROLLOUT: [Self; 2] = [
        Self::Driver(DriverSabotage::NeverYield),
        Self::Driver(DriverSabotage::NeverDefer),
    ];

    /// Every sabotage of a pause run's own (`--pause --sabotage NAME`).
    pub const PAUSE: [Self; 1] = [Self::Driver(DriverSabotage::PublishedBelief)];

    /// Every sabotage of a sharded run's own (`--sharded --sabotage NAME`); the operator's
    /// ([`DriverSabotage::ResignWithoutHoldOff`]) applies to sharded runs as well.
    pub const SHARDED: [Self; 2] = [
        Self::Shard(ShardSabotage::WorkOutlivesTerm),
        Self::Shard(ShardSabotage::KeepShardsOnFailedSurvey),
    ];

    /// The CLI name (`--sabotage NAME`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shard(ShardSabotage::WorkOutlivesTerm) => "shard-work-outlives-term",
            Self::Shard(ShardSabotage::KeepShardsOnFailedSurvey) => "keep-shards-on-failed-survey",
            Self::Shard(ShardSabotage::TakeLiveShards) => "take-live-shards",
            Self::Shard(ShardSabotage::TakeWithoutReap) => "take-without-reap",
            Self::Shard(ShardSabotage::TakeWithoutFence) => "take-without-fence",
            Self::Driver(DriverSabotage::NeverPing) => "never-ping",
            Self::Driver(DriverSabotage::ReturnGrantedToPool) => "return-granted-to-pool",
            Self::Driver(DriverSabotage::SkipIdleSessionTimeout) => "skip-idle-session-timeout",
            Self::Driver(DriverSabotage::KeepTermOnFailedPing) => "keep-term-on-failed-ping",
            Self::Driver(DriverSabotage::ResignWithoutHoldOff) => "resign-without-hold-off",
            Self::Driver(DriverSabotage::LockTimeoutAsRefusal) => "lock-timeout-as-refusal",
            Self::Driver(DriverSabotage::KeepLeaseOnFailedRenewal) => {
                "keep-lease-on-failed-renewal"
            }
            Self::Driver(DriverSabotage::SlowClock) => "slow-clock",
            Self::Driver(DriverSabotage::IgnoreUnfit) => "ignore-unfit",
            Self::Driver(DriverSabotage::PublishedBelief) => "published-belief",
            Self::Driver(DriverSabotage::NeverYield) => "never-yield",
            Self::Driver(DriverSabotage::NeverDefer) => "never-defer",
            Self::FenceWithoutRowLock => "fence-without-row-lock",
        }
    }

    /// The sabotage named `name`, if any (of either list).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::SHARDED)
            .chain(Self::SHARDED_LEASE)
            .chain(Self::LEASE)
            .chain(Self::FITNESS)
            .chain(Self::PAUSE)
            .chain(Self::ROLLOUT)
            .find(|sabotage| sabotage.name() == name)
    }

    /// Whether it breaks the advisory lock's sessions, which lease runs never hold: the
    /// sabotages of [`Sabotage::ALL`] but the operator's and the server's.
    pub const fn is_advisory_only(self) -> bool {
        matches!(
            self,
            Self::Driver(
                DriverSabotage::NeverPing
                    | DriverSabotage::ReturnGrantedToPool
                    | DriverSabotage::SkipIdleSessionTimeout
                    | DriverSabotage::KeepTermOnFailedPing
                    | DriverSabotage::LockTimeoutAsRefusal
            )
        )
    }

    /// Whether it breaks a rollout run only: one of [`Sabotage::ROLLOUT`].
    pub fn is_rollout_only(self) -> bool {
        Self::ROLLOUT.contains(&self)
    }

    /// Whether it breaks a fitness run only: one of [`Sabotage::FITNESS`].
    pub fn is_fitness_only(self) -> bool {
        Self::FITNESS.contains(&self)
    }

    /// Whether it breaks a lease run only: one of [`Sabotage::LEASE`] or
    /// [`Sabotage::SHARDED_LEASE`].
    pub fn is_lease_only(self) -> bool {
        Self::LEASE.contains(&self) || Self::SHARDED_LEASE.contains(&self)
    }

    /// The servers' broken take of a lease shard space, if this is one.
    pub fn server_flaw(self) -> Option<plexsphere_leader_pgsim::ShardLeaseFlaw> {
        self.shard().and_then(ShardSabotage::server_flaw)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for sabotage in Sabotage::ALL
            .into_iter()
            .chain(Sabotage::SHARDED)
            .chain(Sabotage::LEASE)
            .chain(Sabotage::FITNESS)
            .chain(Sabotage::PAUSE)
            .chain(Sabotage::SHARDED_LEASE)
        {
            assert_eq!(Sabotage::from_name(sabotage.name()), Some(sabotage));
        }
        assert_eq!(Sabotage::from_name("nope"), None);
    }
}
