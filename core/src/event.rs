//! What the driver reports to the election.

use crate::control::Control;
use crate::ids::{ConnId, TermId};
use crate::rank::{Candidate, Version};
use crate::verify::LockCheck;

/// Something that happened, reported by the driver through
/// [`Election::handle_event`](crate::Election::handle_event).
///
/// Completions carry the [`ConnId`] of the action they complete. `C` is the driver's error type
/// (the cause of a failure); the election never inspects it, it only hands it back in log records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Event<C> {
    /// [`Action::AcquireConnection`](crate::Action::AcquireConnection) produced a connection.
    ConnectionAcquired {
        /// The connection asked for.
        conn: ConnId,
    },
    /// [`Action::AcquireConnection`](crate::Action::AcquireConnection) failed (pool error,
    /// unreachable server, refused authentication, ...).
    AcquireFailed {
        /// The connection asked for.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// [`Action::ProbePool`](crate::Action::ProbePool) answered: what the exclusion proof
    /// observed ([`crate::proof`]).
    PoolProbed {
        /// The operation.
        conn: ConnId,
        /// What the two sessions answered.
        proof: crate::proof::PoolProof<C>,
    },
    /// [`Action::ProbeFitness`](crate::Action::ProbeFitness) answered: this replica can do the
    /// leader's work.
    Fit {
        /// The connection or operation.
        conn: ConnId,
    },
    /// [`Action::ProbeFitness`](crate::Action::ProbeFitness): the server refused the probe
    /// (an error with an SQLSTATE, such as a missing privilege or a read-only session): this
    /// replica cannot do the leader's work.
    Unfit {
        /// The connection or operation.
        conn: ConnId,
        /// The server's refusal.
        cause: C,
    },
    /// [`Action::ProbeFitness`](crate::Action::ProbeFitness) did not run to an answer (the
    /// connection broke, the pool failed): nothing is learnt of the replica's fitness.
    ProbeFailed {
        /// The connection or operation.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// [`Action::SurveyCandidates`](crate::Action::SurveyCandidates) answered: the live
    /// candidates other than this replica (each replica's sessions may show more than once).
    CandidatesSurveyed {
        /// The connection or operation.
        conn: ConnId,
        /// Each live candidate's rank and how long it has been one.
        candidates: Vec<Candidate>,
        /// The version floor after the survey's step ([`FloorStep`](crate::rank::FloorStep)):
        /// the newest version that has led, `None` when none is recorded or the floor is off.
        floor: Option<Version>,
    },
    /// [`Action::SurveyCandidates`](crate::Action::SurveyCandidates) did not run to an answer.
    SurveyFailed {
        /// The connection or operation.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// [`Action::TryLock`](crate::Action::TryLock) answered `true`: this session holds the lock
    /// and its `idle_session_timeout` is set.
    LockGranted {
        /// The connection the lock was tried on.
        conn: ConnId,
        /// The backend the server granted the lock to (`pg_backend_pid()` in the grant's
        /// answer): every later check must be answered by it.
        backend_pid: i32,
    },
    /// [`Action::TryLock`](crate::Action::TryLock) answered `false`: another session holds the
    /// lock and nothing changed on this session.
    LockRefused {
        /// The connection the lock was tried on.
        conn: ConnId,
    },
    /// Queued mode: the server's `lock_timeout` ended the wait of
    /// [`Action::WaitForLock`](crate::Action::WaitForLock) (SQLSTATE 55P03). The session may
    /// hold the lock all the same (granted at the instant of the timeout).
    LockWaitTimedOut {
        /// The connection the lock was waited for on.
        conn: ConnId,
    },
    /// [`Action::TryLock`](crate::Action::TryLock) or `WaitForLock` found the session already
    /// holding the lock before it asked: no term of this election is on it, so another client
    /// took it on the same server session (a pooler). The statement marked the session
    /// `shared`, so a client that leads on it demotes at its next check. `checked_secs_ago` is
    /// how long ago (server clock, whole seconds) a leader's check last proved the lock on this
    /// session, `None` when none ever did; the election tells a live leader sharing the session
    /// (transaction mode) from a lock a vanished client stranded there (no reset query) by it.
    LockHeldBySession {
        /// The connection the lock was tried on.
        conn: ConnId,
        /// Seconds since a leader's check last proved the lock on this session.
        checked_secs_ago: Option<u64>,
    },
    /// [`Action::ReleaseIfHeld`](crate::Action::ReleaseIfHeld) answered: the session no longer
    /// holds the lock; `released` says whether it did and was released.
    ReleasedIfHeld {
        /// The connection.
        conn: ConnId,
        /// Whether the session held the lock (and released it).
        released: bool,
    },
    /// [`Action::TryLock`](crate::Action::TryLock) or `WaitForLock` answered without trying
    /// the lock: the server is in recovery, or the session is read-only (the cause says which).
    /// The session holds nothing, so it goes back to the pool unchanged.
    LockNotTried {
        /// The connection the grant statement ran on.
        conn: ConnId,
        /// Why the statement did not try the lock.
        cause: C,
    },
    /// [`Action::TryLock`](crate::Action::TryLock), `WaitForLock` or `ReleaseIfHeld` failed:
    /// whether the session holds the lock is unknown.
    LockQueryFailed {
        /// The connection the lock was tried on.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// [`Action::AdvanceEpoch`](crate::Action::AdvanceEpoch) returned the new epoch.
    EpochAdvanced {
        /// The lock connection.
        conn: ConnId,
        /// The epoch the database returned.
        epoch: u64,
    },
    /// [`Action::AdvanceEpoch`](crate::Action::AdvanceEpoch) failed.
    EpochFailed {
        /// The lock connection.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// The lock connection ended on its own (the server terminated the backend, restarted, or
    /// the socket was reset): reported as soon as the driver notices, whatever is in flight.
    SessionEnded {
        /// The lock connection.
        conn: ConnId,
        /// How it ended.
        cause: C,
    },
    /// [`Action::AwaitWork`](crate::Action::AwaitWork): no work of the term runs any more.
    WorkDrained {
        /// The term whose work ended.
        term: TermId,
    },
    /// [`Action::Ping`](crate::Action::Ping) answered with what the lock verification found;
    /// the election judges it ([`LockCheck::verdict`]).
    PingAnswered {
        /// The lock connection.
        conn: ConnId,
        /// What the check statement returned.
        found: LockCheck,
    },
    /// [`Action::Ping`](crate::Action::Ping) failed.
    PingFailed {
        /// The lock connection.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// [`Action::Unlock`](crate::Action::Unlock) answered; `released` is the boolean
    /// `pg_advisory_unlock` returned (`false`: this session did not hold the lock).
    UnlockDone {
        /// The lock connection.
        conn: ConnId,
        /// What `pg_advisory_unlock` returned.
        released: bool,
    },
    /// [`Action::Unlock`](crate::Action::Unlock) failed.
    UnlockFailed {
        /// The lock connection.
        conn: ConnId,
        /// Why it failed.
        cause: C,
    },
    /// Lease mechanism: [`Action::ClaimLease`](crate::Action::ClaimLease) took the lease; a
    /// term may begin with `epoch` as its fencing epoch.
    LeaseClaimed {
        /// The operation.
        conn: ConnId,
        /// The row's new epoch.
        epoch: u64,
    },
    /// Lease mechanism: [`Action::RenewLease`](crate::Action::RenewLease) extended the lease.
    LeaseRenewed {
        /// The operation.
        conn: ConnId,
    },
    /// Lease mechanism: [`Action::RenewLease`](crate::Action::RenewLease) found the row naming
    /// another holder or epoch: the term is lost.
    LeaseLost {
        /// The operation.
        conn: ConnId,
    },
    /// A request from outside the run: a stop, a resign, an eligibility, a panic or a drop.
    Control(Control),
}

impl<C> From<Control> for Event<C> {
    fn from(control: Control) -> Self {
        Self::Control(control)
    }
}

impl<C> Event<C> {
    /// The connection a completion event concerns; `None` for [`Event::Control`] and
    /// [`Event::WorkDrained`].
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Self::ConnectionAcquired { conn }
            | Self::AcquireFailed { conn, .. }
            | Self::PoolProbed { conn, .. }
            | Self::Fit { conn }
            | Self::Unfit { conn, .. }
            | Self::ProbeFailed { conn, .. }
            | Self::CandidatesSurveyed { conn, .. }
            | Self::SurveyFailed { conn, .. }
            | Self::LockGranted { conn, .. }
            | Self::LockRefused { conn }
            | Self::LockWaitTimedOut { conn }
            | Self::LockHeldBySession { conn, .. }
            | Self::ReleasedIfHeld { conn, .. }
            | Self::LockQueryFailed { conn, .. }
            | Self::LockNotTried { conn, .. }
            | Self::PingAnswered { conn, .. }
            | Self::PingFailed { conn, .. }
            | Self::UnlockDone { conn, .. }
            | Self::UnlockFailed { conn, .. }
            | Self::EpochAdvanced { conn, .. }
            | Self::EpochFailed { conn, .. }
            | Self::LeaseClaimed { conn, .. }
            | Self::LeaseRenewed { conn }
            | Self::LeaseLost { conn }
            | Self::SessionEnded { conn, .. } => Some(*conn),
            Self::WorkDrained { .. } | Self::Control(_) => None,
        }
    }
}
