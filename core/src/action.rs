//! What the election asks the driver to do, and the log records it emits.

use std::fmt;
use std::time::Duration;

use crate::cause::{Cause, LockFinding, TermEndCause};
use crate::ids::{ConnId, TermId};
use crate::rank::{Candidate, FloorStep};

/// One thing the driver must do, drained with [`Election::poll_action`](crate::Election::poll_action)
/// in order.
///
/// The driver performs at most one I/O operation at a time. An action that starts an operation
/// on a connection (`TryLock`, `Ping`, `Unlock`) replaces any operation still in flight on it;
/// [`Action::CloseConnection`] cancels whatever is in flight on its connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action<C> {
    /// Borrow a connection from the pool for `conn`, then report
    /// [`Event::ConnectionAcquired`](crate::Event::ConnectionAcquired) or
    /// [`Event::AcquireFailed`](crate::Event::AcquireFailed).
    AcquireConnection {
        /// The identifier the new connection gets.
        conn: ConnId,
    },
    /// [`Options::prove_pool`](crate::Options::prove_pool): the exclusion proof
    /// ([`crate::proof`]). Borrow a pooled connection and ask its server backend
    /// (`pg_backend_pid()`); open a second session (outside the pool where the source can) and
    /// ask its backend, within `second_within`; when the backends differ, take the proof's key
    /// ([`PROOF_CLASS_ID`](crate::proof::PROOF_CLASS_ID), the first backend) on the first,
    /// try it on the second, and release it on both where granted. Report
    /// [`Event::PoolProbed`](crate::Event::PoolProbed) with what each answered (a second
    /// session that did not come in time, or failed, is reported, not an error), or
    /// [`Event::AcquireFailed`](crate::Event::AcquireFailed) when the first borrow or a
    /// statement of the first failed. The first connection goes back to the pool once every
    /// statement on it answered and the key is released; the second is closed (given back
    /// unchanged when it came from the pool and was refused the key). `conn` names the
    /// operation; no connection is kept.
    ProbePool {
        /// The identifier of the operation.
        conn: ConnId,
        /// How long to wait for the second connection.
        second_within: Duration,
    },
    /// [`Options::probe_fitness`](crate::Options::probe_fitness): run the service's fitness
    /// probe on `conn`, then report [`Event::Fit`](crate::Event::Fit), `Unfit` (the server
    /// refused the probe: this replica cannot do the leader's work) or `ProbeFailed` (no
    /// answer: the connection broke or the pool failed). With the advisory lock `conn` is the
    /// standby's borrowed connection (the one that then tries the lock) or the leader's lock
    /// session; with a lease, which holds no connection, `conn` names the operation and the
    /// probe runs on a pooled connection borrowed for it and given back.
    ProbeFitness {
        /// The connection, or the operation's identifier.
        conn: ConnId,
    },
    /// Run the grant statement (try the lock; when granted, set `idle_session_timeout` in the
    /// same statement), then report `LockGranted`, `LockRefused` or `LockQueryFailed`.
    TryLock {
        /// The borrowed connection.
        conn: ConnId,
    },
    /// Queued mode: run the grant statement that waits in the server's lock queue for at most
    /// `lock_timeout` (server side), then report like [`Action::TryLock`]; a wait that the
    /// server's `lock_timeout` ended (SQLSTATE 55P03) is
    /// [`Event::LockWaitTimedOut`](crate::Event::LockWaitTimedOut).
    WaitForLock {
        /// The borrowed connection.
        conn: ConnId,
        /// The server-side bound of the wait, in whole milliseconds as `lock_timeout` takes it
        /// (one interval rounded up, at least 1, at most `i32::MAX`).
        lock_timeout_ms: u32,
    },
    /// After a queued wait timed out: release the lock on the same session if (and only if) it
    /// holds it, then report [`Event::ReleasedIfHeld`](crate::Event::ReleasedIfHeld) or
    /// `LockQueryFailed`. PostgreSQL can grant at the instant of the timeout and still raise
    /// 55P03; without this the pooled session would keep the lock.
    ReleaseIfHeld {
        /// The borrowed connection.
        conn: ConnId,
    },
    /// Give the borrowed connection back to the pool unchanged: the lock was refused, or (for a
    /// connection still being acquired when its deadline passed) cancel the acquire and give
    /// back whatever it produces, on which nothing ran.
    ReturnToPool {
        /// The borrowed connection.
        conn: ConnId,
    },
    /// Take the connection out of the pool for good: it now carries the lock, and nothing but the
    /// election may close it.
    Hijack {
        /// The connection that holds the lock.
        conn: ConnId,
        /// The backend the server granted the lock to (by which a backend may find the
        /// session's end signal).
        backend_pid: i32,
    },
    /// Fencing: advance the fencing epoch on the lock connection under a transaction-local
    /// `lock_timeout` of `lock_timeout_ms`, then report `EpochAdvanced` or `EpochFailed`. The
    /// server bounds the wait for the fence row itself (a cut-off leader's fenced transaction may
    /// hold it until its session ends): a backend whose client gave up would otherwise go on
    /// waiting, holding the advisory lock.
    AdvanceEpoch {
        /// The lock connection.
        conn: ConnId,
        /// The wait's `lock_timeout`, in milliseconds: half a check interval, so the server's
        /// 55P03 comes before the election's deadline of one interval.
        lock_timeout_ms: u32,
    },
    /// The leader's check: verify the lock on the lock connection (the spec's ping, now a lock
    /// verification): read the answering backend, whether the server is in recovery, whether
    /// `pg_locks` shows the lock held by that backend, and the grant's marker, then report
    /// [`Event::PingAnswered`](crate::Event::PingAnswered) with what was found, or
    /// `PingFailed`. The election judges the answer ([`LockCheck::verdict`](crate::LockCheck::verdict)).
    Ping {
        /// The lock connection.
        conn: ConnId,
        /// The backend granted the lock, which must be the one that answers.
        backend_pid: i32,
    },
    /// [`Options::preference`](crate::Options::preference): survey the live candidates of this
    /// election and report [`Event::CandidatesSurveyed`](crate::Event::CandidatesSurveyed)
    /// with each other replica's published rank and how long it has been a candidate, or
    /// [`Event::SurveyFailed`](crate::Event::SurveyFailed). A standby's survey (`publish` is
    /// its own candidacy: its rank, and how long it has been a candidate without a break)
    /// first publishes it where every replica reads it, in the same statement, as the
    /// server's time minus that age; the leader's (`publish` `None`) only reads. With the advisory lock `conn` is the standby's
    /// borrowed connection or the leader's lock session; with a lease `conn` names the
    /// operation, run on a pooled connection borrowed for it and given back.
    SurveyCandidates {
        /// The connection, or the operation's identifier.
        conn: ConnId,
        /// The candidacy to publish (a standby's), or `None` (the leader's survey).
        publish: Option<Candidate>,
        /// What to do with the version floor, in the same statement.
        floor: FloorStep,
    },
    /// Run `pg_advisory_unlock` on the lock connection, then report `UnlockDone` or
    /// `UnlockFailed`.
    Unlock {
        /// The lock connection.
        conn: ConnId,
    },
    /// Lease mechanism: claim the lease for a new term in one autocommit statement on a
    /// connection borrowed from the pool for it alone, then report
    /// [`Event::LeaseClaimed`](crate::Event::LeaseClaimed) (with the new epoch), `LockRefused`
    /// (another holder's lease has not expired) or `LockQueryFailed`. The row is taken when it
    /// is missing, expired by the server's clock or already this run's; its expiry becomes
    /// `now() + ttl_ms` and its epoch is incremented. `conn` names the operation; no connection
    /// is kept: [`Action::ReturnToPool`] gives up a statement still in flight.
    ClaimLease {
        /// The operation.
        conn: ConnId,
        /// The lease's TTL on the server's clock, in whole milliseconds.
        ttl_ms: u32,
    },
    /// Lease mechanism: the leader's check, renewing the lease of `epoch` held by this run for
    /// `ttl_ms` more from the server's `now()` in one autocommit statement, then report
    /// [`Event::LeaseRenewed`](crate::Event::LeaseRenewed), `LeaseLost` (the row is no longer
    /// this term's) or `PingFailed`.
    RenewLease {
        /// The operation.
        conn: ConnId,
        /// The term's epoch.
        epoch: u64,
        /// The lease's TTL on the server's clock, in whole milliseconds.
        ttl_ms: u32,
    },
    /// Lease mechanism: the graceful release, expiring the lease of `epoch` at once if it is
    /// still this run's, then report `UnlockDone { released }` (`false`: it was not) or
    /// `UnlockFailed`.
    ReleaseLease {
        /// The operation.
        conn: ConnId,
        /// The term's epoch.
        epoch: u64,
    },
    /// Abandon the connection: cancel what is in flight on it (including a pending acquire) and
    /// close it without returning it to the pool. The server ends the session, and releases its
    /// locks, when the socket closes.
    CloseConnection {
        /// The connection to close.
        conn: ConnId,
    },
    /// A term begins: the replica leads from now on (is-leader true, gauge 1).
    BeginTerm {
        /// The new term.
        term: TermId,
        /// Its fencing epoch, when fencing is on: strictly greater than every earlier epoch this
        /// election saw.
        epoch: Option<u64>,
    },
    /// A graceful stop ended the term: report [`Event::WorkDrained`](crate::Event::WorkDrained)
    /// once no work of `term` runs any more (at once if none does).
    AwaitWork {
        /// The term whose work is awaited.
        term: TermId,
    },
    /// The term ends: cancel every term token and every leader work in flight, is-leader false,
    /// gauge 0. Emitted exactly once per [`Action::BeginTerm`].
    EndTerm {
        /// The term that ends.
        term: TermId,
        /// Why it ends.
        cause: TermEndCause,
    },
    /// The work deadline of `term` passed ([`Options::work_deadline`](crate::Options::work_deadline)),
    /// or the run finishes before it: report the work of `term` that still runs, if any (WARN,
    /// naming it), and abort what can be aborted when `abort`. Work that returned is not
    /// reported.
    ReportOverdueWork {
        /// The ended term whose work is looked at.
        term: TermId,
        /// Whether to abort it too ([`OnOverdue::Abort`](crate::OnOverdue::Abort)).
        abort: bool,
        /// `true` when the run finishes before the deadline (nothing would report it later).
        run_finished: bool,
    },
    /// Emit a log record.
    Log(LogRecord<C>),
    /// The run fails, right before [`Action::Finish`]: the leader's check proved that the pool
    /// multiplexes server sessions between clients (a transaction- or statement-mode pooler),
    /// which can never carry a session advisory lock ([`LockFinding::proves_multiplexing`]).
    /// The driver's run returns this finding as its error, naming the lease mechanism, instead
    /// of leading intermittently.
    Fail(LockFinding),
    /// The run is over: the driver returns. No term is open and no connection is left.
    Finish,
}

impl<C> Action<C> {
    /// The connection this action concerns, if any.
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Self::AcquireConnection { conn }
            | Self::ProbePool { conn, .. }
            | Self::ProbeFitness { conn }
            | Self::SurveyCandidates { conn, .. }
            | Self::TryLock { conn }
            | Self::WaitForLock { conn, .. }
            | Self::ReleaseIfHeld { conn }
            | Self::ReturnToPool { conn }
            | Self::Hijack { conn, .. }
            | Self::AdvanceEpoch { conn, .. }
            | Self::Ping { conn, .. }
            | Self::Unlock { conn }
            | Self::ClaimLease { conn, .. }
            | Self::RenewLease { conn, .. }
            | Self::ReleaseLease { conn, .. }
            | Self::CloseConnection { conn } => Some(*conn),
            Self::BeginTerm { .. }
            | Self::EndTerm { .. }
            | Self::AwaitWork { .. }
            | Self::ReportOverdueWork { .. }
            | Self::Log(_)
            | Self::Fail(_)
            | Self::Finish => None,
        }
    }
}

/// A log record: a fixed message, the term it concerns and, for failures, the cause.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogRecord<C> {
    /// What happened; fixes the message text and the level.
    pub kind: LogKind,
    /// The term concerned, when there is one.
    pub term: Option<TermId>,
    /// Why, for the records of a failure.
    pub cause: Option<Cause<C>>,
}

impl<C> LogRecord<C> {
    /// The level of this record.
    pub fn level(&self) -> Level {
        self.kind.level()
    }
}

impl<C: fmt::Display> LogRecord<C> {
    /// The record as an election that holds a lease says it: as its `Display`, with
    /// [`LogKind::lease_message`] for the message.
    pub fn lease_text(&self) -> String {
        self.text(self.kind.lease_message())
    }

    fn text(&self, message: &str) -> String {
        match &self.cause {
            Some(cause) => format!("{message}: {cause}"),
            None => message.to_owned(),
        }
    }
}

impl<C: fmt::Display> fmt::Display for LogRecord<C> {
    /// The message, followed by `": <cause>"` when there is a cause.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.message())?;
        match &self.cause {
            Some(cause) => write!(f, ": {cause}"),
            None => Ok(()),
        }
    }
}

/// The level of a log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Normal operation worth recording.
    Info,
    /// Something failed; the election carries on.
    Warn,
    /// A failure that retrying alone will not fix (a permanent configuration error, see
    /// [`failures`](crate::failures)); the election still carries on.
    Error,
}

/// Every kind of log record, each with a stable message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LogKind {
    /// A standby's check failed: no connection, or the grant statement failed or did not answer.
    /// WARN `leader: acquire lock connection: <cause>` (the spec's text).
    AcquireFailed,
    /// The lock was granted and a term began. INFO.
    LeadershipAcquired,
    /// The leader's check failed or did not answer: the term ended. WARN with the ping error.
    LeadershipLost,
    /// A graceful stop released the lock. INFO.
    LockReleased,
    /// A graceful stop could not confirm the release (error, timeout, or the session did not hold
    /// the lock); the connection is closed anyway, so the server releases. WARN.
    ReleaseFailed,
    /// A panic unwound the run while it held, or was releasing, the lock. WARN (the spec's text).
    AbandonedAfterPanic,
    /// The run was dropped while it held, or was releasing, the lock. WARN.
    AbandonedAfterDrop,
    /// Leader work was interrupted by the end of its term. INFO.
    WorkInterrupted,
    /// A graceful stop waited its whole grace and leader work still runs; the lock is released
    /// anyway. WARN (the driver names the work).
    WorkOutlivedStop,
    /// Fencing: the new leader could not advance the epoch; the connection is closed (releasing
    /// the lock) and the replica stays a standby. WARN.
    FencingFailed,
    /// The lock session ended while a graceful stop waited for work or released the lock. WARN.
    SessionEndedWhileStopping,
    /// The leader resigned on request, or because it was made ineligible: its term ended and it
    /// releases the lock, then stays a standby. INFO.
    Resigned,
    /// A resigned leader released the lock and is a standby again. INFO.
    ResignReleased,
    /// A leader that yielded to a better-ranked candidate released the lock and is a standby
    /// again. INFO.
    YieldReleased,
    /// A queued wait timed out at the instant it was granted: the lock was released on the
    /// same session before the connection went back to the pool. INFO.
    GrantReleasedAfterWaitTimeout,
    /// A standby's pooled session held the lock with no live leader checking it (stranded by a
    /// vanished client: a pooler without a reset query handed its server session on); it was
    /// released on that session and the check went on. WARN.
    StrandedLockReleased,
    /// Lease mechanism: the leader's renewal failed or did not answer; the term goes on while
    /// the lease is trusted, and the next check renews again. WARN.
    LeaseRenewalFailed,
    /// The pool proof found two pooled connections answered by one server backend: a
    /// transaction- or statement-mode pooler, which cannot carry the advisory lock; the run
    /// fails before any term. ERROR, once.
    PoolMultiplexes,
    /// The exclusion proof found two sessions on two backends both granted the same advisory
    /// lock key: the server's advisory locks do not exclude, so no replica may lead by them;
    /// the run fails before any term. ERROR, once.
    LockNotExclusive,
    /// The exclusion proof proved nothing (no second session in time, or it failed, or the
    /// proof's key was held); the cause says which. No attempt this check: the next check
    /// proves again. WARN.
    ProofInconclusive,
    /// The server refused the fitness probe ([`Options::probe_fitness`](crate::Options::probe_fitness)):
    /// this replica cannot do the leader's work. A standby makes no attempt until a probe
    /// passes; a leader gives its term up and stays a standby. WARN, with the failure
    /// policy's level (a permanent cause, such as a missing privilege: ERROR once).
    Unfit,
    /// The fitness probe did not answer (it failed, or did not answer within the check):
    /// nothing is learnt of the replica's fitness. A standby's check ends as a failed one; a
    /// lease leader's term goes on while its lease is trusted (an advisory leader's check
    /// fails instead, and its term is lost). WARN.
    ProbeFailed,
    /// A fitness probe passed after one the server refused: the replica may lead again. INFO.
    FitAgain,
    /// A better-ranked candidate had been live for the stabilization window: the leader gave
    /// its term up ([`TermEndCause::Yielded`]) so that candidate takes over; the cause names
    /// both ranks. INFO.
    Yielded,
    /// A standby found a better-ranked live candidate and makes no attempt while it is live
    /// (at most [`Options::defer_limit`](crate::Options::defer_limit)), so the lock goes to
    /// that candidate; once per candidate. INFO.
    Deferring,
    /// A standby deferred to a better candidate for the whole defer limit without that
    /// candidate taking over: it makes its attempts again (the candidate, if it queues, still
    /// comes first). Said once per candidate, at the first attempt past the limit when the
    /// candidacy has lasted longer than the limit and three intervals (a replica that took the
    /// lock stops publishing and is no longer surveyed by then) and no earlier attempt found a
    /// leader, else only if that attempt is granted: an attempt a leader refuses says nothing
    /// (the leader may be that candidate, or one as good). WARN.
    DeferLimitReached,
    /// The survey found this replica's version older than the version floor (the newest that
    /// has led): it makes no attempt until it is not; the cause names both versions. WARN, once.
    BelowFloor,
    /// A replica below the version floor is no longer (the floor was lowered, or it may lead
    /// below it now). INFO.
    AboveFloorAgain,
    /// The survey of the candidates failed or did not answer: nothing is learnt of them. A
    /// standby's check ends as a failed one; a lease leader's term goes on (an advisory
    /// leader's survey runs on its lock session, whose failure ends the term). WARN.
    SurveyFailed,
}

impl LogKind {
    /// The stable message text. Scripts may match on these.
    pub const fn message(self) -> &'static str {
        match self {
            Self::AcquireFailed => "leader: acquire lock connection",
            Self::LeadershipAcquired => "leader: acquired background leader lock",
            Self::LeadershipLost => "leader: lost background leader lock",
            Self::LockReleased => "leader: released background leader lock",
            Self::ReleaseFailed => "leader: release background leader lock",
            Self::AbandonedAfterPanic => "background leader lock abandoned after a panic",
            Self::AbandonedAfterDrop => "background leader lock abandoned: election dropped",
            Self::WorkInterrupted => "leader: leadership ended while background work ran",
            Self::WorkOutlivedStop => "leader: background work still running after the stop grace",
            Self::FencingFailed => "leader: advance fencing epoch",
            Self::SessionEndedWhileStopping => "leader: lock session ended while stopping",
            Self::Resigned => "leader: resigned background leadership",
            Self::ResignReleased => "leader: released background leader lock after resigning",
            Self::YieldReleased => "leader: released background leader lock after yielding",
            Self::GrantReleasedAfterWaitTimeout => {
                "leader: a lock wait timed out as it was granted; released"
            }
            Self::StrandedLockReleased => {
                "leader: released a lock stranded on a pooled session (a session-mode pooler \
                 without a reset query, such as PgBouncer's server_reset_query, handed over a \
                 vanished client's session; a transaction-mode pooler, which cannot carry the \
                 advisory lock at all, does the same: use Config::lease there)"
            }
            Self::LeaseRenewalFailed => "leader: renew background leader lease",
            Self::PoolMultiplexes => {
                "leader: the pool multiplexes server sessions (a transaction- or statement-mode \
                 pooler such as PgBouncer or Supavisor in transaction mode), which cannot carry \
                 a session advisory lock; no term begins: elect with the lease mechanism \
                 (Config::lease; the demo's --mechanism lease), or connect directly or through \
                 a session-mode pooler"
            }
            Self::LockNotExclusive => {
                "leader: this server's session advisory locks do not exclude (two sessions were \
                 both granted one key), so they cannot elect one leader; no term begins: elect \
                 with the lease mechanism (Config::lease; the demo's --mechanism lease)"
            }
            Self::ProofInconclusive => {
                "leader: the exclusion proof proved nothing; no attempt until a proof passes"
            }
            Self::Unfit => {
                "leader: this replica cannot do the leader's work (its fitness probe was \
                 refused); it does not lead until the probe passes"
            }
            Self::FitAgain => "leader: the fitness probe passes again; this replica may lead",
            Self::ProbeFailed => "leader: run the fitness probe",
            Self::Yielded => "leader: yielded background leadership to a better-ranked candidate",
            Self::Deferring => "leader: deferring to a better-ranked candidate",
            Self::DeferLimitReached => {
                "leader: a better-ranked candidate did not take over within the defer limit; \
                 trying again"
            }
            Self::SurveyFailed => "leader: survey the candidates",
            Self::BelowFloor => {
                "leader: this replica's version is older than the version floor; it does not lead"
            }
            Self::AboveFloorAgain => "leader: this replica is no longer below the version floor",
        }
    }

    /// The stable message text in an election that holds a lease
    /// ([`Options::lease`](crate::Options::lease)): "lease" where the advisory lock's records
    /// say "lock" (the spec's own texts, the acquire failure and the panic, are the same for
    /// both).
    pub const fn lease_message(self) -> &'static str {
        match self {
            Self::LeadershipAcquired => "leader: acquired background leader lease",
            Self::LeadershipLost => "leader: lost background leader lease",
            Self::LockReleased => "leader: released background leader lease",
            Self::ReleaseFailed => "leader: release background leader lease",
            Self::ResignReleased => "leader: released background leader lease after resigning",
            Self::YieldReleased => "leader: released background leader lease after yielding",
            Self::AbandonedAfterDrop => "background leader lease abandoned: election dropped",
            _ => self.message(),
        }
    }

    /// The level records of this kind are emitted at.
    pub const fn level(self) -> Level {
        match self {
            Self::LeadershipAcquired
            | Self::LockReleased
            | Self::WorkInterrupted
            | Self::Resigned
            | Self::ResignReleased
            | Self::YieldReleased
            | Self::GrantReleasedAfterWaitTimeout
            | Self::FitAgain
            | Self::Yielded
            | Self::Deferring
            | Self::AboveFloorAgain => Level::Info,
            Self::AcquireFailed
            | Self::LeadershipLost
            | Self::ReleaseFailed
            | Self::AbandonedAfterPanic
            | Self::AbandonedAfterDrop
            | Self::WorkOutlivedStop
            | Self::FencingFailed
            | Self::SessionEndedWhileStopping
            | Self::StrandedLockReleased
            | Self::LeaseRenewalFailed
            | Self::Unfit
            | Self::ProbeFailed
            | Self::DeferLimitReached
            | Self::SurveyFailed
            | Self::BelowFloor
            | Self::ProofInconclusive => Level::Warn,
            Self::PoolMultiplexes | Self::LockNotExclusive => Level::Error,
        }
    }
}
