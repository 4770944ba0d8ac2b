//! The cause vocabulary shared by both machines and their drivers: why a term ended
//! ([`TermEndCause`], with a [`LossReason`] when it was lost), why an operation failed
//! ([`Cause`]) and what the leader's check found wrong ([`LockFinding`]).

use std::fmt;
use std::time::Duration;

use crate::rank::{Candidate, Rank, Version};

/// Why a term ended: it was lost (for a typed [`LossReason`]), stopped, resigned, given up as
/// unfit, yielded to a better-ranked candidate or, in a sharded election only, handed over. The
/// enum is
/// `#[non_exhaustive]`, so a later version may add one and a `match` outside this crate needs a
/// `_` arm. Carried by [`Action::EndTerm`](crate::Action::EndTerm) (and by a shard's
/// [`ShardAction::EndTerm`](crate::shards::ShardAction::EndTerm)), emitted exactly once per
/// term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TermEndCause {
    /// The lock is, or may be, lost (the spec's `ErrLeadershipLost`), for this reason.
    Lost(LossReason),
    /// The run was cancelled: the replica gives the lock up on purpose.
    Stopped,
    /// An operator asked the leader to resign, or made it ineligible: it gives the lock up on
    /// purpose and stays a standby.
    Resigned,
    /// The leader's fitness probe was refused ([`Options::probe_fitness`](crate::Options::probe_fitness)):
    /// it cannot do the leader's work, so it gives the lock up on purpose and stays a standby
    /// until a probe passes.
    Unfit,
    /// Sharded elections only: the shard was handed over to another replica for balance.
    HandedOver,
    /// A better-ranked candidate had been live for the stabilization window
    /// ([`Options::preference`](crate::Options::preference)): the leader gave its term up on
    /// purpose, so that candidate takes over, and stays a standby.
    Yielded,
}

impl TermEndCause {
    /// Every cause a single election can end a term with, in a fixed order, for metrics that
    /// pre-register one series per cause: each [`LossReason`] as `Lost(_)`, then
    /// [`Stopped`](Self::Stopped), [`Resigned`](Self::Resigned), [`Unfit`](Self::Unfit) and
    /// [`Yielded`](Self::Yielded). Not
    /// every variant:
    /// [`HandedOver`](Self::HandedOver) ends only shard terms, so the sharded elector's metrics
    /// add it to this list.
    pub const ALL: [Self; 15] = [
        Self::Lost(LossReason::CheckFailed),
        Self::Lost(LossReason::CheckTimedOut),
        Self::Lost(LossReason::SessionEnded),
        Self::Lost(LossReason::LockNotHeld),
        Self::Lost(LossReason::ServerInRecovery),
        Self::Lost(LossReason::BackendChanged),
        Self::Lost(LossReason::SessionShared),
        Self::Lost(LossReason::Panicked),
        Self::Lost(LossReason::Dropped),
        Self::Lost(LossReason::LeaseTaken),
        Self::Lost(LossReason::LeaseExpired),
        Self::Stopped,
        Self::Resigned,
        Self::Unfit,
        Self::Yielded,
    ];

    /// Whether the term was lost rather than given up on purpose.
    pub const fn is_loss(self) -> bool {
        matches!(self, Self::Lost(_))
    }

    /// A stable `snake_case` label: the loss reason's ([`LossReason::label`]), `stopped`,
    /// `resigned`, `unfit`, `handed_over` or `yielded`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Lost(reason) => reason.label(),
            Self::Stopped => "stopped",
            Self::Resigned => "resigned",
            Self::Unfit => "unfit",
            Self::HandedOver => "handed_over",
            Self::Yielded => "yielded",
        }
    }
}

impl fmt::Display for TermEndCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lost(reason) => write!(f, "leadership lost: {reason}"),
            Self::Stopped => f.write_str("election stopped"),
            Self::Resigned => f.write_str("leadership resigned"),
            Self::Unfit => f.write_str("leadership given up: this replica cannot do the work"),
            Self::HandedOver => f.write_str("shard handed over for balance"),
            Self::Yielded => f.write_str("leadership yielded to a better-ranked candidate"),
        }
    }
}

/// Why a term was lost: every way the election can stop trusting its lock today. The enum is
/// `#[non_exhaustive]`: a later version may add a reason, so a `match` outside this crate needs
/// a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The leader's check failed with an error that does not by itself end the session.
    CheckFailed,
    /// The leader's check did not answer within one interval.
    CheckTimedOut,
    /// The lock session ended: the server terminated the backend, restarted or closed the
    /// session (`idle_session_timeout`), or the socket was reset.
    SessionEnded,
    /// The check found the lock held by another session (released on the lock session behind
    /// the elector's back, and taken).
    LockNotHeld,
    /// The check found the server in recovery (demoted by a failover, or a re-routed
    /// connection).
    ServerInRecovery,
    /// The check ran on another backend than the one granted the lock (a transaction-mode
    /// pooler, or a re-routed connection).
    BackendChanged,
    /// Another client's grant statement ran on the lock session: the server session is shared.
    SessionShared,
    /// A panic unwound the run while it led.
    Panicked,
    /// The run was dropped (its task aborted) while it led.
    Dropped,
    /// Lease mechanism: the renewal found the lease row naming another holder or epoch (it
    /// expired, by the server's clock, and another replica claimed it).
    LeaseTaken,
    /// Lease mechanism: no claim or renewal sent within the lease's trust window
    /// ([`Lease::trusted_for`](crate::Lease::trusted_for)) succeeded; the leader stops trusting
    /// the lease before the server may let another replica claim it.
    LeaseExpired,
}

impl LossReason {
    /// A stable `snake_case` label (the metrics' `cause` label).
    pub const fn label(self) -> &'static str {
        match self {
            Self::CheckFailed => "check_failed",
            Self::CheckTimedOut => "check_timed_out",
            Self::SessionEnded => "session_ended",
            Self::LockNotHeld => "lock_not_held",
            Self::ServerInRecovery => "server_in_recovery",
            Self::BackendChanged => "backend_changed",
            Self::SessionShared => "session_shared",
            Self::Panicked => "panicked",
            Self::Dropped => "dropped",
            Self::LeaseTaken => "lease_taken",
            Self::LeaseExpired => "lease_expired",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CheckFailed => "the check failed",
            Self::CheckTimedOut => "the check did not answer in time",
            Self::SessionEnded => "the lock session ended",
            Self::LockNotHeld => "the lock is no longer held",
            Self::ServerInRecovery => "the server is in recovery",
            Self::BackendChanged => "the check ran on another backend",
            Self::SessionShared => "the lock session is shared",
            Self::Panicked => "the run panicked",
            Self::Dropped => "the run was dropped",
            Self::LeaseTaken => "another replica holds the lease",
            Self::LeaseExpired => "the lease was not renewed in time",
        })
    }
}

/// What the leader's check found wrong with its session. Each names its likely cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockFinding {
    /// The check ran on another backend than the one granted the lock.
    BackendChanged {
        /// The backend granted the lock.
        granted: i32,
        /// The backend that answered the check.
        now: i32,
    },
    /// The server is in recovery.
    InRecovery,
    /// Another session holds the lock: the check's re-entrant try was refused.
    NotHeld,
    /// Another client's grant statement ran on this session (the marker says `shared`, or is
    /// missing).
    SessionShared,
    /// Two pooled connections held at once were answered by one server backend (the pool
    /// proof, [`Options::prove_pool`](crate::Options::prove_pool)).
    PoolSharesBackend {
        /// The backend that answered both.
        backend_pid: i32,
    },
    /// Two sessions on two backends were both granted the same advisory lock key (the
    /// exclusion proof, [`crate::proof`]): the server's advisory lock does not exclude (stubs
    /// that answer `true`, as some PostgreSQL-compatible databases ship), so it cannot elect
    /// one leader.
    LockNotExclusive {
        /// The backend that held the key.
        first: i32,
        /// The backend granted the same key while the first held it.
        second: i32,
    },
}

impl LockFinding {
    /// Whether this finding proves that the pool multiplexes server sessions between clients
    /// (a transaction- or statement-mode pooler): the check ran on another backend than the
    /// grant on the same client connection, or another client's grant ran on the lock session
    /// while this client held it. Nothing else hands one client connection's statements to
    /// several server sessions; a session-mode pooler and a direct connection never do.
    pub const fn proves_multiplexing(self) -> bool {
        matches!(
            self,
            Self::BackendChanged { .. } | Self::SessionShared | Self::PoolSharesBackend { .. }
        )
    }

    /// The loss reason a term ended by this finding carries.
    pub const fn loss_reason(self) -> LossReason {
        match self {
            Self::BackendChanged { .. } => LossReason::BackendChanged,
            Self::InRecovery => LossReason::ServerInRecovery,
            Self::NotHeld => LossReason::LockNotHeld,
            Self::SessionShared | Self::PoolSharesBackend { .. } => LossReason::SessionShared,
            // Found before any term: no term ends by it.
            Self::LockNotExclusive { .. } => LossReason::LockNotHeld,
        }
    }
}

impl fmt::Display for LockFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BackendChanged { granted, now } => write!(
                f,
                "the check ran on backend {now}, not on backend {granted} that was granted the \
                 lock: a transaction-mode pooler or a re-routed connection"
            ),
            Self::InRecovery => f.write_str(
                "the server is in recovery: it was demoted by a failover, or the connection was \
                 re-routed to a standby",
            ),
            Self::NotHeld => f.write_str(
                "another session holds the lock: it was released on the lock session behind this \
                 client's back (another client's unlock on a shared server session) and taken",
            ),
            Self::SessionShared => f.write_str(
                "another client ran the grant statement on this session: the server session is \
                 shared, as behind PgBouncer in transaction mode",
            ),
            Self::PoolSharesBackend { backend_pid } => write!(
                f,
                "two connections of the pool, held at once, were both answered by server \
                 backend {backend_pid}: the pooler runs its clients' transactions on shared \
                 server sessions"
            ),
            Self::LockNotExclusive { first, second } => write!(
                f,
                "server backends {first} and {second} were both granted the same session \
                 advisory lock key at once: this server's advisory locks do not exclude (a \
                 PostgreSQL-compatible database whose advisory-lock functions are stubs, or \
                 functions replaced on this database), so they cannot elect one leader"
            ),
        }
    }
}

/// Why an operation failed: the driver's error, or a verdict of the election itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cause<C> {
    /// The driver reported this error.
    Error(C),
    /// No answer came within this budget.
    TimedOut(Duration),
    /// `pg_advisory_unlock` answered `false`: the session did not hold the lock.
    LockNotHeld,
    /// The leader's check answered, and what it found does not prove the lock.
    LockNotVerified(LockFinding),
    /// The pooled session already held the lock, and a leader's check proved it there this many
    /// seconds ago: another live client shares the server session (a transaction-mode pooler).
    SessionShared {
        /// Seconds since that check.
        checked_secs_ago: u64,
    },
    /// Lease mechanism: the renewal found the row naming another holder or epoch.
    LeaseTaken,
    /// Lease mechanism: no renewal succeeded within the trust window of this length.
    LeaseNotRenewed {
        /// How long the leader trusts a lease after sending its renewal.
        trusted_for: Duration,
    },
    /// Lease mechanism: the release found the row no longer this term's (it expired and was
    /// claimed, or was never written).
    LeaseNotHeld,
    /// The pooled session still held the lock after a stranded lock was released on it (the
    /// lock was taken more than once on that server session).
    StrandedLockKept,
    /// This replica's version is older than the newest that has led
    /// ([`Options::version_floor`](crate::Options::version_floor)), or that has joined the
    /// shard space ([`ShardOptions::version_floor`](crate::shards::ShardOptions::version_floor)):
    /// it does not lead, or owns no shard.
    BelowFloor {
        /// The floor: the newest version that has led.
        floor: Version,
        /// This replica's version.
        mine: Version,
    },
    /// A better-ranked candidate is live ([`Options::preference`](crate::Options::preference)):
    /// the leader yields to it, a standby defers to it.
    Outranked {
        /// The best live candidate.
        by: Candidate,
        /// This replica's rank.
        mine: Rank,
    },
    /// The exclusion proof ([`crate::proof`]) proved nothing, for this reason: no attempt this
    /// check.
    Unproven(Unproven<C>),
    /// The fencing epoch the database returned is not greater than one this election already
    /// used (a restored backup, or a failover to a standby that missed it).
    EpochDidNotAdvance {
        /// The epoch returned.
        epoch: u64,
        /// The greatest epoch used before.
        last: u64,
    },
}

impl<C: fmt::Display> fmt::Display for Cause<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error(cause) => cause.fmt(f),
            Self::TimedOut(budget) => write!(f, "no answer within {budget:?}"),
            Self::LockNotHeld => {
                f.write_str("pg_advisory_unlock returned false: the session did not hold the lock")
            }
            Self::LockNotVerified(finding) => write!(f, "lock check failed: {finding}"),
            Self::SessionShared { checked_secs_ago } => write!(
                f,
                "the pooled session already held the lock, which another client's check proved \
                 {checked_secs_ago} s ago on this server session: a pooler shares server sessions \
                 between clients (PgBouncer in transaction mode), or handed over the session of a \
                 client that vanished since (a pooler without a reset query; the lock is then \
                 released once no check has proved it for four intervals); use a session-mode \
                 pool that resets sessions, or a direct connection"
            ),
            Self::LeaseTaken => f.write_str(
                "the lease row names another holder or epoch: the lease expired by the server's \
                 clock and another replica claimed it",
            ),
            Self::LeaseNotRenewed { trusted_for } => write!(
                f,
                "no renewal of the lease succeeded within its trust window of {trusted_for:?} \
                 (the TTL minus its margin): the server may already let another replica claim it"
            ),
            Self::LeaseNotHeld => f.write_str(
                "the lease row was no longer this term's: it expired and was claimed, or the \
                 table was changed behind the election's back",
            ),
            Self::StrandedLockKept => f.write_str(
                "the pooled session still held the lock after its stranded lock was released \
                 (taken more than once on that server session); the connection is closed",
            ),
            Self::BelowFloor { floor, mine } => write!(
                f,
                "this replica runs version {mine}, older than {floor} which has led this \
                 election or joined this shard space (the version floor); it does not lead or \
                 own shards: roll forward, or allow a deliberate rollback \
                 (below_version_floor)"
            ),
            Self::Outranked { by, mine } => write!(
                f,
                "a candidate of {} has been live for {:?}, better than this replica's {mine}",
                by.rank, by.live_for
            ),
            Self::Unproven(why) => write!(f, "the exclusion proof proved nothing: {why}"),
            Self::EpochDidNotAdvance { epoch, last } => write!(
                f,
                "the fencing epoch did not advance ({epoch} after {last}): the fence table \
                 went back in time (restored backup, or failover to a standby that missed it)"
            ),
        }
    }
}

/// Why the exclusion proof ([`crate::proof`]) proved nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Unproven<C> {
    /// No second session answered within the bound (a saturated pool or pooler, a slow link).
    NoSecondSession,
    /// The second session failed (a connection limit, a full server, a refused login).
    SecondFailed(C),
    /// Another session held the proof's key, so the first was refused it.
    KeyTaken,
    /// Two backends answered, but no lock test was reported.
    NotTested,
}

impl<C: fmt::Display> fmt::Display for Unproven<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSecondSession => f.write_str(
                "no second session answered within half an interval (a saturated pool or \
                 pooler, or a slow link)",
            ),
            Self::SecondFailed(cause) => write!(f, "the second session failed: {cause}"),
            Self::KeyTaken => f.write_str("another session held the proof's key"),
            Self::NotTested => f.write_str("the lock test did not run"),
        }
    }
}
