//! The leader's check, whatever the mechanism: a check that proved the hold, one that failed
//! or did not answer, and the demotions (a disproving check, the lock session's end).

use super::*;

impl<C> Election<C> {
    /// The check proved the lock: the fitness probe follows within the check's deadline, when
    /// the election probes; else the next check is awaited.
    pub(super) fn on_ping_ok(&mut self, now: Instant) {
        let Some(leader) = self.leader_mut() else {
            return;
        };
        leader.verified_at = now;
        if let LeaderCheck::Pinging { sent_at, .. } = leader.check {
            leader.proven_sent_at = sent_at;
        }
        let deadline = match leader.check {
            LeaderCheck::Pinging { deadline, .. } | LeaderCheck::Renewing { deadline, .. } => {
                deadline
            }
            LeaderCheck::Waiting { .. } | LeaderCheck::Probing { .. } => now,
        };
        if self.options.probes_fitness() {
            self.probe_as_leader(deadline);
        } else {
            self.after_verified(now, deadline);
        }
    }

    /// The leader's check is over: the next one is awaited.
    pub(super) fn after_leader_check(&mut self, now: Instant) {
        let next_check = self.next_check(now);
        if let Some(leader) = self.leader_mut() {
            leader.check = LeaderCheck::Waiting { next_check };
        }
    }

    /// The leader's check failed or did not answer: the advisory lock is no longer proven, so
    /// the term is lost; a lease is still trusted, so the renewal is retried at the next check.
    pub(super) fn on_check_failed(&mut self, now: Instant, cause: Cause<C>) {
        let Some(leader) = self.leader_mut() else {
            return;
        };
        match leader.check {
            LeaderCheck::Renewing { conn, .. } => {
                let timed_out = matches!(cause, Cause::TimedOut(_));
                self.retry_renewal(now, conn, timed_out, cause);
            }
            _ => self.lose_unproven(now, cause),
        }
    }

    /// The advisory lock's check failed (`CheckFailed`) or did not answer (`CheckTimedOut`):
    /// the lock is no longer proven, so the term is lost.
    pub(super) fn lose_unproven(&mut self, now: Instant, cause: Cause<C>) {
        let reason = match cause {
            Cause::TimedOut(_) => LossReason::CheckTimedOut,
            _ => LossReason::CheckFailed,
        };
        self.demote(now, reason, cause);
    }

    /// The leader's check failed: end the term, close the connection, log, become a standby.
    pub(super) fn demote(&mut self, now: Instant, reason: LossReason, cause: Cause<C>) {
        let next_check = self.next_check(now);
        self.demote_until(now, next_check, reason, cause);
    }

    /// [`demote`](Self::demote), with the standby's first check at `next_check`.
    pub(super) fn demote_until(
        &mut self,
        now: Instant,
        next_check: Instant,
        reason: LossReason,
        cause: Cause<C>,
    ) {
        let Some(term) = self.leader_mut().map(|leader| leader.term) else {
            return;
        };
        self.push(Action::EndTerm {
            term,
            cause: TermEndCause::Lost(reason),
        });
        self.watch_work(now, term);
        self.close_open_conn();
        self.log(LogKind::LeadershipLost, Some(term), Some(cause));
        // The next session may be another server's (a failover, a re-routed connection): the
        // next term is proven again.
        let reprove = self.options.proves_pool();
        if let State::Running(running) = &mut self.state {
            running.pool_proved &= !reprove;
        }
        self.set_role(Role::Standby(Standby::Waiting { next_check }));
    }

    /// The lock session ended on its own: a leader demotes at once and tries again no sooner
    /// than one interval later; a stop in progress
    /// finishes (the server released the lock); a fencing leader-to-be gives up.
    pub(super) fn on_session_ended(&mut self, now: Instant, cause: Cause<C>) {
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
                term, hold, then, ..
            })
            | Role::Releasing(Releasing {
                term, hold, then, ..
            }) => {
                // Only the end of the stop's lock session gets here (`role::accepts`): a
                // lease's stop holds none.
                let (term, conn, then) = (*term, hold.session_conn(), *then);
                if let Some(conn) = conn {
                    self.push(Action::CloseConnection { conn });
                }
                self.log(LogKind::SessionEndedWhileStopping, Some(term), Some(cause));
                self.after_release(now, then);
            }
            Role::Standby(_) => {}
        }
    }
}
