//! The fitness probe ([`Options::probe_fitness`]): before each attempt, and after each of the
//! leader's checks that proved its hold, the service's probe says whether this replica can do
//! the leader's work. A refusal makes the replica unfit: a standby makes no attempt and a
//! leader gives its term up ([`TermEndCause::Unfit`]) until a probe passes again.

use super::*;

impl<C> Election<C> {
    /// A standby's check is about to make its attempt on `conn`: the probe runs first.
    pub(super) fn probe_before_attempt(&mut self, now: Instant, conn: ConnId) -> Role {
        self.push(Action::ProbeFitness { conn });
        Role::Standby(Standby::Probing {
            conn,
            deadline: now + self.interval().get(),
            step: Step::Fitness,
        })
    }

    /// The leader's check proved its hold: the probe runs, within the check's `deadline`, on
    /// the lock session or (a lease) as an operation of its own.
    pub(super) fn probe_as_leader(&mut self, deadline: Instant) {
        let Some(hold) = self.leader_mut().map(|leader| leader.hold) else {
            return;
        };
        let conn = match hold.session_conn() {
            Some(session) => session,
            None => self.next_conn(),
        };
        self.push(Action::ProbeFitness { conn });
        if let Some(leader) = self.leader_mut() {
            leader.check = LeaderCheck::Probing {
                conn,
                deadline,
                step: Step::Fitness,
            };
        }
    }

    /// The probe passed: a standby makes its attempt, a leader waits for its next check.
    pub(super) fn on_fit(&mut self, now: Instant, conn: ConnId) {
        let State::Running(running) = &mut self.state else {
            return;
        };
        if std::mem::take(&mut running.unfit) {
            self.log(LogKind::FitAgain, None, None);
        }
        let State::Running(running) = &self.state else {
            return;
        };
        match running.role {
            Role::Leader(Leader {
                check: LeaderCheck::Probing { deadline, .. },
                ..
            }) => self.after_verified(now, deadline),
            Role::Leader(_) => self.after_leader_check(now),
            Role::Standby(_) => self.prepare_attempt(now, conn),
            Role::Draining(_) | Role::Releasing(_) => {}
        }
    }

    /// The server refused the probe: the replica is unfit. A standby gives its connection
    /// back and waits; a leader gives its term up and stays a standby.
    pub(super) fn on_unfit(&mut self, now: Instant, conn: ConnId, cause: C) {
        let State::Running(running) = &mut self.state else {
            return;
        };
        running.unfit = true;
        match &running.role {
            Role::Leader(leader) => {
                let term = leader.term;
                if let Some(leader) = self.leader_mut() {
                    // The probe answered: nothing is left in flight on its connection.
                    leader.check = LeaderCheck::Waiting { next_check: now };
                }
                self.log(LogKind::Unfit, Some(term), Some(Cause::Error(cause)));
                self.give_up(
                    now,
                    term,
                    TermEndCause::Unfit,
                    AfterRelease::Standby(TermEndCause::Unfit),
                );
            }
            Role::Standby(_) => {
                self.give_back_answered(conn);
                self.log(LogKind::Unfit, None, Some(Cause::Error(cause)));
                self.wait_as_standby(now);
            }
            Role::Draining(_) | Role::Releasing(_) => {}
        }
    }

    /// The probe, or the survey, did not answer (it failed, or its deadline passed): nothing is learnt. A
    /// standby's check ends as a failed one; a leader's check fails as a check that did not
    /// answer would (an advisory lock session in an unknown state ends the term, a lease is
    /// still trusted until its window ends).
    pub(super) fn on_probe_failed(&mut self, now: Instant, cause: Cause<C>) {
        let State::Running(running) = &self.state else {
            return;
        };
        let kind = match running.role {
            Role::Standby(Standby::Probing {
                step: Step::Survey, ..
            })
            | Role::Leader(Leader {
                check:
                    LeaderCheck::Probing {
                        step: Step::Survey, ..
                    },
                ..
            }) => LogKind::SurveyFailed,
            _ => LogKind::ProbeFailed,
        };
        // A lease's probe that answered left nothing in flight; one that did not is given up.
        let in_flight = matches!(cause, Cause::TimedOut(_)) || self.answered_leaves_conn();
        // A survey the server answered with an error (a missing floor table) left the lock
        // session as it was: the term goes on, as a lease's does.
        let answered_survey = kind == LogKind::SurveyFailed && matches!(cause, Cause::Error(_));
        match running.role {
            Role::Leader(Leader { hold, .. })
                if hold.session_conn().is_none() || answered_survey =>
            {
                if in_flight && hold.session_conn().is_none() {
                    self.close_open_conn();
                }
                let term = self.leader_mut().map(|leader| leader.term);
                self.after_leader_check(now);
                self.log(kind, term, Some(cause));
            }
            Role::Leader(_) => self.lose_unproven(now, cause),
            Role::Standby(_) => {
                if in_flight {
                    self.close_open_conn();
                }
                self.log(kind, None, Some(cause));
                self.wait_as_standby(now);
            }
            Role::Draining(_) | Role::Releasing(_) => {}
        }
    }

    /// Whether the last probe was refused.
    pub fn is_unfit(&self) -> bool {
        matches!(&self.state, State::Running(running) if running.unfit)
    }
}
