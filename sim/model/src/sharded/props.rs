//! The sharded mode's own properties, and the bounds a shard's owner is held to: with
//! advisory locks, how long it has believed a shard without its lock and the instants that
//! bound passes; with leases, its member row's expiry, which its trust (0.9·TTL after the
//! renewal's sending) must end inside; the shards' fences.

use plexsphere_leader_core::shards::MemberId;
use stateright::Property;

use super::{Sharded, owned};
use crate::clock::{Micros, Rate, micros, server_delta};
use crate::engine::props::{DETECTION_INTERVALS, detection_instant};
use crate::engine::{Bounds, ElectionModel, Replica, State, seen};

/// The sharded model.
type ShardedModel = ElectionModel<Sharded>;

impl Bounds for Sharded {
    /// The orphan bound (five intervals), the rebalance delay and a survey's round (one
    /// each), and one for the schedule's grid.
    const RECOVERY_INTERVALS: u64 = 8;
    const RECOVERY: &'static str = "every shard owned within the bound after faults stop";
    const OVERLAP: &'static str = "no shard overlap beyond the bound";

    /// Advisory locks: every unpaused owner has believed each shard its lock session does not
    /// hold `delta` longer. (A lease owner is held to its row's expiry instead.)
    fn age(model: &ShardedModel, s: &mut State<Sharded>, delta: Micros) {
        if model.mode.lease().is_some() {
            return;
        }
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
                let fence = s.server.locks.fence(*shard);
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

    /// An owner believing a shard without its lock passes the detection bound; a lease
    /// owner's member row expires.
    fn bound_instant(model: &ShardedModel, s: &State<Sharded>) -> Option<Micros> {
        if model.mode.lease().is_some() {
            return s
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.paused && !r.machine.owned().is_empty())
                .filter_map(|(index, replica)| row_of(s, index, replica))
                .map(|row| row.expires)
                .filter(|at| *at > s.now)
                .min();
        }
        s.replicas
            .iter()
            .filter(|r| !r.paused)
            .flat_map(|r| r.terms.stale.values())
            .map(|stale| detection_instant(model, s.now, *stale))
            .min()
    }

    /// Advisory locks: an owner believes a shard its session does not hold for at most the
    /// detection bound (counted while it runs); two owners of one shard overlap no longer.
    /// Leases: at most one running replica owns each shard (bound 0: each owner's trust ends
    /// before its row expires, and only an expired row's shards are taken).
    fn overlap_within_bound(model: &ShardedModel, s: &State<Sharded>) -> bool {
        if model.mode.lease().is_some() {
            let mut seen = vec![false; model.mode.shards as usize];
            return s
                .replicas
                .iter()
                .filter(|r| !r.paused)
                .flat_map(|r| owned(&r.machine))
                .all(|shard| match seen.get_mut(shard as usize) {
                    Some(seen) => !std::mem::replace(seen, true),
                    None => false,
                });
        }
        let bound = DETECTION_INTERVALS * model.interval();
        s.replicas
            .iter()
            .filter(|r| !r.paused)
            .all(|r| r.terms.stale.values().all(|stale| *stale <= bound))
    }

    fn within_bounds(model: &ShardedModel, s: &State<Sharded>) -> bool {
        Self::overlap_within_bound(model, s)
            && (model.mode.lease().is_none() || trust_inside_expiry(model, s))
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

    fn properties(model: &ShardedModel) -> Vec<Property<ShardedModel>> {
        let mut properties = vec![
            Property::sometimes(
                "every shard owned",
                |_: &ShardedModel, s: &State<Sharded>| s.seen & seen::ALL_OWNED != 0,
            ),
            Property::sometimes("handover", |_: &ShardedModel, s: &State<Sharded>| {
                s.seen & seen::HANDOVER != 0
            }),
        ];
        if model.mode.lease().is_some() {
            properties.extend([
                Property::always(TRUST, trust_inside_expiry),
                Property::sometimes(
                    "a dead member's shard re-owned after its lease expired",
                    |_: &ShardedModel, s: &State<Sharded>| s.seen & seen::EXPIRY_TAKEOVER != 0,
                ),
            ]);
        }
        properties
    }
}

/// The sharded lease model's trust property.
pub const TRUST: &str = "a lease owner trusts inside its member row's expiry";

/// The member row of replica `index`'s current member, when it is still there.
fn row_of<'s>(
    s: &'s State<Sharded>,
    index: usize,
    replica: &Replica<Sharded>,
) -> Option<&'s super::table::Member> {
    let id = replica.machine.member().map(MemberId::get)?;
    s.server
        .locks
        .rows
        .committed
        .members
        .iter()
        .find(|m| m.id == id)
        .filter(|m| usize::from(m.holder.replica) == index && m.holder.run == replica.run)
}

/// Every running lease owner's member row names it (its replica and run), has not expired by
/// the server's clock and owns every shard it believes; and its trust deadline, on the server's
/// clock through its clock's rate, falls inside that row's expiry.
fn trust_inside_expiry(_: &ShardedModel, s: &State<Sharded>) -> bool {
    let rows = &s.server.locks.rows.committed;
    s.replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.paused && !r.machine.owned().is_empty())
        .all(|(index, replica)| {
            let Some(row) = row_of(s, index, replica) else {
                return false;
            };
            let trust_ends = replica.machine.trust_deadline().map(|at| {
                let ahead = micros(at).saturating_sub(replica.local);
                s.now + server_delta(ahead, replica.rate.ppm())
            });
            row.expires > s.now
                && trust_ends.is_some_and(|at| at <= row.expires)
                && owned(&replica.machine).iter().all(|shard| {
                    rows.owners
                        .get(*shard as usize)
                        .is_some_and(|o| o.member == Some(row.id))
                })
        })
}
