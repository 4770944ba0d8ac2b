//! The sharded space's table on the server: each shard's holder and fencing epoch.

use std::hash::{DefaultHasher, Hash};

use crate::engine::Renamed;
use crate::engine::canon::sess;
use crate::server::{Locks, Sess};

/// The shards' holders and epochs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardTable {
    /// Each shard's holder.
    pub holders: Vec<Option<Sess>>,
    /// Each shard's fencing epoch (durable: the fence commits synchronously).
    pub epochs: Vec<u64>,
}

impl ShardTable {
    /// A space of `shards` free shards at epoch zero.
    pub fn new(shards: u32) -> Self {
        Self {
            holders: vec![None; shards as usize],
            epochs: vec![0; shards as usize],
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
}

/// A restart keeps the durable epochs; the holders went with their sessions.
impl Locks for ShardTable {
    /// Whether the session holds the member lock.
    type Membership = bool;
}

impl Renamed for ShardTable {
    fn fingerprint(&self, mine: &dyn Fn(u8) -> bool, hasher: &mut DefaultHasher) {
        for (shard, holder) in self.holders.iter().enumerate() {
            if let Some(holder) = holder.filter(|h| mine(h.replica)) {
                (shard, holder.run, holder.conn).hash(hasher);
            }
        }
    }

    fn rename(&mut self, rename: &dyn Fn(u8) -> u8) {
        for holder in self.holders.iter_mut().flatten() {
            *holder = sess(*holder, rename);
        }
    }
}
