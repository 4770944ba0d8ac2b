//! The advisory lock's own steps: the pool proof, the grant tried or queued for on a borrowed
//! connection, a session found marked or stranded, the epoch of a fencing grant, and the
//! check that verifies the lock on its session. The rest of its life (the schedule, the stop
//! protocol, the operator's controls) is every mechanism's, in the role modules.

use super::*;
use crate::proof::Verdict;

impl<C> Election<C> {
    /// A standby's grant begins: the pool's proof first (once a run), then a connection.
    pub(super) fn begin_grant(&mut self, now: Instant) -> Role {
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

    /// Whether the run's pool is proven its own (or needs no proof).
    fn pool_proved(&self) -> bool {
        match &self.state {
            State::Running(running) => running.pool_proved,
            State::Idle => true,
        }
    }

    /// The exclusion proof answered ([`crate::proof`]): proven, the check goes on to its
    /// grant; inconclusive, the check ends as a failed one and the next proves again (never a
    /// pass: WARN with what was missing); refuted, the run fails before any term (a pooler
    /// that multiplexes sessions, or a lock that does not exclude: ERROR, once).
    pub(super) fn on_pool_probed(&mut self, now: Instant, proof: crate::proof::PoolProof<C>) {
        match proof.verdict() {
            Verdict::Proven => {
                if let State::Running(running) = &mut self.state {
                    running.pool_proved = true;
                }
                let role = self.begin_attempt(now);
                self.set_role(role);
            }
            Verdict::Inconclusive(why) => {
                self.log(LogKind::ProofInconclusive, None, Some(Cause::Unproven(why)));
                self.wait_as_standby(now);
            }
            Verdict::Refuted(finding) => {
                let kind = if finding.proves_multiplexing() {
                    LogKind::PoolMultiplexes
                } else {
                    LogKind::LockNotExclusive
                };
                self.log(kind, None, Some(Cause::LockNotVerified(finding)));
                self.push(Action::Fail(finding));
                self.finish();
            }
        }
    }

    /// A connection came: try the lock (poll mode) or queue for it (queue mode).
    /// The fitness probe runs first on it, when the election probes.
    pub(super) fn on_acquired(&mut self, now: Instant, conn: ConnId) {
        if self.options.probes_fitness() {
            let role = self.probe_before_attempt(now, conn);
            self.set_role(role);
        } else {
            self.prepare_attempt(now, conn);
        }
    }

    /// Tries the lock (poll mode) or queues for it (queue mode) on the borrowed `conn`. A
    /// standby past its defer limit only tries: it attempts so that a better candidate that
    /// cannot lead leaves nobody without a leader, and a free lock is all it must catch; queued,
    /// it would win a release meant for the better candidate.
    pub(super) fn try_lock_on(&mut self, now: Instant, conn: ConnId, after_stranded: bool) {
        match self.options.acquire_mode() {
            AcquireMode::Poll => self.push(Action::TryLock { conn }),
            AcquireMode::Queue if self.past_defer_limit() => self.push(Action::TryLock { conn }),
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

    /// The leader's check answered: the term goes on if what it found proves the lock, and is
    /// lost with the finding's reason if not.
    pub(super) fn on_ping_answered(&mut self, now: Instant, found: LockCheck) {
        let Some(Hold::Session {
            backend_pid: granted,
            ..
        }) = self.leader_mut().map(|leader| leader.hold)
        else {
            return;
        };
        match found.verdict(granted) {
            Ok(()) => self.on_ping_ok(now),
            Err(finding) => {
                self.demote(now, finding.loss_reason(), Cause::LockNotVerified(finding));
                if finding.proves_multiplexing() {
                    // No check can succeed through this pool: say so once and stop, rather
                    // than lead for an interval at a time.
                    self.push(Action::Fail(finding));
                    self.finish();
                }
            }
        }
    }
}
