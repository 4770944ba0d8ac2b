//! The sharded mode's own properties, and the bounds a shard's owner is held to: how long it
//! has believed a shard without its lock, the instants its bound passes, the shards' fences.

use stateright::Property;

use super::{Sharded, owned};
use crate::clock::Micros;
use crate::engine::props::{DETECTION_INTERVALS, detection_instant};
use crate::engine::{Bounds, ElectionModel, State, seen};

/// The sharded model.
type ShardedModel = ElectionModel<Sharded>;

impl Bounds for Sharded {
    /// The orphan bound (five intervals), the rebalance delay and a survey's round (one
    /// each), and one for the schedule's grid.
    const RECOVERY_INTERVALS: u64 = 8;
    const RECOVERY: &'static str = "every shard owned within the bound after faults stop";
    const OVERLAP: &'static str = "no shard overlap beyond the bound";

    /// Every unpaused owner has believed each shard its lock session does not hold `delta`
    /// longer.
    fn age(s: &mut State<Sharded>, delta: Micros) {
        let locks = &s.server.locks;
        let lost: Vec<Vec<u32>> = s
            .replicas
            .iter()
            .enumerate()
            .map(|(index, replica)| {
                let sess = replica.lock_sess(index);
                owned(&replica.machine)
                    .into_iter()
                    .filter(|shard| sess.is_none() || locks.holder(*shard) != sess)
                    .collect()
            })
            .collect();
        for (replica, lost) in s.replicas.iter_mut().zip(lost) {
            if !replica.paused {
                for shard in lost {
                    *replica.terms.stale.entry(shard).or_default() += delta;
                }
            }
        }
    }

    /// A write with a shard's epoch older than its newest term's goes through the shard's fence.
    fn stale_write_accepted(_: &ShardedModel, s: &State<Sharded>) -> bool {
        s.replicas.iter().filter(|r| !r.paused).any(|replica| {
            replica.terms.epochs.iter().any(|(shard, epoch)| {
                let fence = s
                    .server
                    .locks
                    .epochs
                    .get(*shard as usize)
                    .copied()
                    .unwrap_or(0);
                let newest = s
                    .history
                    .max_epochs
                    .get(*shard as usize)
                    .copied()
                    .unwrap_or(0);
                *epoch >= fence && *epoch < newest
            })
        })
    }

    /// An owner believing a shard without its lock passes the detection bound.
    fn bound_instant(model: &ShardedModel, s: &State<Sharded>) -> Option<Micros> {
        s.replicas
            .iter()
            .filter(|r| !r.paused)
            .flat_map(|r| r.terms.stale.values())
            .map(|stale| detection_instant(model, s.now, *stale))
            .min()
    }

    /// An owner believes a shard its session does not hold for at most the detection bound
    /// (counted while it runs); two owners of one shard overlap no longer.
    fn overlap_within_bound(model: &ShardedModel, s: &State<Sharded>) -> bool {
        let bound = DETECTION_INTERVALS * model.interval();
        s.replicas
            .iter()
            .filter(|r| !r.paused)
            .all(|r| r.terms.stale.values().all(|stale| *stale <= bound))
    }

    /// Every shard is owned.
    fn recovered(model: &ShardedModel, s: &State<Sharded>) -> bool {
        let owned: usize = s
            .replicas
            .iter()
            .filter(|r| !r.paused)
            .map(|r| r.machine.owned().len())
            .sum();
        owned >= model.mode.shards as usize
    }

    fn properties(_: &ShardedModel) -> Vec<Property<ShardedModel>> {
        vec![
            Property::sometimes(
                "every shard owned",
                |_: &ShardedModel, s: &State<Sharded>| s.seen & seen::ALL_OWNED != 0,
            ),
            Property::sometimes("handover", |_: &ShardedModel, s: &State<Sharded>| {
                s.seen & seen::HANDOVER != 0
            }),
        ]
    }
}
