//! The election state machine of one replica.
//!
//! # From the spec's sentences to transitions
//!
//! Every decision of the election is taken here; the driver only performs the actions and
//! reports what happened. Each row names the input, the actions queued, and a unit test of
//! `election/tests.rs` that asserts exactly those actions.
//!
//! | spec (Run, Demotion, Panic, Cancel) and its extensions | input | actions | test |
//! |---|---|---|---|
//! | "It checks once when it starts and then every CheckInterval" | [`Election::start`], [`Timer::NextCheck`] | `AcquireConnection` | `start_checks_at_once_by_asking_for_a_connection` |
//! | "a check acquires a connection … and runs pg_try_advisory_lock" | `ConnectionAcquired` | `TryLock` (poll) or `WaitForLock { lock_timeout_ms }` (queue) | `an_acquired_connection_tries_the_lock` |
//! | "When another session holds the lock, the connection goes back to the pool unchanged" | `LockRefused` | `ReturnToPool` | `a_refused_lock_returns_the_connection_unchanged_and_waits_for_the_next_check` |
//! | (queued) 55P03 may come with the lock granted at the timeout | `LockWaitTimedOut`, then `ReleasedIfHeld` | `ReleaseIfHeld`, then `ReturnToPool` | `a_lock_granted_as_its_wait_timed_out_is_released_with_a_note_then_returned` |
//! | "When the lock is granted, the connection is hijacked …, the replica leads, and a new term begins" | `LockGranted { backend_pid }` | `Hijack { backend_pid }`, `BeginTerm` (after `AdvanceEpoch` with fencing) | `a_granted_lock_hijacks_the_connection_begins_a_term_and_logs` |
//! | "A failed acquire or query is logged at WARN … tries again at the next check" | `AcquireFailed`, `LockQueryFailed`, [`Timer::TryLockDeadline`] | `CloseConnection` (outcome unknown), `Log(AcquireFailed)` | `a_failed_grant_statement_discards_the_connection_instead_of_returning_it` |
//! | "On the leader, a check runs SELECT 1" (here: verifies the lock) | [`Timer::NextCheck`] | `Ping { backend_pid }` | `the_leaders_check_carries_the_backend_granted_the_lock` |
//! | the check's row is judged ([`LockCheck::verdict`](crate::LockCheck::verdict)) | `PingAnswered { found }` | none, or `EndTerm(Lost(<finding>))` | `a_check_that_disproves_the_lock_ends_the_term_with_the_findings_reason` |
//! | "The check fails when the query returns an error" | `PingFailed` | `EndTerm(Lost(CheckFailed))`, `CloseConnection`, `Log(LeadershipLost)` | `a_failed_ping_ends_the_term_as_lost_then_closes_then_warns` |
//! | "… and when it does not answer within one CheckInterval" | [`Timer::PingDeadline`] | `EndTerm(Lost(CheckTimedOut))`, `CloseConnection`, … | `an_unanswered_ping_demotes_after_one_interval_and_the_standby_checks_at_its_next_tick` |
//! | "The server drops a session advisory lock when the session ends" (learned at once) | `SessionEnded` | `EndTerm(Lost(SessionEnded))`, `CloseConnection` | `a_lock_session_that_ends_demotes_the_leader_at_once` |
//! | "When ctx is cancelled, Run runs pg_advisory_unlock …, closes the connection, ends the term" (here: the term ends first) | `Cancelled`, `WorkDrained` or [`Timer::DrainDeadline`] | `EndTerm(Stopped)`, `AwaitWork`, `Unlock`, `CloseConnection`, `Finish` | `cancelling_the_leader_ends_the_term_before_unlocking_under_two_seconds` |
//! | "under a 2-second context" | [`Timer::UnlockDeadline`] | `CloseConnection`, `Log(ReleaseFailed)` | `an_unlock_without_answer_within_two_seconds_closes_anyway` |
//! | "When a panic unwinds Run, it ends the term with ErrLeadershipLost and closes the lock connection … It does not unlock" | `Panicked` (`Dropped`) | `EndTerm(Lost(Panicked))`, `CloseConnection`, `Log(AbandonedAfterPanic)`, `Finish` | `a_panic_while_leading_ends_the_term_as_lost_and_closes_without_unlocking` |
//! | "Run may be called again after an earlier call returned or panicked" | [`Election::start`] after `Finish` | a fresh check | `the_election_can_run_again_after_it_finished_with_fresh_ids` |
//! | (operators) resign, eligibility | `Resign { hold_off }`, `SetEligible` | `EndTerm(Resigned)`, the stop's release, no check while held out | `a_resign_ends_the_term_as_resigned_releases_and_waits_out_the_hold_off_as_a_standby` |
//! | (liveness) a leader nobody drives | [`Election::stuck`] | none: a verdict read by the probe | `a_leader_is_stuck_only_strictly_past_two_intervals_since_its_last_verification` |

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::action::{Action, Cause, LogKind, LogRecord, LossReason, TermEndCause};
use crate::event::Event;
use crate::ids::{ConnId, TermId};
use crate::interval::{CheckInterval, UNLOCK_BUDGET};
use crate::liveness::StuckLeader;
use crate::options::{AcquireMode, OnOverdue, Options};
use crate::schedule::Schedule;
use crate::verify::LockCheck;

/// The election of one replica: standby, leader, or not running.
///
/// An `Election` performs no I/O and reads no clock; a driver feeds it inputs stamped with the
/// current time and performs the actions it queues.
///
/// # Methods
/// - Getters: [`is_running`](Self::is_running), [`is_leader`](Self::is_leader),
///   [`term`](Self::term), [`phase`](Self::phase), [`interval`](Self::interval).
/// - Inputs: [`start`](Self::start), [`handle_event`](Self::handle_event),
///   [`handle_timeout`](Self::handle_timeout).
/// - Outputs: [`poll_action`](Self::poll_action), [`poll_timeout`](Self::poll_timeout),
///   [`timeout_reason`](Self::timeout_reason).
///
/// # The driver's contract
/// 1. `now` never decreases from one input to the next.
/// 2. After every input, drain [`poll_action`](Self::poll_action) until it returns `None` and
///    perform the actions in order, then read [`poll_timeout`](Self::poll_timeout) again.
/// 3. When the time reaches the deadline of `poll_timeout`, call
///    [`handle_timeout`](Self::handle_timeout) before feeding any other input; calling it early or
///    twice does nothing.
/// 4. Report each completion as an [`Event`] echoing the action's [`ConnId`]. A completion for a
///    connection the election no longer waits on is ignored ([`Handled::Ignored`]).
/// 5. Report [`Event::Cancelled`] when asked to stop, [`Event::Panicked`] when a panic unwinds
///    the run, and [`Event::Dropped`] when the run is dropped; the run is over at
///    [`Action::Finish`].
///
/// ```no_run
/// use std::time::{Duration, Instant};
/// use plexsphere_leader_core::{Action, CheckInterval, Election, Event};
///
/// # fn perform(_: &Action<String>) -> Option<Event<String>> { None }
/// # fn wait_until(_: Option<Instant>) -> Option<Event<String>> { None }
/// let mut election = Election::<String>::new(CheckInterval::new(Duration::from_secs(5))?);
/// election.start(Instant::now())?;
/// 'run: loop {
///     while let Some(action) = election.poll_action() {
///         if action == Action::Finish {
///             break 'run;
///         }
///         if let Some(event) = perform(&action) {
///             election.handle_event(Instant::now(), event);
///         }
///     }
///     match wait_until(election.poll_timeout()) {
///         Some(event) => { election.handle_event(Instant::now(), event); }
///         None => election.handle_timeout(Instant::now()),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Time
/// Instants must come from one monotonic clock. Deadlines are computed with `Instant + Duration`
/// and so panic, like `std` does, only for instants within a few days of the platform's limit.
pub struct Election<C> {
    options: Options,
    state: State,
    /// The work deadlines of ended terms, earliest first (they are set in order, all the same
    /// length after their term's end).
    overdue: VecDeque<(TermId, Instant)>,
    actions: VecDeque<Action<C>>,
    last_conn: u64,
    last_term: u64,
    last_epoch: Option<u64>,
    eligible: bool,
}

/// How many role deadlines one [`Election::handle_timeout`] may fire: two fall due together at
/// most (an operation's deadline, then the check on the same instant), and each may end a term
/// whose work deadline of zero is due at once; four leaves room for both.
const MAX_ROLE_FIRES: usize = 4;

/// The longest hold-off a [`Event::Resign`] takes; a longer one is shortened to this (make the
/// replica ineligible to keep it out of the election for good).
pub const MAX_HOLD_OFF: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// What became of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The input changed the election (possibly queuing actions).
    Applied,
    /// The input was ignored; nothing changed and no action was queued.
    Ignored(Ignored),
}

/// Why an input was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// The election is not running.
    NotRunning,
    /// The completion names a connection the election no longer waits on (it timed out, was
    /// closed, or belongs to an earlier check).
    StaleConnection,
    /// The completion names the awaited connection but answers another operation than the one
    /// in flight (for example `PingAnswered` while the grant statement runs).
    Unexpected,
    /// The election is already stopping; a second stop request changes nothing. Also a resign
    /// request while the lock is being given up.
    AlreadyStopping,
    /// [`Event::SetEligible`] with the setting the election already has.
    Unchanged,
}

/// [`Election::start`] was called while a run is in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyRunning;

impl fmt::Display for AlreadyRunning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the election is already running")
    }
}

impl std::error::Error for AlreadyRunning {}

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

enum State {
    Idle,
    Running(Running),
}

struct Running {
    schedule: Schedule,
    role: Role,
    /// No check begins before this instant (a resign's hold-off).
    hold_until: Option<Instant>,
}

/// What a replica does once its lock is given up on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterRelease {
    /// The run finishes (a stop request).
    Finish,
    /// The replica stays a standby (a resign, or ineligibility).
    Standby,
}

enum Role {
    Standby(Standby),
    Leader(Leader),
    Draining(Draining),
    Releasing(Releasing),
}

enum Standby {
    Waiting {
        next_check: Instant,
    },
    Acquiring {
        conn: ConnId,
        deadline: Instant,
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
    Fencing {
        conn: ConnId,
        /// The backend granted the lock, which the term's checks must find.
        backend_pid: i32,
        deadline: Instant,
    },
}

struct Leader {
    term: TermId,
    conn: ConnId,
    /// The backend granted the lock: every check must be answered by it.
    backend_pid: i32,
    /// When the lock was last proven: the grant, then each check that proved it.
    verified_at: Instant,
    check: LeaderCheck,
}

enum LeaderCheck {
    Waiting { next_check: Instant },
    Pinging { deadline: Instant },
}

struct Draining {
    term: TermId,
    conn: ConnId,
    deadline: Instant,
    then: AfterRelease,
}

struct Releasing {
    term: TermId,
    conn: ConnId,
    deadline: Instant,
    then: AfterRelease,
}

/// How a run ends abruptly.
#[derive(Clone, Copy)]
enum Abandon {
    Panic,
    Drop,
}

impl<C> Election<C> {
    /// A new election that is not running yet, with the spec's behaviour
    /// ([`Options::new`]).
    pub fn new(interval: CheckInterval) -> Self {
        Self::with_options(Options::new(interval))
    }

    /// A new election that is not running yet.
    pub fn with_options(options: Options) -> Self {
        Self {
            options,
            state: State::Idle,
            overdue: VecDeque::new(),
            actions: VecDeque::new(),
            last_conn: 0,
            last_term: 0,
            last_epoch: None,
            eligible: options.is_eligible(),
        }
    }

    // ---- getters ----

    /// The check interval.
    pub fn interval(&self) -> CheckInterval {
        self.options.interval()
    }

    /// The options.
    pub fn options(&self) -> Options {
        self.options
    }

    /// Whether a run is in progress (between `start` and [`Action::Finish`]).
    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running(_))
    }

    /// Whether this replica may lead ([`Event::SetEligible`]; initially
    /// [`Options::is_eligible`]).
    pub fn is_eligible(&self) -> bool {
        self.eligible
    }

    /// Until when a resign keeps this replica from trying the lock, while that lies ahead of
    /// `now`.
    pub fn held_off_until(&self, now: Instant) -> Option<Instant> {
        match &self.state {
            State::Running(running) => running.hold_until.filter(|until| *until > now),
            State::Idle => None,
        }
    }

    /// Whether a term is open: the replica leads.
    pub fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    /// The open term, if the replica leads.
    pub fn term(&self) -> Option<TermId> {
        match &self.state {
            State::Running(Running {
                role: Role::Leader(leader),
                ..
            }) => Some(leader.term),
            _ => None,
        }
    }

    /// While leading: when the lock was last proven (the grant, then each check that proved
    /// it).
    pub fn last_verified(&self) -> Option<Instant> {
        match &self.state {
            State::Running(Running {
                role: Role::Leader(leader),
                ..
            }) => Some(leader.verified_at),
            _ => None,
        }
    }

    /// The stuck-leader verdict at `now`: `Err` when this replica leads but its last proof of
    /// the lock ([`last_verified`](Self::last_verified)) is older than
    /// [`STUCK_AFTER_INTERVALS`](crate::STUCK_AFTER_INTERVALS) check intervals — nobody drove
    /// the election in time. A standby, or an election not running, is never stuck.
    ///
    /// # Errors
    /// [`StuckLeader`] with the age of the last proof and the bound.
    pub fn stuck(&self, now: Instant) -> Result<(), StuckLeader> {
        match self.last_verified() {
            Some(verified_at) => StuckLeader::verdict(verified_at, now, self.interval().get()),
            None => Ok(()),
        }
    }

    /// The coarse state, for traces.
    pub fn phase(&self) -> Phase {
        let State::Running(running) = &self.state else {
            return Phase::Idle;
        };
        match &running.role {
            Role::Standby(Standby::Waiting { .. }) => Phase::StandbyWaiting,
            Role::Standby(Standby::Acquiring { .. }) => Phase::Acquiring,
            Role::Standby(Standby::TryingLock { .. } | Standby::ReleasingIfHeld { .. }) => {
                Phase::TryingLock
            }
            Role::Standby(Standby::Fencing { .. }) => Phase::Fencing,
            Role::Leader(Leader {
                check: LeaderCheck::Waiting { .. },
                ..
            }) => Phase::Leading,
            Role::Leader(Leader {
                check: LeaderCheck::Pinging { .. },
                ..
            }) => Phase::Pinging,
            Role::Draining(_) => Phase::Draining,
            Role::Releasing(_) => Phase::Releasing,
        }
    }

    // ---- outputs ----

    /// The next action to perform, in order; `None` when the queue is empty.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action<C>> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called; `None` while not
    /// running. Exactly one deadline is pending in every running state.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending_timer().map(|(_, at)| at)
    }

    /// Which deadline [`poll_timeout`](Self::poll_timeout) stands for.
    pub fn timeout_reason(&self) -> Option<Timer> {
        self.pending_timer().map(|(timer, _)| timer)
    }

    /// The earlier of the role's deadline and the first work deadline.
    fn pending_timer(&self) -> Option<(Timer, Instant)> {
        let role = self.role_timer()?;
        match self.overdue.front() {
            Some((_, at)) if *at < role.1 => Some((Timer::WorkDeadline, *at)),
            _ => Some(role),
        }
    }

    /// The deadline of the current role: exactly one in every running state.
    fn role_timer(&self) -> Option<(Timer, Instant)> {
        let State::Running(running) = &self.state else {
            return None;
        };
        Some(match &running.role {
            Role::Standby(Standby::Waiting { next_check }) => (Timer::NextCheck, *next_check),
            Role::Standby(Standby::Acquiring { deadline, .. }) => {
                (Timer::AcquireDeadline, *deadline)
            }
            Role::Standby(
                Standby::TryingLock { deadline, .. } | Standby::ReleasingIfHeld { deadline, .. },
            ) => (Timer::TryLockDeadline, *deadline),
            Role::Standby(Standby::Fencing { deadline, .. }) => (Timer::FenceDeadline, *deadline),
            Role::Leader(Leader {
                check: LeaderCheck::Waiting { next_check },
                ..
            }) => (Timer::NextCheck, *next_check),
            Role::Leader(Leader {
                check: LeaderCheck::Pinging { deadline },
                ..
            }) => (Timer::PingDeadline, *deadline),
            Role::Draining(draining) => (Timer::DrainDeadline, draining.deadline),
            Role::Releasing(releasing) => (Timer::UnlockDeadline, releasing.deadline),
        })
    }

    // ---- inputs ----

    /// Starts a run at `now`: the first check begins at once (a connection is asked for) and the
    /// next ones fall due every interval after `now`. An ineligible replica only waits for its
    /// checks, which do nothing until it is made eligible.
    ///
    /// # Errors
    /// [`AlreadyRunning`] while a run is in progress; nothing changes. A run that finished (after
    /// [`Action::Finish`]) may be started again.
    pub fn start(&mut self, now: Instant) -> Result<(), AlreadyRunning> {
        if self.is_running() {
            return Err(AlreadyRunning);
        }
        let schedule = Schedule::starting_at(now, self.interval().get());
        let role = if self.eligible {
            self.begin_standby_check(now)
        } else {
            Role::Standby(Standby::Waiting {
                next_check: schedule.next_after(now),
            })
        };
        self.state = State::Running(Running {
            schedule,
            role,
            hold_until: None,
        });
        Ok(())
    }

    /// Fires the pending deadline if `now` has reached it, and any deadline that falls due at once
    /// as a result. Safe to call early or repeatedly: a deadline not yet reached does nothing.
    /// Afterwards [`poll_timeout`](Self::poll_timeout) is `None` or later than `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // At most two role deadlines fall due in one call (an operation's deadline, then the
        // check that follows on the same instant, whose own deadline lies an interval later),
        // besides the work deadlines that passed, each fired once, and those the role's
        // deadlines add (a term ended by a deadline, with a zero work deadline): one each.
        for _ in 0..MAX_ROLE_FIRES + self.overdue.len() {
            match self.pending_timer() {
                Some((timer, at)) if at <= now => self.fire(timer, now),
                _ => return,
            }
        }
    }

    /// Applies a completion or a control event reported at `now`.
    ///
    /// A completion is applied only when it answers the operation the election waits for: same
    /// connection, matching kind. Anything else is [`Handled::Ignored`] and changes nothing.
    pub fn handle_event(&mut self, now: Instant, event: Event<C>) -> Handled {
        if let Event::SetEligible { eligible } = event {
            return self.set_eligible(now, eligible);
        }
        let State::Running(running) = &self.state else {
            return Handled::Ignored(Ignored::NotRunning);
        };
        if let Err(ignored) = accepts(&running.role, &event) {
            return Handled::Ignored(ignored);
        }
        match event {
            Event::Cancelled => self.cancel(now),
            Event::Resign { hold_off } => self.resign(now, hold_off),
            // Applied before the election's state is looked at.
            Event::SetEligible { .. } => {}
            Event::Panicked => self.abandon(Abandon::Panic),
            Event::Dropped => self.abandon(Abandon::Drop),
            Event::ConnectionAcquired { conn } => self.on_acquired(now, conn),
            Event::AcquireFailed { cause, .. } => self.on_acquire_failed(now, Cause::Error(cause)),
            Event::LockGranted { conn, backend_pid } => self.on_granted(now, conn, backend_pid),
            Event::LockRefused { conn } => self.on_refused(now, conn),
            Event::LockWaitTimedOut { conn } => self.on_wait_timed_out(conn),
            Event::LockHeldBySession {
                conn,
                checked_secs_ago,
            } => self.on_held_by_session(now, conn, checked_secs_ago),
            Event::ReleasedIfHeld { conn, released } => {
                self.on_released_if_held(now, conn, released);
            }
            Event::LockQueryFailed { conn, cause } => {
                self.on_try_failed(now, conn, Cause::Error(cause));
            }
            Event::EpochAdvanced { conn, epoch } => self.on_epoch(now, conn, epoch),
            Event::EpochFailed { cause, .. } => self.on_fencing_failed(now, Cause::Error(cause)),
            Event::SessionEnded { cause, .. } => self.on_session_ended(now, Cause::Error(cause)),
            Event::WorkDrained { term } => {
                // The stopped term's work returned: its work deadline is moot.
                self.overdue.retain(|(ended, _)| *ended != term);
                self.release(now);
            }
            Event::PingAnswered { found, .. } => self.on_ping_answered(now, found),
            Event::PingFailed { cause, .. } => {
                self.demote(now, LossReason::CheckFailed, Cause::Error(cause));
            }
            Event::UnlockDone { released: true, .. } => self.finish_release(now, None),
            Event::UnlockDone {
                released: false, ..
            } => {
                self.finish_release(now, Some(Cause::LockNotHeld));
            }
            Event::UnlockFailed { cause, .. } => {
                self.finish_release(now, Some(Cause::Error(cause)));
            }
        }
        Handled::Applied
    }

    // ---- transitions ----

    fn fire(&mut self, timer: Timer, now: Instant) {
        let interval = self.interval().get();
        match timer {
            Timer::NextCheck => self.begin_check(now),
            Timer::AcquireDeadline => self.on_acquire_failed(now, Cause::TimedOut(interval)),
            Timer::TryLockDeadline => {
                if let Some(conn) = self.open_conn() {
                    let budget = self.grant_budget();
                    self.on_try_failed(now, conn, Cause::TimedOut(budget));
                }
            }
            Timer::FenceDeadline => self.on_fencing_failed(now, Cause::TimedOut(interval)),
            Timer::PingDeadline => {
                self.demote(now, LossReason::CheckTimedOut, Cause::TimedOut(interval));
            }
            Timer::DrainDeadline => {
                let term = self.draining().map(|draining| draining.term);
                self.log(LogKind::WorkOutlivedStop, term, None);
                self.release(now);
            }
            Timer::UnlockDeadline => {
                self.finish_release(now, Some(Cause::TimedOut(UNLOCK_BUDGET)));
            }
            Timer::WorkDeadline => {
                if let Some((term, _)) = self.overdue.pop_front() {
                    self.report_overdue(term, false);
                }
            }
        }
    }

    /// The work deadline of `term` passed, or the run finishes first.
    fn report_overdue(&mut self, term: TermId, run_finished: bool) {
        if let Some(deadline) = self.options.work_deadline_of() {
            let abort = deadline.on_overdue == OnOverdue::Abort;
            self.push(Action::ReportOverdueWork {
                term,
                abort,
                run_finished,
            });
        }
    }

    /// A term ended: its work deadline, if the options set one, starts now.
    fn watch_work(&mut self, now: Instant, term: TermId) {
        if let Some(deadline) = self.options.work_deadline_of() {
            self.overdue.push_back((term, now + deadline.after));
        }
    }

    /// The check due now: a standby tries the lock, the leader pings its connection.
    fn begin_check(&mut self, now: Instant) {
        let deadline = now + self.interval().get();
        let State::Running(running) = &mut self.state else {
            return;
        };
        if !matches!(
            running.role,
            Role::Standby(Standby::Waiting { .. })
                | Role::Leader(Leader {
                    check: LeaderCheck::Waiting { .. },
                    ..
                })
        ) {
            return;
        }
        running.schedule.begin(now);
        let held_off = running.hold_until.is_some_and(|until| until > now);
        if matches!(running.role, Role::Standby(_)) && (held_off || !self.eligible) {
            // Nothing is tried: the next check falls due as usual, or when the hold-off ends.
            self.wait_as_standby(now);
            return;
        }
        if let Role::Leader(leader) = &mut running.role {
            leader.check = LeaderCheck::Pinging { deadline };
            let (conn, backend_pid) = (leader.conn, leader.backend_pid);
            self.push(Action::Ping { conn, backend_pid });
        } else {
            let role = self.begin_standby_check(now);
            self.set_role(role);
        }
    }

    fn begin_standby_check(&mut self, now: Instant) -> Role {
        self.last_conn += 1;
        let conn = ConnId::new(self.last_conn);
        self.push(Action::AcquireConnection { conn });
        Role::Standby(Standby::Acquiring {
            conn,
            deadline: now + self.interval().get(),
        })
    }

    /// A connection came: try the lock (poll mode) or queue for it (queue mode).
    fn on_acquired(&mut self, now: Instant, conn: ConnId) {
        self.try_lock_on(now, conn, false);
    }

    /// Tries the lock (poll mode) or queues for it (queue mode) on the borrowed `conn`.
    fn try_lock_on(&mut self, now: Instant, conn: ConnId, after_stranded: bool) {
        match self.options.acquire_mode() {
            AcquireMode::Poll => self.push(Action::TryLock { conn }),
            AcquireMode::Queue => self.push(Action::WaitForLock {
                conn,
                lock_timeout_ms: self.options.lock_timeout_millis(),
            }),
        }
        let deadline = now + self.grant_budget();
        self.set_role(Role::Standby(Standby::TryingLock {
            conn,
            deadline,
            after_stranded,
        }));
    }

    /// The grant found the session already holding the lock. A leader's check proved it there
    /// within [`CheckInterval::stranded_after_secs`]: a live client shares the server session
    /// (transaction mode), so the connection is closed and the check fails naming that. Else
    /// the lock was stranded by a vanished client (a pooler without a reset query): it is
    /// released on this same session and the check goes on, once per check.
    fn on_held_by_session(&mut self, now: Instant, conn: ConnId, checked_secs_ago: Option<u64>) {
        let State::Running(Running {
            role:
                Role::Standby(Standby::TryingLock {
                    deadline,
                    after_stranded,
                    ..
                }),
            ..
        }) = &self.state
        else {
            return;
        };
        let (deadline, after_stranded) = (*deadline, *after_stranded);
        match checked_secs_ago {
            Some(age) if age <= self.interval().stranded_after_secs() => {
                self.on_try_failed(
                    now,
                    conn,
                    Cause::SessionShared {
                        checked_secs_ago: age,
                    },
                );
            }
            _ if after_stranded => self.on_try_failed(now, conn, Cause::StrandedLockKept),
            _ => {
                self.push(Action::ReleaseIfHeld { conn });
                self.set_role(Role::Standby(Standby::ReleasingIfHeld {
                    conn,
                    deadline,
                    stranded: true,
                }));
            }
        }
    }

    /// The release after a timed-out wait or a stranded lock answered.
    fn on_released_if_held(&mut self, now: Instant, conn: ConnId, released: bool) {
        let stranded = matches!(
            &self.state,
            State::Running(Running {
                role: Role::Standby(Standby::ReleasingIfHeld { stranded: true, .. }),
                ..
            })
        );
        if stranded {
            self.log(LogKind::StrandedLockReleased, None, None);
            self.try_lock_on(now, conn, true);
        } else {
            if released {
                self.log(LogKind::GrantReleasedAfterWaitTimeout, None, None);
            }
            self.on_refused(now, conn);
        }
    }

    /// How long the grant statement may take: one interval, or the queued wait plus one.
    fn grant_budget(&self) -> std::time::Duration {
        match self.options.acquire_mode() {
            AcquireMode::Poll => self.interval().get(),
            AcquireMode::Queue => self.options.queued_grant_budget(),
        }
    }

    /// The acquire failed or timed out. A timed-out acquire is abandoned so a connection that
    /// arrives late is never used: nothing ran on it, so it goes back to the pool.
    fn on_acquire_failed(&mut self, now: Instant, cause: Cause<C>) {
        if let (Cause::TimedOut(_), Some(conn)) = (&cause, self.open_conn()) {
            self.push(Action::ReturnToPool { conn });
        }
        self.log(LogKind::AcquireFailed, None, Some(cause));
        self.wait_as_standby(now);
    }

    /// The lock is held: the connection leaves the pool, then the term begins, or first the
    /// fencing epoch is advanced.
    fn on_granted(&mut self, now: Instant, conn: ConnId, backend_pid: i32) {
        self.push(Action::Hijack { conn, backend_pid });
        if self.options.is_fencing() {
            self.push(Action::AdvanceEpoch {
                conn,
                lock_timeout_ms: self.interval().half_millis(),
            });
            let deadline = now + self.interval().get();
            self.set_role(Role::Standby(Standby::Fencing {
                conn,
                backend_pid,
                deadline,
            }));
        } else {
            self.begin_term(now, conn, backend_pid, None);
        }
    }

    /// The epoch came back: the term begins if it advanced past every epoch seen before.
    fn on_epoch(&mut self, now: Instant, conn: ConnId, epoch: u64) {
        let Some(backend_pid) = self.fencing_backend() else {
            return;
        };
        match self.last_epoch {
            Some(last) if epoch <= last => {
                self.on_fencing_failed(now, Cause::EpochDidNotAdvance { epoch, last });
            }
            _ => {
                self.last_epoch = Some(epoch);
                self.begin_term(now, conn, backend_pid, Some(epoch));
            }
        }
    }

    /// No epoch: the lock is given up by closing the connection, and the replica stays a
    /// standby.
    fn on_fencing_failed(&mut self, now: Instant, cause: Cause<C>) {
        self.close_open_conn();
        self.log(LogKind::FencingFailed, None, Some(cause));
        self.wait_as_standby(now);
    }

    fn begin_term(&mut self, now: Instant, conn: ConnId, backend_pid: i32, epoch: Option<u64>) {
        self.last_term += 1;
        let term = TermId::new(self.last_term);
        self.push(Action::BeginTerm { term, epoch });
        self.log(LogKind::LeadershipAcquired, Some(term), None);
        let next_check = self.next_check(now);
        self.set_role(Role::Leader(Leader {
            term,
            conn,
            backend_pid,
            verified_at: now,
            check: LeaderCheck::Waiting { next_check },
        }));
    }

    /// The server's `lock_timeout` ended a queued wait: the lock may have been granted at that
    /// instant anyway, so it is released on the same session, if held, before the connection
    /// goes back to the pool; the grant statement's deadline still bounds it.
    fn on_wait_timed_out(&mut self, conn: ConnId) {
        let State::Running(Running {
            role: Role::Standby(Standby::TryingLock { deadline, .. }),
            ..
        }) = &self.state
        else {
            return;
        };
        let deadline = *deadline;
        self.push(Action::ReleaseIfHeld { conn });
        self.set_role(Role::Standby(Standby::ReleasingIfHeld {
            conn,
            deadline,
            stranded: false,
        }));
    }

    fn on_refused(&mut self, now: Instant, conn: ConnId) {
        self.push(Action::ReturnToPool { conn });
        self.wait_as_standby(now);
    }

    /// The grant statement failed or did not answer: the lock may be held by this session, so
    /// the connection is closed (the server then releases), never returned to the pool.
    fn on_try_failed(&mut self, now: Instant, conn: ConnId, cause: Cause<C>) {
        self.push(Action::CloseConnection { conn });
        self.log(LogKind::AcquireFailed, None, Some(cause));
        self.wait_as_standby(now);
    }

    /// The leader's check answered: the term goes on if what it found proves the lock, and is
    /// lost with the finding's reason if not.
    fn on_ping_answered(&mut self, now: Instant, found: LockCheck) {
        let Some(granted) = self.leader_mut().map(|leader| leader.backend_pid) else {
            return;
        };
        match found.verdict(granted) {
            Ok(()) => self.on_ping_ok(now),
            Err(finding) => {
                self.demote(now, finding.loss_reason(), Cause::LockNotVerified(finding));
            }
        }
    }

    fn on_ping_ok(&mut self, now: Instant) {
        let next_check = self.next_check(now);
        if let Some(leader) = self.leader_mut() {
            leader.check = LeaderCheck::Waiting { next_check };
            leader.verified_at = now;
        }
    }

    /// The leader's check failed: end the term, close the connection, log, become a standby.
    fn demote(&mut self, now: Instant, reason: LossReason, cause: Cause<C>) {
        let next_check = self.next_check(now);
        self.demote_until(now, next_check, reason, cause);
    }

    /// [`demote`](Self::demote), with the standby's first check at `next_check`.
    fn demote_until(
        &mut self,
        now: Instant,
        next_check: Instant,
        reason: LossReason,
        cause: Cause<C>,
    ) {
        let Some((term, conn)) = self.leader_mut().map(|leader| (leader.term, leader.conn)) else {
            return;
        };
        self.push(Action::EndTerm {
            term,
            cause: TermEndCause::Lost(reason),
        });
        self.watch_work(now, term);
        self.push(Action::CloseConnection { conn });
        self.log(LogKind::LeadershipLost, Some(term), Some(cause));
        self.set_role(Role::Standby(Standby::Waiting { next_check }));
    }

    /// The lock session ended on its own: a leader demotes at once and tries again no sooner
    /// than one interval later; a stop in progress
    /// finishes (the server released the lock); a fencing leader-to-be gives up.
    fn on_session_ended(&mut self, now: Instant, cause: Cause<C>) {
        let State::Running(running) = &self.state else {
            return;
        };
        match &running.role {
            Role::Leader(_) => {
                // The loss is known at once, long before a check would have found it: the
                // replica lets the standbys' checks, all due within one interval, come first
                // (an operator who ends the leader's backend wants leadership to move).
                let next_check = running
                    .schedule
                    .first_at_or_after(now + self.options.interval().get());
                self.demote_until(now, next_check, LossReason::SessionEnded, cause);
            }
            Role::Standby(Standby::Fencing { .. }) => self.on_fencing_failed(now, cause),
            Role::Draining(Draining {
                term, conn, then, ..
            })
            | Role::Releasing(Releasing {
                term, conn, then, ..
            }) => {
                let (term, conn, then) = (*term, *conn, *then);
                self.push(Action::CloseConnection { conn });
                self.log(LogKind::SessionEndedWhileStopping, Some(term), Some(cause));
                self.after_release(now, then);
            }
            Role::Standby(_) => {}
        }
    }

    /// A stop request: a standby stops at once; a leader ends its term, gives its work the stop
    /// grace to return, then releases the lock under [`UNLOCK_BUDGET`]. A resign in progress
    /// finishes instead of going back to standby.
    fn cancel(&mut self, now: Instant) {
        let State::Running(running) = &mut self.state else {
            return;
        };
        match &mut running.role {
            Role::Draining(Draining { then, .. }) | Role::Releasing(Releasing { then, .. }) => {
                *then = AfterRelease::Finish;
            }
            Role::Leader(leader) => {
                let (term, conn) = (leader.term, leader.conn);
                self.give_up(now, term, conn, TermEndCause::Stopped, AfterRelease::Finish);
            }
            Role::Standby(_) => {
                self.close_open_conn();
                self.finish();
            }
        }
    }

    /// A resign request: no check begins before `hold_off` has passed, and the replica steps
    /// down.
    fn resign(&mut self, now: Instant, hold_off: Duration) {
        let until = now + hold_off.min(MAX_HOLD_OFF);
        if let State::Running(running) = &mut self.state {
            running.hold_until = Some(running.hold_until.map_or(until, |held| held.max(until)));
        }
        self.step_down(now);
    }

    /// [`Event::SetEligible`]: records the setting; a replica made ineligible steps down.
    fn set_eligible(&mut self, now: Instant, eligible: bool) -> Handled {
        if self.eligible == eligible {
            return Handled::Ignored(Ignored::Unchanged);
        }
        self.eligible = eligible;
        if !eligible {
            self.step_down(now);
        }
        Handled::Applied
    }

    /// Gives leadership up on purpose and stays a standby: a leader ends its term as
    /// [`TermEndCause::Resigned`] and releases the lock after the stop grace; a standby abandons
    /// a check in progress (closing its connection, which may already carry the lock) and waits.
    fn step_down(&mut self, now: Instant) {
        let State::Running(running) = &self.state else {
            return;
        };
        match &running.role {
            Role::Leader(leader) => {
                let (term, conn) = (leader.term, leader.conn);
                self.give_up(
                    now,
                    term,
                    conn,
                    TermEndCause::Resigned,
                    AfterRelease::Standby,
                );
            }
            Role::Standby(Standby::Waiting { .. }) => self.wait_as_standby(now),
            Role::Standby(_) => {
                self.close_open_conn();
                self.wait_as_standby(now);
            }
            Role::Draining(_) | Role::Releasing(_) => {}
        }
    }

    /// The leader gives the lock up on purpose: the term ends, its work gets the stop grace, then
    /// the lock is released; `then` says what follows the release.
    fn give_up(
        &mut self,
        now: Instant,
        term: TermId,
        conn: ConnId,
        cause: TermEndCause,
        then: AfterRelease,
    ) {
        self.push(Action::EndTerm { term, cause });
        self.watch_work(now, term);
        if cause == TermEndCause::Resigned {
            self.log(LogKind::Resigned, Some(term), None);
        }
        let grace = self.options.grace();
        if grace.is_zero() {
            self.set_role(Role::Draining(Draining {
                term,
                conn,
                deadline: now,
                then,
            }));
            self.release(now);
        } else {
            self.push(Action::AwaitWork { term });
            self.set_role(Role::Draining(Draining {
                term,
                conn,
                deadline: now + grace,
                then,
            }));
        }
    }

    /// The work of the stopped term returned, or its grace is over: unlock.
    fn release(&mut self, now: Instant) {
        let Some((term, conn, then)) = self
            .draining()
            .map(|draining| (draining.term, draining.conn, draining.then))
        else {
            return;
        };
        self.push(Action::Unlock { conn });
        self.set_role(Role::Releasing(Releasing {
            term,
            conn,
            deadline: now + UNLOCK_BUDGET,
            then,
        }));
    }

    /// The release completed (`None`) or could not be confirmed: close, log, then finish or
    /// (after a resign) wait as a standby.
    fn finish_release(&mut self, now: Instant, failure: Option<Cause<C>>) {
        let State::Running(Running {
            role: Role::Releasing(releasing),
            ..
        }) = &self.state
        else {
            return;
        };
        let (term, conn, then) = (releasing.term, releasing.conn, releasing.then);
        self.push(Action::CloseConnection { conn });
        match (failure, then) {
            (None, AfterRelease::Finish) => self.log(LogKind::LockReleased, Some(term), None),
            (None, AfterRelease::Standby) => self.log(LogKind::ResignReleased, Some(term), None),
            (Some(cause), _) => self.log(LogKind::ReleaseFailed, Some(term), Some(cause)),
        }
        self.after_release(now, then);
    }

    fn after_release(&mut self, now: Instant, then: AfterRelease) {
        match then {
            AfterRelease::Finish => self.finish(),
            AfterRelease::Standby => self.wait_as_standby(now),
        }
    }

    /// A panic or a drop: end an open term as lost, close any connection without unlocking (it
    /// may be mid-query), and finish.
    fn abandon(&mut self, how: Abandon) {
        let State::Running(running) = &self.state else {
            return;
        };
        let held = match &running.role {
            Role::Leader(leader) => {
                let term = leader.term;
                let reason = match how {
                    Abandon::Panic => LossReason::Panicked,
                    Abandon::Drop => LossReason::Dropped,
                };
                self.push(Action::EndTerm {
                    term,
                    cause: TermEndCause::Lost(reason),
                });
                Some(term)
            }
            Role::Draining(Draining { term, .. }) | Role::Releasing(Releasing { term, .. }) => {
                Some(*term)
            }
            Role::Standby(_) => None,
        };
        self.close_open_conn();
        if let Some(term) = held {
            let kind = match how {
                Abandon::Panic => LogKind::AbandonedAfterPanic,
                Abandon::Drop => LogKind::AbandonedAfterDrop,
            };
            self.log(kind, Some(term), None);
        }
        self.finish();
    }

    /// The run is over. Work deadlines still pending come due now: nothing drives the election
    /// after [`Action::Finish`].
    fn finish(&mut self) {
        while let Some((term, _)) = self.overdue.pop_front() {
            self.report_overdue(term, true);
        }
        self.push(Action::Finish);
        self.state = State::Idle;
    }

    // ---- helpers ----

    /// Waits for the next check, or for the end of a hold-off when that comes later.
    fn wait_as_standby(&mut self, now: Instant) {
        let mut next_check = self.next_check(now);
        if let State::Running(Running {
            hold_until: Some(until),
            ..
        }) = &self.state
        {
            next_check = next_check.max(*until);
        }
        self.set_role(Role::Standby(Standby::Waiting { next_check }));
    }

    fn next_check(&self, now: Instant) -> Instant {
        match &self.state {
            State::Running(running) => running.schedule.next_after(now),
            State::Idle => now,
        }
    }

    fn set_role(&mut self, role: Role) {
        if let State::Running(running) = &mut self.state {
            running.role = role;
        }
    }

    /// The granted backend of a lock whose fencing epoch is being advanced.
    fn fencing_backend(&self) -> Option<i32> {
        match &self.state {
            State::Running(Running {
                role: Role::Standby(Standby::Fencing { backend_pid, .. }),
                ..
            }) => Some(*backend_pid),
            _ => None,
        }
    }

    fn draining(&self) -> Option<&Draining> {
        match &self.state {
            State::Running(Running {
                role: Role::Draining(draining),
                ..
            }) => Some(draining),
            _ => None,
        }
    }

    fn leader_mut(&mut self) -> Option<&mut Leader> {
        match &mut self.state {
            State::Running(Running {
                role: Role::Leader(leader),
                ..
            }) => Some(leader),
            _ => None,
        }
    }

    /// Closes the connection the election owns or is acquiring, if any.
    fn close_open_conn(&mut self) {
        if let Some(conn) = self.open_conn() {
            self.push(Action::CloseConnection { conn });
        }
    }

    /// The connection the election owns or is acquiring, if any.
    fn open_conn(&self) -> Option<ConnId> {
        match &self.state {
            State::Running(running) => match &running.role {
                Role::Standby(Standby::Waiting { .. }) => None,
                Role::Standby(Standby::Acquiring { conn, .. })
                | Role::Standby(Standby::TryingLock { conn, .. })
                | Role::Standby(Standby::ReleasingIfHeld { conn, .. })
                | Role::Standby(Standby::Fencing { conn, .. }) => Some(*conn),
                Role::Leader(leader) => Some(leader.conn),
                Role::Draining(draining) => Some(draining.conn),
                Role::Releasing(releasing) => Some(releasing.conn),
            },
            State::Idle => None,
        }
    }

    fn push(&mut self, action: Action<C>) {
        self.actions.push_back(action);
    }

    fn log(&mut self, kind: LogKind, term: Option<TermId>, cause: Option<Cause<C>>) {
        self.push(Action::Log(LogRecord { kind, term, cause }));
    }
}

/// Whether `role` takes `event`: control events always (but a second stop request), a completion
/// only when it answers the operation in flight on the awaited connection.
fn accepts<C>(role: &Role, event: &Event<C>) -> Result<(), Ignored> {
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
                Event::Cancelled,
            )
            | (Role::Draining(_) | Role::Releasing(_), Event::Resign { .. }) => {
                Err(Ignored::AlreadyStopping)
            }
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
        Role::Standby(Standby::Acquiring { conn, .. })
        | Role::Standby(Standby::TryingLock { conn, .. })
        | Role::Standby(Standby::ReleasingIfHeld { conn, .. })
        | Role::Standby(Standby::Fencing { conn, .. })
        | Role::Leader(Leader {
            conn,
            check: LeaderCheck::Pinging { .. },
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
        Role::Standby(Standby::TryingLock { .. }) => matches!(
            event,
            Event::LockGranted { .. }
                | Event::LockRefused { .. }
                | Event::LockQueryFailed { .. }
                | Event::LockWaitTimedOut { .. }
                | Event::LockHeldBySession { .. }
        ),
        Role::Standby(Standby::ReleasingIfHeld { .. }) => matches!(
            event,
            Event::ReleasedIfHeld { .. } | Event::LockQueryFailed { .. }
        ),
        Role::Standby(Standby::Fencing { .. }) => matches!(
            event,
            Event::EpochAdvanced { .. } | Event::EpochFailed { .. }
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
        Role::Leader(Leader { conn, .. })
        | Role::Standby(Standby::Fencing { conn, .. })
        | Role::Draining(Draining { conn, .. })
        | Role::Releasing(Releasing { conn, .. }) => *conn,
        Role::Standby(_) => return Err(Ignored::StaleConnection),
    };
    if lock_conn == ended {
        Ok(())
    } else {
        Err(Ignored::StaleConnection)
    }
}

impl<C> fmt::Debug for Election<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("options", &self.options)
            .field("phase", &self.phase())
            .field("term", &self.term())
            .field("poll_timeout", &self.poll_timeout())
            .field("queued_actions", &self.actions.len())
            .finish()
    }
}

#[cfg(test)]
mod tests;
