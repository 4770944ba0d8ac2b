//! Committed table data: the fencing table `plexsphere_leader_fence` and the lease table
//! `plexsphere_leader_lease` of each database.
//!
//! Unlike sessions and advisory locks, committed rows survive a crash and a restart (they
//! are in the WAL), and an instance that replicates synchronously from another one
//! ([`ServerHandle::replicate_to`](super::ServerHandle::replicate_to)) has every row the
//! other committed, so a failover to it keeps the fencing epochs and the leases.
//!
//! Only the two tables' shapes are modelled: a `(classid int4, objid int4)` primary key with
//! a `bigint` epoch (the fence table), or with a `text` holder and a `timestamptz` expiry (the
//! lease table). MVCC visibility is not: every write commits on its own and every statement
//! sees every committed row. Row locks (`FOR SHARE`) belong to each instance, not to the
//! committed data (see `rows`).

use std::collections::BTreeMap;

/// The fencing table's name.
pub(crate) const FENCE_TABLE: &str = "plexsphere_leader_fence";

/// One fence table: the epoch of each `(classid, objid)` key.
pub(crate) type FenceTable = BTreeMap<(i32, i32), i64>;

/// One row of a lease table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRow {
    /// The replica run holding (or last holding) the lease.
    pub(crate) holder: String,
    /// When the lease expires by the server's clock, in microseconds since the unix epoch.
    pub(crate) expires_at: i64,
}

/// One lease table: the lease of each `(classid, objid)` key.
pub(crate) type LeaseTable = BTreeMap<(i32, i32), LeaseRow>;

/// Which of the two modelled shapes a table has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableKind {
    /// `(classid, objid, epoch)`: the fence table's.
    Fence,
    /// `(classid, objid, holder, expires_at)`: the lease table's.
    Lease,
}

/// A table of one of the modelled shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Table {
    Fence(FenceTable),
    Lease(LeaseTable),
}

/// The committed tables of one instance (or of a primary and its synchronous standbys).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Storage {
    /// Tables by database, then by (lowercased) table name.
    tables: BTreeMap<String, BTreeMap<String, Table>>,
}

impl Storage {
    /// Creates table `name` of shape `kind` in `database` unless a table of that name exists;
    /// true when it was created.
    pub(crate) fn create(&mut self, database: &str, name: &str, kind: TableKind) -> bool {
        let tables = self.tables.entry(database.to_owned()).or_default();
        if tables.contains_key(name) {
            return false;
        }
        let table = match kind {
            TableKind::Fence => Table::Fence(FenceTable::new()),
            TableKind::Lease => Table::Lease(LeaseTable::new()),
        };
        tables.insert(name.to_owned(), table);
        true
    }

    /// Fence table `name` of `database`, if it exists (and has the fence table's shape).
    pub(crate) fn fence(&self, database: &str, name: &str) -> Option<&FenceTable> {
        match self.tables.get(database)?.get(name)? {
            Table::Fence(rows) => Some(rows),
            Table::Lease(_) => None,
        }
    }

    /// Fence table `name` of `database` for writing, if it exists.
    pub(crate) fn fence_mut(&mut self, database: &str, name: &str) -> Option<&mut FenceTable> {
        match self.tables.get_mut(database)?.get_mut(name)? {
            Table::Fence(rows) => Some(rows),
            Table::Lease(_) => None,
        }
    }

    /// Lease table `name` of `database`, if it exists (and has the lease table's shape).
    pub(crate) fn lease(&self, database: &str, name: &str) -> Option<&LeaseTable> {
        match self.tables.get(database)?.get(name)? {
            Table::Lease(rows) => Some(rows),
            Table::Fence(_) => None,
        }
    }

    /// Lease table `name` of `database` for writing, if it exists.
    pub(crate) fn lease_mut(&mut self, database: &str, name: &str) -> Option<&mut LeaseTable> {
        match self.tables.get_mut(database)?.get_mut(name)? {
            Table::Lease(rows) => Some(rows),
            Table::Fence(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_answers_only_as_the_shape_it_was_created_with() {
        let mut storage = Storage::default();
        assert!(storage.create("db", "f", TableKind::Fence));
        assert!(storage.create("db", "l", TableKind::Lease));
        assert!(
            !storage.create("db", "l", TableKind::Fence),
            "the name exists"
        );
        assert!(storage.fence("db", "f").is_some() && storage.lease("db", "f").is_none());
        assert!(storage.lease("db", "l").is_some() && storage.fence("db", "l").is_none());
        assert!(storage.lease("other", "l").is_none());
    }
}
