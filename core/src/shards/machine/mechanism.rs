//! The mechanism's choices for a shard space, made in this one place: how a member joins, what
//! follows the join, which check is due each interval, what a statement in flight asks the
//! driver for, how long a member trusts its shards, and what a failed or unanswered statement
//! costs. The rest of the machine asks these and never matches on the mechanism.

use super::*;
use crate::Mechanism;
use crate::rank::FloorStep;

impl<C> ShardedElection<C> {
    pub(super) fn mechanism(&self) -> Mechanism {
        self.options.mechanism_of()
    }

    /// Without a session at a check: the advisory lock session is borrowed first, then
    /// registered; a lease member registers at once on any pooled connection.
    pub(super) fn begin_join(&mut self, now: Instant) {
        let interval = self.options.interval().get();
        let conn = self.next_conn();
        let deadline = now + interval;
        match self.mechanism() {
            Mechanism::Advisory if !self.run().proved => {
                self.run().session = Session::Acquiring {
                    conn,
                    deadline,
                    proving: true,
                };
                self.actions.push_back(ShardAction::ProbePool {
                    conn,
                    // Half an interval for the second session: the proof's answer is due in one.
                    second_within: interval / 2,
                });
            }
            Mechanism::Advisory => {
                self.run().session = Session::Acquiring {
                    conn,
                    deadline,
                    proving: false,
                };
                self.actions.push_back(ShardAction::AcquireSession { conn });
            }
            Mechanism::Lease(lease) => {
                self.run().session = Session::Registering {
                    conn,
                    since: now,
                    deadline,
                };
                self.actions.push_back(ShardAction::RegisterMember {
                    conn,
                    ttl_ms: lease.ttl_millis(),
                    floor: self.options.join_floor_step(),
                });
            }
        }
    }

    /// Joined as `backend`: the advisory lock session leaves the pool for good; a lease member
    /// holds no connection.
    pub(super) fn after_join(&mut self, conn: ConnId, backend: MemberId) {
        if let Mechanism::Advisory = self.mechanism() {
            self.actions
                .push_back(ShardAction::Detach { conn, backend });
        }
    }

    /// A check of an open member: the advisory survey proves its locks every interval; a lease
    /// member renews, and surveys only when the renewal says it must.
    pub(super) fn check_due(&mut self) {
        let lease = self.mechanism().lease().is_some();
        if let Session::Open(open) = &mut self.run().session {
            if lease {
                open.renew_due = true;
                open.release_held_off = false;
            } else {
                open.survey_due = true;
            }
        }
    }

    /// Until when a lease member trusts its shards after a success of a statement sent at
    /// `sent_at`; `None` for advisory locks (their session proves them).
    pub(super) fn trust_after(&self, sent_at: Instant) -> Option<Instant> {
        self.mechanism()
            .lease()
            .map(|lease| sent_at + lease.trusted_for())
    }

    /// What a survey does with the version floor: until a statement of the membership took
    /// the join's step (`joined_floor`), the survey takes it, and later surveys read the floor.
    /// A lease's registration takes it in its own transaction; an advisory member's join cannot
    /// write (it must also run on a server in recovery, to refuse it), so its first survey does.
    pub(super) fn survey_floor_step(&self, joined_floor: bool) -> FloorStep {
        match self.options.join_floor_step() {
            FloorStep::Off => FloorStep::Off,
            step if !joined_floor => step,
            _ => FloorStep::Read,
        }
    }

    /// The action of `op` on the member's `conn`.
    pub(super) fn action_of(&self, conn: ConnId, op: Op, joined_floor: bool) -> ShardAction<C> {
        let lock_timeout_ms = self.options.interval().half_millis();
        let lease = self.mechanism().lease();
        let floor = self.survey_floor_step(joined_floor);
        match (op, lease) {
            (Op::Survey, _) => ShardAction::Survey { conn, floor },
            (Op::Renew(_), Some(lease)) => ShardAction::RenewMember {
                conn,
                ttl_ms: lease.ttl_millis(),
            },
            // A renewal is issued only for a lease; the advisory check is the survey.
            (Op::Renew(_), None) => ShardAction::Survey { conn, floor },
            (Op::Take(shards), Some(_)) => ShardAction::TakeLeases {
                conn,
                shards,
                lock_timeout_ms,
            },
            (Op::Take(shards), None) => ShardAction::Take { conn, shards },
            (Op::Fence(shards), _) => ShardAction::AdvanceEpochs {
                conn,
                shards,
                lock_timeout_ms,
            },
            (Op::Unlock(shards), _) => ShardAction::Unlock { conn, shards },
            (Op::UnlockAll, _) => ShardAction::UnlockAll { conn },
        }
    }

    /// Whether a failed or unanswered statement leaves the member standing: a lease's
    /// statements run on pooled connections, and its shards stay trusted until the last
    /// renewal's trust runs out; an advisory lock session in an unknown state is lost.
    pub(super) fn survives_statement_failure(&self) -> bool {
        self.mechanism().lease().is_some()
    }
}
