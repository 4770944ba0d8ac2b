//! The stop protocol: every term ended, leader work awaited under the grace, the lock
//! released under the unlock budget, the connection closed and the run finished; a panic or drop
//! abandons without unlocking; work deadlines of ended terms.

use super::*;

impl<C> Election<C> {
    /// The first pending work deadline passed.
    pub(super) fn report_overdue(&mut self) {
        if let Some(overdue) = self.overdue.pop(self.options.work_deadline_of()) {
            self.push(overdue_work(overdue, false));
        }
    }

    /// A term ended: its work deadline, if the options set one, starts now.
    pub(super) fn watch_work(&mut self, now: Instant, term: TermId) {
        self.overdue
            .watch(self.options.work_deadline_of(), now, term);
    }

    /// A stop request: a standby stops at once; a leader ends its term, gives its work the stop
    /// grace to return, then releases the lock under [`UNLOCK_BUDGET`]. A resign in progress
    /// finishes instead of going back to standby.
    pub(super) fn cancel(&mut self, now: Instant) {
        let State::Running(running) = &mut self.state else {
            return;
        };
        match &mut running.role {
            Role::Draining(Draining { then, .. }) | Role::Releasing(Releasing { then, .. }) => {
                *then = AfterRelease::Finish;
            }
            Role::Leader(leader) => {
                let term = leader.term;
                self.give_up(now, term, TermEndCause::Stopped, AfterRelease::Finish);
            }
            Role::Standby(_) => {
                self.close_open_conn();
                self.finish();
            }
        }
    }

    /// Gives leadership up on purpose and stays a standby: a leader ends its term as
    /// [`TermEndCause::Resigned`] and releases the lock after the stop grace; a standby abandons
    /// a check in progress (closing its connection, which may already carry the lock) and waits.
    pub(super) fn step_down(&mut self, now: Instant) {
        let State::Running(running) = &self.state else {
            return;
        };
        match &running.role {
            Role::Leader(leader) => {
                let term = leader.term;
                self.give_up(
                    now,
                    term,
                    TermEndCause::Resigned,
                    AfterRelease::Standby(TermEndCause::Resigned),
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
    pub(super) fn give_up(
        &mut self,
        now: Instant,
        term: TermId,
        cause: TermEndCause,
        then: AfterRelease,
    ) {
        let Some(leader) = self.leader_mut() else {
            return;
        };
        let hold = leader.hold;
        if let (LeaderCheck::Renewing { conn, .. } | LeaderCheck::Probing { conn, .. }, None) =
            (&leader.check, hold.session_conn())
        {
            let conn = *conn;
            // The release's compare-and-set decides; a renewal in flight is moot.
            self.push(Action::ReturnToPool { conn });
        }
        self.push(Action::EndTerm { term, cause });
        self.watch_work(now, term);
        if cause == TermEndCause::Resigned {
            self.log(LogKind::Resigned, Some(term), None);
        }
        let grace = self.options.grace();
        if grace.is_zero() {
            self.set_role(Role::Draining(Draining {
                term,
                hold,
                deadline: now,
                then,
            }));
            self.release(now);
        } else {
            self.push(Action::AwaitWork { term });
            self.set_role(Role::Draining(Draining {
                term,
                hold,
                deadline: now + grace,
                then,
            }));
        }
    }

    /// The work of the stopped term returned, or its grace is over: unlock, or expire the
    /// lease.
    pub(super) fn release(&mut self, now: Instant) {
        let Some((term, hold, then)) = self
            .draining()
            .map(|draining| (draining.term, draining.hold, draining.then))
        else {
            return;
        };
        let conn = self.release_hold(hold);
        self.set_role(Role::Releasing(Releasing {
            term,
            hold,
            conn,
            deadline: now + UNLOCK_BUDGET,
            then,
        }));
    }

    /// The release completed (`None`) or could not be confirmed: close, log, then finish or
    /// (after a resign) wait as a standby.
    pub(super) fn finish_release(&mut self, now: Instant, failure: Option<Cause<C>>) {
        let State::Running(Running {
            role: Role::Releasing(releasing),
            ..
        }) = &self.state
        else {
            return;
        };
        let (term, hold, conn, then) = (
            releasing.term,
            releasing.hold,
            releasing.conn,
            releasing.then,
        );
        self.after_release_statement(hold, conn, failure.as_ref());
        match (failure, then) {
            (None, AfterRelease::Finish) => self.log(LogKind::LockReleased, Some(term), None),
            (None, AfterRelease::Standby(TermEndCause::Yielded)) => {
                self.log(LogKind::YieldReleased, Some(term), None);
            }
            (None, AfterRelease::Standby(_)) => self.log(LogKind::ResignReleased, Some(term), None),
            (Some(cause), _) => self.log(LogKind::ReleaseFailed, Some(term), Some(cause)),
        }
        self.after_release(now, then);
    }

    pub(super) fn after_release(&mut self, now: Instant, then: AfterRelease) {
        match then {
            AfterRelease::Finish => self.finish(),
            AfterRelease::Standby(_) => self.wait_as_standby(now),
        }
    }

    /// A panic or a drop: end an open term as lost, close any connection without unlocking (it
    /// may be mid-query), and finish.
    pub(super) fn abandon(&mut self, how: Abandon) {
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
    pub(super) fn finish(&mut self) {
        for overdue in self.overdue.take_all(self.options.work_deadline_of()) {
            self.push(overdue_work(overdue, true));
        }
        self.push(Action::Finish);
        self.state = State::Idle;
    }

    /// Waits for the next check, or for the end of a hold-off when that comes later.
    pub(super) fn wait_as_standby(&mut self, now: Instant) {
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
}

/// The report of `overdue`; `run_finished`: the run finished before its deadline.
fn overdue_work<C>(overdue: Overdue, run_finished: bool) -> Action<C> {
    Action::ReportOverdueWork {
        term: overdue.term,
        abort: overdue.abort,
        run_finished,
    }
}
