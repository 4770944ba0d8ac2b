//! The standby's check and the grant: a connection, the lock tried (or waited for in the
//! server's queue), a session found marked or stranded, the epoch of a fencing grant, and the
//! term that begins on the lock session.

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
            self.begin_leader_check(now, hold, deadline);
        } else {
            let role = self.begin_standby_check(now);
            self.set_role(role);
        }
    }

    /// The leader's check: the advisory lock is verified on its session, a lease renewed.
    fn begin_leader_check(&mut self, now: Instant, hold: Hold, deadline: Instant) {
        let check = match (hold, self.options.lease_of()) {
            (Hold::Session { conn, backend_pid }, _) => {
                self.push(Action::Ping { conn, backend_pid });
                LeaderCheck::Pinging { deadline }
            }
            (Hold::Lease { epoch, .. }, Some(lease)) => {
                let conn = self.next_conn();
                self.push(Action::RenewLease {
                    conn,
                    epoch,
                    ttl_ms: lease.ttl_millis(),
                });
                LeaderCheck::Renewing {
                    conn,
                    sent_at: now,
                    deadline,
                }
            }
            // Unreachable: a lease term exists only with lease options.
            (Hold::Lease { .. }, None) => return,
        };
        if let Some(leader) = self.leader_mut() {
            leader.check = check;
        }
    }

    pub(super) fn begin_standby_check(&mut self, now: Instant) -> Role {
        if self.options.lease_of().is_some() {
            if self.options.probes_fitness() {
                let conn = self.next_conn();
                return self.probe_before_attempt(now, conn);
            }
            return self.claim(now);
        }
        let conn = self.next_conn();
        let deadline = now + self.interval().get();
        if !self.pool_proved() {
            // Half an interval for the second connection: the proof's answer is due in one.
            let second_within = self.interval().get() / 2;
            self.push(Action::ProbePool {
                conn,
                second_within,
            });
            return Role::Standby(Standby::ProvingPool { conn, deadline });
        }
        self.push(Action::AcquireConnection { conn });
        Role::Standby(Standby::Acquiring { conn, deadline })
    }

    /// A lease's claim, as an operation of its own.
    pub(super) fn claim(&mut self, now: Instant) -> Role {
        let conn = self.next_conn();
        let ttl_ms = self
            .options
            .lease_of()
            .map_or(0, |lease| lease.ttl_millis());
        self.push(Action::ClaimLease { conn, ttl_ms });
        Role::Standby(Standby::Claiming {
            conn,
            sent_at: now,
            deadline: now + self.interval().get(),
        })
    }

    /// Whether the run's pool is proven its own (or needs no proof).
    fn pool_proved(&self) -> bool {
        match &self.state {
            State::Running(running) => running.pool_proved,
            State::Idle => true,
        }
    }

    /// The pool proof answered: two backends (or no second connection: a pool of one, which
    /// cannot hand one client's statements to another), and the check goes on to its grant;
    /// one backend for both, and the run fails before any term (a multiplexing pooler).
    pub(super) fn on_pool_probed(&mut self, now: Instant, first: i32, second: Option<i32>) {
        if second == Some(first) {
            let finding = crate::cause::LockFinding::PoolSharesBackend { backend_pid: first };
            self.log(
                LogKind::PoolMultiplexes,
                None,
                Some(Cause::LockNotVerified(finding)),
            );
            self.push(Action::Fail(finding));
            self.finish();
            return;
        }
        if let State::Running(running) = &mut self.state {
            running.pool_proved = true;
        }
        let role = self.begin_standby_check(now);
        self.set_role(role);
    }

    /// A connection came: try the lock (poll mode) or queue for it (queue mode).
    /// The fitness probe runs first on it, when the election probes.
    pub(super) fn on_acquired(&mut self, now: Instant, conn: ConnId) {
        if self.options.probes_fitness() {
            let role = self.probe_before_attempt(now, conn);
            self.set_role(role);
        } else {
            self.try_lock_on(now, conn, false);
        }
    }

    /// Tries the lock (poll mode) or queues for it (queue mode) on the borrowed `conn`.
    pub(super) fn try_lock_on(&mut self, now: Instant, conn: ConnId, after_stranded: bool) {
        match self.options.acquire_mode() {
            AcquireMode::Poll => self.push(Action::TryLock { conn }),
            AcquireMode::Queue => self.push(Action::WaitForLock {
                conn,
                lock_timeout_ms: self.options.lock_timeout_millis(),
            }),
        }
        let deadline = now + self.grant_budget();
        self.set_role(Role::Standby(Standby::TryingLock {
            conn,
            deadline,
            after_stranded,
        }));
    }

    /// The grant found the session already holding the lock. A leader's check proved it there
    /// within [`CheckInterval::stranded_after_secs`]: a live client shares the server session
    /// (transaction mode), so the connection is closed and the check fails naming that. Else
    /// the lock was stranded by a vanished client (a pooler without a reset query): it is
    /// released on this same session and the check goes on, once per check.
    pub(super) fn on_held_by_session(
        &mut self,
        now: Instant,
        conn: ConnId,
        checked_secs_ago: Option<u64>,
    ) {
        let State::Running(Running {
            role:
                Role::Standby(Standby::TryingLock {
                    deadline,
                    after_stranded,
                    ..
                }),
            ..
        }) = &self.state
        else {
            return;
        };
        let (deadline, after_stranded) = (*deadline, *after_stranded);
        match checked_secs_ago {
            Some(age) if age <= self.interval().stranded_after_secs() => {
                self.on_try_failed(
                    now,
                    conn,
                    Cause::SessionShared {
                        checked_secs_ago: age,
                    },
                );
            }
            _ if after_stranded => self.on_try_failed(now, conn, Cause::StrandedLockKept),
            _ => {
                self.push(Action::ReleaseIfHeld { conn });
                self.set_role(Role::Standby(Standby::ReleasingIfHeld {
                    conn,
                    deadline,
                    stranded: true,
                }));
            }
        }
    }

    /// The release after a timed-out wait or a stranded lock answered.
    pub(super) fn on_released_if_held(&mut self, now: Instant, conn: ConnId, released: bool) {
        let stranded = matches!(
            &self.state,
            State::Running(Running {
                role: Role::Standby(Standby::ReleasingIfHeld { stranded: true, .. }),
                ..
            })
        );
        if stranded {
            self.log(LogKind::StrandedLockReleased, None, None);
            self.try_lock_on(now, conn, true);
        } else {
            if released {
                self.log(LogKind::GrantReleasedAfterWaitTimeout, None, None);
            }
            self.on_refused(now, conn);
        }
    }

    /// How long the grant statement may take: one interval, or the queued wait plus one.
    pub(super) fn grant_budget(&self) -> std::time::Duration {
        match self.options.acquire_mode() {
            AcquireMode::Poll => self.interval().get(),
            AcquireMode::Queue => self.options.queued_grant_budget(),
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

    /// The lock is held: the connection leaves the pool, then the term begins, or first the
    /// fencing epoch is advanced.
    pub(super) fn on_granted(&mut self, now: Instant, conn: ConnId, backend_pid: i32) {
        self.push(Action::Hijack { conn, backend_pid });
        if self.options.is_fencing() {
            self.push(Action::AdvanceEpoch {
                conn,
                lock_timeout_ms: self.interval().half_millis(),
            });
            let deadline = now + self.interval().get();
            self.set_role(Role::Standby(Standby::Fencing {
                conn,
                backend_pid,
                deadline,
            }));
        } else {
            self.begin_term(now, Hold::Session { conn, backend_pid }, None);
        }
    }

    /// The epoch came back: the term begins if it advanced past every epoch seen before.
    pub(super) fn on_epoch(&mut self, now: Instant, conn: ConnId, epoch: u64) {
        let Some(backend_pid) = self.fencing_backend() else {
            return;
        };
        match self.last_epoch {
            Some(last) if epoch <= last => {
                self.on_fencing_failed(now, Cause::EpochDidNotAdvance { epoch, last });
            }
            _ => {
                self.last_epoch = Some(epoch);
                self.begin_term(now, Hold::Session { conn, backend_pid }, Some(epoch));
            }
        }
    }

    /// No epoch: the lock is given up by closing the connection, and the replica stays a
    /// standby.
    pub(super) fn on_fencing_failed(&mut self, now: Instant, cause: Cause<C>) {
        self.close_open_conn();
        self.log(LogKind::FencingFailed, None, Some(cause));
        self.wait_as_standby(now);
    }

    pub(super) fn begin_term(&mut self, now: Instant, hold: Hold, epoch: Option<u64>) {
        self.last_term += 1;
        let term = TermId::new(self.last_term);
        self.push(Action::BeginTerm { term, epoch });
        self.log(LogKind::LeadershipAcquired, Some(term), None);
        let next_check = self.next_check(now);
        self.set_role(Role::Leader(Leader {
            term,
            hold,
            verified_at: now,
            check: LeaderCheck::Waiting { next_check },
        }));
    }

    /// The server's `lock_timeout` ended a queued wait: the lock may have been granted at that
    /// instant anyway, so it is released on the same session, if held, before the connection
    /// goes back to the pool; the grant statement's deadline still bounds it.
    pub(super) fn on_wait_timed_out(&mut self, conn: ConnId) {
        let State::Running(Running {
            role: Role::Standby(Standby::TryingLock { deadline, .. }),
            ..
        }) = &self.state
        else {
            return;
        };
        let deadline = *deadline;
        self.push(Action::ReleaseIfHeld { conn });
        self.set_role(Role::Standby(Standby::ReleasingIfHeld {
            conn,
            deadline,
            stranded: false,
        }));
    }

    /// Another holds the lock: the connection goes back unchanged (a lease's claim kept none).
    pub(super) fn on_refused(&mut self, now: Instant, conn: ConnId) {
        if self.options.lease_of().is_none() {
            self.push(Action::ReturnToPool { conn });
        }
        self.wait_as_standby(now);
    }

    /// The grant statement failed or did not answer: the lock may be held by this session, so
    /// the connection is closed (the server then releases), never returned to the pool.
    /// A lease's claim holds no connection: one still in flight at its deadline is given up,
    /// and a claim that committed all the same is this run's to claim again at the next check.
    pub(super) fn on_try_failed(&mut self, now: Instant, conn: ConnId, cause: Cause<C>) {
        match self.options.lease_of() {
            None => self.push(Action::CloseConnection { conn }),
            Some(lease) if matches!(cause, Cause::TimedOut(_)) => {
                self.push(Action::ReturnToPool { conn });
                self.hold_off_after_unanswered_claim(lease);
            }
            Some(_) => {}
        }
        self.log(LogKind::AcquireFailed, None, Some(cause));
        self.wait_as_standby(now);
    }
}
