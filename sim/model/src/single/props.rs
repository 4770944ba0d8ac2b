//! The bounds a single-lock belief is held to (how long a leader has led on a lost lock, the
//! instants its bounds pass, the fence its work writes through), the mode's own properties,
//! and its last state in one line.

use plexsphere_leader_core::AcquireMode;
use stateright::Property;

use super::{Mechanism, Single};
use crate::clock::Micros;
use crate::engine::props::{DETECTION_INTERVALS, detection_instant};
use crate::engine::{Bounds, Broken, ElectionModel, State, seen};
use crate::trace::ms;

/// The single-lock model.
type SingleModel = ElectionModel<Single>;

impl Bounds for Single {
    const OVERLAP: &'static str = "no overlap beyond the bound";
    const RECOVERY: &'static str = "a leader within the bound after faults stop";
    /// The orphan bound (the server ends a silent session within four intervals of its last
    /// query, a standby leads within one more), plus one interval for the round trips and the
    /// schedule's grid.
    const RECOVERY_INTERVALS: u64 = 6;

    /// Every unpaused leader on a lost lock has led on it `delta` longer.
    fn age(_: &SingleModel, s: &mut State<Single>, delta: Micros) {
        for replica in &mut s.replicas {
            if !replica.paused && replica.terms.lost.is_some() && replica.machine.is_leader() {
                replica.terms.stale += delta;
            }
        }
    }

    /// The fence is the fence table's epoch, or the lease row's.
    fn stale_write_accepted(model: &SingleModel, s: &State<Single>) -> bool {
        let locks = &s.server.locks;
        let fence = match model.mode.mechanism {
            Mechanism::Advisory => locks.fence.committed,
            Mechanism::Lease => locks.lease.committed.map_or(0, |row| row.epoch),
        };
        s.replicas.iter().any(|replica| {
            !replica.paused
                && replica.machine.is_leader()
                && replica
                    .terms
                    .epoch
                    .is_some_and(|epoch| epoch >= fence && epoch < s.history.max_epoch)
        })
    }

    /// A leader on a lost lock reaching its detection bound, a leader's lease row expiring.
    fn bound_instant(model: &SingleModel, s: &State<Single>) -> Option<Micros> {
        let leaders = || {
            s.replicas
                .iter()
                .filter(|r| !r.paused && r.machine.is_leader())
        };
        let detection = leaders()
            .filter(|r| r.terms.lost.is_some())
            .map(|r| detection_instant(model, s.now, r.terms.stale));
        let expiry = s
            .server
            .locks
            .lease
            .committed
            .map(|row| row.expires)
            .filter(|at| *at > s.now && leaders().next().is_some());
        detection.chain(expiry).min()
    }

    /// With the advisory lock, a leader's session holds the lock, or lost it at most the
    /// detection bound ago (counted while the replica runs); with the lease, at most one
    /// replica leads.
    fn overlap_within_bound(model: &SingleModel, s: &State<Single>) -> bool {
        let leaders = || {
            s.replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.paused && r.machine.is_leader())
        };
        match model.mode.mechanism {
            Mechanism::Advisory => {
                let bound = DETECTION_INTERVALS * model.interval();
                leaders().all(|(index, replica)| {
                    let holds = replica
                        .lock_sess(index)
                        .is_some_and(|sess| s.server.locks.holder == Some(sess));
                    holds || (replica.terms.lost.is_some() && replica.terms.stale <= bound)
                })
            }
            Mechanism::Lease => leaders().count() <= 1,
        }
    }

    fn within_bounds(model: &SingleModel, s: &State<Single>) -> bool {
        Self::overlap_within_bound(model, s)
            && (model.mode.mechanism == Mechanism::Advisory || trust_inside_expiry(model, s))
    }

    /// A replica leads.
    fn recovered(_: &SingleModel, s: &State<Single>) -> bool {
        s.replicas
            .iter()
            .any(|r| !r.paused && r.machine.is_leader())
    }

    /// The mechanism's own, and a ranked model's.
    fn properties(model: &SingleModel) -> Vec<Property<SingleModel>> {
        let mut properties = mechanism_properties(model);
        if model.mode.ranked {
            properties.push(Property::always(
                "a yield goes to a better-ranked replica",
                |_: &SingleModel, s: &State<Single>| s.broken != Some(Broken::YieldMisdirected),
            ));
            properties.push(Property::sometimes(
                "preempted by a better-ranked replica",
                |_: &SingleModel, s: &State<Single>| s.seen & seen::PREEMPTED != 0,
            ));
        }
        properties
    }
}

/// The mechanism's own properties.
fn mechanism_properties(model: &SingleModel) -> Vec<Property<SingleModel>> {
    let queued = model.mode.options.acquire_mode() == AcquireMode::Queue;
    match model.mode.mechanism {
        Mechanism::Advisory if queued => vec![Property::sometimes(
            "queued handover",
            |_: &SingleModel, s: &State<Single>| s.seen & seen::QUEUED_HANDOVER != 0,
        )],
        Mechanism::Advisory => Vec::new(),
        Mechanism::Lease => vec![
            Property::always(
                "a lease believer trusts inside the row's expiry",
                trust_inside_expiry,
            ),
            Property::sometimes(
                "takeover after a lease expiry",
                |_: &SingleModel, s: &State<Single>| s.seen & seen::EXPIRY_TAKEOVER != 0,
            ),
        ],
    }
}

/// A lease leader's row names it (its replica and run) and has not expired by the server's
/// clock. The row's epoch may be newer than the term's: a claim of the same run given up and
/// landing late takes the row again, and the term then ends at its next renewal (`LeaseLost`).
fn trust_inside_expiry(_: &SingleModel, s: &State<Single>) -> bool {
    s.replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.paused && r.machine.is_leader())
        .all(|(index, replica)| {
            s.server.locks.lease.committed.is_some_and(|row| {
                usize::from(row.holder.0) == index
                    && row.holder.1 == replica.run
                    && row.expires > s.now
            })
        })
}

/// Who leads in `state`, and the environment's view of the lock and the lease.
pub(super) fn summary(state: &State<Single>) -> String {
    let replicas: Vec<String> = state
        .replicas
        .iter()
        .map(|r| {
            let mut text = format!("r{}.{} {:?}", r.name, r.run, r.machine.phase());
            if r.machine.is_leader() {
                text.push_str(&format!(" leads (epoch {:?})", r.terms.epoch));
            }
            if r.paused {
                text.push_str(" paused");
            }
            if r.terms.lost.is_some() {
                text.push_str(&format!(" lost its lock {} ago", ms(r.terms.stale)));
            }
            text
        })
        .collect();
    let name = |index: u8| {
        state
            .replicas
            .get(usize::from(index))
            .map_or(u8::MAX, |r| r.name.0)
    };
    let locks = &state.server.locks;
    let holder = locks.holder.map_or_else(
        || "free".to_owned(),
        |h| format!("r{}.{} {:?}", name(h.replica), h.run, h.conn),
    );
    let lease = locks.lease.committed.map_or_else(
        || "none".to_owned(),
        |row| {
            let (replica, run) = (name(row.holder.0), row.holder.1);
            let expires = ms(row.expires);
            format!("r{replica}.{run} epoch {} expires {expires}", row.epoch)
        },
    );
    format!("{}; lock {holder}; lease {lease}", replicas.join(", "))
}
