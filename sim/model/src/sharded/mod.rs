//! The sharded mode: three replicas running the real [`ShardedElection`] over a space of
//! [`SHARDS`] shards (fencing on), its shards held by the mechanism of the options: advisory
//! locks on one member session each, or leases (a member row renewed on the server's clock,
//! owner rows, each statement on any pooled connection).
//!
//! - [`table`]: the server's table of shard holders, member and owner rows, fencing epochs.
//! - [`perform`]: the driver performing the election's actions, the server running them.
//! - [`props`]: the bounds its beliefs are held to, and its own properties.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash};

use plexsphere_leader_core::shards::{ShardAction, ShardEvent, ShardOptions, ShardedElection};
use plexsphere_leader_core::{CheckInterval, Lease, Mechanism};

use crate::clock::{EXACT, Micros, Ppm};
use crate::engine::{Cause, ElectionModel, INTERVAL, Parts, PauseClock, Renamed, State};
use crate::server::Sess;

pub mod perform;
pub mod props;
pub mod table;

/// The shards of the model's space.
pub const SHARDS: u32 = 4;

/// The sharded mode: the elections' options over a space of `shards` shards held by
/// `mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sharded {
    /// The elections' options.
    pub options: ShardOptions,
    /// How many shards.
    pub shards: u32,
    /// How the shards are held (the options' mechanism): advisory locks, or leases.
    pub mechanism: Mechanism,
}

impl Sharded {
    /// The lease's terms, when the shards are held by leases.
    pub fn lease(&self) -> Option<Lease> {
        self.mechanism.lease()
    }
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
    /// Per shard, the highest epoch the server ever handed out (a rollback does not lower it).
    pub granted: Vec<u64>,
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

/// The model's check interval.
fn interval() -> CheckInterval {
    CheckInterval::new(INTERVAL)
        .unwrap_or_else(|_| unreachable!("one second is a valid check interval"))
}

/// The mode over [`SHARDS`] shards, fencing on, held by `mechanism`.
fn mode(mechanism: Mechanism) -> Sharded {
    let options = ShardOptions::new(interval(), SHARDS)
        .unwrap_or_else(|_| unreachable!("four shards are a valid space"))
        .fencing(true)
        .mechanism(mechanism);
    Sharded {
        options,
        shards: SHARDS,
        mechanism,
    }
}

/// The sharded lease model's clock rates: the first replica's clock slow by half the lease's
/// margin of a tenth (the direction in which a member trusts longer by the server's clock),
/// the others exact.
pub const LEASE_RATES: [Ppm; 2] = [950_000, EXACT];

impl ElectionModel<Sharded> {
    /// The model as CI checks it: [`SHARDS`] shards held by advisory locks, fencing on, three
    /// replicas, one fault.
    pub fn sharded() -> Self {
        let mode = mode(Mechanism::Advisory);
        Self::new(mode, 1, vec![EXACT], PauseClock::Stops)
    }

    /// The sharded lease model as CI checks it: [`SHARDS`] shards held by leases of the
    /// default TTL (three intervals, trusted 0.9 of it), three replicas (clock rates
    /// [`LEASE_RATES`]), one fault; a paused replica's clock runs on, as in the lease model.
    pub fn sharded_lease() -> Self {
        let mode = mode(Mechanism::Lease(Lease::default_for(interval())));
        Self::new(mode, 1, LEASE_RATES.to_vec(), PauseClock::Runs)
    }
}

impl Parts for Sharded {
    type Event = ShardEvent<Cause>;
    type Action = ShardAction<Cause>;
    type Machine = ShardedElection<Cause>;
    /// The advisory model's clocks keep the server's time; the lease model's drift.
    type Rate = Ppm;
    type Terms = Terms;
    type Locks = table::ShardTable;
    type History = History;

    /// A lease's statements run on pooled connections: one given up, or sent before a cut,
    /// may still land.
    fn stragglers(&self) -> bool {
        self.lease().is_some()
    }

    fn machine(&self, _replica: usize) -> ShardedElection<Cause> {
        ShardedElection::new(self.options)
    }

    fn restarted(&self, _old: &ShardedElection<Cause>) -> ShardedElection<Cause> {
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
            granted: vec![0; self.shards as usize],
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

    /// Who owns what; with leases, also the member rows and each shard's owner row.
    fn summary(s: &State<Self>) -> String {
        let owners: Vec<String> = s
            .replicas
            .iter()
            .map(|r| format!("r{}.{} owns {:?}", r.name, r.run, owned(&r.machine)))
            .collect();
        let rows = &s.server.locks.rows.committed;
        if rows.members.is_empty() {
            return owners.join(", ");
        }
        let name = |index: u8| {
            s.replicas
                .get(usize::from(index))
                .map_or(u8::MAX, |r| r.name.0)
        };
        let members: Vec<String> = rows
            .members
            .iter()
            .map(|m| {
                let (replica, run) = (name(m.holder.replica), m.holder.run);
                let expires = crate::trace::ms(m.expires);
                format!("{} of r{replica}.{run} expires {expires}", m.id)
            })
            .collect();
        let owner_rows: Vec<Option<i32>> = rows.owners.iter().map(|o| o.member).collect();
        format!(
            "{}; members {}; owner rows {owner_rows:?}",
            owners.join(", "),
            members.join(", ")
        )
    }
}
