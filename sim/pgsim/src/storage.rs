//! Committed table data: the fencing table `plexsphere_leader_fence` of each database.
//!
//! Unlike sessions and advisory locks, committed rows survive a crash and a restart (they
//! are in the WAL), and an instance that replicates synchronously from another one
//! ([`ServerHandle::replicate_to`](super::ServerHandle::replicate_to)) has every row the
//! other committed, so a failover to it keeps the fencing epochs.
//!
//! Only the fence table's shape is modelled: `(classid int4, objid int4)` primary key and
//! a `bigint` epoch. MVCC visibility is not: every write commits on its own and every
//! statement sees every committed row. Row locks (`FOR SHARE`) belong to each instance, not
//! to the committed data (see `rows`).

use std::collections::BTreeMap;

/// The fencing table's name.
pub(crate) const FENCE_TABLE: &str = "plexsphere_leader_fence";

/// One fence table: the epoch of each `(classid, objid)` key.
pub(crate) type FenceTable = BTreeMap<(i32, i32), i64>;

/// The committed tables of one instance (or of a primary and its synchronous standbys).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Storage {
    /// Tables by database, then by (lowercased) table name.
    tables: BTreeMap<String, BTreeMap<String, FenceTable>>,
}

impl Storage {
    /// Creates table `name` in `database` unless it exists; true when it was created.
    pub(crate) fn create(&mut self, database: &str, name: &str) -> bool {
        let tables = self.tables.entry(database.to_owned()).or_default();
        if tables.contains_key(name) {
            return false;
        }
        tables.insert(name.to_owned(), FenceTable::new());
        true
    }

    /// Table `name` of `database`, if it exists.
    pub(crate) fn table(&self, database: &str, name: &str) -> Option<&FenceTable> {
        self.tables.get(database)?.get(name)
    }

    /// Table `name` of `database` for writing, if it exists.
    pub(crate) fn table_mut(&mut self, database: &str, name: &str) -> Option<&mut FenceTable> {
        self.tables.get_mut(database)?.get_mut(name)
    }
}
