//! The driver of the model: feeds inputs to a replica's real election under the `Machine`
//! contract (deadlines fired before every input, every queued action performed), and performs
//! the actions against the model's server.

use plexsphere_leader_core::{Action, Election, Event, TermEndCause, Timer};

use super::state::{Broken, Cause, State, seen};
use super::{Mechanism, SingleModel, props};
use crate::clock::{Micros, instant, local_delta, micros, server_delta};
use crate::flight::{self, Flight, Stage};
use crate::sabotage::Sabotage;
use crate::server::Sess;
use crate::trace::{Input, Line, Recorder};

/// A step being applied: the model's configuration, the state it changes, and the trace being
/// recorded (when printing a path).
pub(crate) struct World<'a> {
    pub(crate) model: &'a SingleModel,
    pub(crate) s: &'a mut State,
    pub(crate) trace: Option<&'a mut Recorder<Event<Cause>>>,
}

impl World<'_> {
    /// Feeds `input` to replica `r` at its clock's now, then performs what it queued.
    pub(crate) fn feed(&mut self, r: usize, input: Input<Event<Cause>>) {
        let replica = &self.s.replicas[r];
        let (name, run, at) = (replica.name, replica.run, replica.local);
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push(Line::Input {
                replica: name,
                run,
                at,
                input: input.clone(),
            });
        }
        let now = instant(at);
        let sabotage = self.model.sabotage;
        let machine = &mut self.s.replicas[r].machine;
        match input {
            Input::Start => {
                let _started = machine.start(now);
            }
            Input::Timeout => fire(machine, now, sabotage),
            Input::Event(event) => {
                fire(machine, now, sabotage);
                let _handled = machine.handle_event(now, event);
            }
        }
        self.drain(r);
        // A deadline the input made due at once (a check whose grid time passed while the
        // last one ran): the driver's sleep returns at once.
        let machine = &self.s.replicas[r].machine;
        let due = machine.poll_timeout().is_some_and(|at| at <= now);
        let skipped = sabotage == Sabotage::UnboundedTrust
            && machine.timeout_reason() == Some(Timer::LeaseExpiry);
        if due && !skipped {
            self.feed(r, Input::Timeout);
        }
    }

    /// Performs every action replica `r` queued, then feeds back the answers the model gives
    /// at once (a pooled connection, drained work).
    fn drain(&mut self, r: usize) {
        let mut answers = Vec::new();
        while let Some(action) = self.s.replicas[r].machine.poll_action() {
            if let Some(event) = self.perform(r, action) {
                answers.push(event);
            }
        }
        for event in answers {
            self.feed(r, Input::Event(event));
        }
    }

    /// Performs one action of replica `r`; returns the answer given at once, if any.
    fn perform(&mut self, r: usize, action: Action<Cause>) -> Option<Event<Cause>> {
        let now = self.s.now;
        match action {
            Action::AcquireConnection { conn } if self.s.replicas[r].partitioned => {
                Some(Event::AcquireFailed {
                    conn,
                    cause: "server unreachable",
                })
            }
            Action::AcquireConnection { conn } => {
                let sess = self.s.replicas[r].sess(r, conn);
                self.s.server.open(sess, now);
                Some(Event::ConnectionAcquired { conn })
            }
            // The pool proof (off in the model's options, on in the adapter): the model's
            // server is reached directly, so two held connections are two backends.
            Action::ProbePool { conn, .. } if self.s.replicas[r].partitioned => {
                Some(Event::AcquireFailed {
                    conn,
                    cause: "server unreachable",
                })
            }
            Action::ProbePool { conn, .. } => {
                let base = i32::try_from(r).unwrap_or(0) * 2;
                Some(Event::PoolProbed {
                    conn,
                    first: base,
                    second: Some(base + 1),
                })
            }
            // The fitness probe (off in the model's options): every replica is fit.
            Action::ProbeFitness { conn } => Some(Event::Fit { conn }),
            Action::TryLock { conn }
            | Action::WaitForLock { conn, .. }
            | Action::ReleaseIfHeld { conn }
            | Action::AdvanceEpoch { conn, .. }
            | Action::Ping { conn, .. }
            | Action::Unlock { conn }
            | Action::ClaimLease { conn, .. }
            | Action::RenewLease { conn, .. }
            | Action::ReleaseLease { conn, .. } => {
                let owner = self.s.replicas[r].sess(r, conn);
                if self.s.replicas[r].partitioned {
                    // Lost on the way; a sabotaged driver reports a renewal renewed anyway.
                    let renewal = matches!(action, Action::RenewLease { .. });
                    return (renewal && self.model.sabotage == Sabotage::RenewIgnoresTerm)
                        .then_some(Event::LeaseRenewed { conn });
                }
                flight::insert(
                    &mut self.s.flights,
                    Flight {
                        owner,
                        stage: Stage::Sent(action),
                        abandoned: false,
                    },
                );
                None
            }
            Action::ReturnToPool { conn } => {
                // Back in the pool, unchanged: the session is no longer the election's (a lease
                // statement given up may still run: its answer is dropped).
                let sess = self.s.replicas[r].sess(r, conn);
                self.abandon(sess);
                self.s.server.sessions.retain(|s| s.owner != sess);
                self.s.server.waiters.retain(|w| w.owner != sess);
                None
            }
            Action::CloseConnection { conn } => {
                let sess = self.s.replicas[r].sess(r, conn);
                self.s.flights.retain(|f| f.owner != sess);
                let replica = &mut self.s.replicas[r];
                if replica.lock_conn == Some(conn) {
                    replica.lock_conn = None;
                    replica.lost = None;
                    replica.stale = 0;
                }
                self.end_session(sess, false);
                None
            }
            Action::Hijack { conn, .. } => {
                let replica = &mut self.s.replicas[r];
                replica.lock_conn = Some(conn);
                replica.lost = None;
                replica.stale = 0;
                None
            }
            Action::BeginTerm { epoch, .. } => {
                self.begin_term(r, epoch);
                None
            }
            Action::EndTerm { cause, .. } => {
                self.s.replicas[r].epoch = None;
                if cause == TermEndCause::Resigned {
                    self.s.resigned = u8::try_from(r).ok();
                }
                None
            }
            Action::AwaitWork { term } => Some(Event::WorkDrained { term }),
            Action::ReportOverdueWork { .. }
            | Action::Log(_)
            | Action::Fail(_)
            | Action::Finish => None,
        }
    }

    /// A term begins on replica `r` with `epoch`: the epochs' rule, and the discoveries.
    fn begin_term(&mut self, r: usize, epoch: Option<u64>) {
        let s = &mut *self.s;
        s.seen |= seen::ELECTED;
        if let Some(epoch) = epoch {
            s.max_epoch = s.max_epoch.max(epoch);
        }
        s.replicas[r].epoch = epoch;
        if s.resigned.is_some_and(|by| usize::from(by) != r) {
            s.seen |= seen::RESIGN_HANDOVER;
            s.resigned = None;
        }
        let replica = &s.replicas[r];
        if let Some(conn) = replica.lock_conn
            && s.server.queued_grant == Some(replica.sess(r, conn))
        {
            s.seen |= seen::QUEUED_HANDOVER;
        }
        let took_over = s.server.lease.committed.is_some_and(|row| {
            row.took_over && Some(row.epoch) == epoch && row.holder == (r as u8, replica.run)
        });
        if took_over {
            s.seen |= seen::EXPIRY_TAKEOVER;
        }
    }

    /// The operations of `sess` still in flight are given up: any may still reach the server.
    fn abandon(&mut self, sess: Sess) {
        for flight in self.s.flights.iter_mut().filter(|f| f.owner == sess) {
            flight.abandoned = true;
        }
        self.s
            .flights
            .retain(|f| !(f.owner == sess && matches!(f.stage, Stage::Replied(_))));
    }

    /// The server hands out `epoch` (a fence advanced, a lease claimed): it must exceed every
    /// epoch handed out before, whatever a restart rolled back.
    pub(crate) fn hand_out(&mut self, epoch: u64) {
        if epoch <= self.s.granted {
            self.s.broken = Some(Broken::EpochNotIncreasing);
        }
        self.s.granted = self.s.granted.max(epoch);
    }

    /// Puts `event` on the way back to `owner`.
    pub(crate) fn reply(&mut self, owner: Sess, event: Event<Cause>) {
        flight::insert(
            &mut self.s.flights,
            Flight {
                owner,
                stage: Stage::Replied(event),
                abandoned: false,
            },
        );
    }

    /// Whether `sess` belongs to the current run of its replica.
    pub(crate) fn is_current(&self, sess: Sess) -> bool {
        self.s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|replica| replica.run == sess.run)
    }

    /// The server ends `sess`: its lock goes to the next waiter, its wait fails; with `notify`
    /// its client hears of it (the FIN reaches it).
    pub(crate) fn end_session(&mut self, sess: Sess, notify: bool) {
        let server = &mut self.s.server;
        if !server.is_open(sess) {
            return;
        }
        server.sessions.retain(|s| s.owner != sess);
        if server.is_waiting(sess) {
            server.waiters.retain(|w| w.owner != sess);
            if notify && self.is_current(sess) {
                let cause = "session ended while waiting";
                let conn = sess.conn;
                self.reply(sess, Event::LockQueryFailed { conn, cause });
            }
        }
        if self.s.server.holder == Some(sess) {
            self.s.server.holder = None;
            if let Some(replica) = self.s.replicas.get_mut(usize::from(sess.replica))
                && replica.run == sess.run
                && replica.lock_conn == Some(sess.conn)
            {
                replica.lost = Some(sess.conn);
            }
            self.grant_next();
        }
        let lock_session = self
            .s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|r| r.run == sess.run && r.lock_conn == Some(sess.conn));
        let reachable = self
            .s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|r| !r.partitioned);
        if notify && lock_session && reachable {
            let conn = sess.conn;
            self.reply(
                sess,
                Event::SessionEnded {
                    conn,
                    cause: "session ended",
                },
            );
        }
    }

    /// The lock was released: the first waiter gets it, and its wait answers "granted".
    pub(crate) fn grant_next(&mut self) {
        let server = &mut self.s.server;
        if server.holder.is_some() || server.waiters.is_empty() {
            return;
        }
        let waiter = server.waiters.remove(0);
        server.holder = Some(waiter.owner);
        server.queued_grant = Some(waiter.owner);
        if self.model.sabotage != Sabotage::SkipIdleSessionTimeout {
            server.limit_idle(waiter.owner);
        }
        let now = self.s.now;
        server.touch(waiter.owner, now);
        let backend_pid = server.backend_pid(waiter.owner);
        if self.is_current(waiter.owner) {
            let conn = waiter.owner.conn;
            self.reply(waiter.owner, Event::LockGranted { conn, backend_pid });
        }
    }

    /// The next instant anything is due ([`next_instant`]).
    pub(crate) fn next_instant(&self) -> Option<Micros> {
        next_instant(self.model, self.s)
    }

    /// Time passes to the next instant anything is due: the server's timeouts, then every
    /// replica's deadlines, then each leader's fenced write.
    pub(crate) fn advance(&mut self, to: Micros) {
        let delta = to - self.s.now;
        self.s.now = to;
        let stops = self.model.pause_clock == super::PauseClock::Stops;
        for replica in &mut self.s.replicas {
            if !(replica.paused && stops) {
                replica.local += local_delta(delta, replica.rate);
            }
            if !replica.paused && replica.lost.is_some() && replica.machine.is_leader() {
                replica.stale += delta;
            }
        }
        self.server_timeouts();
        if self.model.sabotage == Sabotage::NonDurableLeaseWrite {
            // The WAL writer flushed what was committed by the last instant.
            self.s.server.lease.flush();
            self.s.server.fence.flush();
        }
        for r in 0..self.s.replicas.len() {
            if !self.s.replicas[r].paused && self.s.replicas[r].machine.is_running() {
                self.feed(r, Input::Timeout);
            }
        }
        self.fenced_writes();
    }

    /// The server's own deadlines due now: queued waits time out (55P03), idle lock sessions
    /// end (`idle_session_timeout`, FATAL 57P05).
    fn server_timeouts(&mut self) {
        let now = self.s.now;
        while let Some((at, sess)) = self.s.server.next_wait_timeout()
            && at <= now
        {
            self.s.server.waiters.retain(|w| w.owner != sess);
            self.s.server.touch(sess, now);
            if self.is_current(sess) {
                let conn = sess.conn;
                self.reply(sess, Event::LockWaitTimedOut { conn });
            }
        }
        let idle = self.model.idle_timeout();
        while let Some((at, sess)) = self.s.server.next_idle_end(idle)
            && at <= now
        {
            self.end_session(sess, true);
        }
    }

    /// Every unpaused leader's work writes through the fence with its term's epoch; the fence
    /// refuses an epoch older than the one it holds.
    fn fenced_writes(&mut self) {
        let fence = match self.model.mechanism {
            Mechanism::Advisory => self.s.server.fence.committed,
            Mechanism::Lease => self.s.server.lease.committed.map_or(0, |row| row.epoch),
        };
        let stale_accepted = self.s.replicas.iter().any(|replica| {
            !replica.paused
                && replica.machine.is_leader()
                && replica
                    .epoch
                    .is_some_and(|epoch| epoch >= fence && epoch < self.s.max_epoch)
        });
        if stale_accepted {
            self.s.broken = Some(Broken::StaleWriteAccepted);
        }
    }
}

/// The driver fires the deadlines due at `now` (a sabotaged driver never fires a lease
/// leader's trust deadline).
fn fire(machine: &mut Election<Cause>, now: std::time::Instant, sabotage: Sabotage) {
    if sabotage == Sabotage::UnboundedTrust && machine.timeout_reason() == Some(Timer::LeaseExpiry)
    {
        return;
    }
    machine.handle_timeout(now);
}

/// The next instant anything is due, on the server's clock: a replica's deadline (through its
/// clock's rate), a queued wait's timeout, an idle session's end; and the instants at which a
/// bound would be passed (a leader's lease row expiring, a leader on a lost lock reaching its
/// detection bound), so that a belief outliving its bound is seen in a state even when the
/// leader's own deadline falls later.
pub(crate) fn next_instant(model: &SingleModel, s: &State) -> Option<Micros> {
    let replicas = s.replicas.iter().filter_map(|replica| {
        if replica.paused {
            return None;
        }
        let due = replica.machine.poll_timeout().map(micros)?;
        if model.sabotage == Sabotage::UnboundedTrust
            && replica.machine.timeout_reason() == Some(Timer::LeaseExpiry)
        {
            return None;
        }
        let ahead = due.saturating_sub(replica.local);
        Some(s.now + server_delta(ahead, replica.rate).max(1))
    });
    let server = [
        s.server.next_wait_timeout().map(|(at, _)| at),
        s.server
            .next_idle_end(model.idle_timeout())
            .map(|(at, _)| at),
    ];
    let detection = props::DETECTION_INTERVALS * model.interval();
    let leaders = || {
        s.replicas
            .iter()
            .filter(|r| !r.paused && r.machine.is_leader())
    };
    let bounds = leaders()
        .filter(|r| r.lost.is_some())
        .map(|r| s.now + detection.saturating_sub(r.stale) + 1);
    let expiry = s
        .server
        .lease
        .committed
        .map(|row| row.expires)
        .filter(|at| *at > s.now && leaders().next().is_some());
    replicas
        .chain(server.into_iter().flatten())
        .chain(bounds)
        .chain(expiry)
        .map(|at| at.max(s.now + 1))
        .min()
}
