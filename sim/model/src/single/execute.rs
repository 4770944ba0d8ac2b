//! The server runs a statement: the grant (try or queued), the release, the fence, the leader's
//! check, and the lease's claim, renewal and release. Each answers as PostgreSQL would.

use std::time::Duration;

use plexsphere_leader_core::rank::Candidate;
use plexsphere_leader_core::{Action, Event, LockCheck};

use super::locks::{Candidacy, Row, Waiter};
use super::perform::grant_next;
use super::{Mechanism, Single};
use crate::clock::Micros;
use crate::engine::{Broken, Cause, World};
use crate::sabotage::Sabotage;
use crate::server::Sess;

/// How many intervals a candidacy stays live after its last survey (the adapter's
/// `sql::candidacy::LIVE_INTERVALS`).
const LIVE_INTERVALS: u64 = 2;

impl World<'_, Single> {
    /// The server runs `action` of `owner` now; `None` when it answers later (a queued wait).
    pub(super) fn execute(&mut self, owner: Sess, action: &Action<Cause>) -> Option<Event<Cause>> {
        let conn = owner.conn;
        let lease = self.model.mode.mechanism == Mechanism::Lease;
        // The lease's statements (its survey too) run on any pooled session.
        let sessionless = match action {
            Action::ClaimLease { .. } | Action::RenewLease { .. } | Action::ReleaseLease { .. } => {
                true
            }
            Action::SurveyCandidates { .. } => lease,
            _ => false,
        };
        let needs_session = !sessionless;
        if needs_session && !self.s.server.is_open(owner) {
            return Some(failure(action, "connection closed"));
        }
        let now = self.s.now;
        self.s.server.touch(owner, now);
        match *action {
            Action::TryLock { .. } => Some(self.try_lock(owner)),
            Action::WaitForLock {
                lock_timeout_ms, ..
            } => self.wait_for_lock(owner, lock_timeout_ms),
            Action::ReleaseIfHeld { .. } => {
                let released = self.s.server.locks.holder == Some(owner);
                if released {
                    self.release_lock(owner);
                }
                Some(Event::ReleasedIfHeld { conn, released })
            }
            Action::AdvanceEpoch { .. } => {
                let epoch = self.s.server.locks.fence.committed + 1;
                let durable = self.model.sabotage != Sabotage::NonDurableLeaseWrite;
                self.s.server.locks.fence.write(epoch, durable);
                self.hand_out(epoch);
                Some(Event::EpochAdvanced { conn, epoch })
            }
            Action::Ping { .. } => {
                let found = LockCheck {
                    holds_lock: self.s.server.locks.holder == Some(owner),
                    ..LockCheck::holding(self.s.server.backend_pid(owner))
                };
                Some(Event::PingAnswered { conn, found })
            }
            Action::Unlock { .. } => {
                let released = self.s.server.locks.holder == Some(owner);
                if released {
                    self.release_lock(owner);
                }
                Some(Event::UnlockDone { conn, released })
            }
            Action::SurveyCandidates { publish, .. } => Some(self.survey(owner, publish)),
            Action::ClaimLease { ttl_ms, .. } => Some(self.claim(owner, ttl_ms)),
            Action::RenewLease { epoch, ttl_ms, .. } => Some(self.renew(owner, epoch, ttl_ms)),
            Action::ReleaseLease { epoch, .. } => {
                let holder = (owner.replica, owner.run);
                let mut row = self.s.server.locks.lease.committed;
                let released = match &mut row {
                    Some(row) if row.holder == holder && row.epoch == epoch => {
                        row.expires = now;
                        true
                    }
                    _ => false,
                };
                if released {
                    self.note_release(owner);
                    self.write_lease(row);
                }
                Some(Event::UnlockDone { conn, released })
            }
            _ => None,
        }
    }

    fn try_lock(&mut self, owner: Sess) -> Event<Cause> {
        let conn = owner.conn;
        match self.s.server.locks.holder {
            Some(holder) if holder != owner => Event::LockRefused { conn },
            _ => self.grant(owner),
        }
    }

    fn grant(&mut self, owner: Sess) -> Event<Cause> {
        let keeps_limit = self.model.sabotage != Sabotage::SkipIdleSessionTimeout;
        let server = &mut self.s.server;
        server.locks.holder = Some(owner);
        if keeps_limit {
            server.limit_idle(owner);
        }
        let backend_pid = server.backend_pid(owner);
        Event::LockGranted {
            conn: owner.conn,
            backend_pid,
        }
    }

    fn wait_for_lock(&mut self, owner: Sess, lock_timeout_ms: u32) -> Option<Event<Cause>> {
        match self.s.server.locks.holder {
            None => Some(self.grant(owner)),
            Some(holder) if holder == owner => Some(self.grant(owner)),
            Some(_) if self.model.sabotage == Sabotage::SkipQueue => {
                let backend_pid = self.s.server.backend_pid(owner);
                Some(Event::LockGranted {
                    conn: owner.conn,
                    backend_pid,
                })
            }
            Some(_) => {
                let timeout_at = self.s.now + u64::from(lock_timeout_ms) * 1_000;
                self.s
                    .server
                    .locks
                    .waiters
                    .push(Waiter { owner, timeout_at });
                None
            }
        }
    }

    /// `owner` released the lock it held.
    fn release_lock(&mut self, owner: Sess) {
        self.note_release(owner);
        self.s.server.locks.holder = None;
        grant_next(self);
    }

    /// A release on purpose must come after its holder's term ended (the ordered stop's zero
    /// overlap).
    fn note_release(&mut self, owner: Sess) {
        let leads = self
            .s
            .replicas
            .get(usize::from(owner.replica))
            .is_some_and(|replica| replica.run == owner.run && replica.machine.is_leader());
        if leads {
            self.s.broken = Some(Broken::ReleasedWhileLeading);
        }
    }

    /// The candidates' survey, as `sql::candidacy` writes it: publishes `publish` (a
    /// standby's) for `owner` (in its session's `application_name` with the advisory lock, in
    /// its run's row with a lease), then answers every other candidacy last published at most
    /// [`LIVE_INTERVALS`] intervals ago, with how long it has been live. The floor is off.
    fn survey(&mut self, owner: Sess, publish: Option<Candidate>) -> Event<Cause> {
        let now = self.s.now;
        let live = LIVE_INTERVALS * self.model.interval();
        let advisory = self.model.mode.mechanism == Mechanism::Advisory;
        // The advisory lock's candidacy is the session's; the lease's row is the run's.
        let same = move |a: Sess, b: Sess| {
            if advisory {
                a == b
            } else {
                (a.replica, a.run) == (b.replica, b.run)
            }
        };
        let candidates = &mut self.s.server.locks.candidates;
        // What no survey would answer again is forgotten (a smaller state, the same answers).
        candidates.retain(|c| c.seen + live >= now && !(publish.is_some() && same(c.owner, owner)));
        if let Some(mine) = publish {
            let candidacy = Candidacy {
                owner,
                rank: mine.rank,
                seen: now,
                age: crate::clock::us(mine.live_for),
            };
            let at = candidates.partition_point(|c| c.owner < owner);
            candidates.insert(at, candidacy);
        }
        let hidden = publish.is_some() && self.model.sabotage == Sabotage::NeverDefer;
        let candidates = candidates
            .iter()
            .filter(|c| !same(c.owner, owner) && !hidden)
            .map(|c| Candidate {
                rank: c.rank,
                live_for: Duration::from_micros(c.age + (now - c.seen)),
            })
            .collect();
        Event::CandidatesSurveyed {
            conn: owner.conn,
            candidates,
            floor: None,
        }
    }

    fn claim(&mut self, owner: Sess, ttl_ms: u32) -> Event<Cause> {
        let conn = owner.conn;
        let now = self.s.now;
        let holder = (owner.replica, owner.run);
        match self.s.server.locks.lease.committed {
            Some(row) if row.holder != holder && row.expires > now => Event::LockRefused { conn },
            row => {
                let epoch = row.map_or(1, |row| row.epoch + 1);
                let took_over = row.is_some_and(|row| row.holder != holder);
                self.hand_out(epoch);
                self.write_lease(Some(Row {
                    holder,
                    epoch,
                    expires: now + ttl(ttl_ms),
                    took_over,
                }));
                Event::LeaseClaimed { conn, epoch }
            }
        }
    }

    fn renew(&mut self, owner: Sess, epoch: u64, ttl_ms: u32) -> Event<Cause> {
        let conn = owner.conn;
        let expires = self.s.now + ttl(ttl_ms);
        let holder = (owner.replica, owner.run);
        let row = self.s.server.locks.lease.committed;
        let renewed = match (row, self.model.sabotage) {
            (Some(row), _) if row.holder == holder && row.epoch == epoch => {
                Some(Row { expires, ..row })
            }
            (_, Sabotage::RenewIgnoresTerm) => return Event::LeaseRenewed { conn },
            (_, Sabotage::RenewTakesBack) => Some(Row {
                holder,
                epoch,
                expires,
                took_over: false,
            }),
            _ => None,
        };
        match renewed {
            Some(row) => {
                self.write_lease(Some(row));
                Event::LeaseRenewed { conn }
            }
            None => Event::LeaseLost { conn },
        }
    }

    /// The server hands out `epoch` (a fence advanced, a lease claimed): it must exceed every
    /// epoch handed out before, whatever a restart rolled back.
    fn hand_out(&mut self, epoch: u64) {
        if epoch <= self.s.history.granted {
            self.s.broken = Some(Broken::EpochNotIncreasing);
        }
        self.s.history.granted = self.s.history.granted.max(epoch);
    }

    fn write_lease(&mut self, row: Option<Row>) {
        let durable = self.model.sabotage != Sabotage::NonDurableLeaseWrite;
        self.s.server.locks.lease.write(row, durable);
    }
}

fn ttl(ttl_ms: u32) -> Micros {
    u64::from(ttl_ms) * 1_000
}

/// The answer of `action` failing with `cause`.
fn failure(action: &Action<Cause>, cause: Cause) -> Event<Cause> {
    match *action {
        Action::AdvanceEpoch { conn, .. } => Event::EpochFailed { conn, cause },
        Action::Ping { conn, .. } | Action::RenewLease { conn, .. } => {
            Event::PingFailed { conn, cause }
        }
        Action::Unlock { conn } | Action::ReleaseLease { conn, .. } => {
            Event::UnlockFailed { conn, cause }
        }
        Action::SurveyCandidates { conn, .. } => Event::SurveyFailed { conn, cause },
        ref other => Event::LockQueryFailed {
            conn: other
                .conn()
                .unwrap_or_else(|| plexsphere_leader_core::ConnId::new(0)),
            cause,
        },
    }
}
