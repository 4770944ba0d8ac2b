//! The inputs and outputs of a [`ShardedElection`](super::ShardedElection).

use std::fmt;

use super::{LockTableTooSmall, MemberId, Shard, Survey};
use crate::action::Level;
use crate::cause::{Cause, TermEndCause};
use crate::control::Control;
use crate::ids::{ConnId, TermId};
use crate::rank::FloorStep;

/// What the driver reports: the completion of an action, or a request from outside.
///
/// Completions echo the [`ConnId`] of their action; one for another connection than the
/// election's current one is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ShardEvent<C> {
    /// [`ShardAction::ProbePool`] answered: what the exclusion proof observed
    /// ([`crate::proof`]).
    PoolProbed {
        /// The operation.
        conn: ConnId,
        /// What the two sessions answered.
        proof: crate::proof::PoolProof<C>,
    },
    /// [`ShardAction::AcquireSession`] got a session.
    Acquired {
        /// The connection asked for.
        conn: ConnId,
    },
    /// [`ShardAction::AcquireSession`] failed.
    AcquireFailed {
        /// The connection asked for.
        conn: ConnId,
        /// The pool's error.
        cause: C,
    },
    /// [`ShardAction::Register`] answered.
    Registered {
        /// The session.
        conn: ConnId,
        /// `pg_backend_pid()` of the session: the member it now is.
        backend: MemberId,
        /// Whether the member lock was granted (`false`: another session holds the member key
        /// exclusively, so the space is not usable).
        granted: bool,
        /// The server's lock-table slots: `max_locks_per_transaction × (max_connections +
        /// max_prepared_transactions)`.
        lock_capacity: u64,
        /// The members of the space, this one included when granted.
        members: u32,
    },
    /// [`ShardAction::Survey`] answered.
    Surveyed {
        /// The session.
        conn: ConnId,
        /// What it found.
        survey: Survey,
    },
    /// [`ShardAction::Take`] answered with the shards the server granted (the others are held
    /// by another session).
    Took {
        /// The session.
        conn: ConnId,
        /// The shards granted, a subset of those asked for.
        granted: Vec<Shard>,
    },
    /// Lease mechanism: [`ShardAction::RenewMember`] answered.
    Renewed {
        /// The member's operations.
        conn: ConnId,
        /// Whether the member's lease was extended (`false`: it had expired, or a take reaped
        /// it, and every shard of the member is lost).
        renewed: bool,
        /// The live members, ascending.
        members: Vec<MemberId>,
    },
    /// Lease mechanism: [`ShardAction::TakeLeases`] answered.
    TookLeases {
        /// The member's operations.
        conn: ConnId,
        /// Whether the member was live (`false`: its lease expired and nothing was taken).
        live: bool,
        /// The shards taken, each with its new fencing epoch (a subset of those asked for).
        taken: Vec<(Shard, u64)>,
    },
    /// [`ShardAction::AdvanceEpochs`] answered with each shard's new epoch.
    EpochsAdvanced {
        /// The session.
        conn: ConnId,
        /// The epoch of each shard asked for.
        epochs: Vec<(Shard, u64)>,
    },
    /// [`ShardAction::Unlock`] answered.
    Unlocked {
        /// The session.
        conn: ConnId,
        /// The shards whose `pg_advisory_unlock` returned `false`: the session did not hold
        /// them.
        not_held: Vec<Shard>,
    },
    /// [`ShardAction::UnlockAll`] answered.
    UnlockedAll {
        /// The session.
        conn: ConnId,
    },
    /// A statement on the session failed.
    StatementFailed {
        /// The session.
        conn: ConnId,
        /// The driver's error.
        cause: C,
        /// Whether the error ended the session (closed socket, SQLSTATE class 57P).
        session_ended: bool,
    },
    /// The detached lock session ended on its own (the server closed it, or the socket broke).
    SessionEnded {
        /// The session.
        conn: ConnId,
    },
    /// Every handle of this ended term is gone ([`ShardAction::AwaitWork`]).
    WorkDrained {
        /// The term.
        term: TermId,
    },
    /// A request from outside the run: a stop, a resign, an eligibility, a panic or a drop.
    Control(Control),
}

impl<C> From<Control> for ShardEvent<C> {
    fn from(control: Control) -> Self {
        Self::Control(control)
    }
}

impl<C> ShardEvent<C> {
    /// The connection a completion concerns.
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Self::Acquired { conn }
            | Self::PoolProbed { conn, .. }
            | Self::AcquireFailed { conn, .. }
            | Self::Registered { conn, .. }
            | Self::Surveyed { conn, .. }
            | Self::Took { conn, .. }
            | Self::Renewed { conn, .. }
            | Self::TookLeases { conn, .. }
            | Self::EpochsAdvanced { conn, .. }
            | Self::Unlocked { conn, .. }
            | Self::UnlockedAll { conn }
            | Self::StatementFailed { conn, .. }
            | Self::SessionEnded { conn } => Some(*conn),
            Self::WorkDrained { .. } | Self::Control(_) => None,
        }
    }
}

/// What the election asks the driver to do, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ShardAction<C> {
    /// [`ShardOptions::prove_pool`](super::ShardOptions::prove_pool): the exclusion proof
    /// before the lock session is borrowed, as the single election's
    /// [`Action::ProbePool`](crate::Action::ProbePool) describes it; report
    /// [`ShardEvent::PoolProbed`] or [`ShardEvent::AcquireFailed`].
    ProbePool {
        /// The identifier of the operation.
        conn: ConnId,
        /// How long to wait for the second session.
        second_within: std::time::Duration,
    },
    /// Borrow a session from the pool; report [`ShardEvent::Acquired`] or
    /// [`ShardEvent::AcquireFailed`].
    AcquireSession {
        /// The connection's id.
        conn: ConnId,
    },
    /// Take the member lock `(class, -1)` in shared mode and, when granted, bound the session
    /// with `idle_session_timeout`; report [`ShardEvent::Registered`].
    Register {
        /// The session.
        conn: ConnId,
        /// The `idle_session_timeout` to set, in milliseconds (four intervals).
        idle_session_timeout_ms: u32,
    },
    /// Lease mechanism: join the space as a new member whose lease lasts `ttl_ms` on the
    /// server's clock, on any pooled connection; report [`ShardEvent::Registered`] (granted,
    /// with a lock capacity of `u64::MAX`: no lock table holds the space) or
    /// [`ShardEvent::StatementFailed`]. `conn` names the member's operations from then on; no
    /// connection is kept, and the driver runs [`Survey`](Self::Survey),
    /// [`Unlock`](Self::Unlock) and [`UnlockAll`](Self::UnlockAll) as the member's lease
    /// statements.
    RegisterMember {
        /// The member's operations.
        conn: ConnId,
        /// The lease's TTL, in whole milliseconds.
        ttl_ms: u32,
        /// What the same transaction does with the version floor
        /// ([`ShardOptions::join_floor_step`](super::ShardOptions::join_floor_step)): a member
        /// is never seen without the floor it raised.
        floor: FloorStep,
    },
    /// Lease mechanism: extend the member's lease by `ttl_ms` from the server's `now()` and
    /// read the live members; report [`ShardEvent::Renewed`].
    RenewMember {
        /// The member's operations.
        conn: ConnId,
        /// The lease's TTL, in whole milliseconds.
        ttl_ms: u32,
    },
    /// Lease mechanism: own these shards where they are free (reaping the members whose lease
    /// expired first), advancing each taken shard's fencing epoch in the same transaction,
    /// whose waits are bounded by `lock_timeout_ms`; report [`ShardEvent::TookLeases`].
    TakeLeases {
        /// The member's operations.
        conn: ConnId,
        /// The shards, ascending.
        shards: Vec<Shard>,
        /// The transaction's `lock_timeout`, in milliseconds (half an interval).
        lock_timeout_ms: u32,
    },
    /// Take the session out of the pool for good: it carries the member lock.
    Detach {
        /// The session.
        conn: ConnId,
        /// Its backend.
        backend: MemberId,
    },
    /// Read who holds which shard (the space's rows of `pg_locks`; with a lease, the live
    /// members' owner rows) and each member's published [`Standing`](super::Standing); report
    /// [`ShardEvent::Surveyed`], with the version floor after `floor`'s step when it reads one.
    Survey {
        /// The session.
        conn: ConnId,
        /// What the survey does with the version floor: the advisory member's first survey
        /// after it joined takes the join's step, later ones (and a lease member's) read it;
        /// [`FloorStep::Off`] without a floor.
        floor: FloorStep,
    },
    /// Try the locks of these shards in one statement; report [`ShardEvent::Took`].
    Take {
        /// The session.
        conn: ConnId,
        /// The shards, ascending.
        shards: Vec<Shard>,
    },
    /// Advance the fencing epochs of these just-granted shards in one statement, waiting for a
    /// fence row at most `lock_timeout_ms`; report [`ShardEvent::EpochsAdvanced`].
    AdvanceEpochs {
        /// The session.
        conn: ConnId,
        /// The shards, ascending.
        shards: Vec<Shard>,
        /// The statement's `lock_timeout`, in milliseconds (half an interval).
        lock_timeout_ms: u32,
    },
    /// Unlock these shards in one statement (with a lease, free their owner rows that are
    /// still the member's); report [`ShardEvent::Unlocked`].
    Unlock {
        /// The session.
        conn: ConnId,
        /// The shards, ascending.
        shards: Vec<Shard>,
    },
    /// Release every advisory lock of the session (`pg_advisory_unlock_all()`; with a lease,
    /// free every shard of the member and delete its row); report
    /// [`ShardEvent::UnlockedAll`].
    UnlockAll {
        /// The session.
        conn: ConnId,
    },
    /// Close the session, or abandon its acquire; the server releases whatever it held.
    CloseSession {
        /// The session.
        conn: ConnId,
    },
    /// A term of `shard` begins: this replica owns it.
    BeginTerm {
        /// The shard.
        shard: Shard,
        /// Its new term.
        term: TermId,
        /// Its fencing epoch, with fencing on.
        epoch: Option<u64>,
    },
    /// The term of `shard` ends (exactly once per term).
    EndTerm {
        /// The shard.
        shard: Shard,
        /// The term.
        term: TermId,
        /// Why.
        cause: TermEndCause,
    },
    /// Report [`ShardEvent::WorkDrained`] once no handle of this ended term is alive.
    AwaitWork {
        /// The term.
        term: TermId,
    },
    /// The work deadline of the ended `term` passed
    /// ([`ShardOptions::work_deadline`](super::ShardOptions::work_deadline)), or the run finished
    /// first (`run_finished`): report its work still running, and abort it when `abort`.
    ReportOverdueWork {
        /// The ended term.
        term: TermId,
        /// Whether to abort the work still running.
        abort: bool,
        /// The run finished before the deadline.
        run_finished: bool,
    },
    /// Log this record.
    Log(ShardLog<C>),
    /// The run cannot go on: it ends with this error ([`ShardAction::Finish`] follows).
    Fail(ShardFailure),
    /// The run is over: no term is open and no session is held.
    Finish,
}

/// Why a sharded run cannot go on ([`ShardAction::Fail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardFailure {
    /// The server's lock table has no room for the space's locks.
    LockTableTooSmall(LockTableTooSmall),
    /// The exclusion proof refuted the advisory lock: a pool that multiplexes sessions, or a
    /// lock that does not exclude.
    Refuted(crate::LockFinding),
}

/// A log record of a sharded election.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardLog<C> {
    /// What happened.
    pub kind: ShardLogKind,
    /// How many shards it concerns.
    pub shards: u32,
    /// Why terms ended, for the records of a loss.
    pub reason: Option<TermEndCause>,
    /// Why, for the records of a failure.
    pub cause: Option<Cause<C>>,
}

impl<C> ShardLog<C> {
    pub(crate) fn new(kind: ShardLogKind, shards: usize) -> Self {
        Self {
            kind,
            shards: u32::try_from(shards).unwrap_or(u32::MAX),
            reason: None,
            cause: None,
        }
    }
}

impl<C: fmt::Display> fmt::Display for ShardLog<C> {
    /// The message, then `": <reason>"` and `": <cause>"` when there are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.message())?;
        if let Some(reason) = self.reason {
            write!(f, ": {reason}")?;
        }
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

/// What a [`ShardLog`] reports; fixes its message and level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShardLogKind {
    /// The lock session holds the member lock: the replica is a member of the space.
    Joined,
    /// Shards were granted.
    Took,
    /// Shards are being handed over for balance: their terms ended, their work is awaited.
    HandingOver,
    /// Handed-over shards were unlocked.
    HandedOver,
    /// The lock session is lost, and every shard with it.
    SessionLost,
    /// A session could not be acquired.
    AcquireFailed,
    /// The exclusion proof proved nothing (the cause says why): no session this check; the
    /// next check proves again.
    ProofInconclusive,
    /// The exclusion proof refuted the advisory lock (the cause names the finding): the run
    /// fails before any shard is taken.
    ProofRefuted,
    /// The member lock is held exclusively by another session.
    MemberLockRefused,
    /// A handed-over shard's work outlived the handover grace; the lock stays until it returns.
    HandoverOverdue,
    /// The fencing epochs of granted shards could not be advanced; their locks are released
    /// and taken again at a later survey.
    FencingFailed,
    /// The graceful release failed; the session is closed, and the server releases the locks.
    ReleaseFailed,
    /// Lease mechanism: a statement failed or did not answer; the member goes on, and its
    /// shards stay trusted until its last renewal's trust runs out.
    LeaseStatementFailed,
    /// A graceful stop's grace ended before every shard's work returned.
    WorkOutlivedStop,
    /// A panic unwound the run; the session is closed without unlocking.
    AbandonedAfterPanic,
    /// The run was dropped; the session is closed without unlocking.
    AbandonedAfterDrop,
    /// A survey found this ranked replica older than the version floor
    /// ([`ShardOptions::version_floor`](super::ShardOptions::version_floor)): it gives up every
    /// shard and takes none. Once, as it falls below (the cause names both versions).
    BelowFloor,
    /// A survey found this replica no longer below the version floor: it owns shards again.
    AboveFloorAgain,
}

impl ShardLogKind {
    /// The fixed message.
    pub const fn message(self) -> &'static str {
        match self {
            Self::Joined => "sharded leader: joined the shard space",
            Self::Took => "sharded leader: took shards",
            Self::HandingOver => "sharded leader: handing shards over for balance",
            Self::HandedOver => "sharded leader: handed shards over",
            Self::SessionLost => "sharded leader: lock session lost with every shard it held",
            Self::AcquireFailed => "sharded leader: acquire lock connection",
            Self::ProofInconclusive => {
                "sharded leader: the exclusion proof proved nothing; no shard is taken until a \
                 proof passes"
            }
            Self::ProofRefuted => {
                "sharded leader: the advisory lock cannot hold this shard space here (a pooler \
                 that multiplexes sessions, or locks that do not exclude); no shard is taken: \
                 use the lease mechanism (ShardConfig::lease)"
            }
            Self::MemberLockRefused => {
                "sharded leader: the member lock is held exclusively by another session"
            }
            Self::HandoverOverdue => {
                "sharded leader: handed-over shard's work still runs; the lock is kept until it returns"
            }
            Self::FencingFailed => "sharded leader: advance the granted shards' fencing epochs",
            Self::ReleaseFailed => "sharded leader: release shard locks",
            Self::LeaseStatementFailed => {
                "sharded leader: lease statement failed; retried at the next check"
            }
            Self::WorkOutlivedStop => "sharded leader: shard work outlived the stop grace",
            Self::AbandonedAfterPanic => "sharded leader: shard locks abandoned after a panic",
            Self::AbandonedAfterDrop => "sharded leader: shard locks abandoned after a drop",
            Self::BelowFloor => {
                "sharded leader: this replica's version is older than the version floor; it \
                 owns no shard"
            }
            Self::AboveFloorAgain => {
                "sharded leader: this replica is no longer below the version floor; it owns \
                 shards again"
            }
        }
    }

    /// The level.
    pub const fn level(self) -> Level {
        match self {
            Self::Joined
            | Self::Took
            | Self::HandingOver
            | Self::HandedOver
            | Self::AboveFloorAgain => Level::Info,
            Self::SessionLost
            | Self::AcquireFailed
            | Self::MemberLockRefused
            | Self::HandoverOverdue
            | Self::FencingFailed
            | Self::ReleaseFailed
            | Self::LeaseStatementFailed
            | Self::WorkOutlivedStop
            | Self::AbandonedAfterPanic
            | Self::AbandonedAfterDrop
            | Self::BelowFloor
            | Self::ProofInconclusive => Level::Warn,
            Self::ProofRefuted => Level::Error,
        }
    }
}
