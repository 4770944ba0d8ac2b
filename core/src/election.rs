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

use crate::action::{Action, LogKind, LogRecord};
use crate::cause::{Cause, LossReason, TermEndCause};
use crate::control::Control;
use crate::event::Event;
use crate::handled::{AlreadyRunning, Handled, Ignored};
use crate::ids::{ConnId, IdSource, TermId};
use crate::interval::{CheckInterval, UNLOCK_BUDGET};
use crate::liveness::StuckLeader;
use crate::options::{AcquireMode, Options};
use crate::overdue::{Overdue, OverdueBook};
use crate::rank::{self, Candidate, Rank, Version};
use crate::schedule::Schedule;
use crate::verify::LockCheck;

mod advisory;
mod fitness;
mod leader;
mod lease;
mod mechanism;
mod operator;
mod preference;
mod role;
mod standby;
mod stop;

use self::role::{
    Abandon, AfterRelease, Deferral, Draining, Hold, Leader, LeaderCheck, Releasing, Role, Running,
    Standby, State, Step, accepts,
};
pub use self::role::{Phase, Timer};

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
/// 5. Report [`Control::Cancelled`] when asked to stop, [`Control::Panicked`] when a panic
///    unwinds the run, and [`Control::Dropped`] when the run is dropped (as [`Event::Control`]);
///    the run is over at [`Action::Finish`].
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
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Election<C> {
    options: Options,
    state: State,
    /// The work deadlines of ended terms, earliest first (they are set in order, all the same
    /// length after their term's end).
    overdue: OverdueBook,
    actions: VecDeque<Action<C>>,
    ids: IdSource,
    last_epoch: Option<u64>,
    eligible: bool,
}

/// How many role deadlines one [`Election::handle_timeout`] may fire: two fall due together at
/// most (an operation's deadline, then the check on the same instant), and each may end a term
/// whose work deadline of zero is due at once; four leaves room for both.
const MAX_ROLE_FIRES: usize = 4;

/// The longest hold-off a [`Control::Resign`] takes; a longer one is shortened to this (make the
/// replica ineligible to keep it out of the election for good).
pub const MAX_HOLD_OFF: Duration = Duration::from_secs(7 * 24 * 60 * 60);

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
            overdue: OverdueBook::default(),
            actions: VecDeque::new(),
            ids: IdSource::default(),
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

    /// Whether this replica may lead ([`Control::SetEligible`]; initially
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

    /// While leading: the instant its trust ends on this replica's clock. With a lease, the send
    /// of its last successful claim or renewal plus [`Lease::trusted_for`](crate::Lease::trusted_for);
    /// with the advisory lock, the send of the grant or check that last proved the lock plus
    /// the session's `idle_session_timeout` (four intervals; the server may end the session
    /// and free the lock no sooner, while this replica did not run) less the lease's margin of
    /// a tenth, so that the replica says no before a successor can lead. Past it
    /// the replica must not act as leader, whether or not
    /// [`handle_timeout`](Self::handle_timeout) has run yet (a paused process, a stalled
    /// runtime): a driver answers "am I the leader" with it at the moment of the call. A
    /// running advisory leader proves its lock every interval, long before. `None` on a
    /// standby.
    pub fn trust_deadline(&self) -> Option<Instant> {
        match &self.state {
            State::Running(Running {
                role: Role::Leader(leader),
                ..
            }) => Some(match leader.hold {
                Hold::Lease { trusted_until, .. } => trusted_until,
                Hold::Session { .. } => {
                    let idle = self.interval().idle_session_timeout();
                    leader.proven_sent_at + idle - idle / crate::lease::LEASE_MARGIN_DIVISOR
                }
            }),
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
            Role::Standby(
                Standby::Acquiring { .. } | Standby::ProvingPool { .. } | Standby::Probing { .. },
            ) => Phase::Acquiring,
            Role::Standby(
                Standby::TryingLock { .. }
                | Standby::ReleasingIfHeld { .. }
                | Standby::Claiming { .. },
            ) => Phase::TryingLock,
            Role::Standby(Standby::Fencing { .. }) => Phase::Fencing,
            Role::Leader(Leader {
                check: LeaderCheck::Waiting { .. },
                ..
            }) => Phase::Leading,
            Role::Leader(Leader {
                check:
                    LeaderCheck::Pinging { .. }
                    | LeaderCheck::Renewing { .. }
                    | LeaderCheck::Probing { .. },
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
        match self.overdue.next() {
            Some(at) if at < role.1 => Some((Timer::WorkDeadline, at)),
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
            Role::Standby(
                Standby::Acquiring { deadline, .. } | Standby::ProvingPool { deadline, .. },
            ) => (Timer::AcquireDeadline, *deadline),
            Role::Standby(
                Standby::TryingLock { deadline, .. }
                | Standby::ReleasingIfHeld { deadline, .. }
                | Standby::Claiming { deadline, .. },
            ) => (Timer::TryLockDeadline, *deadline),
            Role::Standby(Standby::Fencing { deadline, .. }) => (Timer::FenceDeadline, *deadline),
            Role::Standby(Standby::Probing { deadline, .. }) => (Timer::ProbeDeadline, *deadline),
            Role::Leader(leader) => {
                let check = match &leader.check {
                    LeaderCheck::Waiting { next_check } => (Timer::NextCheck, *next_check),
                    LeaderCheck::Pinging { deadline, .. }
                    | LeaderCheck::Renewing { deadline, .. } => (Timer::PingDeadline, *deadline),
                    LeaderCheck::Probing { deadline, .. } => (Timer::ProbeDeadline, *deadline),
                };
                // A lease is trusted no longer than its window, whatever the check waits for.
                match leader.hold {
                    Hold::Lease { trusted_until, .. } if trusted_until <= check.1 => {
                        (Timer::LeaseExpiry, trusted_until)
                    }
                    _ => check,
                }
            }
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
        let role = Role::Standby(Standby::Waiting {
            next_check: schedule.next_after(now),
        });
        self.state = State::Running(Running {
            schedule,
            role,
            unfit: false,
            hold_until: None,
            pool_proved: !self.options.proves_pool(),
            deferral: None,
            candidacy: None,
            below_floor: false,
        });
        if self.eligible {
            // The first check, once the run's state exists (it may prove the pool first).
            let role = self.begin_attempt(now);
            self.set_role(role);
        }
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
        if let Event::Control(Control::SetEligible { eligible }) = event {
            return self.set_eligible(now, eligible);
        }
        let State::Running(running) = &self.state else {
            return Handled::Ignored(Ignored::NotRunning);
        };
        if let Err(ignored) = accepts(&running.role, &event) {
            return Handled::Ignored(ignored);
        }
        match event {
            Event::Control(control) => self.on_control(now, control),
            Event::ConnectionAcquired { conn } => self.on_acquired(now, conn),
            Event::AcquireFailed { cause, .. } => self.on_acquire_failed(now, Cause::Error(cause)),
            Event::PoolProbed { proof, .. } => self.on_pool_probed(now, proof),
            Event::Fit { conn } => self.on_fit(now, conn),
            Event::Unfit { conn, cause } => self.on_unfit(now, conn, cause),
            Event::ProbeFailed { cause, .. } | Event::SurveyFailed { cause, .. } => {
                self.on_probe_failed(now, Cause::Error(cause));
            }
            Event::CandidatesSurveyed {
                conn,
                candidates,
                floor,
            } => {
                self.on_surveyed(now, conn, &candidates, floor);
            }
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
            Event::LockNotTried { conn, cause } => {
                self.on_not_tried(now, conn, Cause::Error(cause))
            }
            Event::LockQueryFailed { conn, cause } => {
                self.on_try_failed(now, conn, Cause::Error(cause));
            }
            Event::EpochAdvanced { conn, epoch } => self.on_epoch(now, conn, epoch),
            Event::EpochFailed { cause, .. } => self.on_fencing_failed(now, Cause::Error(cause)),
            Event::SessionEnded { cause, .. } => self.on_session_ended(now, Cause::Error(cause)),
            Event::WorkDrained { term } => {
                // The stopped term's work returned: its work deadline is moot.
                self.overdue.forget(term);
                self.release(now);
            }
            Event::PingAnswered { found, .. } => self.on_ping_answered(now, found),
            Event::PingFailed { cause, .. } => self.on_check_failed(now, Cause::Error(cause)),
            Event::LeaseClaimed { epoch, .. } => self.on_lease_claimed(now, epoch),
            Event::LeaseRenewed { .. } => self.on_lease_renewed(now),
            Event::LeaseLost { .. } => self.on_lease_lost(now),
            Event::UnlockDone { released: true, .. } => self.finish_release(now, None),
            Event::UnlockDone {
                released: false, ..
            } => {
                let cause = self.not_held();
                self.finish_release(now, Some(cause));
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
            // A proof that did not answer within its interval proves nothing: the next check
            // proves again (never a pass).
            Timer::AcquireDeadline => self.on_acquire_failed(now, Cause::TimedOut(interval)),
            Timer::TryLockDeadline => {
                if let Some(conn) = self.open_conn() {
                    let budget = self.grant_budget();
                    self.on_try_failed(now, conn, Cause::TimedOut(budget));
                }
            }
            Timer::FenceDeadline => self.on_fencing_failed(now, Cause::TimedOut(interval)),
            Timer::ProbeDeadline => self.on_probe_failed(now, Cause::TimedOut(interval)),
            Timer::PingDeadline => self.on_check_failed(now, Cause::TimedOut(interval)),
            Timer::LeaseExpiry => {
                let trusted_for = self.trusted_for();
                let cause = Cause::LeaseNotRenewed {
                    trusted_for: trusted_for.unwrap_or(interval),
                };
                self.demote(now, LossReason::LeaseExpired, cause);
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
                self.report_overdue();
            }
        }
    }

    // ---- helpers ----

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

    /// The connection the election owns or is acquiring, if any: the lock session, or the
    /// operation in flight.
    pub(super) fn open_conn(&self) -> Option<ConnId> {
        match &self.state {
            State::Running(running) => match &running.role {
                Role::Standby(Standby::Waiting { .. }) => None,
                Role::Standby(Standby::Acquiring { conn, .. })
                | Role::Standby(Standby::ProvingPool { conn, .. })
                | Role::Standby(Standby::Probing { conn, .. })
                | Role::Standby(Standby::TryingLock { conn, .. })
                | Role::Standby(Standby::ReleasingIfHeld { conn, .. })
                | Role::Standby(Standby::Claiming { conn, .. })
                | Role::Standby(Standby::Fencing { conn, .. }) => Some(*conn),
                Role::Leader(Leader {
                    check: LeaderCheck::Renewing { conn, .. } | LeaderCheck::Probing { conn, .. },
                    ..
                }) => Some(*conn),
                Role::Leader(Leader { hold, .. }) | Role::Draining(Draining { hold, .. }) => {
                    hold.session_conn()
                }
                Role::Releasing(releasing) => Some(releasing.conn),
            },
            State::Idle => None,
        }
    }

    /// A fresh connection or operation id.
    fn next_conn(&mut self) -> ConnId {
        self.ids.next_conn()
    }

    fn push(&mut self, action: Action<C>) {
        self.actions.push_back(action);
    }

    fn log(&mut self, kind: LogKind, term: Option<TermId>, cause: Option<Cause<C>>) {
        self.push(Action::Log(LogRecord { kind, term, cause }));
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
