//! The lock session: a connection for it, the registration (the member lock), and their
//! failures.

use super::*;

impl<C> ShardedElection<C> {
    pub(super) fn check(&mut self, now: Instant) {
        let eligible = self.eligible;
        let run = self.run();
        run.schedule.begin(now);
        run.next_check = Some(run.schedule.next_after(now));
        if matches!(run.session, Session::None) {
            // Every hold-off puts the next check at its end, so a check without a session is
            // never early: the hold-off is over.
            run.held_off_until = None;
            if !eligible {
                run.next_check = None;
                return;
            }
        }
        match &mut run.session {
            Session::None => self.begin_join(now),
            Session::Open(_) => {
                self.check_due();
                self.pump(now);
            }
            Session::Acquiring { .. } | Session::Registering { .. } => {}
        }
    }

    pub(super) fn acquired(&mut self, now: Instant) -> Handled {
        let interval = self.options.interval();
        let run = self.run();
        let Session::Acquiring {
            conn,
            proving: false,
            ..
        } = run.session
        else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        run.session = Session::Registering {
            conn,
            since: now,
            deadline: now + interval.get(),
        };
        self.actions.push_back(ShardAction::Register {
            conn,
            idle_session_timeout_ms: interval.idle_session_timeout_millis(),
        });
        Handled::Applied
    }

    /// The exclusion proof answered ([`crate::proof`]): proven, the lock session is borrowed
    /// at once; inconclusive, nothing this check (WARN), and the next proves again; refuted,
    /// the run fails before any shard (ERROR).
    pub(super) fn pool_probed(
        &mut self,
        now: Instant,
        proof: crate::proof::PoolProof<C>,
    ) -> Handled {
        let run = self.run();
        if !matches!(run.session, Session::Acquiring { proving: true, .. }) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        run.session = Session::None;
        match proof.verdict() {
            crate::proof::Verdict::Proven => {
                self.run().proved = true;
                self.begin_join(now);
            }
            crate::proof::Verdict::Inconclusive(why) => {
                let mut log = ShardLog::new(ShardLogKind::ProofInconclusive, 0);
                log.cause = Some(Cause::Unproven(why));
                self.log(log);
            }
            crate::proof::Verdict::Refuted(finding) => {
                let mut log = ShardLog::new(ShardLogKind::ProofRefuted, 0);
                log.cause = Some(Cause::LockNotVerified(finding));
                self.log(log);
                self.actions
                    .push_back(ShardAction::Fail(ShardFailure::Refuted(finding)));
                self.finish();
            }
        }
        Handled::Applied
    }

    pub(super) fn acquire_failed(&mut self, cause: Cause<C>) -> Handled {
        let run = self.run();
        if !matches!(run.session, Session::Acquiring { .. }) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        run.session = Session::None;
        let mut log = ShardLog::new(ShardLogKind::AcquireFailed, 0);
        log.cause = Some(cause);
        self.log(log);
        Handled::Applied
    }

    pub(super) fn acquire_timed_out(&mut self, _now: Instant) {
        let interval = self.options.interval().get();
        let run = self.run();
        let Session::Acquiring { conn, .. } = run.session else {
            return;
        };
        run.session = Session::None;
        self.actions.push_back(ShardAction::CloseSession { conn });
        let mut log = ShardLog::new(ShardLogKind::AcquireFailed, 0);
        log.cause = Some(Cause::TimedOut(interval));
        self.log(log);
    }

    pub(super) fn registered(
        &mut self,
        now: Instant,
        backend: MemberId,
        granted: bool,
        lock_capacity: u64,
        members: u32,
    ) -> Handled {
        let options = self.options;
        let run = self.run();
        let Session::Registering { conn, since, .. } = run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !granted {
            run.session = Session::None;
            self.actions.push_back(ShardAction::CloseSession { conn });
            self.log(ShardLog::new(ShardLogKind::MemberLockRefused, 0));
            return Handled::Applied;
        }
        if let Err(too_small) = options.check_lock_table(lock_capacity, members) {
            self.actions.push_back(ShardAction::CloseSession { conn });
            self.actions
                .push_back(ShardAction::Fail(ShardFailure::LockTableTooSmall(
                    too_small,
                )));
            self.finish();
            return Handled::Applied;
        }
        let trusted_until = self.trust_after(since);
        // A lease's registration took the join's step on the floor; an advisory member's first
        // survey takes it.
        let joined_floor = self.mechanism().lease().is_some();
        let run = self.run();
        run.session = Session::Open(Open {
            conn,
            backend,
            joined_at: run.schedule.current(),
            verified_at: now,
            busy: None,
            survey_due: true,
            joined_floor,
            renew_due: false,
            release_held_off: false,
            trusted_until,
        });
        self.after_join(conn, backend);
        self.log(ShardLog::new(ShardLogKind::Joined, 0));
        self.pump(now);
        Handled::Applied
    }
}
