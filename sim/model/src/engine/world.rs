//! A step applied: the driver feeds inputs to a replica's real machine under the `Machine`
//! contract (deadlines fired before every input, every queued action performed), the wire
//! carries the operations and their answers, and the server's sessions open and end.

use plexsphere_leader_core::{ConnId, Control, Machine};

use super::state::{Cause, State};
use super::{ElectionModel, Mode, Parts, due, steps};
use crate::clock::instant;
use crate::flight::{self, Stage};
use crate::server::Sess;
use crate::step::Step;
use crate::trace::{Input, Line, Recorder};

/// A step being applied: the model's configuration, the state it changes, and the trace being
/// recorded (when printing a path).
pub struct World<'a, M: Parts> {
    /// The model.
    pub model: &'a ElectionModel<M>,
    /// The state the step changes.
    pub s: &'a mut State<M>,
    /// The trace being recorded, if any.
    pub trace: Option<&'a mut Recorder<M::Event>>,
}

impl<'a, M: Parts> World<'a, M> {
    /// A step of `model` on `s`, recorded into `trace` when given.
    pub fn new(
        model: &'a ElectionModel<M>,
        s: &'a mut State<M>,
        trace: Option<&'a mut Recorder<M::Event>>,
    ) -> Self {
        Self { model, s, trace }
    }
}

impl<M: Mode> World<'_, M> {
    /// Applies one step of the checker.
    pub fn step(&mut self, step: Step) {
        let described = self.trace.is_some().then(|| self.describe(step));
        if let Some(trace) = self.trace.as_deref_mut() {
            let index = trace
                .lines()
                .iter()
                .filter(|line| matches!(line, Line::Step { .. }))
                .count()
                + 1;
            trace.push(Line::Step {
                index,
                server: self.s.now,
                step: described.unwrap_or_default(),
            });
        }
        let costs = self.costs(step);
        if costs {
            self.s.faults_left = self.s.faults_left.saturating_sub(1);
        }
        let hold_off = self.model.mode.interval().default_hold_off();
        match step {
            Step::Advance => {
                if let Some(to) = due::next_instant(self.model, self.s) {
                    self.advance(to);
                }
            }
            Step::Deliver(i) => self.deliver(usize::from(i), true),
            Step::Delay(i) => self.deliver(usize::from(i), false),
            Step::Lose(i) => self.lose(usize::from(i)),
            Step::Crash { replica, fin } => self.crash(usize::from(replica), fin),
            Step::Terminate(r) => self.terminate(usize::from(r)),
            Step::Pause(r) => self.s.replicas[usize::from(r)].paused = true,
            Step::Resume(r) => self.resume(usize::from(r)),
            Step::Partition(r) => self.s.replicas[usize::from(r)].partitioned = true,
            Step::Heal(r) => self.s.replicas[usize::from(r)].partitioned = false,
            Step::Stop(r) => self.control(usize::from(r), Control::Cancelled),
            Step::Resign(r) => self.control(usize::from(r), Control::Resign { hold_off }),
            Step::Eligible(r, eligible) => {
                self.control(usize::from(r), Control::SetEligible { eligible });
            }
            Step::Restart => self.restart(true),
            Step::Failover => self.restart(false),
        }
        if costs || step.ends_fault() {
            self.s.quiet_since = self.s.now;
        }
    }

    /// Whether `step` spends one of the path's faults.
    fn costs(&self, step: Step) -> bool {
        let flight = |i: u8| self.s.flights.get(usize::from(i));
        match step {
            Step::Advance => steps::awaited(self.s),
            Step::Deliver(i) => flight(i).is_some_and(|f| f.abandoned),
            Step::Resume(_) | Step::Heal(_) | Step::Eligible(_, true) => false,
            Step::Lose(i) => flight(i).is_some_and(|f| {
                let partitioned = self.s.replicas[usize::from(f.owner.replica)].partitioned;
                !f.abandoned && !partitioned
            }),
            _ => true,
        }
    }

    /// The flight at `i` reaches the server (if it had not) and, when `answer`, its answer is
    /// delivered; otherwise the answer stays on the way.
    fn deliver(&mut self, i: usize, answer: bool) {
        if i >= self.s.flights.len() {
            return;
        }
        let flight = self.s.flights.remove(i);
        let event = match flight.stage {
            Stage::Sent(action) => M::execute(self, flight.owner, &action),
            Stage::Replied(event) => Some(event),
        };
        let Some(event) = event else { return };
        let dropped = flight.abandoned || !self.is_current(flight.owner);
        if dropped || M::ignores(self.model.sabotage, &event) {
            return;
        }
        if answer {
            self.feed(usize::from(flight.owner.replica), Input::Event(event));
        } else {
            self.reply(flight.owner, event);
        }
    }

    /// The flight at `i`, or its answer, is lost.
    fn lose(&mut self, i: usize) {
        if i < self.s.flights.len() {
            let flight = self.s.flights.remove(i);
            M::lost(self, &flight);
        }
    }

    /// `step` as a trace shows it: with the names of the replicas and the operation concerned.
    fn describe(&self, step: Step) -> String {
        let name = |r: u8| {
            self.s
                .replicas
                .get(usize::from(r))
                .map_or(u8::MAX, |replica| replica.name.0)
        };
        let flight = |i: u8| {
            self.s
                .flights
                .get(usize::from(i))
                .map_or_else(String::new, |f| {
                    let what = match &f.stage {
                        Stage::Sent(action) => format!("{action:?}"),
                        Stage::Replied(event) => format!("answer {event:?}"),
                    };
                    let given_up = if f.abandoned { " (given up)" } else { "" };
                    let (replica, run) = (name(f.owner.replica), f.owner.run);
                    format!(" r{replica}.{run}: {what}{given_up}")
                })
        };
        step.describe(name, flight)
    }

    /// Feeds `input` to replica `r` at its clock's now, then performs what it queued.
    pub fn feed(&mut self, r: usize, input: Input<M::Event>) {
        let replica = &self.s.replicas[r];
        let (name, run, at) = (replica.name.0, replica.run, replica.local);
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
        let fire = !M::skips_deadline(sabotage, machine);
        input.give(machine, now, fire);
        self.drain(r);
        // A deadline the input made due at once (a check whose grid time passed while the
        // last one ran): the driver's sleep returns at once.
        let machine = &self.s.replicas[r].machine;
        let due = machine.poll_timeout().is_some_and(|at| at <= now);
        if due && !M::skips_deadline(sabotage, machine) {
            self.feed(r, Input::Timeout);
        }
    }

    /// Performs every action replica `r` queued, then feeds back the answers the model gives
    /// at once (a pooled connection, drained work).
    fn drain(&mut self, r: usize) {
        let mut answers = Vec::new();
        while let Some(action) = self.s.replicas[r].machine.poll_action() {
            if let Some(event) = M::perform(self, r, action) {
                answers.push(event);
            }
        }
        for event in answers {
            self.feed(r, Input::Event(event));
        }
    }

    /// The operator's input `control` to replica `r`.
    fn control(&mut self, r: usize, control: Control) {
        self.feed(r, Input::Event(M::Machine::control(control)));
    }

    /// Replica `r` sends `action` on `conn`: it is on the wire, unless the replica is cut off.
    pub fn send(&mut self, r: usize, conn: ConnId, action: M::Action) {
        if self.s.replicas[r].partitioned {
            return;
        }
        let owner = self.s.replicas[r].sess(r, conn);
        flight::insert(&mut self.s.flights, owner, Stage::Sent(action));
    }

    /// Puts `event` on the way back to `owner`.
    pub fn reply(&mut self, owner: Sess, event: M::Event) {
        flight::insert(&mut self.s.flights, owner, Stage::Replied(event));
    }

    /// Replica `r` opens `conn` (a connection borrowed from the pool).
    pub fn open(&mut self, r: usize, conn: ConnId) {
        let sess = self.s.replicas[r].sess(r, conn);
        let now = self.s.now;
        self.s.server.open(sess, now);
    }

    /// Replica `r` closes `conn`: its operations go, the server ends the session. Returns
    /// whether it was the lock session.
    pub fn close(&mut self, r: usize, conn: ConnId) -> bool {
        let sess = self.s.replicas[r].sess(r, conn);
        self.s.flights.retain(|f| f.owner != sess);
        let replica = &mut self.s.replicas[r];
        let lock_session = replica.lock_conn == Some(conn);
        if lock_session {
            replica.lock_conn = None;
        }
        self.end_session(sess, false);
        lock_session
    }

    /// The operations of `sess` still in flight are given up: any may still reach the server.
    pub fn abandon(&mut self, sess: Sess) {
        for flight in self.s.flights.iter_mut().filter(|f| f.owner == sess) {
            flight.abandoned = true;
        }
        self.s
            .flights
            .retain(|f| !(f.owner == sess && matches!(f.stage, Stage::Replied(_))));
    }

    /// Whether `sess` belongs to the current run of its replica.
    pub fn is_current(&self, sess: Sess) -> bool {
        self.s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|replica| replica.run == sess.run)
    }

    /// The server ends `sess`: its locks go; with `notify` its client hears of it (the FIN
    /// reaches it).
    pub fn end_session(&mut self, sess: Sess, notify: bool) {
        if !self.s.server.is_open(sess) {
            return;
        }
        self.s.server.sessions.retain(|s| s.owner != sess);
        M::release(self, sess, notify);
        let heard = self
            .s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|r| r.run == sess.run && r.lock_conn == Some(sess.conn) && !r.partitioned);
        if notify && heard {
            let cause: Cause = "session ended";
            self.reply(sess, M::Machine::session_ended(sess.conn, cause));
        }
    }
}
