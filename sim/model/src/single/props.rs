//! The properties of the single-lock models. Safety is checked in every state; the bounded
//! liveness ("a leader within the bound after the faults stop") is a safety property over the
//! model's clock, as TLA+ writes a bounded "eventually".

use stateright::Property;

use super::state::{Broken, State, seen};
use super::{Mechanism, SingleModel};
use crate::clock::Micros;

/// A leader's detection bound after its lock session ended under it: one check plus an
/// unanswered check (design.md section 6), in check intervals.
pub const DETECTION_INTERVALS: u64 = 2;

/// How long after the last fault a leader must exist, in check intervals: the orphan bound (the
/// server ends a silent session within four intervals of its last query, a standby leads within
/// one more), plus one interval for the round trips and the schedule's grid.
pub const RECOVERY_INTERVALS: u64 = 6;

/// The properties of `mechanism`'s model.
pub(super) fn properties(mechanism: Mechanism, queued: bool) -> Vec<Property<SingleModel>> {
    let mut properties = vec![
        Property::always("no overlap beyond the bound", no_overlap_beyond_bound),
        Property::always(
            "epochs strictly increase per grant",
            |_: &SingleModel, s: &State| s.broken != Some(Broken::EpochNotIncreasing),
        ),
        Property::always(
            "a stale fenced write is refused",
            |_: &SingleModel, s: &State| s.broken != Some(Broken::StaleWriteAccepted),
        ),
        Property::always(
            "an ordered release follows the term's end",
            |_: &SingleModel, s: &State| s.broken != Some(Broken::ReleasedWhileLeading),
        ),
        Property::always(
            "a leader within the bound after faults stop",
            leader_after_faults,
        ),
        Property::sometimes("elected", |_: &SingleModel, s: &State| {
            s.seen & seen::ELECTED != 0
        }),
        Property::sometimes("handover after resign", |_: &SingleModel, s: &State| {
            s.seen & seen::RESIGN_HANDOVER != 0
        }),
        Property::sometimes(
            "quiet past the recovery bound after a fault",
            quiet_after_fault,
        ),
    ];
    match mechanism {
        Mechanism::Advisory if queued => properties.push(Property::sometimes(
            "queued handover",
            |_: &SingleModel, s: &State| s.seen & seen::QUEUED_HANDOVER != 0,
        )),
        Mechanism::Advisory => {}
        Mechanism::Lease => {
            properties.push(Property::always(
                "a lease believer trusts inside the row's expiry",
                trust_inside_expiry,
            ));
            properties.push(Property::sometimes(
                "takeover after a lease expiry",
                |_: &SingleModel, s: &State| s.seen & seen::EXPIRY_TAKEOVER != 0,
            ));
        }
    }
    properties
}

/// Whether every "always" property holds in `s` (successors of a violation are not explored).
pub(super) fn safe(model: &SingleModel, s: &State) -> bool {
    overlap_within_bound(model, s)
        && (model.mechanism == Mechanism::Advisory || trust_inside_expiry(model, s))
        && leader_after_faults(model, s)
}

/// No two replicas believe they lead beyond the mechanism's bound: with the advisory lock, a
/// leader's session holds the lock, or lost it at most the detection bound ago (counted while
/// the replica runs); with the lease, at most one replica leads.
fn no_overlap_beyond_bound(model: &SingleModel, s: &State) -> bool {
    // The first property: it counts the states checked.
    model
        .explored
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    overlap_within_bound(model, s)
}

fn overlap_within_bound(model: &SingleModel, s: &State) -> bool {
    let leaders = || {
        s.replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.paused && r.machine.is_leader())
    };
    match model.mechanism {
        Mechanism::Advisory => {
            let bound = DETECTION_INTERVALS * model.interval();
            leaders().all(|(index, replica)| {
                let holds = replica
                    .lock_conn
                    .is_some_and(|conn| s.server.holder == Some(replica.sess(index, conn)));
                holds || (replica.lost.is_some() && replica.stale <= bound)
            })
        }
        Mechanism::Lease => leaders().count() <= 1,
    }
}

/// A lease leader's row names it (its replica and run) and has not expired by the server's
/// clock. The row's epoch may be newer than the term's: a claim of the same run given up and
/// landing late takes the row again, and the term then ends at its next renewal (`LeaseLost`).
fn trust_inside_expiry(_: &SingleModel, s: &State) -> bool {
    s.replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.paused && r.machine.is_leader())
        .all(|(index, replica)| {
            s.server.lease.committed.is_some_and(|row| {
                usize::from(row.holder.0) == index
                    && row.holder.1 == replica.run
                    && row.expires > s.now
            })
        })
}

/// A fault happened, and the faults have stopped for longer than [`RECOVERY_INTERVALS`]: the
/// bounded liveness is judged in such a state, so its discovery shows that the depth reaches it.
fn quiet_after_fault(model: &SingleModel, s: &State) -> bool {
    s.quiet_since > 0 && s.now - s.quiet_since > RECOVERY_INTERVALS * model.interval()
}

/// Once the faults stopped for [`RECOVERY_INTERVALS`], a replica leads, if any could (running,
/// eligible, neither paused nor cut off).
fn leader_after_faults(model: &SingleModel, s: &State) -> bool {
    let bound: Micros = RECOVERY_INTERVALS * model.interval();
    if s.now.saturating_sub(s.quiet_since) <= bound {
        return true;
    }
    let candidate = s
        .replicas
        .iter()
        .any(|r| !r.paused && !r.partitioned && r.machine.is_running() && r.machine.is_eligible());
    !candidate
        || s.replicas
            .iter()
            .any(|r| !r.paused && r.machine.is_leader())
}
