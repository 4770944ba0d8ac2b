//! What a sharded elector publishes: the shards this replica owns, the space as its last survey
//! saw it, and the recent transitions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use plexsphere_leader_core::rank::{Rank, Version};
use plexsphere_leader_core::shards::{MemberId, Shard, Survey};
use plexsphere_leader_core::{TermEndCause, TermId};

/// The shards this replica owns, published on every change
/// ([`ShardedElector::subscribe`](super::ShardedElector::subscribe)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// The member this replica is (its lock session's backend pid), while it is one.
    pub member: Option<i32>,
    /// The owned shards, each with its open term.
    pub shards: BTreeMap<u32, OwnedShard>,
    /// Shards whose term ended for a handover while their lock is kept until their work returns.
    pub handing_over: BTreeSet<u32>,
    /// This replica's checks are failing: since when, and whether retrying alone can fix it
    /// ([`ShardedElector::check_failure`](super::ShardedElector::check_failure) has the error
    /// text); published when a run of failures begins, changes class or ends.
    pub check_failing: Option<crate::leadership::CheckFailing>,
}

impl Ownership {
    /// Whether this replica owns `shard` (a term of it is open).
    pub fn is_owner(&self, shard: impl Into<Shard>) -> bool {
        self.shards.contains_key(&shard.into().get())
    }

    /// How many shards this replica owns.
    pub fn count(&self) -> usize {
        self.shards.len()
    }
}

/// One owned shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedShard {
    /// Its term.
    pub term: TermId,
    /// When the term began (wall clock).
    pub since: SystemTime,
    /// Its fencing epoch, with [`ShardConfig::fencing`](super::ShardConfig::fencing).
    pub epoch: Option<u64>,
}

/// The space as this replica's last survey saw it: who owns what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceView {
    /// When the survey answered (wall clock).
    pub surveyed_at: SystemTime,
    /// This replica's member id (its lock session's backend pid).
    pub me: i32,
    /// The members, by backend pid, with their names and shards.
    pub members: Vec<Holder>,
    /// Backends holding shards without the member lock (a session of another program using
    /// the same class id).
    pub foreign: Vec<Holder>,
    /// Shards nobody holds.
    pub unowned: Vec<u32>,
    /// The version floor the survey read ([`ShardConfig::version_floor`](super::ShardConfig::version_floor)),
    /// when it is on and one is recorded.
    pub floor: Option<Version>,
}

impl SpaceView {
    /// The view `survey` shows, its holders named by `names` (their `application_name`, or a
    /// lease member's holder), stamped with the wall clock now.
    pub(crate) fn of(survey: &Survey, names: &BTreeMap<MemberId, String>) -> Self {
        let mut holders: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
        let mut unowned = Vec::new();
        for (shard, holder) in survey.holders() {
            match holder {
                Some(pid) => holders.entry(pid.get()).or_default().push(shard.get()),
                None => unowned.push(shard.get()),
            }
        }
        let holder = |pid: MemberId| Holder {
            pid: pid.get(),
            name: names.get(&pid).cloned(),
            shards: holders.get(&pid.get()).cloned().unwrap_or_default(),
            rank: survey.standing(pid).rank,
            below_floor: survey.is_below_floor(pid),
        };
        let members: Vec<Holder> = survey.members().iter().map(|&m| holder(m)).collect();
        let foreign = holders
            .keys()
            .filter(|pid| !survey.members().iter().any(|m| m.get() == **pid))
            .map(|&pid| holder(MemberId::new(pid)))
            .collect();
        Self {
            surveyed_at: crate::clock::wall_now(),
            me: survey.backend().get(),
            members,
            foreign,
            unowned,
            floor: survey.floor(),
        }
    }
}

/// One backend holding locks of the space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its backend pid.
    pub pid: i32,
    /// Its `application_name`: the identity the replica registered with (without the rank
    /// published before it).
    pub name: Option<String>,
    /// The shards it holds, ascending.
    pub shards: Vec<u32>,
    /// The rank it published ([`ShardConfig::version`](super::ShardConfig::version)), if any.
    pub rank: Option<Rank>,
    /// Whether it is below the version floor, and so owns no shard.
    pub below_floor: bool,
}

/// A shard term that began or ended on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// When (wall clock).
    pub at: SystemTime,
    /// The shard.
    pub shard: u32,
    /// The term.
    pub term: TermId,
    /// `None` for a term that began; the cause for one that ended.
    pub ended: Option<TermEndCause>,
}

/// How many transitions [`ShardedElector::transitions`](super::ShardedElector::transitions)
/// keeps, newest last.
pub const TRANSITIONS_KEPT: usize = 256;
