//! The lease mechanism's answers: a renewal (which keeps the member's trust and says whether
//! to survey), a take (whose shards come with their epochs), a statement that failed or did
//! not answer, and the end of the trust.

use super::*;

impl<C> ShardedElection<C> {
    pub(super) fn renewed(
        &mut self,
        now: Instant,
        renewed: bool,
        members: Vec<MemberId>,
    ) -> Handled {
        let Session::Open(open) = &mut self.run().session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Renew(sent_at), _)) = open.busy else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        open.busy = None;
        if !renewed {
            self.lose(now, LossReason::LeaseExpired, None);
            return Handled::Applied;
        }
        let trusted_until = self.trust_after(sent_at);
        let run = self.run();
        let changed = members != run.members;
        if changed {
            run.members = members;
            run.members_since = run.schedule.current();
        }
        let settled = run.settled;
        if let Session::Open(open) = &mut run.session {
            open.trusted_until = trusted_until;
            open.verified_at = now;
            open.survey_due |= changed || !settled;
        }
        self.pump(now);
        Handled::Applied
    }

    pub(super) fn took_leases(
        &mut self,
        now: Instant,
        live: bool,
        taken: &[(Shard, u64)],
    ) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Take(asked), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !live {
            self.lose(now, LossReason::LeaseExpired, None);
            return Handled::Applied;
        }
        if run.stop.is_some() {
            // Stopping: the leave that follows frees whatever was taken; no term begins.
            self.pump(now);
            return Handled::Applied;
        }
        self.begin_terms(
            taken
                .iter()
                .filter(|(shard, _)| asked.contains(shard))
                .map(|&(shard, epoch)| (shard, Some(epoch))),
        );
        self.pump(now);
        Handled::Applied
    }

    /// A lease statement failed or did not answer by its deadline: the member goes on. A take
    /// in an unknown state (unanswered: it may still commit) loses every shard, so that no
    /// shard is owned on the server without a term; a failed take changed nothing (its
    /// transaction rolled back), and the other statements are retried at the next check (a
    /// release too: it stays pending, held off until then).
    pub(super) fn lease_statement_failed(&mut self, now: Instant, cause: Cause<C>) {
        let unanswered = matches!(cause, Cause::TimedOut(_));
        let fresh = self.next_conn();
        let Session::Open(open) = &mut self.run().session else {
            // The registration: a new member at the next check.
            self.run().session = Session::None;
            let mut log = ShardLog::new(ShardLogKind::LeaseStatementFailed, 0);
            log.cause = Some(cause);
            self.log(log);
            return;
        };
        let op = open.busy.take();
        if matches!(op, Some((Op::Unlock(_), _))) {
            open.release_held_off = true;
        }
        if unanswered && matches!(op, Some((Op::Take(_), _))) {
            self.lose(now, LossReason::CheckTimedOut, Some(cause));
            return;
        }
        if unanswered {
            // The statement may still run and answer later: its answer must not be taken for
            // the next statement's (a late renewal's answer would extend the trust from the
            // newer send, past the row's expiry: found by the model check's sharded lease
            // model). The member's statements go on under a new id, so an answer to the old
            // one is stale.
            open.conn = fresh;
        }
        let mut log = ShardLog::new(ShardLogKind::LeaseStatementFailed, 0);
        log.cause = Some(cause);
        self.log(log);
        self.pump(now);
    }

    /// The trust of the last successful renewal ran out: every shard is lost (the server may
    /// reap the member and hand its shards to others from the lease's expiry on).
    pub(super) fn trust_ran_out(&mut self, now: Instant) {
        self.lose(now, LossReason::LeaseExpired, None);
    }
}
