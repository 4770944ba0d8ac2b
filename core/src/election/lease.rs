//! The lease mechanism's own steps: a claim sent and answered, a renewal answered or failed.
//! The rest of a lease's life (the schedule, the stop protocol, the operator's controls, the
//! work deadlines) is every mechanism's, in the role modules, with the lease's choices in
//! `mechanism.rs`.

use super::*;

impl<C> Election<C> {
    /// The claim took the lease: a term begins with its epoch, if that advanced past every
    /// epoch this election saw (else the table went back in time and the replica stays a
    /// standby; the lease it now holds expires by its TTL or is claimed again, with a higher
    /// epoch, at the next check).
    pub(super) fn on_lease_claimed(&mut self, now: Instant, epoch: u64) {
        let (
            State::Running(Running {
                role: Role::Standby(Standby::Claiming { sent_at, .. }),
                ..
            }),
            Some(lease),
        ) = (&self.state, self.options.lease_of())
        else {
            return;
        };
        let trusted_until = *sent_at + lease.trusted_for();
        match self.last_epoch {
            Some(last) if epoch <= last => {
                let cause = Cause::EpochDidNotAdvance { epoch, last };
                self.log(LogKind::FencingFailed, None, Some(cause));
                self.wait_as_standby(now);
            }
            _ => {
                self.last_epoch = Some(epoch);
                let hold = Hold::Lease {
                    epoch,
                    trusted_until,
                };
                self.begin_term(now, hold, Some(epoch));
            }
        }
    }

    /// A claim went unanswered: it may have committed, leaving this run the holder of a lease
    /// it cannot use (its answers do not come back). The next claim waits until that lease
    /// would have expired plus one interval, so that another replica's check takes it first;
    /// without this, a replica whose statements reach the server but whose answers are lost
    /// would claim its own lease again at every check and nobody would lead.
    pub(super) fn hold_off_after_unanswered_claim(&mut self, lease: crate::Lease) {
        let interval = self.interval().get();
        if let State::Running(Running {
            role: Role::Standby(Standby::Claiming { sent_at, .. }),
            hold_until,
            ..
        }) = &mut self.state
        {
            let until = *sent_at + lease.ttl() + interval;
            *hold_until = Some(crate::hold_off::until_later(*hold_until, until));
        }
    }

    /// The renewal extended the lease: it is trusted for the window after the renewal was
    /// sent.
    pub(super) fn on_lease_renewed(&mut self, now: Instant) {
        let Some(lease) = self.options.lease_of() else {
            return;
        };
        let Some(leader) = self.leader_mut() else {
            return;
        };
        if let (LeaderCheck::Renewing { sent_at, .. }, Hold::Lease { trusted_until, .. }) =
            (&leader.check, &mut leader.hold)
        {
            *trusted_until = (*trusted_until).max(*sent_at + lease.trusted_for());
        }
        self.on_ping_ok(now);
    }

    /// The renewal found the row no longer this term's: the term is lost.
    pub(super) fn on_lease_lost(&mut self, now: Instant) {
        let next_check = self.next_check(now);
        if let Some(leader) = self.leader_mut() {
            // The statement answered: nothing is left in flight to give up.
            leader.check = LeaderCheck::Waiting { next_check };
        }
        self.demote(now, LossReason::LeaseTaken, Cause::LeaseTaken);
    }

    /// The renewal `conn` failed or (`timed_out`) did not answer: the lease is still trusted
    /// until its window ends ([`Timer::LeaseExpiry`]), so the term goes on and the next check
    /// renews again.
    pub(super) fn retry_renewal(
        &mut self,
        now: Instant,
        conn: ConnId,
        timed_out: bool,
        cause: Cause<C>,
    ) {
        let next_check = self.next_check(now);
        let Some(leader) = self.leader_mut() else {
            return;
        };
        leader.check = LeaderCheck::Waiting { next_check };
        let term = leader.term;
        if timed_out {
            self.push(Action::ReturnToPool { conn });
        }
        self.log(LogKind::LeaseRenewalFailed, Some(term), Some(cause));
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
}
