//! The sharded space's table on the server: each shard's advisory holder, and the space's
//! rows with what is committed and what is durable: each shard's fencing epoch and, for a
//! space held by leases, the rows of `shard_sql::lease` (the members, each with its expiry on
//! the server's clock, and each shard's owner).

use std::hash::{DefaultHasher, Hash};

use crate::clock::Micros;
use crate::engine::Renamed;
use crate::engine::canon::sess;
use crate::server::{Durable, Locks, Sess};

/// A member row of a lease space (`plexsphere_shard_member`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Member {
    /// The member's id, from the members' sequence.
    pub id: i32,
    /// Who registered it: the replica, its run and the member's operations (its holder).
    pub holder: Sess,
    /// When its lease expires, by the server's clock.
    pub expires: Micros,
}

/// A shard's owner row of a lease space (`plexsphere_shard_owner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Owner {
    /// The owning member (`None`: free).
    pub member: Option<i32>,
    /// Whether a take's reap freed the row from an expired member (and, owned, whether it was
    /// taken after such a reap): for the "sometimes" property of a dead member's shard re-owned.
    pub reaped: bool,
}

/// The space's rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Rows {
    /// Each shard's fencing epoch (the fence table: advanced by `AdvanceEpochs` with advisory
    /// locks, in the take's transaction with leases).
    pub epochs: Vec<u64>,
    /// Lease mechanism: the member rows, ascending by id.
    pub members: Vec<Member>,
    /// Lease mechanism: each shard's owner row.
    pub owners: Vec<Owner>,
}

impl Rows {
    /// The member row `holder` registered, if it is still there.
    pub fn member_of(&self, holder: Sess) -> Option<&Member> {
        self.members.iter().find(|m| m.holder == holder)
    }

    /// The members live at `now`, ascending by id.
    pub fn live(&self, now: Micros) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(move |m| m.expires > now)
    }

    /// The shards `member` owns, ascending.
    pub fn owned_by(&self, member: i32) -> Vec<u32> {
        (0u32..)
            .zip(&self.owners)
            .filter(|(_, owner)| owner.member == Some(member))
            .map(|(shard, _)| shard)
            .collect()
    }
}

/// The shards' holders and epochs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardTable {
    /// Each shard's advisory holder.
    pub holders: Vec<Option<Sess>>,
    /// The space's rows (written with `synchronous_commit = on`: durable when answered).
    pub rows: Durable<Rows>,
    /// The members' sequence: the last id handed out (a sequence survives a restart).
    pub last_member: i32,
}

impl ShardTable {
    /// A space of `shards` free shards at epoch zero, with no member.
    pub fn new(shards: u32) -> Self {
        let rows = Rows {
            epochs: vec![0; shards as usize],
            members: Vec::new(),
            owners: vec![Owner::default(); shards as usize],
        };
        Self {
            holders: vec![None; shards as usize],
            rows: Durable {
                committed: rows.clone(),
                durable: rows,
            },
            last_member: 0,
        }
    }

    /// The holder of `shard`.
    pub fn holder(&self, shard: u32) -> Option<Sess> {
        self.holders.get(shard as usize).copied().flatten()
    }

    /// Every shard `sess` holds is free again.
    pub fn release(&mut self, sess: Sess) {
        for holder in &mut self.holders {
            if *holder == Some(sess) {
                *holder = None;
            }
        }
    }

    /// Shard `shard`'s fence as a write finds it.
    pub fn fence(&self, shard: u32) -> u64 {
        let epochs = &self.rows.committed.epochs;
        epochs.get(shard as usize).copied().unwrap_or(0)
    }
}

/// A restart keeps the durable rows (what was committed and not yet durable is lost); the
/// holders went with their sessions.
impl Locks for ShardTable {
    /// Whether the session holds the member lock.
    type Membership = bool;

    fn restart(&mut self) {
        self.rows.recover();
    }
}

impl Renamed for ShardTable {
    fn fingerprint(&self, mine: &dyn Fn(u8) -> bool, hasher: &mut DefaultHasher) {
        for (shard, holder) in self.holders.iter().enumerate() {
            if let Some(holder) = holder.filter(|h| mine(h.replica)) {
                (shard, holder.run, holder.conn).hash(hasher);
            }
        }
        for rows in [&self.rows.committed, &self.rows.durable] {
            for member in rows.members.iter().filter(|m| mine(m.holder.replica)) {
                let holder = member.holder;
                (member.id, holder.run, holder.conn, member.expires).hash(hasher);
                rows.owned_by(member.id).hash(hasher);
            }
        }
    }

    fn rename(&mut self, rename: &dyn Fn(u8) -> u8) {
        for holder in self.holders.iter_mut().flatten() {
            *holder = sess(*holder, rename);
        }
        for rows in [&mut self.rows.committed, &mut self.rows.durable] {
            for member in &mut rows.members {
                member.holder = sess(member.holder, rename);
            }
        }
    }
}
