//! The properties every mode has. Safety is checked in every state; the bounded liveness ("a
//! leader, or every shard owned, within the bound after the faults stop") is a safety property
//! over the model's clock, as TLA+ writes a bounded "eventually".

use std::sync::atomic::Ordering;

use plexsphere_leader_core::Machine;
use stateright::Property;

use super::state::{Broken, State, seen};
use super::{ElectionModel, Mode};
use crate::clock::Micros;

/// An owner's detection bound after its lock session ended under it: one check plus an
/// unanswered check (design.md section 6), in check intervals.
pub const DETECTION_INTERVALS: u64 = 2;

/// The properties of every mode, the mode's own overlap first.
pub(super) fn common<M: Mode>() -> Vec<Property<ElectionModel<M>>> {
    vec![
        Property::always(M::OVERLAP, counted_overlap::<M>),
        Property::always(
            "epochs strictly increase per grant",
            |_: &ElectionModel<M>, s: &State<M>| s.broken != Some(Broken::EpochNotIncreasing),
        ),
        Property::always(
            "a stale fenced write is refused",
            |_: &ElectionModel<M>, s: &State<M>| s.broken != Some(Broken::StaleWriteAccepted),
        ),
        Property::always(
            "an ordered release follows the term's end",
            |_: &ElectionModel<M>, s: &State<M>| s.broken != Some(Broken::ReleasedWhileLeading),
        ),
        Property::always(M::RECOVERY, recovered_after_faults::<M>),
        Property::sometimes("elected", |_: &ElectionModel<M>, s: &State<M>| {
            s.seen & seen::ELECTED != 0
        }),
        Property::sometimes(
            "handover after resign",
            |_: &ElectionModel<M>, s: &State<M>| s.seen & seen::RESIGN_HANDOVER != 0,
        ),
        Property::sometimes(
            "quiet past the recovery bound after a fault",
            quiet_after_fault::<M>,
        ),
    ]
}

/// Whether every "always" property holds in `s` (successors of a violation are not explored).
pub fn safe<M: Mode>(model: &ElectionModel<M>, s: &State<M>) -> bool {
    M::within_bounds(model, s) && recovered_after_faults(model, s)
}

/// The mode's overlap property; the first property, so it counts the states checked.
fn counted_overlap<M: Mode>(model: &ElectionModel<M>, s: &State<M>) -> bool {
    model.explored.fetch_add(1, Ordering::Relaxed);
    M::overlap_within_bound(model, s)
}

/// The instant at which an owner that has believed without its lock for `stale` passes the
/// detection bound.
pub fn detection_instant<M: Mode>(model: &ElectionModel<M>, now: Micros, stale: Micros) -> Micros {
    now + (DETECTION_INTERVALS * model.interval()).saturating_sub(stale) + 1
}

/// A fault happened, and the faults have stopped for longer than the recovery bound: the
/// bounded liveness is judged in such a state, so its discovery shows that the depth reaches it.
fn quiet_after_fault<M: Mode>(model: &ElectionModel<M>, s: &State<M>) -> bool {
    s.quiet_since > 0 && s.now - s.quiet_since > M::RECOVERY_INTERVALS * model.interval()
}

/// Once the faults stopped for the mode's recovery bound, it has recovered, if any replica
/// could lead (running, eligible, neither paused nor cut off).
fn recovered_after_faults<M: Mode>(model: &ElectionModel<M>, s: &State<M>) -> bool {
    let bound: Micros = M::RECOVERY_INTERVALS * model.interval();
    if s.now.saturating_sub(s.quiet_since) <= bound {
        return true;
    }
    let candidate = s.replicas.iter().any(|r| {
        !r.paused && !r.partitioned && r.machine.is_running() && M::is_eligible(&r.machine)
    });
    !candidate || M::recovered(model, s)
}
