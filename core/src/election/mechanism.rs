//! The lock mechanism's choices, made in this one place: how a standby's attempt begins, which
//! action verifies a held lock and which releases it, what becomes of the connection of an
//! attempt that was answered, failed or went unanswered, and of a release. The role code
//! (`standby.rs`, `leader.rs`, `stop.rs`) asks these and never matches on the mechanism.
//!
//! A new mechanism is a variant of [`Mechanism`] and of [`Hold`], its arms here, and a module
//! of its own answers' handlers, as `advisory.rs` and `lease.rs` are for the two there are.

use super::*;
use crate::Mechanism;

impl<C> Election<C> {
    pub(super) fn mechanism(&self) -> Mechanism {
        self.options
            .lease_of()
            .map_or(Mechanism::Advisory, Mechanism::Lease)
    }

    /// A standby's attempt begins: a connection for the advisory grant (after the pool's
    /// proof), or the lease's claim (after the fitness probe and the survey, when the election
    /// runs them).
    pub(super) fn begin_attempt(&mut self, now: Instant) -> Role {
        match self.mechanism() {
            Mechanism::Advisory => self.begin_grant(now),
            Mechanism::Lease(_) if self.options.probes_fitness() => {
                let conn = self.next_conn();
                self.probe_before_attempt(now, conn)
            }
            Mechanism::Lease(_) => match self.options.rank_of() {
                Some(rank) => self.survey_before_attempt(now, None, rank),
                None => self.claim(now),
            },
        }
    }

    /// The steps before the attempt are over (on `conn`, the advisory lock's borrowed
    /// connection): the attempt itself.
    pub(super) fn attempt(&mut self, now: Instant, conn: ConnId) {
        match self.mechanism() {
            Mechanism::Advisory => self.try_lock_on(now, conn, false),
            Mechanism::Lease(_) => {
                let role = self.claim(now);
                self.set_role(role);
            }
        }
    }

    /// The leader's check: the advisory lock is verified on its session, a lease renewed.
    pub(super) fn verify_hold(&mut self, now: Instant, hold: Hold, deadline: Instant) {
        let check = match (hold, self.mechanism()) {
            (Hold::Session { conn, backend_pid }, _) => {
                self.push(Action::Ping { conn, backend_pid });
                LeaderCheck::Pinging {
                    sent_at: now,
                    deadline,
                }
            }
            (Hold::Lease { epoch, .. }, Mechanism::Lease(lease)) => {
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
            (Hold::Lease { .. }, Mechanism::Advisory) => return,
        };
        if let Some(leader) = self.leader_mut() {
            leader.check = check;
        }
    }

    /// A standby's statement on `conn` answered (a refusal, an unfit probe): the advisory
    /// lock's borrowed connection goes back to the pool unchanged; a lease's statement kept
    /// none.
    pub(super) fn give_back_answered(&mut self, conn: ConnId) {
        if let Mechanism::Advisory = self.mechanism() {
            self.push(Action::ReturnToPool { conn });
        }
    }

    /// The attempt's grant statement on `conn` failed or did not answer. The advisory lock
    /// may be held by that session, so it is closed (the server then releases), never
    /// returned. A lease's claim holds no connection: one still in flight is given up, and a
    /// claim that committed all the same holds the next claim off until that lease expired.
    pub(super) fn give_up_attempt(&mut self, conn: ConnId, cause: &Cause<C>) {
        match self.mechanism() {
            Mechanism::Advisory => self.push(Action::CloseConnection { conn }),
            Mechanism::Lease(lease) if matches!(cause, Cause::TimedOut(_)) => {
                self.push(Action::ReturnToPool { conn });
                self.hold_off_after_unanswered_claim(lease);
            }
            Mechanism::Lease(_) => {}
        }
    }

    /// The release of `hold`: unlock on its session, or expire the lease by a statement of its
    /// own. Returns the connection the release runs on.
    pub(super) fn release_hold(&mut self, hold: Hold) -> ConnId {
        match hold {
            Hold::Session { conn, .. } => {
                self.push(Action::Unlock { conn });
                conn
            }
            Hold::Lease { epoch, .. } => {
                let conn = self.next_conn();
                self.push(Action::ReleaseLease { conn, epoch });
                conn
            }
        }
    }

    /// The release of `hold` on `conn` completed (`failure` `None`) or could not be confirmed:
    /// the lock session is closed; a lease's release statement still in flight is given up
    /// (the lease then expires by its TTL).
    pub(super) fn after_release_statement(
        &mut self,
        hold: Hold,
        conn: ConnId,
        failure: Option<&Cause<C>>,
    ) {
        match hold {
            Hold::Session { .. } => self.push(Action::CloseConnection { conn }),
            Hold::Lease { .. } if matches!(failure, Some(Cause::TimedOut(_))) => {
                self.push(Action::ReturnToPool { conn });
            }
            Hold::Lease { .. } => {}
        }
    }

    /// What a release that found nothing held says.
    pub(super) fn not_held(&self) -> Cause<C> {
        match self.mechanism() {
            Mechanism::Advisory => Cause::LockNotHeld,
            Mechanism::Lease(_) => Cause::LeaseNotHeld,
        }
    }

    /// Whether a statement on the standby's open connection that answered left it in flight
    /// all the same: the advisory lock's borrowed connection is the election's until it is
    /// closed or returned; a lease's answered statement left nothing.
    pub(super) fn answered_leaves_conn(&self) -> bool {
        matches!(self.mechanism(), Mechanism::Advisory)
    }

    /// How long a believer may trust a hold after the send of its last success: a lease's
    /// window; `None` for the advisory lock, whose term its session bounds.
    pub(super) fn trusted_for(&self) -> Option<Duration> {
        match self.mechanism() {
            Mechanism::Advisory => None,
            Mechanism::Lease(lease) => Some(lease.trusted_for()),
        }
    }

    /// Closes the connection the election owns or is acquiring, if any (the exclusion proof's
    /// sessions too, and whatever setup it left for the next check); a lease's statement in
    /// flight is given up instead (its connection is the pool's, and carries nothing).
    pub(super) fn close_open_conn(&mut self) {
        let Some(conn) = self.open_conn() else {
            return;
        };
        match self.mechanism() {
            Mechanism::Advisory => self.push(Action::CloseConnection { conn }),
            Mechanism::Lease(_) => self.push(Action::ReturnToPool { conn }),
        }
    }
}
