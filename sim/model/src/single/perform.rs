//! The single-lock driver performs the election's actions against the model's server; the
//! server's side of a session's end, of the lock's queue and of its timeouts.

use plexsphere_leader_core::rank::Rank;
use plexsphere_leader_core::{Action, Election, Event, TermEndCause, Timer};

use super::{Mechanism, Single, Yield};
use crate::engine::{Broken, Cause, Driver, State, World, seen};
use crate::flight::{Flight, Stage};
use crate::sabotage::Sabotage;
use crate::server::{Locks, Sess};
use crate::trace::Input;

impl Driver for Single {
    /// Performs one action of replica `r`; returns the answer given at once, if any.
    fn perform(w: &mut World<'_, Single>, r: usize, action: Action<Cause>) -> Option<Event<Cause>> {
        let unreachable = w.s.replicas[r].partitioned;
        match action {
            Action::AcquireConnection { conn } | Action::ProbePool { conn, .. } if unreachable => {
                Some(Event::AcquireFailed {
                    conn,
                    cause: "server unreachable",
                })
            }
            Action::AcquireConnection { conn } => {
                w.open(r, conn);
                Some(Event::ConnectionAcquired { conn })
            }
            // The exclusion proof (off in the model's options, on in the adapter): the model's
            // server is reached directly and its lock excludes.
            Action::ProbePool { conn, .. } => {
                let base = i32::try_from(r).unwrap_or(0) * 2;
                Some(Event::PoolProbed {
                    conn,
                    proof: plexsphere_leader_core::proof::PoolProof::excluding(base, base + 1),
                })
            }
            // The fitness probe (off in the model's options): every replica is fit.
            Action::ProbeFitness { conn } => Some(Event::Fit { conn }),
            Action::SurveyCandidates { conn, .. }
            | Action::TryLock { conn }
            | Action::WaitForLock { conn, .. }
            | Action::ReleaseIfHeld { conn }
            | Action::AdvanceEpoch { conn, .. }
            | Action::Ping { conn, .. }
            | Action::Unlock { conn }
            | Action::ClaimLease { conn, .. }
            | Action::RenewLease { conn, .. }
            | Action::ReleaseLease { conn, .. } => {
                if unreachable {
                    // Lost on the way; a sabotaged driver reports a renewal renewed anyway.
                    let renewal = matches!(action, Action::RenewLease { .. });
                    return (renewal && w.model.sabotage == Sabotage::RenewIgnoresTerm)
                        .then_some(Event::LeaseRenewed { conn });
                }
                w.send(r, conn, action);
                None
            }
            Action::ReturnToPool { conn } => {
                // Back in the pool, unchanged: the session is no longer the election's (a lease
                // statement given up may still run: its answer is dropped).
                let sess = w.s.replicas[r].sess(r, conn);
                w.abandon(sess);
                w.s.server.sessions.retain(|s| s.owner != sess);
                w.s.server.locks.waiters.retain(|x| x.owner != sess);
                None
            }
            Action::CloseConnection { conn } => {
                if w.close(r, conn) {
                    let terms = &mut w.s.replicas[r].terms;
                    terms.lost = None;
                    terms.stale = 0;
                }
                None
            }
            Action::Hijack { conn, .. } => {
                let replica = &mut w.s.replicas[r];
                replica.lock_conn = Some(conn);
                replica.terms.lost = None;
                replica.terms.stale = 0;
                None
            }
            Action::BeginTerm { epoch, .. } => {
                begin_term(w, r, epoch);
                None
            }
            Action::EndTerm { cause, .. } => {
                w.s.replicas[r].terms.epoch = None;
                match cause {
                    TermEndCause::Resigned => w.s.history.resigned = u8::try_from(r).ok(),
                    TermEndCause::Yielded => yielded(w, r),
                    _ => {}
                }
                None
            }
            Action::AwaitWork { term } => Some(Event::WorkDrained { term }),
            Action::ReportOverdueWork { .. }
            | Action::Log(_)
            | Action::Fail(_)
            | Action::Finish => None,
        }
    }

    fn execute(
        w: &mut World<'_, Single>,
        owner: Sess,
        action: &Action<Cause>,
    ) -> Option<Event<Cause>> {
        w.execute(owner, action)
    }

    /// The server ended `sess`: its wait fails (heard with `notify`), its lock goes to the next
    /// waiter, and its replica's driver knows the lock is lost.
    fn release(w: &mut World<'_, Single>, sess: Sess, notify: bool) {
        let advisory = w.model.mode.mechanism == Mechanism::Advisory;
        let locks = &mut w.s.server.locks;
        if advisory {
            // Its `application_name` is gone with it.
            locks.candidates.retain(|c| c.owner != sess);
        }
        if locks.waiters.iter().any(|x| x.owner == sess) {
            locks.waiters.retain(|x| x.owner != sess);
            if notify && w.is_current(sess) {
                let cause = "session ended while waiting";
                let conn = sess.conn;
                w.reply(sess, Event::LockQueryFailed { conn, cause });
            }
        }
        if w.s.server.locks.holder == Some(sess) {
            w.s.server.locks.holder = None;
            if let Some(replica) = w.s.replicas.get_mut(usize::from(sess.replica))
                && replica.run == sess.run
                && replica.lock_conn == Some(sess.conn)
            {
                replica.terms.lost = Some(sess.conn);
            }
            grant_next(w);
        }
    }

    /// The lock table's deadlines due now: queued waits time out (55P03); a sabotaged server's WAL
    /// writer flushes what was committed by the last instant.
    fn lock_timeouts(w: &mut World<'_, Single>) {
        let now = w.s.now;
        while let Some((at, sess)) = w.s.server.locks.next_wait_timeout()
            && at <= now
        {
            w.s.server.locks.waiters.retain(|x| x.owner != sess);
            w.s.server.touch(sess, now);
            if w.is_current(sess) {
                let conn = sess.conn;
                w.reply(sess, Event::LockWaitTimedOut { conn });
            }
        }
        if w.model.sabotage == Sabotage::NonDurableLeaseWrite {
            w.s.server.locks.lease.flush();
            w.s.server.locks.fence.flush();
        }
    }

    fn crashed(s: &mut State<Single>, replica: u8) {
        if s.history.resigned == Some(replica) {
            s.history.resigned = None;
        }
    }

    /// [`Sabotage::UnboundedTrust`]: a lease leader's trust deadline never fires.
    fn skips_deadline(sabotage: Sabotage, machine: &Election<Cause>) -> bool {
        sabotage == Sabotage::UnboundedTrust && machine.timeout_reason() == Some(Timer::LeaseExpiry)
    }

    /// A lost renewal: a sabotaged driver ([`Sabotage::RenewIgnoresTerm`]) reports it renewed.
    fn lost(w: &mut World<'_, Single>, flight: &Flight<Action<Cause>, Event<Cause>>) {
        let renewal = matches!(
            flight.stage,
            Stage::Sent(Action::RenewLease { .. })
                | Stage::Replied(Event::LeaseLost { .. } | Event::PingFailed { .. })
        );
        if w.model.sabotage == Sabotage::RenewIgnoresTerm
            && renewal
            && !flight.abandoned
            && w.is_current(flight.owner)
        {
            let conn = flight.owner.conn;
            w.feed(
                usize::from(flight.owner.replica),
                Input::Event(Event::LeaseRenewed { conn }),
            );
        }
    }
}

/// A term begins on replica `r` with `epoch`: the epochs' rule, and the discoveries.
fn begin_term(w: &mut World<'_, Single>, r: usize, epoch: Option<u64>) {
    let s = &mut *w.s;
    s.seen |= seen::ELECTED;
    if let Some(epoch) = epoch {
        s.history.max_epoch = s.history.max_epoch.max(epoch);
    }
    s.replicas[r].terms.epoch = epoch;
    if s.history.resigned.is_some_and(|by| usize::from(by) != r) {
        s.seen |= seen::RESIGN_HANDOVER;
        s.history.resigned = None;
    }
    if let Some(yielded) = s.history.yielded.filter(|y| usize::from(y.by) != r) {
        s.seen |= seen::PREEMPTED;
        s.history.yielded = None;
        // Without a fault near the yield or since, the better-ranked candidate it yielded to
        // leads next.
        let quiet = yielded.quiet && s.faults_left == yielded.faults_left;
        if quiet && rank(s, r) <= rank(s, usize::from(yielded.by)) {
            s.broken = Some(Broken::YieldMisdirected);
        }
    }
    let replica = &s.replicas[r];
    let locks = &s.server.locks;
    if replica
        .lock_sess(r)
        .is_some_and(|sess| locks.queued_grant == Some(sess))
    {
        s.seen |= seen::QUEUED_HANDOVER;
    }
    let took_over = locks.lease.committed.is_some_and(|row| {
        row.took_over && Some(row.epoch) == epoch && row.holder == (r as u8, replica.run)
    });
    if took_over {
        s.seen |= seen::EXPIRY_TAKEOVER;
    }
}

/// Replica `r`'s term ended by a yield (the floor is off in the model): some other replica
/// must outrank it, and the next term on another replica is that preemption's.
fn yielded(w: &mut World<'_, Single>, r: usize) {
    let s = &mut *w.s;
    let mine = rank(s, r);
    if !(0..s.replicas.len()).any(|other| other != r && rank(s, other) > mine) {
        s.broken = Some(Broken::YieldMisdirected);
    }
    // The preference's guarantee needs the candidacy seen by every standby before the yield
    // (published for the window, each standby surveying every interval), no wait decided
    // before it still queued (a wait lasts an interval), and no standby past its defer limit
    // (a fault can delay a yield by a term's tenure). A fault breaks that for a while: a
    // standby paused with its request in flight, a failover that erased the published
    // candidacies while the candidate's age ran on, a term begun late (docs/model.md,
    // Findings). So a yield less than the defer limit and an interval after the last fault is
    // not judged.
    let options = &w.model.mode.options;
    let settle = crate::clock::us(options.defer_limit() + options.interval().get());
    let s = &mut *w.s;
    let faults_over = s.quiet_since == 0 || s.now >= s.quiet_since + settle;
    let quiet = faults_over && !s.replicas.iter().any(|r| r.paused || r.partitioned);
    s.history.yielded = u8::try_from(r).ok().map(|by| Yield {
        by,
        faults_left: s.faults_left,
        quiet,
    });
}

/// Replica `r`'s rank (`None`, below every rank, when unranked).
fn rank(s: &State<Single>, r: usize) -> Option<Rank> {
    s.replicas[r].machine.options().rank_of()
}

/// The lock was released: the first waiter gets it, and its wait answers "granted".
pub(super) fn grant_next(w: &mut World<'_, Single>) {
    let keeps_limit = w.model.sabotage != Sabotage::SkipIdleSessionTimeout;
    let now = w.s.now;
    let server = &mut w.s.server;
    if server.locks.holder.is_some() || server.locks.waiters.is_empty() {
        return;
    }
    let waiter = server.locks.waiters.remove(0);
    server.locks.holder = Some(waiter.owner);
    server.locks.queued_grant = Some(waiter.owner);
    if keeps_limit {
        server.limit_idle(waiter.owner);
    }
    server.touch(waiter.owner, now);
    let backend_pid = server.backend_pid(waiter.owner);
    if w.is_current(waiter.owner) {
        let conn = waiter.owner.conn;
        w.reply(waiter.owner, Event::LockGranted { conn, backend_pid });
    }
}
