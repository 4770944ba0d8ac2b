//! The sharded mode: three replicas running the real [`ShardedElection`] over a space of
//! [`SHARDS`] shards (fencing on), one member session each.
//!
//! - [`table`]: the server's table of shard holders and fencing epochs.
//! - [`perform`]: the driver performing the election's actions, the server running them.
//! - [`props`]: the bounds its beliefs are held to, and its own properties.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash};

use plexsphere_leader_core::CheckInterval;
use plexsphere_leader_core::shards::{ShardAction, ShardEvent, ShardOptions, ShardedElection};

use crate::clock::{EXACT, Micros};
use crate::engine::{Cause, ElectionModel, INTERVAL, Parts, PauseClock, Renamed, State};
use crate::server::Sess;

pub mod perform;
pub mod props;
pub mod table;

/// The shards of the model's space.
pub const SHARDS: u32 = 4;

/// The sharded mode: the elections' options over a space of `shards` shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sharded {
    /// The elections' options.
    pub options: ShardOptions,
    /// How many shards.
    pub shards: u32,
}

/// What a replica's driver knows of its shard terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Terms {
    /// The epoch of each shard term it has open.
    pub epochs: BTreeMap<u32, u64>,
    /// How long, unpaused, each owned shard has been believed without its lock.
    pub stale: BTreeMap<u32, Micros>,
}

/// What the sharded properties remember along a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct History {
    /// Per shard, the highest epoch a term began with.
    pub max_epochs: Vec<u64>,
    /// Shards whose term ended by a handover or a resign, with the replica that gave them up
    /// and whether it resigned.
    pub given_up: BTreeMap<u32, (u8, bool)>,
}

impl Renamed for History {
    fn fingerprint(&self, mine: &dyn Fn(u8) -> bool, hasher: &mut DefaultHasher) {
        for (shard, (from, resigned)) in &self.given_up {
            if mine(*from) {
                (shard, resigned).hash(hasher);
            }
        }
    }

    fn rename(&mut self, rename: &dyn Fn(u8) -> u8) {
        for (from, _) in self.given_up.values_mut() {
            *from = rename(*from);
        }
    }
}

/// The shards whose terms `machine` has open.
pub fn owned(machine: &ShardedElection<Cause>) -> Vec<u32> {
    machine
        .owned()
        .into_iter()
        .map(|(shard, _)| shard.get())
        .collect()
}

impl ElectionModel<Sharded> {
    /// The model as CI checks it: [`SHARDS`] shards, fencing on, three replicas, one fault.
    pub fn sharded() -> Self {
        let interval = CheckInterval::new(INTERVAL)
            .unwrap_or_else(|_| unreachable!("one second is a valid check interval"));
        let options = ShardOptions::new(interval, SHARDS)
            .unwrap_or_else(|_| unreachable!("four shards are a valid space"))
            .fencing(true);
        let mode = Sharded {
            options,
            shards: SHARDS,
        };
        Self::new(mode, 1, vec![EXACT], PauseClock::Stops)
    }
}

impl Parts for Sharded {
    type Event = ShardEvent<Cause>;
    type Action = ShardAction<Cause>;
    type Machine = ShardedElection<Cause>;
    /// The sharded model's clocks keep the server's time.
    type Rate = ();
    type Terms = Terms;
    type Locks = table::ShardTable;
    type History = History;

    const STRAGGLERS: bool = false;

    fn machine(&self) -> ShardedElection<Cause> {
        ShardedElection::new(self.options)
    }

    fn interval(&self) -> CheckInterval {
        self.options.interval()
    }

    fn locks(&self) -> table::ShardTable {
        table::ShardTable::new(self.shards)
    }

    fn history(&self) -> History {
        History {
            max_epochs: vec![0; self.shards as usize],
            given_up: BTreeMap::new(),
        }
    }

    fn is_eligible(machine: &ShardedElection<Cause>) -> bool {
        machine.is_eligible()
    }

    fn leads(machine: &ShardedElection<Cause>) -> bool {
        !machine.owned().is_empty()
    }

    fn terminable(s: &State<Self>, r: usize) -> Option<Sess> {
        s.replicas[r].lock_sess(r)
    }

    fn summary(s: &State<Self>) -> String {
        let owners: Vec<String> = s
            .replicas
            .iter()
            .map(|r| format!("r{}.{} owns {:?}", r.name, r.run, owned(&r.machine)))
            .collect();
        owners.join(", ")
    }
}
