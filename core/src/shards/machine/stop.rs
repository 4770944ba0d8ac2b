//! The stop protocol of a sharded run: every term ended, handed-over work awaited under the
//! grace, every lock released under the unlock budget, the session closed and the run finished;
//! a panic or drop abandons without unlocking; a lost session loses every shard.

use super::*;

impl<C> ShardedElection<C> {
    pub(super) fn unlocked_all(&mut self) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !matches!(open.busy, Some((Op::UnlockAll, _))) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        let conn = open.conn;
        self.actions.push_back(ShardAction::CloseSession { conn });
        self.finish();
        Handled::Applied
    }

    pub(super) fn releasing(&mut self) -> bool {
        matches!(
            &self.run().session,
            Session::Open(Open {
                busy: Some((Op::UnlockAll, _)),
                ..
            })
        )
    }

    pub(super) fn release_failed(&mut self, cause: Cause<C>) {
        if let Some(conn) = self.run().conn() {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let mut log = ShardLog::new(ShardLogKind::ReleaseFailed, 0);
        log.cause = Some(cause);
        self.log(log);
        self.finish();
    }

    pub(super) fn work_drained(&mut self, now: Instant, term: TermId) -> Handled {
        let run = self.run();
        let mut applied = false;
        if let Some(stop) = &mut run.stop {
            applied |= stop.awaiting.remove(&term);
        }
        if let Some(handover) = run.handing.values_mut().find(|h| h.term == term)
            && !handover.drained
        {
            handover.drained = true;
            applied = true;
        }
        if !applied {
            return Handled::Ignored(Ignored::Unexpected);
        }
        self.pump(now);
        Handled::Applied
    }

    pub(super) fn handover_overdue(&mut self, now: Instant) {
        let run = self.run();
        let mut late = 0;
        for handover in run.handing.values_mut() {
            if !handover.drained && !handover.warned && handover.overdue_at <= now {
                handover.warned = true;
                late += 1;
            }
        }
        // Called at the earliest such deadline: at least one is late.
        self.log(ShardLog::new(ShardLogKind::HandoverOverdue, late));
    }

    pub(super) fn drain_timed_out(&mut self, now: Instant) {
        let run = self.run();
        let Some(stop) = &mut run.stop else {
            return;
        };
        let late = stop.awaiting.len();
        stop.awaiting.clear();
        self.log(ShardLog::new(ShardLogKind::WorkOutlivedStop, late));
        self.pump(now);
    }

    pub(super) fn cancelled(&mut self, now: Instant) -> Handled {
        let grace = self.options.grace();
        let run = self.run();
        if run.stop.is_some() {
            return Handled::Ignored(Ignored::AlreadyStopping);
        }
        run.next_check = None;
        run.pending_take.clear();
        match run.session {
            Session::None => {
                self.finish();
                return Handled::Applied;
            }
            Session::Acquiring { conn, .. } | Session::Registering { conn, .. } => {
                self.actions.push_back(ShardAction::CloseSession { conn });
                self.finish();
                return Handled::Applied;
            }
            Session::Open(_) => {}
        }
        // Handovers still waiting for their work were asked for it already.
        let mut awaiting: BTreeSet<TermId> = run
            .handing
            .values()
            .filter(|h| !h.drained)
            .map(|h| h.term)
            .collect();
        let owned = std::mem::take(&mut run.owned);
        for (&shard, &term) in &owned {
            awaiting.insert(term);
            self.actions.push_back(ShardAction::EndTerm {
                shard,
                term,
                cause: TermEndCause::Stopped,
            });
        }
        for &term in owned.values() {
            self.actions.push_back(ShardAction::AwaitWork { term });
        }
        self.run().stop = Some(Stop {
            deadline: now + grace,
            awaiting,
        });
        self.pump(now);
        Handled::Applied
    }

    pub(super) fn abandon(&mut self, reason: LossReason) -> Handled {
        let run = self.run();
        run.next_check = None;
        let conn = run.conn();
        self.end_all(TermEndCause::Lost(reason));
        if let Some(conn) = conn {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let kind = if reason == LossReason::Panicked {
            ShardLogKind::AbandonedAfterPanic
        } else {
            ShardLogKind::AbandonedAfterDrop
        };
        self.log(ShardLog::new(kind, 0));
        self.finish();
        Handled::Applied
    }

    /// Ends every open term with `cause`; returns how many there were.
    pub(super) fn end_all(&mut self, cause: TermEndCause) -> usize {
        let run = self.run();
        let owned = std::mem::take(&mut run.owned);
        run.handing.clear();
        run.release.clear();
        run.pending_take.clear();
        for (&shard, &term) in &owned {
            self.actions
                .push_back(ShardAction::EndTerm { shard, term, cause });
        }
        owned.len()
    }

    /// The session is lost: every shard's term ends, the session closes, and the next check
    /// opens a new one (a stopping run finishes instead).
    pub(super) fn lose(&mut self, _now: Instant, reason: LossReason, cause: Option<Cause<C>>) {
        let conn = self.run().conn();
        let lost = self.end_all(TermEndCause::Lost(reason));
        let run = self.run();
        run.session = Session::None;
        run.members.clear();
        let stopping = run.stop.is_some();
        if let Some(conn) = conn {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let mut log = ShardLog::new(ShardLogKind::SessionLost, lost);
        log.reason = Some(TermEndCause::Lost(reason));
        log.cause = cause;
        self.log(log);
        if stopping {
            self.finish();
        }
    }

    pub(super) fn finish(&mut self) {
        self.run = None;
        self.actions.push_back(ShardAction::Finish);
    }
}
