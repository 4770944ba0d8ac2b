//! A checker of the election's safety properties over a trace of inputs and actions.
//!
//! Feed it every input given to an [`Election`](crate::Election) together with the actions that
//! input queued and the `poll_timeout` read afterwards; it returns the first [`Violation`]. The
//! property tests, the fuzz target and the simulation share it.
//!
//! Properties checked:
//! - at most one term is open, term ids strictly increase, and every `BeginTerm` is matched by
//!   exactly one `EndTerm`, with cause `Stopped` only on a stop request, `Resigned` only on a
//!   resign request or when the replica was made ineligible, and a loss only with the reason
//!   its input implies (`CheckTimedOut` on a deadline, `SessionEnded` on a session end, the
//!   check row's own finding for `PingAnswered`, …);
//! - `Hijack` and every `Ping` carry the backend pid the newest grant named;
//! - `Hijack` only in answer to `LockGranted`, `ReleaseIfHeld` only in answer to
//!   `LockWaitTimedOut` or `LockHeldBySession`, a grant statement on a borrowed connection only
//!   in answer to its acquire or to `ReleasedIfHeld` (a stranded lock released), and
//!   `ReturnToPool` only in answer to `LockRefused`, `LockNotTried` or `ReleasedIfHeld`
//!   for the same connection, or to an acquire's deadline; a term begins only on a hijacked connection, in answer to
//!   `LockGranted` or (fencing) `EpochAdvanced`, and fencing epochs strictly increase;
//! - actions only ever name the newest connection, and nothing is done with a connection after it
//!   was closed or returned (so nothing is sent after its check timed out);
//! - `Unlock` only after the term ended on a stop or resign request (in answer to it, to
//!   `WorkDrained` or to the end of the grace), never in the step of a panic or a drop;
//! - `ReportOverdueWork` only for a term that ended;
//! - no connection is asked for while the replica is ineligible, or before a resign's hold-off
//!   has passed;
//! - lease mechanism ([`Checker::for_lease`]): a claim is asked for like a connection (never
//!   while ineligible or held off, never with a term open), a term begins only in answer to
//!   `LeaseClaimed` with its epoch, a renewal only on a check's deadline with the open term's
//!   epoch, a release only as `Unlock` is; a statement in flight is given up only on a deadline
//!   or a control input; and **no term outlives its lease's trust**: while a term is open the
//!   next deadline is never later than the instant its last successful claim or renewal was
//!   sent plus [`Lease::trusted_for`](crate::Lease::trusted_for), and a timeout at or after it
//!   leaves no term open;
//! - fitness ([`Options::probe_fitness`](crate::Options::probe_fitness)): no attempt (a grant
//!   statement or a claim) while the last probe was refused, unless in answer to a probe that
//!   passed; a term ends `Unfit` only in answer to a refused probe;
//! - a run finishes with no term open and no connection left (the gauge reads 0);
//! - an ignored input queues nothing, and nothing is queued while not running;
//! - the next deadline is never earlier than the time of the input, and later than it after a
//!   timeout was handled.

use std::fmt;
use std::time::Instant;

use crate::action::Action;
use crate::cause::{LossReason, TermEndCause};
use crate::control::Control;
use crate::event::Event;
use crate::handled::Handled;
use crate::ids::{ConnId, TermId};
use crate::lease::Lease;

mod names;
pub mod shards;
mod steps;

use self::names::{input_name, is_control_input, is_stop_input, name};
use self::steps::Steps;

/// One input given to a machine, as a checker sees it; `E` is the machine's event type
/// ([`Event`] for the election, [`ShardEvent`](crate::shards::ShardEvent) for a shard space).
#[derive(Debug, Clone, Copy)]
pub enum Input<'a, E> {
    /// `start` was called; `accepted` is whether it returned `Ok`.
    Start {
        /// Whether `start` returned `Ok`.
        accepted: bool,
    },
    /// `handle_timeout` was called.
    Timeout,
    /// `handle_event` was called with this event and returned `handled`.
    Event {
        /// The event.
        event: &'a E,
        /// What `handle_event` returned.
        handled: Handled,
    },
}

/// A broken property, with the step it was found at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The number of the step (input) that broke it, from 1.
    pub step: u64,
    /// What went wrong.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: {}", self.step, self.what)
    }
}

impl std::error::Error for Violation {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Acquiring,
    Borrowed,
    Hijacked,
    /// A lease statement in flight (sent at the instant given).
    Statement(Instant),
    Done,
}

/// A machine's own rules over its trace, beside the ones every machine is held to (counted
/// steps, time that never goes backwards, starts, ignored inputs, nothing after `Finish`, the
/// next deadline): what a [`Checker`] of that machine checks. [`ElectionRules`] for the
/// election, [`ShardRules`](shards::ShardRules) for a shard space.
pub trait Rules: Default {
    /// The machine's inputs.
    type Event<C>;
    /// The machine's outputs.
    type Action<C>;
    /// Whether a running machine has a deadline pending in every state.
    const ALWAYS_A_DEADLINE: bool;

    /// What the step's `input`, given at `now`, changes before its actions are checked.
    ///
    /// # Errors
    /// What the input broke.
    fn input<C>(&mut self, now: Instant, input: &Input<'_, Self::Event<C>>) -> Result<(), String>;

    /// One of the step's actions, in order; `Ok(true)` when it finishes the run.
    ///
    /// # Errors
    /// What the action broke.
    fn action<C>(
        &mut self,
        input: &Input<'_, Self::Event<C>>,
        action: &Self::Action<C>,
    ) -> Result<bool, String>;

    /// The step's `poll_timeout`, read after its actions, at `now`.
    ///
    /// # Errors
    /// What the deadline broke.
    fn deadline<C>(
        &self,
        now: Instant,
        input: &Input<'_, Self::Event<C>>,
        poll_timeout: Option<Instant>,
    ) -> Result<(), String>;
}

/// Checks a trace of a machine step by step: the rules every machine is held to, then `R`, the
/// machine's own. See the module documentation for the election's properties.
#[derive(Debug, Default)]
pub struct Checker<R = ElectionRules> {
    steps: Steps,
    rules: R,
}

impl<R: Rules> Checker<R> {
    /// Checks one step: the input given at `now`, the actions it queued, in order, and
    /// `poll_timeout` read afterwards.
    ///
    /// # Errors
    /// The first property the step breaks.
    pub fn check<C>(
        &mut self,
        now: Instant,
        input: Input<'_, R::Event<C>>,
        actions: &[R::Action<C>],
        poll_timeout: Option<Instant>,
    ) -> Result<(), Violation> {
        self.check_step(now, &input, actions, poll_timeout)
            .map_err(|what| self.steps.violation(what))
    }

    fn check_step<C>(
        &mut self,
        now: Instant,
        input: &Input<'_, R::Event<C>>,
        actions: &[R::Action<C>],
        poll_timeout: Option<Instant>,
    ) -> Result<(), String> {
        self.steps.input(now, input, actions.len())?;
        self.rules.input(now, input)?;
        for action in actions {
            self.steps.action()?;
            if self.rules.action(input, action)? {
                self.steps.running = false;
            }
        }
        self.rules.deadline(now, input, poll_timeout)?;
        self.steps
            .deadline(now, input, poll_timeout, R::ALWAYS_A_DEADLINE)
    }
}

/// The election's own rules (see the module documentation).
#[derive(Debug, Default)]
pub struct ElectionRules {
    /// The time of the step being checked.
    now: Option<Instant>,
    open_term: Option<TermId>,
    last_term: Option<TermId>,
    last_epoch: Option<u64>,
    /// The open term ended on purpose (a stop or resign request): the lock may be released.
    stopped: bool,
    /// The last fitness probe was refused.
    unfit: bool,
    newest: Option<(ConnId, ConnState)>,
    ineligible: bool,
    hold_until: Option<Instant>,
    /// The backend granted the lock of the newest grant, which the leader's checks must find.
    granted_pid: Option<i32>,
    /// The lease mechanism's terms, for a lease election's trace.
    lease: Option<Lease>,
    /// The newest lease term's epoch and the end of its trust.
    lease_term: Option<(u64, Instant)>,
    /// The lease statement answered in this step, and when it was sent.
    answered: Option<(ConnId, Instant)>,
}

impl Checker {
    /// A checker for a fresh election.
    pub fn new() -> Self {
        Self::default()
    }

    /// A checker for a fresh election created ineligible
    /// ([`Options::eligible`](crate::Options::eligible)).
    #[must_use]
    pub fn starting_ineligible(mut self) -> Self {
        self.rules.ineligible = true;
        self
    }

    /// A checker for a fresh election holding `lease` ([`Options::lease`](crate::Options::lease)).
    #[must_use]
    pub fn for_lease(mut self, lease: Lease) -> Self {
        self.rules.lease = Some(lease);
        self
    }

    /// Whether a term is open in the trace seen so far (the gauge would read 1).
    pub fn term_open(&self) -> bool {
        self.rules.open_term.is_some()
    }
}

impl Rules for ElectionRules {
    type Event<C> = Event<C>;
    type Action<C> = Action<C>;
    const ALWAYS_A_DEADLINE: bool = true;

    fn input<C>(&mut self, now: Instant, input: &Input<'_, Event<C>>) -> Result<(), String> {
        self.now = Some(now);
        if let Input::Start { accepted: true } = input {
            self.hold_until = None;
        }
        if let Input::Event {
            event,
            handled: Handled::Applied,
        } = input
        {
            match event {
                Event::Control(Control::SetEligible { eligible }) => self.ineligible = !eligible,
                Event::Unfit { .. } => self.unfit = true,
                Event::Fit { .. } => self.unfit = false,
                // (An applied resign means a running election; `Start` clears the hold.)
                Event::Control(Control::Resign { hold_off }) => {
                    self.hold_until =
                        Some(crate::hold_off::extended(self.hold_until, now, *hold_off));
                }
                _ => {}
            }
        }
        if let Input::Event {
            event: Event::AcquireFailed { conn, .. },
            handled: Handled::Applied,
        } = input
            && self.newest == Some((*conn, ConnState::Acquiring))
        {
            // A failed acquire yields no connection: nothing is left to close.
            self.newest = Some((*conn, ConnState::Done));
        }
        self.answered = None;
        if let Input::Event {
            event,
            handled: Handled::Applied,
        } = input
        {
            self.lease_answered(event);
        }
        Ok(())
    }

    fn action<C>(
        &mut self,
        input: &Input<'_, Event<C>>,
        action: &Action<C>,
    ) -> Result<bool, String> {
        self.check_action(input, action)?;
        Ok(matches!(action, Action::Finish))
    }

    /// No lease term outlives its trust.
    fn deadline<C>(
        &self,
        now: Instant,
        input: &Input<'_, Event<C>>,
        poll_timeout: Option<Instant>,
    ) -> Result<(), String> {
        let (Some((epoch, until)), Some(_)) = (self.lease_term, self.open_term) else {
            return Ok(());
        };
        if matches!(input, Input::Timeout) && now >= until {
            return Err(format!(
                "the term of epoch {epoch} is still open at a timeout past its lease's trust"
            ));
        }
        match poll_timeout {
            Some(at) if at <= until => Ok(()),
            _ => Err(format!(
                "the term of epoch {epoch} has no deadline by the end of its lease's trust \
                 (next: {poll_timeout:?})"
            )),
        }
    }
}

impl ElectionRules {
    /// A lease statement answered: it is done, and a renewal that succeeded extends the
    /// trust from the instant it was sent.
    fn lease_answered<C>(&mut self, event: &Event<C>) {
        let Some((newest, ConnState::Statement(sent_at))) = self.newest else {
            return;
        };
        if event.conn() != Some(newest) {
            return;
        }
        self.newest = Some((newest, ConnState::Done));
        self.answered = Some((newest, sent_at));
        if let (Event::LeaseRenewed { .. }, Some(lease), Some((epoch, until))) =
            (event, self.lease, self.lease_term)
        {
            self.lease_term = Some((epoch, until.max(sent_at + lease.trusted_for())));
        }
    }

    /// A lease statement (claim, renewal, release): when it may be sent.
    fn check_lease_statement<C>(
        &self,
        event: Option<&Event<C>>,
        action: &Action<C>,
        conn: ConnId,
    ) -> Result<bool, String> {
        match action {
            // The pool proof: an operation that keeps no connection, like a lease statement.
            Action::ProbePool { .. } => {
                self.may_ask(conn)?;
                if let Some(term) = self.open_term {
                    return Err(format!("{conn} proves the pool while term {term} is open"));
                }
            }
            Action::ProbeFitness { .. } if self.lease.is_some() => match self.open_term {
                None => self.may_ask(conn)?,
                Some(term) if !matches!(event, Some(Event::LeaseRenewed { .. })) => {
                    return Err(format!(
                        "{conn} probes the fitness of term {term} in answer to {}",
                        input_name(event)
                    ));
                }
                Some(_) => {}
            },
            Action::SurveyCandidates { publish, .. } if self.lease.is_some() => {
                match (self.open_term, publish) {
                    (None, Some(_)) => self.may_ask(conn)?,
                    (Some(_), None)
                        if matches!(
                            event,
                            Some(Event::LeaseRenewed { .. } | Event::Fit { .. })
                        ) => {}
                    (term, _) => {
                        return Err(format!(
                            "{conn} surveys the candidates (term {term:?}, publishing \
                             {publish:?}) in answer to {}",
                            input_name(event)
                        ));
                    }
                }
            }
            Action::ClaimLease { .. } => {
                self.may_ask(conn)?;
                if self.unfit {
                    return Err(format!(
                        "{conn} claims the lease while the replica is unfit"
                    ));
                }
                if let Some(term) = self.open_term {
                    return Err(format!("{conn} claims the lease while term {term} is open"));
                }
            }
            Action::RenewLease { epoch, .. } => {
                let open = self.open_term.and(self.lease_term).map(|(open, _)| open);
                if event.is_some() || open != Some(*epoch) {
                    return Err(format!(
                        "RenewLease of epoch {epoch} in answer to {} with term epoch {open:?}",
                        input_name(event)
                    ));
                }
            }
            Action::ReleaseLease { epoch, .. } => {
                let last = self.lease_term.map(|(last, _)| last);
                if !self.stopped
                    || self.open_term.is_some()
                    || last != Some(*epoch)
                    || !(event.is_none() || event.is_some_and(is_stop_input))
                {
                    return Err(format!(
                        "ReleaseLease of epoch {epoch} in answer to {} (last epoch {last:?})",
                        input_name(event)
                    ));
                }
            }
            _ => return Ok(false),
        }
        if let Some((newest, state)) = self.newest {
            if conn <= newest {
                return Err(format!("{conn} sent after {newest}"));
            }
            if state != ConnState::Done {
                return Err(format!("{conn} sent while {newest} is {state:?}"));
            }
        }
        Ok(true)
    }

    /// Whether a new check may begin: the replica is eligible and not held off.
    fn may_ask(&self, conn: ConnId) -> Result<(), String> {
        if self.ineligible {
            return Err(format!("{conn} asked for while the replica is ineligible"));
        }
        if let (Some(until), Some(now)) = (self.hold_until, self.now)
            && now < until
        {
            return Err(format!(
                "{conn} asked for before the resign's hold-off ended"
            ));
        }
        Ok(())
    }

    fn check_action<C>(
        &mut self,
        input: &Input<'_, Event<C>>,
        action: &Action<C>,
    ) -> Result<(), String> {
        let event = match input {
            Input::Event { event, .. } => Some(*event),
            _ => None,
        };
        if let Some(conn) = action.conn() {
            self.check_conn_action(event, action, conn)?;
        }
        match action {
            Action::BeginTerm { term, epoch } => {
                if let Some(open) = self.open_term {
                    return Err(format!("term {term} began while term {open} is open"));
                }
                if self.last_term.is_some_and(|last| *term <= last) {
                    return Err(format!("term {term} does not increase"));
                }
                let hijacked = matches!(self.newest, Some((_, ConnState::Hijacked)));
                let granted = matches!(
                    event,
                    Some(Event::LockGranted { .. } | Event::EpochAdvanced { .. })
                );
                let claimed = self.lease_claimed(event, *epoch)?;
                if !claimed && (!hijacked || !granted) {
                    return Err(format!(
                        "term {term} began in answer to {} without a hijacked connection",
                        input_name(event)
                    ));
                }
                if let Some(epoch) = epoch {
                    if self.last_epoch.is_some_and(|last| *epoch <= last) {
                        return Err(format!("epoch {epoch} does not increase"));
                    }
                    self.last_epoch = Some(*epoch);
                }
                self.open_term = Some(*term);
                self.last_term = Some(*term);
                self.stopped = false;
            }
            Action::EndTerm { term, cause } => {
                if self.open_term != Some(*term) {
                    return Err(format!("EndTerm {term} but open is {:?}", self.open_term));
                }
                let expected = self.expected_end(event);
                if Some(*cause) != expected {
                    return Err(format!(
                        "EndTerm cause {cause:?} for input {:?}",
                        input_name(event)
                    ));
                }
                self.open_term = None;
                self.stopped = !cause.is_loss();
            }
            Action::ReportOverdueWork { term, .. }
                if self.open_term == Some(*term)
                    || self.last_term.is_none_or(|last| *term > last) =>
            {
                return Err(format!(
                    "ReportOverdueWork {term} of a term that has not ended"
                ));
            }
            Action::AwaitWork { term } if !self.stopped || self.last_term != Some(*term) => {
                return Err(format!("AwaitWork {term} without a stopped term"));
            }
            Action::Finish => {
                if let Some(term) = self.open_term {
                    return Err(format!("finished with term {term} open"));
                }
                if let Some((conn, state)) = self.newest
                    && state != ConnState::Done
                {
                    return Err(format!("finished with {conn} left {state:?}"));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether a lease term begins in answer to `event`, the claim of the term's `epoch`.
    fn lease_claimed<C>(
        &mut self,
        event: Option<&Event<C>>,
        epoch: Option<u64>,
    ) -> Result<bool, String> {
        let Some(lease) = self.lease else {
            return Ok(false);
        };
        let Some(Event::LeaseClaimed {
            epoch: claimed,
            conn,
        }) = event
        else {
            return Err(format!(
                "a lease term began in answer to {}",
                input_name(event)
            ));
        };
        if epoch != Some(*claimed) {
            return Err(format!(
                "a lease term began with epoch {epoch:?}, not the claimed {claimed}"
            ));
        }
        let Some(sent_at) = self.answered.filter(|(c, _)| c == conn).map(|(_, at)| at) else {
            return Err(format!(
                "a lease term began on {conn}, not the newest claim"
            ));
        };
        self.lease_term = Some((*claimed, sent_at + lease.trusted_for()));
        Ok(true)
    }

    /// The only cause a term may end with in answer to `event` (`None` for a timeout: the
    /// leader's check deadline); `None` when no term may end in answer to it.
    fn expected_end<C>(&self, event: Option<&Event<C>>) -> Option<TermEndCause> {
        let lost = |reason| Some(TermEndCause::Lost(reason));
        match event {
            Some(Event::Control(control)) => control.term_end(),
            Some(Event::Unfit { .. }) => Some(TermEndCause::Unfit),
            Some(Event::CandidatesSurveyed { .. }) => Some(TermEndCause::Yielded),
            _ if self.lease.is_some() => match event {
                None => lost(LossReason::LeaseExpired),
                Some(Event::LeaseLost { .. }) => lost(LossReason::LeaseTaken),
                Some(_) => None,
            },
            None => lost(LossReason::CheckTimedOut),
            Some(Event::PingFailed { .. } | Event::ProbeFailed { .. }) => {
                lost(LossReason::CheckFailed)
            }
            Some(Event::SessionEnded { .. }) => lost(LossReason::SessionEnded),
            Some(Event::PingAnswered { found, .. }) => {
                let granted = self.granted_pid?;
                found
                    .verdict(granted)
                    .err()
                    .map(|finding| TermEndCause::Lost(finding.loss_reason()))
            }
            Some(_) => None,
        }
    }

    fn check_conn_action<C>(
        &mut self,
        event: Option<&Event<C>>,
        action: &Action<C>,
        conn: ConnId,
    ) -> Result<(), String> {
        if self.check_lease_statement(event, action, conn)? {
            let sent_at = self.now.ok_or("a statement before any input")?;
            self.newest = Some((conn, ConnState::Statement(sent_at)));
            return Ok(());
        }
        if let Action::AcquireConnection { .. } = action {
            self.may_ask(conn)?;
            if let Some((newest, state)) = self.newest {
                if conn <= newest {
                    return Err(format!("{conn} asked for after {newest}"));
                }
                if state != ConnState::Done {
                    return Err(format!("{conn} asked for while {newest} is {state:?}"));
                }
            }
            self.newest = Some((conn, ConnState::Acquiring));
            return Ok(());
        }
        let Some((newest, state)) = self.newest else {
            return Err(format!(
                "{action:?} names {conn}, never asked for",
                action = name(action)
            ));
        };
        if conn != newest {
            return Err(format!(
                "{} names {conn}, but {newest} is the newest",
                name(action)
            ));
        }
        let answered = |expected: fn(&Event<C>) -> bool| event.is_some_and(expected);
        if matches!(action, Action::TryLock { .. } | Action::WaitForLock { .. })
            && self.unfit
            && !answered(|e| matches!(e, Event::Fit { .. }))
        {
            return Err(format!(
                "{} on {conn} while the replica is unfit",
                name(action)
            ));
        }
        let next = match (action, state) {
            (_, ConnState::Done) => {
                return Err(format!("{} on {conn} after it was closed", name(action)));
            }
            (
                Action::TryLock { .. }
                | Action::WaitForLock { .. }
                | Action::ProbeFitness { .. }
                | Action::SurveyCandidates {
                    publish: Some(_), ..
                },
                ConnState::Acquiring,
            ) if answered(|e| matches!(e, Event::ConnectionAcquired { .. })) => ConnState::Borrowed,
            // The attempt after a probe that passed, or after the survey, on that connection.
            (Action::TryLock { .. } | Action::WaitForLock { .. }, ConnState::Borrowed)
                if answered(|e| {
                    matches!(e, Event::Fit { .. } | Event::CandidatesSurveyed { .. })
                }) =>
            {
                ConnState::Borrowed
            }
            // The survey after a probe that passed, on the probed connection.
            (
                Action::SurveyCandidates {
                    publish: Some(_), ..
                },
                ConnState::Borrowed,
            ) if answered(|e| matches!(e, Event::Fit { .. })) => ConnState::Borrowed,
            // The leader's probe, after a check that proved the lock.
            (Action::ProbeFitness { .. }, ConnState::Hijacked)
                if answered(|e| matches!(e, Event::PingAnswered { .. })) =>
            {
                ConnState::Hijacked
            }
            // The leader's survey, after a check that proved the lock (and a probe that passed).
            (Action::SurveyCandidates { publish: None, .. }, ConnState::Hijacked)
                if answered(|e| matches!(e, Event::PingAnswered { .. } | Event::Fit { .. })) =>
            {
                ConnState::Hijacked
            }
            (Action::ReturnToPool { .. }, ConnState::Borrowed)
                if answered(|e| {
                    matches!(
                        e,
                        Event::LockRefused { .. }
                            | Event::LockNotTried { .. }
                            | Event::ReleasedIfHeld { .. }
                            | Event::Unfit { .. }
                            | Event::CandidatesSurveyed { .. }
                    )
                }) =>
            {
                ConnState::Done
            }
            // A lease statement given up: on its deadline, or by a control input.
            (Action::ReturnToPool { .. }, ConnState::Statement(_))
                if event.is_none_or(is_control_input) =>
            {
                ConnState::Done
            }
            // An acquire whose deadline passed: abandoned, whatever it produces given back.
            (Action::ReturnToPool { .. }, ConnState::Acquiring) if event.is_none() => {
                ConnState::Done
            }
            (Action::ReleaseIfHeld { .. }, ConnState::Borrowed)
                if answered(|e| {
                    matches!(
                        e,
                        Event::LockWaitTimedOut { .. } | Event::LockHeldBySession { .. }
                    )
                }) =>
            {
                ConnState::Borrowed
            }
            // The check goes on after a stranded lock was released on the same session.
            (Action::TryLock { .. } | Action::WaitForLock { .. }, ConnState::Borrowed)
                if answered(|e| matches!(e, Event::ReleasedIfHeld { .. })) =>
            {
                ConnState::Borrowed
            }
            (Action::Hijack { backend_pid, .. }, ConnState::Borrowed)
                if matches!(
                    event,
                    Some(Event::LockGranted { backend_pid: granted, .. }) if granted == backend_pid
                ) =>
            {
                self.granted_pid = Some(*backend_pid);
                ConnState::Hijacked
            }
            (Action::AdvanceEpoch { .. }, ConnState::Hijacked)
                if answered(|e| matches!(e, Event::LockGranted { .. })) =>
            {
                ConnState::Hijacked
            }
            (Action::Ping { backend_pid, .. }, ConnState::Hijacked)
                if event.is_none() && self.granted_pid == Some(*backend_pid) =>
            {
                ConnState::Hijacked
            }
            (Action::Unlock { .. }, ConnState::Hijacked)
                if self.stopped
                    && self.open_term.is_none()
                    && (event.is_none() || answered(is_stop_input)) =>
            {
                ConnState::Hijacked
            }
            (Action::CloseConnection { .. }, _) => ConnState::Done,
            _ => {
                return Err(format!(
                    "{} on {conn} ({state:?}) in answer to {}",
                    name(action),
                    input_name(event)
                ));
            }
        };
        self.newest = Some((conn, next));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Each property, broken on purpose by a crafted trace, is reported.

    use std::time::{Duration, Instant};

    use super::*;
    use crate::action::{LogKind, LogRecord};
    use crate::verify::LockCheck;

    type A = Action<u8>;
    type E = Event<u8>;

    const C1: ConnId = ConnId::new(1);
    const C2: ConnId = ConnId::new(2);
    const T1: TermId = TermId::new(1);
    const PID: i32 = 4242;

    struct Trace {
        checker: Checker,
        t0: Instant,
    }

    impl Trace {
        fn new() -> Self {
            Self {
                checker: Checker::new(),
                t0: Instant::now(),
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        fn start(&mut self, actions: &[A]) -> Result<(), Violation> {
            let (now, timeout) = (self.at(0), Some(self.at(100)));
            self.checker
                .check(now, Input::Start { accepted: true }, actions, timeout)
        }

        fn timeout(&mut self, ms: u64, actions: &[A]) -> Result<(), Violation> {
            let (now, timeout) = (self.at(ms), Some(self.at(ms + 100)));
            self.checker.check(now, Input::Timeout, actions, timeout)
        }

        fn event(&mut self, ms: u64, event: impl Into<E>, actions: &[A]) -> Result<(), Violation> {
            let (now, timeout) = (self.at(ms), Some(self.at(ms + 100)));
            let input = Input::Event {
                event: &event.into(),
                handled: Handled::Applied,
            };
            self.checker.check(now, input, actions, timeout)
        }

        /// Started, conn 1 acquired and granted: leading in term 1.
        fn leading() -> Self {
            let mut trace = Self::new();
            trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
            trace
                .event(
                    1,
                    E::ConnectionAcquired { conn: C1 },
                    &[A::TryLock { conn: C1 }],
                )
                .unwrap();
            let granted = [
                A::Hijack {
                    conn: C1,
                    backend_pid: PID,
                },
                A::BeginTerm {
                    term: T1,
                    epoch: None,
                },
            ];
            trace
                .event(
                    2,
                    E::LockGranted {
                        conn: C1,
                        backend_pid: PID,
                    },
                    &granted,
                )
                .unwrap();
            assert!(trace.checker.term_open());
            trace
        }
    }

    mod fitness;
    mod lease;
    mod preference;

    fn violation(result: Result<(), Violation>, needle: &str) {
        let violation = result.expect_err("the broken trace is reported");
        assert!(violation.to_string().contains(needle), "{violation}");
        assert!(violation.to_string().starts_with("step "), "{violation}");
    }

    #[test]
    fn a_term_lost_on_a_disproving_check_passes_with_the_finding_s_reason_only() {
        let lost = |reason| {
            [
                A::EndTerm {
                    term: T1,
                    cause: TermEndCause::Lost(reason),
                },
                A::CloseConnection { conn: C1 },
            ]
        };
        let found = E::PingAnswered {
            conn: C1,
            found: LockCheck {
                holds_lock: false,
                ..LockCheck::holding(PID)
            },
        };
        let mut trace = Trace::leading();
        let ping = A::Ping {
            conn: C1,
            backend_pid: PID,
        };
        trace.timeout(100, std::slice::from_ref(&ping)).unwrap();
        trace
            .event(101, found.clone(), &lost(LossReason::LockNotHeld))
            .unwrap();
        let mut trace = Trace::leading();
        trace.timeout(100, &[ping]).unwrap();
        violation(
            trace.event(101, found, &lost(LossReason::CheckFailed)),
            "EndTerm cause",
        );
    }

    #[test]
    fn a_correct_trace_passes_and_finishes_clean() {
        let mut trace = Trace::leading();
        let stop = [
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Stopped,
            },
            A::Unlock { conn: C1 },
        ];
        trace.event(3, Control::Cancelled, &stop).unwrap();
        let done = [A::CloseConnection { conn: C1 }, A::Finish];
        let input = Input::Event {
            event: &E::UnlockDone {
                conn: C1,
                released: true,
            },
            handled: Handled::Applied,
        };
        trace
            .checker
            .check(trace.at(4), input, &done, None)
            .unwrap();
        assert!(!trace.checker.term_open());
    }

    #[test]
    fn two_open_terms_are_reported() {
        let mut trace = Trace::leading();
        violation(
            trace.event(
                3,
                E::PingAnswered {
                    conn: C1,
                    found: LockCheck::holding(PID),
                },
                &[A::BeginTerm {
                    term: TermId::new(2),
                    epoch: None,
                }],
            ),
            "step 4: term 2 began while term 1 is open",
        );
    }

    #[test]
    fn a_term_without_a_hijack_or_a_decreasing_id_is_reported() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        violation(
            trace.event(
                1,
                E::LockGranted {
                    conn: C1,
                    backend_pid: PID,
                },
                &[A::BeginTerm {
                    term: T1,
                    epoch: None,
                }],
            ),
            "without a hijack",
        );
        let mut trace = Trace::leading();
        let lost = [
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::CheckFailed),
            },
            A::CloseConnection { conn: C1 },
        ];
        trace
            .event(3, E::PingFailed { conn: C1, cause: 0 }, &lost)
            .unwrap();
        trace
            .event(
                4,
                E::PingAnswered {
                    conn: C1,
                    found: LockCheck::holding(PID),
                },
                &[A::AcquireConnection { conn: C2 }],
            )
            .unwrap();
        trace
            .event(
                5,
                E::ConnectionAcquired { conn: C2 },
                &[A::TryLock { conn: C2 }],
            )
            .unwrap();
        let stale = [
            A::Hijack {
                conn: C2,
                backend_pid: PID,
            },
            A::BeginTerm {
                term: T1,
                epoch: None,
            },
        ];
        violation(
            trace.event(
                6,
                E::LockGranted {
                    conn: C2,
                    backend_pid: PID,
                },
                &stale,
            ),
            "does not increase",
        );
    }

    #[test]
    fn an_end_without_a_term_or_with_the_wrong_cause_is_reported() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        let end = [A::EndTerm {
            term: T1,
            cause: TermEndCause::Lost(LossReason::Panicked),
        }];
        violation(trace.event(1, Control::Panicked, &end), "open is None");
        let mut trace = Trace::leading();
        let end = [A::EndTerm {
            term: T1,
            cause: TermEndCause::Stopped,
        }];
        violation(trace.event(3, Control::Panicked, &end), "EndTerm cause");
    }

    #[test]
    fn a_grant_statement_that_tried_no_lock_may_give_its_connection_back() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        trace
            .event(
                1,
                E::ConnectionAcquired { conn: C1 },
                &[A::TryLock { conn: C1 }],
            )
            .unwrap();
        trace
            .event(
                2,
                E::LockNotTried { conn: C1, cause: 1 },
                &[A::ReturnToPool { conn: C1 }],
            )
            .unwrap();
        // A failed statement's outcome is unknown: its connection never goes back.
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        trace
            .event(
                1,
                E::ConnectionAcquired { conn: C1 },
                &[A::TryLock { conn: C1 }],
            )
            .unwrap();
        violation(
            trace.event(
                2,
                E::LockQueryFailed { conn: C1, cause: 2 },
                &[A::ReturnToPool { conn: C1 }],
            ),
            "ReturnToPool on conn#1 (Borrowed) in answer to LockQueryFailed",
        );
    }

    #[test]
    fn a_hijack_or_return_not_answering_the_lock_outcome_is_reported() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        trace
            .event(
                1,
                E::ConnectionAcquired { conn: C1 },
                &[A::TryLock { conn: C1 }],
            )
            .unwrap();
        violation(
            trace.event(
                2,
                E::LockRefused { conn: C1 },
                &[A::Hijack {
                    conn: C1,
                    backend_pid: PID,
                }],
            ),
            "Hijack on conn#1 (Borrowed) in answer to LockRefused",
        );
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        trace
            .event(
                1,
                E::ConnectionAcquired { conn: C1 },
                &[A::TryLock { conn: C1 }],
            )
            .unwrap();
        violation(
            trace.event(
                2,
                E::LockGranted {
                    conn: C1,
                    backend_pid: PID,
                },
                &[A::ReturnToPool { conn: C1 }],
            ),
            "ReturnToPool",
        );
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        violation(
            trace.event(1, Control::Cancelled, &[A::TryLock { conn: C1 }]),
            "TryLock",
        );
    }

    #[test]
    fn anything_on_a_closed_or_old_connection_is_reported() {
        let mut trace = Trace::leading();
        let lost = [
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Lost(LossReason::CheckFailed),
            },
            A::CloseConnection { conn: C1 },
        ];
        trace
            .event(3, E::PingFailed { conn: C1, cause: 0 }, &lost)
            .unwrap();
        let ping = [A::Ping {
            conn: C1,
            backend_pid: PID,
        }];
        let timeout = Some(trace.at(200));
        violation(
            trace
                .checker
                .check(trace.at(100), Input::<E>::Timeout, &ping, timeout),
            "after it was closed",
        );
        let mut trace = Trace::leading();
        violation(
            trace.event(3, Control::Cancelled, &[A::Unlock { conn: C2 }]),
            "but conn#1 is the newest",
        );
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C2 }]).unwrap();
        violation(
            trace.event(1, Control::Cancelled, &[A::CloseConnection { conn: C1 }]),
            "newest",
        );
    }

    #[test]
    fn a_connection_never_asked_for_is_reported() {
        let mut trace = Trace::new();
        trace.start(&[]).unwrap();
        violation(
            trace.event(1, Control::Cancelled, &[A::CloseConnection { conn: C1 }]),
            "never asked for",
        );
    }

    #[test]
    fn a_new_connection_while_one_is_open_or_out_of_order_is_reported() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C2 }]).unwrap();
        let input = Input::Event {
            event: &E::AcquireFailed { conn: C2, cause: 0 },
            handled: Handled::Applied,
        };
        trace
            .checker
            .check(trace.at(1), input, &[], Some(trace.at(100)))
            .unwrap();
        violation(
            trace.event(2, Control::Cancelled, &[A::AcquireConnection { conn: C1 }]),
            "asked for after",
        );
        let mut trace = Trace::leading();
        violation(
            trace.event(3, Control::Cancelled, &[A::AcquireConnection { conn: C2 }]),
            "while conn#1",
        );
    }

    #[test]
    fn an_unlock_after_a_panic_or_a_ping_in_answer_to_an_event_is_reported() {
        let mut trace = Trace::leading();
        violation(
            trace.event(3, Control::Panicked, &[A::Unlock { conn: C1 }]),
            "Unlock",
        );
        let mut trace = Trace::leading();
        violation(
            trace.event(
                3,
                E::PingAnswered {
                    conn: C1,
                    found: LockCheck::holding(PID),
                },
                &[A::Ping {
                    conn: C1,
                    backend_pid: PID,
                }],
            ),
            "Ping",
        );
    }

    #[test]
    fn an_unlock_without_a_stopped_term_is_reported() {
        // While fencing: the lock is held on a hijacked connection, but no term began or was
        // stopped.
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        trace
            .event(
                1,
                E::ConnectionAcquired { conn: C1 },
                &[A::TryLock { conn: C1 }],
            )
            .unwrap();
        let fence = [
            A::Hijack {
                conn: C1,
                backend_pid: PID,
            },
            A::AdvanceEpoch {
                conn: C1,
                lock_timeout_ms: 2_500,
            },
        ];
        trace
            .event(
                2,
                E::LockGranted {
                    conn: C1,
                    backend_pid: PID,
                },
                &fence,
            )
            .unwrap();
        let unlock = [A::Unlock { conn: C1 }];
        violation(
            trace
                .checker
                .check(trace.at(50), Input::Timeout, &unlock, Some(trace.at(100))),
            "Unlock on conn#1 (Hijacked) in answer to a timeout or start",
        );
        // On a stop request, before the term ended.
        let mut trace = Trace::leading();
        violation(
            trace.event(3, Control::Cancelled, &unlock),
            "Unlock on conn#1 (Hijacked) in answer to Cancelled",
        );
    }

    #[test]
    fn an_epoch_advance_not_answering_the_grant_is_reported() {
        let mut trace = Trace::leading();
        violation(
            trace.event(
                3,
                E::PingAnswered {
                    conn: C1,
                    found: LockCheck::holding(PID),
                },
                &[A::AdvanceEpoch {
                    conn: C1,
                    lock_timeout_ms: 2_500,
                }],
            ),
            "AdvanceEpoch on conn#1 (Hijacked) in answer to PingAnswered",
        );
    }

    #[test]
    fn awaiting_work_of_a_term_not_stopped_is_reported() {
        let stopped = A::EndTerm {
            term: T1,
            cause: TermEndCause::Stopped,
        };
        // The term stopped: its work is awaited.
        let mut trace = Trace::leading();
        trace
            .event(
                3,
                Control::Cancelled,
                &[stopped.clone(), A::AwaitWork { term: T1 }],
            )
            .unwrap();
        // The term is still open.
        let mut trace = Trace::leading();
        violation(
            trace.event(
                3,
                E::PingAnswered {
                    conn: C1,
                    found: LockCheck::holding(PID),
                },
                &[A::AwaitWork { term: T1 }],
            ),
            "AwaitWork 1 without a stopped term",
        );
        // Another term than the stopped one.
        let mut trace = Trace::leading();
        let other = A::AwaitWork {
            term: TermId::new(2),
        };
        violation(
            trace.event(3, Control::Cancelled, &[stopped, other]),
            "AwaitWork 2 without a stopped term",
        );
    }

    #[test]
    fn finishing_with_a_term_or_a_connection_left_is_reported() {
        let mut trace = Trace::leading();
        violation(
            trace.event(3, Control::Cancelled, &[A::Finish]),
            "finished with term",
        );
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        violation(
            trace.event(1, Control::Cancelled, &[A::Finish]),
            "left Acquiring",
        );
    }

    #[test]
    fn actions_after_finish_or_for_ignored_inputs_are_reported() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        let close = [
            A::CloseConnection { conn: C1 },
            A::Finish,
            A::Log(LogRecord {
                kind: LogKind::LockReleased,
                term: None,
                cause: None,
            }),
        ];
        let input = Input::Event {
            event: &E::Control(Control::Cancelled),
            handled: Handled::Applied,
        };
        violation(
            trace.checker.check(trace.at(1), input, &close, None),
            "after Finish",
        );
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        let ignored = Input::Event {
            event: &E::PingAnswered {
                conn: C1,
                found: LockCheck::holding(PID),
            },
            handled: Handled::Ignored(crate::Ignored::Unexpected),
        };
        violation(
            trace.checker.check(
                trace.at(1),
                ignored,
                &[A::TryLock { conn: C1 }],
                Some(trace.at(100)),
            ),
            "ignored input",
        );
    }

    #[test]
    fn a_start_while_running_or_a_refused_start_while_idle_is_reported() {
        let mut trace = Trace::new();
        let refused: Input<'_, E> = Input::Start { accepted: false };
        violation(
            trace.checker.check(trace.at(0), refused, &[], None),
            "start accepted=false",
        );
        let mut trace = Trace::leading();
        let again: Input<'_, E> = Input::Start { accepted: true };
        violation(
            trace
                .checker
                .check(trace.at(5), again, &[], Some(trace.at(100))),
            "start accepted=true",
        );
    }

    #[test]
    fn deadlines_in_the_past_still_due_or_missing_are_reported() {
        let mut trace = Trace::leading();
        let input: Input<'_, E> = Input::Timeout;
        violation(
            trace
                .checker
                .check(trace.at(50), input, &[], Some(trace.at(49))),
            "in the past",
        );
        let mut trace = Trace::leading();
        violation(
            trace
                .checker
                .check(trace.at(50), Input::<E>::Timeout, &[], Some(trace.at(50))),
            "still due",
        );
        let mut trace = Trace::leading();
        violation(
            trace
                .checker
                .check(trace.at(50), Input::<E>::Timeout, &[], None),
            "no deadline",
        );
        let mut trace = Trace::new();
        violation(
            trace
                .checker
                .check(trace.at(0), Input::<E>::Timeout, &[], Some(trace.at(1))),
            "while not running",
        );
        let mut trace = Trace::leading();
        violation(
            trace
                .checker
                .check(trace.at(1), Input::<E>::Timeout, &[], Some(trace.at(100))),
            "backwards",
        );
    }

    #[test]
    fn asking_for_a_connection_while_held_out_is_reported() {
        // Created ineligible: the first check may not ask for a connection.
        let mut trace = Trace::new();
        trace.checker = Checker::new().starting_ineligible();
        violation(
            trace.start(&[A::AcquireConnection { conn: C1 }]),
            "asked for while the replica is ineligible",
        );
        // Made ineligible while running.
        let mut trace = Trace::new();
        trace.start(&[]).unwrap();
        trace
            .event(10, Control::SetEligible { eligible: false }, &[])
            .unwrap();
        violation(
            trace.timeout(100, &[A::AcquireConnection { conn: C1 }]),
            "asked for while the replica is ineligible",
        );
        // A resign's hold-off of one second, from 10 ms: not at 500 ms, but at 1010 ms.
        let mut trace = Trace::new();
        trace.start(&[]).unwrap();
        let hold_off = Duration::from_secs(1);
        trace.event(10, Control::Resign { hold_off }, &[]).unwrap();
        violation(
            trace.timeout(500, &[A::AcquireConnection { conn: C1 }]),
            "before the resign's hold-off ended",
        );
        let mut trace = Trace::new();
        trace.start(&[]).unwrap();
        trace.event(10, Control::Resign { hold_off }, &[]).unwrap();
        trace
            .timeout(1010, &[A::AcquireConnection { conn: C1 }])
            .unwrap();
    }

    #[test]
    fn giving_back_an_acquiring_connection_is_only_for_its_deadline() {
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        trace.timeout(100, &[A::ReturnToPool { conn: C1 }]).unwrap();
        let mut trace = Trace::new();
        trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
        violation(
            trace.event(5, Control::Cancelled, &[A::ReturnToPool { conn: C1 }]),
            "ReturnToPool on conn#1 (Acquiring) in answer to Cancelled",
        );
    }

    #[test]
    fn a_release_if_held_only_answers_a_timed_out_wait() {
        let waiting = || {
            let mut trace = Trace::new();
            trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
            let wait = [A::WaitForLock {
                conn: C1,
                lock_timeout_ms: 100,
            }];
            trace
                .event(1, E::ConnectionAcquired { conn: C1 }, &wait)
                .unwrap();
            trace
        };
        let release = [A::ReleaseIfHeld { conn: C1 }];
        waiting()
            .event(50, E::LockWaitTimedOut { conn: C1 }, &release)
            .unwrap();
        violation(
            waiting().event(50, E::LockRefused { conn: C1 }, &release),
            "ReleaseIfHeld on conn#1 (Borrowed) in answer to LockRefused",
        );
    }

    #[test]
    fn a_grant_on_a_borrowed_connection_only_follows_a_stranded_release() {
        let trying = || {
            let mut trace = Trace::new();
            trace.start(&[A::AcquireConnection { conn: C1 }]).unwrap();
            trace
                .event(
                    1,
                    E::ConnectionAcquired { conn: C1 },
                    &[A::TryLock { conn: C1 }],
                )
                .unwrap();
            trace
        };
        // The grant found a stranded lock: released on the same session, then the grant again.
        let mut stranded = trying();
        stranded
            .event(
                2,
                E::LockHeldBySession {
                    conn: C1,
                    checked_secs_ago: None,
                },
                &[A::ReleaseIfHeld { conn: C1 }],
            )
            .unwrap();
        stranded
            .event(
                3,
                E::ReleasedIfHeld {
                    conn: C1,
                    released: true,
                },
                &[A::TryLock { conn: C1 }],
            )
            .unwrap();
        // A grant sent again on the borrowed session in answer to anything else is reported.
        violation(
            trying().event(2, E::LockRefused { conn: C1 }, &[A::TryLock { conn: C1 }]),
            "TryLock on conn#1 (Borrowed) in answer to LockRefused",
        );
    }

    #[test]
    fn a_report_of_overdue_work_of_a_term_not_ended_is_reported() {
        let overdue = [A::ReportOverdueWork {
            term: T1,
            abort: false,
            run_finished: false,
        }];
        violation(
            Trace::leading().timeout(50, &overdue),
            "ReportOverdueWork 1 of a term that has not ended",
        );
        let mut trace = Trace::new();
        trace.start(&[]).unwrap();
        violation(
            trace.timeout(50, &overdue),
            "ReportOverdueWork 1 of a term that has not ended",
        );
    }
}
