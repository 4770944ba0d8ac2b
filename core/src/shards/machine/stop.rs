//! The stop protocol of a sharded run: every term ended, handed-over work awaited under the
//! grace, every lock released under the unlock budget, the session closed and the run finished;
//! a panic or drop abandons without unlocking; a lost session loses every shard. The requests
//! from outside the run ([`Control`]) that begin it.

use super::*;

impl<C> ShardedElection<C> {
    pub(super) fn unlocked_all(&mut self, now: Instant) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !matches!(open.busy, Some((Op::UnlockAll, _))) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        let conn = open.conn;
        self.actions.push_back(ShardAction::CloseSession { conn });
        self.after_stop(now);
        Handled::Applied
    }

    /// Every lock is released (or the session is gone) at `now`: the run finishes, or rejoins
    /// (at the hold-off's end, at once when none runs, never while ineligible).
    pub(super) fn after_stop(&mut self, now: Instant) {
        let then = self
            .run()
            .stop
            .as_ref()
            .map_or(AfterStop::Finish, |s| s.then);
        match then {
            AfterStop::Finish => self.finish(),
            AfterStop::Rejoin => {
                let run = self.run();
                run.stop = None;
                run.session = Session::None;
                run.members.clear();
                self.schedule_rejoin(now);
            }
        }
    }

    /// Without a session: the next check is the rejoin, at the hold-off's end (at once when
    /// none runs), and none while ineligible.
    fn schedule_rejoin(&mut self, now: Instant) {
        let eligible = self.eligible;
        let run = self.run();
        // A hold-off that passed while the replica was ineligible is no reason to wait, nor to
        // set a deadline in the past.
        let due = run.held_off_until.map_or(now, |until| until.max(now));
        run.next_check = eligible.then_some(due);
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

    pub(super) fn release_failed(&mut self, now: Instant, cause: Cause<C>) {
        if let Some(conn) = self.run().conn() {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let mut log = ShardLog::new(ShardLogKind::ReleaseFailed, 0);
        log.cause = Some(cause);
        self.log(log);
        self.after_stop(now);
    }

    pub(super) fn work_drained(&mut self, now: Instant, term: TermId) -> Handled {
        let run = self.run();
        // The term's work returned: its work deadline is moot.
        run.overdue.forget(term);
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

    /// A request from outside the run, on a running election.
    pub(super) fn on_control(&mut self, now: Instant, control: Control) -> Handled {
        match control {
            Control::Cancelled => self.cancelled(now),
            Control::Resign { hold_off } => self.resign(now, hold_off),
            Control::SetEligible { eligible } => self.set_eligible(now, eligible),
            Control::Panicked => self.abandon(LossReason::Panicked),
            Control::Dropped => self.abandon(LossReason::Dropped),
        }
    }

    fn cancelled(&mut self, now: Instant) -> Handled {
        let run = self.run();
        if let Some(stop) = &mut run.stop {
            // A resign's release in progress: the run finishes once it is done.
            if stop.then == AfterStop::Rejoin {
                stop.then = AfterStop::Finish;
                return Handled::Applied;
            }
            return Handled::Ignored(Ignored::AlreadyStopping);
        }
        if self.close_unopened() {
            self.finish();
            return Handled::Applied;
        }
        self.begin_stop(now, TermEndCause::Stopped, AfterStop::Finish);
        Handled::Applied
    }

    /// A resign: every shard given up as at a stop, then `hold_off` (at most
    /// [`MAX_HOLD_OFF`](crate::MAX_HOLD_OFF)) without a session.
    ///
    /// During a release that ends in a rejoin (an earlier resign's, an ineligible replica's) the
    /// release goes on and the hold-off (the later end wins) delays the rejoin; during a stop's
    /// release the request is refused as [`Ignored::AlreadyStopping`].
    fn resign(&mut self, now: Instant, hold_off: std::time::Duration) -> Handled {
        let run = self.run();
        let stopping = run.stop.as_ref().map(|stop| stop.then);
        if stopping == Some(AfterStop::Finish) {
            return Handled::Ignored(Ignored::AlreadyStopping);
        }
        run.held_off_until = Some(crate::hold_off::extended(run.held_off_until, now, hold_off));
        if stopping.is_none() {
            self.leave_space(now);
        }
        Handled::Applied
    }

    /// Eligibility set while running: made ineligible, the replica leaves the space as a resign
    /// does (without a hold-off); made eligible, it rejoins at once unless a hold-off runs.
    fn set_eligible(&mut self, now: Instant, eligible: bool) -> Handled {
        if eligible == self.eligible {
            return Handled::Ignored(Ignored::Unchanged);
        }
        self.eligible = eligible;
        let run = self.run();
        if run.stop.is_some() {
            // The release in progress ends with a rejoin (or the run's end) that reads it.
            return Handled::Applied;
        }
        if eligible {
            if matches!(run.session, Session::None) {
                self.schedule_rejoin(now);
            }
        } else {
            self.leave_space(now);
        }
        Handled::Applied
    }

    /// Eligibility set while no run is in progress: kept for the next.
    pub(super) fn keep_eligibility(&mut self, eligible: bool) -> Handled {
        if eligible == self.eligible {
            return Handled::Ignored(Ignored::Unchanged);
        }
        self.eligible = eligible;
        Handled::Applied
    }

    /// Gives up the session and every shard on it, to rejoin later: a stop's release when the
    /// session is open, else the session (if any) closed and the next check put off.
    fn leave_space(&mut self, now: Instant) {
        if self.close_unopened() {
            self.schedule_rejoin(now);
            return;
        }
        self.begin_stop(now, TermEndCause::Resigned, AfterStop::Rejoin);
    }

    /// Closes a session not yet open (being acquired or registered); `true` when no session is
    /// open now, so there is nothing to release.
    fn close_unopened(&mut self) -> bool {
        let run = self.run();
        run.pending_take.clear();
        match run.session {
            Session::None => true,
            Session::Acquiring { conn, .. } | Session::Registering { conn, .. } => {
                run.session = Session::None;
                self.actions.push_back(ShardAction::CloseSession { conn });
                true
            }
            Session::Open(_) => false,
        }
    }

    /// The stop protocol on an open session: every owned term ends with `cause`, their work and
    /// that of handovers in flight is awaited under the stop grace, then every lock is released
    /// at once and the session closed; `then` says what follows.
    fn begin_stop(&mut self, now: Instant, cause: TermEndCause, then: AfterStop) {
        let grace = self.options.grace();
        let run = self.run();
        run.next_check = None;
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
            self.end_term(Some(now), shard, term, cause);
        }
        for &term in owned.values() {
            self.actions.push_back(ShardAction::AwaitWork { term });
        }
        self.run().stop = Some(Stop {
            deadline: now + grace,
            awaiting,
            then,
        });
        self.pump(now);
    }

    fn abandon(&mut self, reason: LossReason) -> Handled {
        let run = self.run();
        run.next_check = None;
        let conn = run.conn();
        self.end_all(None, TermEndCause::Lost(reason));
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

    /// Ends every open term with `cause`, their work deadlines starting at `now` (none when
    /// the run is abandoned); returns how many there were.
    pub(super) fn end_all(&mut self, now: Option<Instant>, cause: TermEndCause) -> usize {
        let run = self.run();
        let owned = std::mem::take(&mut run.owned);
        run.handing.clear();
        run.release.clear();
        run.pending_take.clear();
        for (&shard, &term) in &owned {
            self.end_term(now, shard, term, cause);
        }
        owned.len()
    }

    /// Ends `shard`'s `term` with `cause`; its work deadline starts at `now` (none when the run
    /// is abandoned).
    pub(super) fn end_term(
        &mut self,
        now: Option<Instant>,
        shard: Shard,
        term: TermId,
        cause: TermEndCause,
    ) {
        self.actions
            .push_back(ShardAction::EndTerm { shard, term, cause });
        let deadline = self.options.work_deadline_of();
        if let Some(now) = now {
            self.run().overdue.watch(deadline, now, term);
        }
    }

    /// The first pending work deadline passed.
    pub(super) fn report_overdue(&mut self) {
        let deadline = self.options.work_deadline_of();
        if let Some(overdue) = self.run.as_mut().and_then(|run| run.overdue.pop(deadline)) {
            self.actions.push_back(overdue_work(overdue, false));
        }
    }

    /// The session is lost: every shard's term ends, the session closes, and the next check
    /// opens a new one (a stopping run finishes instead).
    pub(super) fn lose(&mut self, now: Instant, reason: LossReason, cause: Option<Cause<C>>) {
        let conn = self.run().conn();
        let lost = self.end_all(Some(now), TermEndCause::Lost(reason));
        let reprove = self.options.proves_pool();
        let run = self.run();
        run.session = Session::None;
        run.members.clear();
        // The next session may be another server's (a failover): it is proven again.
        run.proved &= !reprove;
        let stopping = run.stop.is_some();
        if let Some(conn) = conn {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let mut log = ShardLog::new(ShardLogKind::SessionLost, lost);
        log.reason = Some(TermEndCause::Lost(reason));
        log.cause = cause;
        self.log(log);
        if stopping {
            self.after_stop(now);
        }
    }

    /// The run is over. Work deadlines still pending come due now: nothing drives the election
    /// after [`ShardAction::Finish`].
    pub(super) fn finish(&mut self) {
        let deadline = self.options.work_deadline_of();
        if let Some(mut run) = self.run.take() {
            for overdue in run.overdue.take_all(deadline) {
                self.actions.push_back(overdue_work(overdue, true));
            }
        }
        self.actions.push_back(ShardAction::Finish);
    }
}

/// The report of `overdue`; `run_finished`: the run finished before its deadline.
fn overdue_work<C>(overdue: Overdue, run_finished: bool) -> ShardAction<C> {
    ShardAction::ReportOverdueWork {
        term: overdue.term,
        abort: overdue.abort,
        run_finished,
    }
}
