//! The standby's check, whatever the mechanism: the attempt begun (`mechanism.rs` says how),
//! refused, failed or unanswered, and the term that begins when it succeeds.

use super::*;

impl<C> Election<C> {
    /// The check due now: a standby tries the lock, the leader pings its connection.
    pub(super) fn begin_check(&mut self, now: Instant) {
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
        if let Role::Leader(leader) = &running.role {
            let hold = leader.hold;
            self.verify_hold(now, hold, deadline);
        } else {
            let role = self.begin_attempt(now);
            self.set_role(role);
        }
    }

    /// The acquire failed or timed out. A timed-out acquire is abandoned so a connection that
    /// arrives late is never used: nothing ran on it, so it goes back to the pool.
    pub(super) fn on_acquire_failed(&mut self, now: Instant, cause: Cause<C>) {
        if let (Cause::TimedOut(_), Some(conn)) = (&cause, self.open_conn()) {
            self.push(Action::ReturnToPool { conn });
        }
        self.log(LogKind::AcquireFailed, None, Some(cause));
        self.wait_as_standby(now);
    }

    pub(super) fn begin_term(&mut self, now: Instant, hold: Hold, epoch: Option<u64>) {
        self.granted_past_defer_limit();
        let term = self.ids.next_term();
        if let State::Running(running) = &mut self.state {
            // A leader is no candidate: after its term, a new candidacy begins.
            running.candidacy = None;
            running.deferral = None;
        }
        self.push(Action::BeginTerm { term, epoch });
        self.log(LogKind::LeadershipAcquired, Some(term), None);
        let next_check = self.next_check(now);
        let proven_sent_at = self.attempt_sent_at(now);
        self.set_role(Role::Leader(Leader {
            term,
            hold,
            verified_at: now,
            proven_sent_at,
            since: now,
            check: LeaderCheck::Waiting { next_check },
        }));
    }

    /// When the statement that won the term was sent: the grant's (its deadline less its
    /// budget), or the fencing epoch's advance on the lock session (less one interval); `now`
    /// for a lease, whose trust counts from its own claim.
    fn attempt_sent_at(&self, now: Instant) -> Instant {
        let State::Running(running) = &self.state else {
            return now;
        };
        match running.role {
            Role::Standby(Standby::TryingLock { deadline, .. }) => {
                deadline.checked_sub(self.grant_budget()).unwrap_or(now)
            }
            Role::Standby(Standby::Fencing { deadline, .. }) => {
                deadline.checked_sub(self.interval().get()).unwrap_or(now)
            }
            _ => now,
        }
        .min(now)
    }

    /// Another holds the lock: the connection goes back unchanged (a lease's claim kept none).
    pub(super) fn on_refused(&mut self, now: Instant, conn: ConnId) {
        self.held_by_another(now);
        self.give_back_answered(conn);
        self.wait_as_standby(now);
    }

    /// The grant statement failed or did not answer: the lock may be held by this session, so
    /// the connection is closed (the server then releases), never returned to the pool.
    /// A lease's claim holds no connection: one still in flight at its deadline is given up,
    /// and a claim that committed all the same is this run's to claim again at the next check.
    /// The grant statement answered without trying the lock (recovery, a read-only session):
    /// nothing is held, so the connection goes back to the pool, and the check fails.
    pub(super) fn on_not_tried(&mut self, now: Instant, conn: ConnId, cause: Cause<C>) {
        self.push(Action::ReturnToPool { conn });
        self.log(LogKind::AcquireFailed, None, Some(cause));
        self.wait_as_standby(now);
    }

    pub(super) fn on_try_failed(&mut self, now: Instant, conn: ConnId, cause: Cause<C>) {
        self.give_up_attempt(conn, &cause);
        self.log(LogKind::AcquireFailed, None, Some(cause));
        self.wait_as_standby(now);
    }
}
