//! The properties of the sharded model.

use stateright::Property;

use super::ShardedModel;
use super::state::{Broken, State, seen};
use crate::clock::Micros;
use crate::single::props::DETECTION_INTERVALS;

/// How long after the last fault every shard must be owned, in check intervals: the orphan
/// bound (five intervals), the rebalance delay and a survey's round (one each), and one for the
/// schedule's grid.
pub const SHARD_RECOVERY_INTERVALS: u64 = 8;

/// The properties of the sharded model.
pub(super) fn properties() -> Vec<Property<ShardedModel>> {
    vec![
        Property::always(
            "no shard overlap beyond the bound",
            |m: &ShardedModel, s: &State| {
                m.explored
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                overlap_within_bound(m, s)
            },
        ),
        Property::always(
            "epochs strictly increase per grant",
            |_: &ShardedModel, s: &State| s.broken != Some(Broken::EpochNotIncreasing),
        ),
        Property::always(
            "a stale fenced write is refused",
            |_: &ShardedModel, s: &State| s.broken != Some(Broken::StaleWriteAccepted),
        ),
        Property::always(
            "an ordered release follows the term's end",
            |_: &ShardedModel, s: &State| s.broken != Some(Broken::ReleasedWhileOwned),
        ),
        Property::always(
            "every shard owned within the bound after faults stop",
            owned_after_faults,
        ),
        Property::sometimes("elected", |_: &ShardedModel, s: &State| {
            s.seen & seen::ELECTED != 0
        }),
        Property::sometimes("every shard owned", |_: &ShardedModel, s: &State| {
            s.seen & seen::ALL_OWNED != 0
        }),
        Property::sometimes("handover", |_: &ShardedModel, s: &State| {
            s.seen & seen::HANDOVER != 0
        }),
        Property::sometimes("handover after resign", |_: &ShardedModel, s: &State| {
            s.seen & seen::RESIGN_HANDOVER != 0
        }),
        Property::sometimes(
            "quiet past the recovery bound after a fault",
            |m: &ShardedModel, s: &State| {
                let bound = SHARD_RECOVERY_INTERVALS * m.interval();
                s.quiet_since > 0 && s.now - s.quiet_since > bound
            },
        ),
    ]
}

/// Whether every "always" property holds in `s`.
pub(super) fn safe(model: &ShardedModel, s: &State) -> bool {
    overlap_within_bound(model, s) && owned_after_faults(model, s)
}

/// An owner believes a shard its session does not hold for at most the detection bound
/// (counted while it runs); two owners of one shard overlap no longer.
fn overlap_within_bound(model: &ShardedModel, s: &State) -> bool {
    let bound = DETECTION_INTERVALS * model.interval();
    s.replicas
        .iter()
        .filter(|r| !r.paused)
        .all(|r| r.stale.values().all(|stale| *stale <= bound))
}

/// Once the faults stopped for [`SHARD_RECOVERY_INTERVALS`], every shard is owned, if any
/// replica could own one.
fn owned_after_faults(model: &ShardedModel, s: &State) -> bool {
    let bound: Micros = SHARD_RECOVERY_INTERVALS * model.interval();
    if s.now.saturating_sub(s.quiet_since) <= bound {
        return true;
    }
    let candidate = s
        .replicas
        .iter()
        .any(|r| !r.paused && !r.partitioned && r.machine.is_running() && r.machine.is_eligible());
    let owned: usize = s
        .replicas
        .iter()
        .filter(|r| !r.paused)
        .map(|r| r.machine.owned().len())
        .sum();
    !candidate || owned >= model.shards as usize
}
