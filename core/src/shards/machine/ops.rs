//! The statement in flight on the lock session: the next one issued under its deadline, and its
//! failure or timeout.

use super::*;

impl<C> ShardedElection<C> {
    pub(super) fn statement_failed(
        &mut self,
        now: Instant,
        cause: C,
        session_ended: bool,
    ) -> Handled {
        let run = self.run();
        match &run.session {
            Session::Registering { .. } => {}
            Session::Open(open) if open.busy.is_some() => {}
            _ => return Handled::Ignored(Ignored::Unexpected),
        }
        if self.releasing() {
            self.release_failed(now, Cause::Error(cause));
            return Handled::Applied;
        }
        if self.survives_statement_failure() {
            self.lease_statement_failed(now, Cause::Error(cause));
            return Handled::Applied;
        }
        if !session_ended && let Some(asked) = self.fencing() {
            // The grant stands, the epochs do not: release those shards, keep the session.
            self.fencing_failed(asked, Some(Cause::Error(cause)));
            self.pump(now);
            return Handled::Applied;
        }
        let reason = if session_ended {
            LossReason::SessionEnded
        } else {
            LossReason::CheckFailed
        };
        self.lose(now, reason, Some(Cause::Error(cause)));
        Handled::Applied
    }

    pub(super) fn statement_timed_out(&mut self, now: Instant) {
        if self.releasing() {
            self.release_failed(now, Cause::TimedOut(UNLOCK_BUDGET));
            return;
        }
        let interval = self.options.interval().get();
        if self.survives_statement_failure() {
            self.lease_statement_failed(now, Cause::TimedOut(interval));
            return;
        }
        self.lose(
            now,
            LossReason::CheckTimedOut,
            Some(Cause::TimedOut(interval)),
        );
    }

    /// Starts the next statement when the session is free: the final release when stopping,
    /// else the pending take, the drained handovers' unlock, then a due survey.
    pub(super) fn pump(&mut self, now: Instant) {
        let interval = self.options.interval().get();
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return;
        };
        if open.busy.is_some() {
            return;
        }
        let (op, deadline) = if let Some(stop) = &run.stop {
            if !stop.awaiting.is_empty() {
                return;
            }
            (Op::UnlockAll, now + UNLOCK_BUDGET)
        } else if !run.pending_take.is_empty() {
            (
                Op::Take(std::mem::take(&mut run.pending_take)),
                now + interval,
            )
        } else if (run.handing.values().any(|h| h.drained) || !run.release.is_empty())
            && !open.release_held_off
        {
            let mut unlock: Vec<Shard> = run
                .handing
                .iter()
                .filter(|(_, h)| h.drained)
                .map(|(s, _)| *s)
                .chain(run.release.iter().copied())
                .collect();
            unlock.sort_unstable();
            (Op::Unlock(unlock), now + interval)
        } else if open.renew_due {
            open.renew_due = false;
            (Op::Renew(now), now + interval)
        } else if open.survey_due {
            open.survey_due = false;
            (Op::Survey, now + interval)
        } else {
            return;
        };
        self.issue(op, deadline);
    }

    /// Runs `op` on the open session, answered by `deadline`: the one place a statement starts.
    pub(super) fn issue(&mut self, op: Op, deadline: Instant) {
        let Session::Open(open) = &mut self.run().session else {
            return;
        };
        let conn = open.conn;
        let joined_floor = open.joined_floor;
        open.busy = Some((op.clone(), deadline));
        let action = self.action_of(conn, op, joined_floor);
        self.actions.push_back(action);
    }
}
