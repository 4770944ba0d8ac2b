//! The roles of a running election (standby steps, leader, stopping), which inputs each
//! takes, and the names the election shows of them ([`Phase`], [`Timer`]).

use super::*;

/// Which deadline [`Election::poll_timeout`] stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    /// The next check is due.
    NextCheck,
    /// A standby's connection acquire must have completed.
    AcquireDeadline,
    /// A standby's grant statement must have answered.
    TryLockDeadline,
    /// The new leader's fencing epoch must have been advanced.
    FenceDeadline,
    /// The leader's check must have answered.
    PingDeadline,
    /// A graceful stop's grace for leader work is over.
    DrainDeadline,
    /// The graceful release's `pg_advisory_unlock` must have answered.
    UnlockDeadline,
    /// An ended term's work deadline passed ([`Options::work_deadline`]).
    WorkDeadline,
    /// Lease mechanism: the leader's trust in its lease ends.
    LeaseExpiry,
    /// The fitness probe ([`Options::probe_fitness`]) must have answered.
    ProbeDeadline,
}

/// A coarse name of the current state, for traces and status pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not running.
    Idle,
    /// Standby, waiting for the next check.
    StandbyWaiting,
    /// Standby, acquiring a connection.
    Acquiring,
    /// Standby, running the grant statement.
    TryingLock,
    /// Granted, advancing the fencing epoch before the term begins.
    Fencing,
    /// Leader, waiting for the next check.
    Leading,
    /// Leader, running its check.
    Pinging,
    /// Stopping: the term ended and leader work is given its grace to return.
    Draining,
    /// Stopping: the term ended and the lock is being released.
    Releasing,
}

#[derive(Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // reason: one per election; boxing would buy nothing
pub(super) enum State {
    Idle,
    Running(Running),
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Running {
    pub(super) schedule: Schedule,
    pub(super) role: Role,
    /// The last fitness probe was refused ([`Options::probe_fitness`]): no attempt is made
    /// until one passes.
    pub(super) unfit: bool,
    /// No check begins before this instant (a resign's hold-off).
    pub(super) hold_until: Option<Instant>,
    /// The pool proof answered that the pool's sessions are this client's own (or is off).
    pub(super) pool_proved: bool,
    /// The better candidate this standby defers to, if any.
    pub(super) deferral: Option<Deferral>,
    /// This standby's own candidacy: when it began, and its last survey (a gap of more than
    /// two intervals, or a term, begins a new one).
    pub(super) candidacy: Option<(Instant, Instant)>,
    /// The last survey found this replica older than the version floor.
    pub(super) below_floor: bool,
}

/// A standby's deferral to a better-ranked candidate ([`Options::preference`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Deferral {
    /// The rank deferred to: a better one begins a new deferral.
    pub(super) to: Rank,
    /// When the deferral began.
    pub(super) since: Instant,
    /// The defer limit had passed at the last survey: the standby attempted again.
    pub(super) over: bool,
    /// The limit's passing was said (once per candidate deferred to, however often an attempt
    /// past it is refused by a leader and the deferral begins anew).
    pub(super) said: bool,
    /// The attempt past the limit went without saying so, because the candidate may have
    /// taken over unseen: said if that attempt is granted (the candidate, surveyed so, did
    /// not hold the lock), dropped if a leader refuses it.
    pub(super) owed: Option<Candidate>,
    /// An attempt past the limit found the lock held: a leader exists (perhaps one as good as
    /// the candidate, which then never takes over), so the limit's passing is said only if a
    /// later attempt is granted.
    pub(super) led: bool,
}

/// The statement a check runs before its attempt, or after a leader's check that proved the
/// hold: the fitness probe ([`Options::probe_fitness`]), or the survey of the candidates
/// ([`Options::preference`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Step {
    Fitness,
    Survey,
}

/// What a replica does once its lock is given up on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum AfterRelease {
    /// The run finishes (a stop request).
    Finish,
    /// The replica stays a standby; the term ended for this cause (a resign, ineligibility,
    /// unfitness or a yield), which the release's record names.
    Standby(TermEndCause),
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Role {
    Standby(Standby),
    Leader(Leader),
    Draining(Draining),
    Releasing(Releasing),
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Standby {
    Waiting {
        next_check: Instant,
    },
    Acquiring {
        conn: ConnId,
        deadline: Instant,
    },
    /// The pool proof of the run's first grant ([`Options::prove_pool`]): operation `conn`.
    ProvingPool {
        conn: ConnId,
        deadline: Instant,
    },
    /// The fitness probe or the survey before the attempt ([`Step`]): on the borrowed
    /// connection `conn` (advisory lock), or operation `conn` (lease).
    Probing {
        conn: ConnId,
        deadline: Instant,
        step: Step,
    },
    TryingLock {
        conn: ConnId,
        deadline: Instant,
        /// A stranded lock was already released on this connection in this check.
        after_stranded: bool,
    },
    /// The session may hold the lock without a term of this election on it: a queued wait
    /// timed out (55P03, granted at the instant of the timeout), or the grant found a lock
    /// stranded there. It is released if held; then the connection goes back, or (stranded)
    /// the check goes on.
    ReleasingIfHeld {
        conn: ConnId,
        deadline: Instant,
        stranded: bool,
    },
    /// Lease mechanism: the claim, operation `conn` sent at `sent_at`.
    Claiming {
        conn: ConnId,
        sent_at: Instant,
        deadline: Instant,
    },
    Fencing {
        conn: ConnId,
        /// The backend granted the lock, which the term's checks must find.
        backend_pid: i32,
        deadline: Instant,
    },
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Leader {
    pub(super) term: TermId,
    pub(super) hold: Hold,
    /// When the lock was last proven: the grant, then each check that proved it.
    pub(super) verified_at: Instant,
    /// When the statement that last proved the lock was sent (the grant's, then each proving
    /// check's): the server's `idle_session_timeout` may drop the lock no sooner than this
    /// plus the timeout.
    pub(super) proven_sent_at: Instant,
    /// When the term began.
    pub(super) since: Instant,
    pub(super) check: LeaderCheck,
}

/// What a term holds: the advisory lock on a session, or a lease row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Hold {
    /// The advisory lock on the hijacked session `conn`, granted to backend `backend_pid`: every
    /// check must be answered by it.
    Session { conn: ConnId, backend_pid: i32 },
    /// The lease row of `epoch`, trusted until `trusted_until` (the last successful claim or
    /// renewal's send instant plus [`Lease::trusted_for`](crate::Lease::trusted_for)).
    Lease { epoch: u64, trusted_until: Instant },
}

impl Hold {
    /// The session that carries an advisory lock.
    pub(super) fn session_conn(self) -> Option<ConnId> {
        match self {
            Self::Session { conn, .. } => Some(conn),
            Self::Lease { .. } => None,
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum LeaderCheck {
    Waiting {
        next_check: Instant,
    },
    /// The advisory lock's check, on the lock session, sent at `sent_at`.
    Pinging {
        sent_at: Instant,
        deadline: Instant,
    },
    /// The lease's renewal, operation `conn` sent at `sent_at`.
    Renewing {
        conn: ConnId,
        sent_at: Instant,
        deadline: Instant,
    },
    /// The fitness probe or the survey after a check that proved the hold ([`Step`]): on the
    /// lock session, or operation `conn` (lease); `deadline` is the check's.
    Probing {
        conn: ConnId,
        deadline: Instant,
        step: Step,
    },
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Draining {
    pub(super) term: TermId,
    pub(super) hold: Hold,
    pub(super) deadline: Instant,
    pub(super) then: AfterRelease,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Releasing {
    pub(super) term: TermId,
    pub(super) hold: Hold,
    /// The connection the release runs on: the lock session, or the lease's release statement.
    pub(super) conn: ConnId,
    pub(super) deadline: Instant,
    pub(super) then: AfterRelease,
}

/// How a run ends abruptly.
#[derive(Clone, Copy)]
pub(super) enum Abandon {
    Panic,
    Drop,
}

/// Whether `role` takes `event`: control events always (but a second stop request), a completion
/// only when it answers the operation in flight on the awaited connection.
pub(super) fn accepts<C>(role: &Role, event: &Event<C>) -> Result<(), Ignored> {
    match event {
        Event::SessionEnded { conn, .. } => return accepts_session_end(role, *conn),
        Event::WorkDrained { term } => {
            return match role {
                Role::Draining(draining) if draining.term == *term => Ok(()),
                Role::Draining(_) => Err(Ignored::StaleConnection),
                _ => Err(Ignored::Unexpected),
            };
        }
        _ => {}
    }
    let Some(conn) = event.conn() else {
        return match (role, event) {
            (
                Role::Draining(Draining {
                    then: AfterRelease::Finish,
                    ..
                })
                | Role::Releasing(Releasing {
                    then: AfterRelease::Finish,
                    ..
                }),
                Event::Control(Control::Cancelled),
            )
            | (
                Role::Draining(Draining {
                    then: AfterRelease::Finish,
                    ..
                })
                | Role::Releasing(Releasing {
                    then: AfterRelease::Finish,
                    ..
                }),
                Event::Control(Control::Resign { .. }),
            ) => Err(Ignored::AlreadyStopping),
            _ => Ok(()),
        };
    };
    let awaited = match role {
        Role::Standby(Standby::Waiting { .. })
        | Role::Draining(_)
        | Role::Leader(Leader {
            check: LeaderCheck::Waiting { .. },
            ..
        }) => None,
        Role::Leader(Leader {
            hold,
            check: LeaderCheck::Pinging { .. },
            ..
        }) => hold.session_conn(),
        Role::Standby(Standby::Acquiring { conn, .. })
        | Role::Standby(Standby::ProvingPool { conn, .. })
        | Role::Standby(Standby::Probing { conn, .. })
        | Role::Standby(Standby::TryingLock { conn, .. })
        | Role::Standby(Standby::ReleasingIfHeld { conn, .. })
        | Role::Standby(Standby::Claiming { conn, .. })
        | Role::Standby(Standby::Fencing { conn, .. })
        | Role::Leader(Leader {
            check: LeaderCheck::Renewing { conn, .. } | LeaderCheck::Probing { conn, .. },
            ..
        })
        | Role::Releasing(Releasing { conn, .. }) => Some(*conn),
    };
    if awaited != Some(conn) {
        return Err(Ignored::StaleConnection);
    }
    let answers = match role {
        Role::Standby(Standby::Acquiring { .. }) => {
            matches!(
                event,
                Event::ConnectionAcquired { .. } | Event::AcquireFailed { .. }
            )
        }
        Role::Standby(Standby::ProvingPool { .. }) => matches!(
            event,
            Event::PoolProbed { .. } | Event::AcquireFailed { .. }
        ),
        Role::Standby(Standby::Probing {
            step: Step::Fitness,
            ..
        })
        | Role::Leader(Leader {
            check:
                LeaderCheck::Probing {
                    step: Step::Fitness,
                    ..
                },
            ..
        }) => matches!(
            event,
            Event::Fit { .. } | Event::Unfit { .. } | Event::ProbeFailed { .. }
        ),
        Role::Standby(Standby::Probing {
            step: Step::Survey, ..
        })
        | Role::Leader(Leader {
            check: LeaderCheck::Probing {
                step: Step::Survey, ..
            },
            ..
        }) => matches!(
            event,
            Event::CandidatesSurveyed { .. } | Event::SurveyFailed { .. }
        ),
        Role::Standby(Standby::TryingLock { .. }) => matches!(
            event,
            Event::LockGranted { .. }
                | Event::LockRefused { .. }
                | Event::LockQueryFailed { .. }
                | Event::LockNotTried { .. }
                | Event::LockWaitTimedOut { .. }
                | Event::LockHeldBySession { .. }
        ),
        Role::Standby(Standby::ReleasingIfHeld { .. }) => matches!(
            event,
            Event::ReleasedIfHeld { .. } | Event::LockQueryFailed { .. }
        ),
        Role::Standby(Standby::Claiming { .. }) => matches!(
            event,
            Event::LeaseClaimed { .. } | Event::LockRefused { .. } | Event::LockQueryFailed { .. }
        ),
        Role::Standby(Standby::Fencing { .. }) => matches!(
            event,
            Event::EpochAdvanced { .. } | Event::EpochFailed { .. }
        ),
        Role::Leader(Leader {
            check: LeaderCheck::Renewing { .. },
            ..
        }) => matches!(
            event,
            Event::LeaseRenewed { .. } | Event::LeaseLost { .. } | Event::PingFailed { .. }
        ),
        Role::Leader(_) => matches!(event, Event::PingAnswered { .. } | Event::PingFailed { .. }),
        Role::Releasing(_) => {
            matches!(event, Event::UnlockDone { .. } | Event::UnlockFailed { .. })
        }
        Role::Standby(Standby::Waiting { .. }) | Role::Draining(_) => false,
    };
    if answers {
        Ok(())
    } else {
        Err(Ignored::Unexpected)
    }
}

/// A session end is taken for the connection that carries the lock, whatever is in flight.
fn accepts_session_end(role: &Role, ended: ConnId) -> Result<(), Ignored> {
    let lock_conn = match role {
        Role::Leader(Leader { hold, .. })
        | Role::Draining(Draining { hold, .. })
        | Role::Releasing(Releasing { hold, .. }) => hold.session_conn(),
        Role::Standby(Standby::Fencing { conn, .. }) => Some(*conn),
        Role::Standby(_) => None,
    };
    if lock_conn == Some(ended) {
        Ok(())
    } else {
        Err(Ignored::StaleConnection)
    }
}
