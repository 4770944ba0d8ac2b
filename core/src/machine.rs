//! What every election machine of the engine is to its driver, whichever mode (single or
//! sharded): the sans-IO interface (start, inputs, deadlines, queued actions) and the lifecycle
//! inputs every machine takes. [`Election`](crate::Election) and
//! [`ShardedElection`](crate::shards::ShardedElection) implement it; one driver runs either.

use std::time::Instant;

use crate::action::Action;
use crate::control::Control;
use crate::election::Election;
use crate::event::Event;
use crate::handled::{AlreadyRunning, Handled};
use crate::ids::ConnId;
use crate::liveness::StuckLeader;
use crate::shards::{ShardAction, ShardEvent, ShardedElection};

/// An election machine: time enters with every input, effects leave as actions.
///
/// The contract of both machines: before an input the driver fires the deadlines that passed
/// ([`handle_timeout`](Self::handle_timeout)), so that a late answer never extends a term; it
/// performs every queued action after each input; it sleeps until
/// [`poll_timeout`](Self::poll_timeout).
pub trait Machine {
    /// The machine's inputs, a [`Control`] among them.
    type Event: From<Control>;
    /// The machine's outputs.
    type Action;
    /// The driver's error type, carried in the events.
    type Error;

    /// Starts a run at `now`.
    ///
    /// # Errors
    /// [`AlreadyRunning`] while a run is in progress.
    fn start(&mut self, now: Instant) -> Result<(), AlreadyRunning>;
    /// Applies `event` reported at `now`.
    fn handle_event(&mut self, now: Instant, event: Self::Event) -> Handled;
    /// Fires every deadline due at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// The next queued action.
    #[must_use]
    fn poll_action(&mut self) -> Option<Self::Action>;
    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    #[must_use]
    fn poll_timeout(&self) -> Option<Instant>;
    /// Whether a run is in progress: an operator's request is then queued for its driver;
    /// otherwise a resign has nothing to give up and an eligibility is kept for the next run.
    fn is_running(&self) -> bool;
    /// Whether the replica may lead (or own shards): the last eligibility the machine applied.
    fn is_eligible(&self) -> bool;
    /// The liveness verdict at `now` ([`Election::stuck`], [`ShardedElection::stuck`]).
    ///
    /// # Errors
    /// [`StuckLeader`] when the machine holds leadership its driver has not verified for
    /// strictly more than two intervals.
    fn stuck(&self, now: Instant) -> Result<(), StuckLeader>;

    /// The request `control` from outside the run, as the machine's input.
    fn control(control: Control) -> Self::Event {
        control.into()
    }
    /// The held session `conn` ended on its own, with `cause`.
    fn session_ended(conn: ConnId, cause: Self::Error) -> Self::Event;
    /// The connection an event concerns, when it concerns one.
    fn conn(event: &Self::Event) -> Option<ConnId>;
    /// Whether `event` answers a check that worked (the failed-check run it ends is reported
    /// by [`failures`](crate::failures)).
    fn answers_check(event: &Self::Event) -> bool;
}

impl<C> Machine for Election<C> {
    type Event = Event<C>;
    type Action = Action<C>;
    type Error = C;

    fn start(&mut self, now: Instant) -> Result<(), AlreadyRunning> {
        Election::start(self, now)
    }

    fn handle_event(&mut self, now: Instant, event: Event<C>) -> Handled {
        Election::handle_event(self, now, event)
    }

    fn handle_timeout(&mut self, now: Instant) {
        Election::handle_timeout(self, now);
    }

    fn poll_action(&mut self) -> Option<Action<C>> {
        Election::poll_action(self)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Election::poll_timeout(self)
    }

    fn is_running(&self) -> bool {
        Election::is_running(self)
    }

    fn is_eligible(&self) -> bool {
        Election::is_eligible(self)
    }

    fn stuck(&self, now: Instant) -> Result<(), StuckLeader> {
        Election::stuck(self, now)
    }

    fn session_ended(conn: ConnId, cause: C) -> Event<C> {
        Event::SessionEnded { conn, cause }
    }

    fn conn(event: &Event<C>) -> Option<ConnId> {
        event.conn()
    }

    /// The lock granted or refused, a queued wait ended by its timeout, the leader's check
    /// answered; with a lease, a claim taken (a claim refused is `LockRefused`) or a renewal
    /// that renewed.
    fn answers_check(event: &Event<C>) -> bool {
        matches!(
            event,
            Event::LockGranted { .. }
                | Event::LockRefused { .. }
                | Event::LockWaitTimedOut { .. }
                | Event::PingAnswered { .. }
                | Event::LeaseClaimed { .. }
                | Event::LeaseRenewed { .. }
        )
    }
}

impl<C> Machine for ShardedElection<C> {
    type Event = ShardEvent<C>;
    type Action = ShardAction<C>;
    type Error = C;

    fn start(&mut self, now: Instant) -> Result<(), AlreadyRunning> {
        ShardedElection::start(self, now)
    }

    fn handle_event(&mut self, now: Instant, event: ShardEvent<C>) -> Handled {
        ShardedElection::handle_event(self, now, event)
    }

    fn handle_timeout(&mut self, now: Instant) {
        ShardedElection::handle_timeout(self, now);
    }

    fn poll_action(&mut self) -> Option<ShardAction<C>> {
        ShardedElection::poll_action(self)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        ShardedElection::poll_timeout(self)
    }

    fn is_running(&self) -> bool {
        ShardedElection::is_running(self)
    }

    fn is_eligible(&self) -> bool {
        ShardedElection::is_eligible(self)
    }

    fn stuck(&self, now: Instant) -> Result<(), StuckLeader> {
        ShardedElection::stuck(self, now)
    }

    /// The sharded machine needs no cause: every shard is lost with `SessionEnded`.
    fn session_ended(conn: ConnId, _cause: C) -> ShardEvent<C> {
        ShardEvent::SessionEnded { conn }
    }

    fn conn(event: &ShardEvent<C>) -> Option<ConnId> {
        event.conn()
    }

    /// The session registered or surveyed.
    fn answers_check(event: &ShardEvent<C>) -> bool {
        matches!(
            event,
            ShardEvent::Registered { .. } | ShardEvent::Surveyed { .. }
        )
    }
}

#[cfg(test)]
mod tests;
