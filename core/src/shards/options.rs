//! The validated options of a sharded election.

use std::fmt;
use std::time::Duration;

use crate::interval::CheckInterval;
use crate::mechanism::Mechanism;
use crate::options::{MAX_STOP_GRACE_INTERVALS, StopGraceTooLong, WorkDeadline};
use crate::rank::{FloorStep, Rank};
use crate::shards::Standing;

/// The most shards one space may have: far more than a server's lock table holds with its
/// defaults (6,400 locks), so that a larger table is the only limit in practice.
pub const MAX_SHARDS: u32 = 1 << 20;

/// The options of one [`ShardedElection`](super::ShardedElection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardOptions {
    interval: CheckInterval,
    count: u32,
    rebalance_delay: Duration,
    max_moves: u32,
    stop_grace: Duration,
    handover_grace: Duration,
    fencing: bool,
    prove_pool: bool,
    work_deadline: Option<WorkDeadline>,
    mechanism: Mechanism,
    rank: Option<Rank>,
    version_floor: bool,
    below_floor: bool,
}

/// An invalid shard option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardOptionsError {
    /// The space has no shard, or more than [`MAX_SHARDS`].
    ShardCount(u32),
    /// The move limit is zero: no replica could ever give a shard up.
    NoMoves,
    /// The stop grace is longer than the election allows.
    StopGrace(StopGraceTooLong),
}

impl fmt::Display for ShardOptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ShardCount(count) => {
                write!(f, "shard count {count} is outside 1..={MAX_SHARDS}")
            }
            Self::NoMoves => f.write_str("the move limit per interval must be at least 1"),
            Self::StopGrace(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ShardOptionsError {}

/// The server's lock table has no room for the space's locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockTableTooSmall {
    /// Locks the space needs: one per shard and one per member.
    pub needed: u64,
    /// The lock table's slots: `max_locks_per_transaction × (max_connections +
    /// max_prepared_transactions)`.
    pub capacity: u64,
}

impl LockTableTooSmall {
    /// The share of the lock table a shard space may fill: one half, the other half is left to
    /// every other lock of the server (tables, indexes, other advisory locks).
    pub const fn usable(capacity: u64) -> u64 {
        capacity / 2
    }
}

impl fmt::Display for LockTableTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the shard space needs {} advisory locks (one per shard and one per replica), more \
             than half of the server's lock table of {} slots (max_locks_per_transaction × \
             (max_connections + max_prepared_transactions)); raise max_locks_per_transaction, use \
             fewer shards, or hold the space with leases (ShardConfig::lease), which need no \
             advisory lock per shard",
            self.needed, self.capacity
        )
    }
}

impl std::error::Error for LockTableTooSmall {}

impl ShardOptions {
    /// A space of `count` shards checked every `interval`: a rebalance delay of one interval, at
    /// most `⌈count / 4⌉` shards given up per interval, a stop grace of one interval, and a
    /// WARN when a handed-over shard's work outlives one interval.
    ///
    /// # Errors
    /// [`ShardOptionsError::ShardCount`] for a count outside `1..=MAX_SHARDS`.
    pub fn new(interval: CheckInterval, count: u32) -> Result<Self, ShardOptionsError> {
        if count == 0 || count > MAX_SHARDS {
            return Err(ShardOptionsError::ShardCount(count));
        }
        Ok(Self {
            interval,
            count,
            rebalance_delay: interval.get(),
            max_moves: count.div_ceil(4),
            stop_grace: interval.get(),
            handover_grace: interval.get(),
            fencing: false,
            prove_pool: false,
            work_deadline: None,
            mechanism: Mechanism::Advisory,
            rank: None,
            version_floor: false,
            below_floor: false,
        })
    }

    /// How long the set of members must stay unchanged before this replica gives up shards
    /// for balance, and how long a cold start (no shard held by anyone) waits before its first
    /// take, so that replicas starting together split the space instead of the first one taking
    /// it all. Free shards are taken at once otherwise, whatever the window.
    #[must_use]
    pub fn rebalance_delay(mut self, delay: Duration) -> Self {
        self.rebalance_delay = delay.min(crate::MAX_HOLD_OFF);
        self
    }

    /// The most shards this replica starts handing over in one interval.
    ///
    /// # Errors
    /// [`ShardOptionsError::NoMoves`] for zero.
    pub fn max_moves(mut self, moves: u32) -> Result<Self, ShardOptionsError> {
        if moves == 0 {
            return Err(ShardOptionsError::NoMoves);
        }
        self.max_moves = moves;
        Ok(self)
    }

    /// How long a graceful stop waits for the work of every shard before releasing the locks
    /// anyway; at most [`MAX_STOP_GRACE_INTERVALS`] intervals.
    ///
    /// # Errors
    /// [`ShardOptionsError::StopGrace`] for a longer grace.
    pub fn stop_grace(mut self, grace: Duration) -> Result<Self, ShardOptionsError> {
        let max = self.interval.get() * MAX_STOP_GRACE_INTERVALS;
        if grace > max {
            return Err(ShardOptionsError::StopGrace(StopGraceTooLong {
                given: grace,
                max,
            }));
        }
        self.stop_grace = grace;
        Ok(self)
    }

    /// After how long a handed-over shard whose work still runs is reported at WARN. The lock is
    /// kept until the work returns, whatever the wait: a successor never overlaps it.
    #[must_use]
    pub fn handover_grace(mut self, grace: Duration) -> Self {
        self.handover_grace = grace.min(crate::MAX_HOLD_OFF);
        self
    }

    /// Give every shard term a fencing epoch: right after a take, the granted shards' epochs
    /// are advanced in one statement (rows `(class, shard)` of the fence table) before their
    /// terms begin.
    #[must_use]
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = enabled;
        self
    }

    /// Advisory locks: before a run joins the space (and again after it lost its session),
    /// prove that the pool's sessions are its own and that the server's lock excludes
    /// ([`crate::proof`], [`ShardAction::ProbePool`](super::ShardAction::ProbePool)). Off by
    /// default here; the `plexsphere-leader` adapter turns it on. No effect with a lease.
    #[must_use]
    pub fn prove_pool(mut self, on: bool) -> Self {
        self.prove_pool = on;
        self
    }

    /// Whether a run proves its pool before it joins ([`prove_pool`](Self::prove_pool)).
    pub fn proves_pool(&self) -> bool {
        self.prove_pool && self.mechanism.lease().is_none()
    }

    /// Whether shard terms get fencing epochs: with [`fencing`](Self::fencing), and always with
    /// a lease ([`mechanism`](Self::mechanism)).
    pub fn is_fencing(&self) -> bool {
        self.fencing || self.mechanism.lease().is_some()
    }

    /// A hard deadline for shard work, as the single election's
    /// [`Options::work_deadline`](crate::Options::work_deadline): `after` a shard term ended
    /// (for any reason), the election asks the driver to report work of that term still
    /// running, and with [`OnOverdue::Abort`](crate::OnOverdue::Abort) to abort it
    /// ([`ShardAction::ReportOverdueWork`](super::ShardAction::ReportOverdueWork)); when the run
    /// finishes first, the reports come as it finishes. `after` is at most
    /// [`MAX_HOLD_OFF`](crate::MAX_HOLD_OFF); longer is shortened to it.
    #[must_use]
    pub fn work_deadline(mut self, after: Duration, on_overdue: crate::OnOverdue) -> Self {
        self.work_deadline = Some(WorkDeadline::new(after, on_overdue));
        self
    }

    /// How the space is held (default [`Mechanism::Advisory`]). With
    /// [`Mechanism::Lease`], for a transaction-mode pooler: a member row per replica renewed
    /// every interval (one statement whatever the shard count), a shard row written only when
    /// its owner changes, and every shard term fenced by its row's epoch (whatever
    /// [`fencing`](Self::fencing) says); a member trusts its shards for
    /// [`Lease::trusted_for`](crate::Lease::trusted_for) after sending its last renewal that
    /// succeeded.
    #[must_use]
    pub fn mechanism(mut self, mechanism: Mechanism) -> Self {
        self.mechanism = mechanism;
        self
    }

    /// This replica's rank in the space (unranked by default): the `K mod R` extra slots and
    /// the free shards go to the best-ranked members first, so that during a rolling deploy
    /// the shards an old replica frees go to the new versions. It is published with the
    /// membership ([`Standing`]); equal ranks are assigned as without ranks.
    #[must_use]
    pub fn preference(mut self, rank: Rank) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The rank, when this replica has one.
    pub fn rank_of(&self) -> Option<Rank> {
        self.rank
    }

    /// The version floor of a ranked space (off by default): every ranked member that joins
    /// raises the floor to its version, in the statement that joins it, and a ranked member
    /// older than the floor owns no shard (it gives up what it holds and takes none, and the
    /// space is balanced over the others) until the floor is lowered. Without a
    /// [rank](Self::preference) it does nothing.
    #[must_use]
    pub fn version_floor(mut self, on: bool) -> Self {
        self.version_floor = on;
        self
    }

    /// A deliberate rollback: with the [floor](Self::version_floor) on, this replica owns
    /// shards even below the floor, and sets the floor to its own version as it joins (so the
    /// other replicas of its version may own shards again).
    #[must_use]
    pub fn below_floor(mut self, allowed: bool) -> Self {
        self.below_floor = allowed;
        self
    }

    /// What this replica publishes with its membership.
    pub fn standing(&self) -> Standing {
        Standing {
            rank: self.rank,
            below_floor_allowed: self.version_floor && self.below_floor,
        }
    }

    /// Whether the surveys read the version floor: the floor is on and this replica is ranked.
    pub fn reads_floor(&self) -> bool {
        self.version_floor && self.rank.is_some()
    }

    /// What the statement that joins the space does with the floor: nothing without a floor or
    /// a rank, else it raises the floor to this replica's version (or, allowed below it, sets
    /// it).
    pub fn join_floor_step(&self) -> FloorStep {
        match self.rank {
            Some(rank) if self.version_floor && self.below_floor => FloorStep::Set(rank.version),
            Some(rank) if self.version_floor => FloorStep::Raise(rank.version),
            _ => FloorStep::Off,
        }
    }

    /// How the space is held.
    pub fn mechanism_of(&self) -> Mechanism {
        self.mechanism
    }

    /// The work deadline, if any.
    pub fn work_deadline_of(&self) -> Option<WorkDeadline> {
        self.work_deadline
    }

    /// The check interval.
    pub fn interval(&self) -> CheckInterval {
        self.interval
    }

    /// The number of shards, `K`.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The rebalance delay.
    pub fn delay(&self) -> Duration {
        self.rebalance_delay
    }

    /// The move limit per interval.
    pub fn moves(&self) -> u32 {
        self.max_moves
    }

    /// The stop grace.
    pub fn grace(&self) -> Duration {
        self.stop_grace
    }

    /// The handover grace.
    pub fn handover(&self) -> Duration {
        self.handover_grace
    }

    /// Whether the server's lock table of `capacity` slots has room for this space with
    /// `members` members: `K + members` at most [`LockTableTooSmall::usable`].
    ///
    /// # Errors
    /// [`LockTableTooSmall`] when it has not.
    pub fn check_lock_table(&self, capacity: u64, members: u32) -> Result<(), LockTableTooSmall> {
        let needed = u64::from(self.count) + u64::from(members);
        if needed > LockTableTooSmall::usable(capacity) {
            return Err(LockTableTooSmall { needed, capacity });
        }
        Ok(())
    }
}
