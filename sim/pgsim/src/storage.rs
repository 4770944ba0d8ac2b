//! Committed table data: the fencing table `plexsphere_leader_fence`, the lease table
//! `plexsphere_leader_lease` and a lease shard space's members, owners and member sequence
//! (`plexsphere_shard_member`, `plexsphere_shard_owner`, `plexsphere_shard_member_id`) of each
//! database.
//!
//! Unlike sessions and advisory locks, committed rows survive a crash and a restart (they
//! are in the WAL), and an instance that replicates synchronously from another one
//! ([`ServerHandle::replicate_to`](super::ServerHandle::replicate_to)) has every row the
//! other committed, so a failover to it keeps the fencing epochs and the leases.
//!
//! Only the tables' shapes are modelled: a `(classid int4, objid int4)` primary key with
//! a `bigint` epoch (the fence table), or with a `text` holder and a `timestamptz` expiry (the
//! lease table, and with `member` for `objid` the shard members' table); a `(classid, shard)`
//! key with a nullable `member` (the shard owners' table); an `int4` sequence that cycles from
//! 1 (the members' ids; its values are WAL-logged with the commits that use them, so a crash
//! never hands one out twice). MVCC visibility is not: every write commits on its own and every statement
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

/// One table of shard owners: the owning member of each `(classid, shard)` key (`None`: free).
pub(crate) type OwnerTable = BTreeMap<(i32, i32), Option<i32>>;

/// Which of the modelled shapes a table (or sequence) has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableKind {
    /// `(classid, objid, epoch)`: the fence table's.
    Fence,
    /// `(classid, objid, holder, expires_at)`: the lease table's.
    Lease,
    /// `(classid, member, holder, expires_at)`: a lease shard space's members.
    Members,
    /// `(classid, shard, member)`: a lease shard space's owners.
    Owners,
    /// `CREATE SEQUENCE … AS int4 MINVALUE 1 CYCLE`: the members' ids.
    Sequence,
    /// The lease's unlogged table of ranked replicas' candidacies: created by the lease's
    /// setup; its rows are each instance's own (`State::candidates`), not committed data.
    Candidates,
    /// The version floors: created by the lease's setup, never written (no floor is on).
    Floor,
}

/// A table of one of the modelled shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Table {
    Fence(FenceTable),
    /// The lease table, and the shard members' table of the same row shape.
    Lease(TableKind, LeaseTable),
    Owners(OwnerTable),
    /// The value the sequence's last `nextval` returned (`None`: never called).
    Sequence(Option<i32>),
    /// A table whose definition is all it keeps here: the candidacies' (its rows are
    /// unlogged, `State::candidates`) or the floors' (no floor is on in the simulation).
    Unwritten(TableKind),
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
            TableKind::Lease | TableKind::Members => Table::Lease(kind, LeaseTable::new()),
            TableKind::Owners => Table::Owners(OwnerTable::new()),
            TableKind::Sequence => Table::Sequence(None),
            TableKind::Candidates | TableKind::Floor => Table::Unwritten(kind),
        };
        tables.insert(name.to_owned(), table);
        true
    }

    /// Whether the candidate table `name` of `database` exists.
    pub(crate) fn has_candidates(&self, database: &str, name: &str) -> bool {
        matches!(
            self.tables
                .get(database)
                .and_then(|tables| tables.get(name)),
            Some(Table::Unwritten(TableKind::Candidates))
        )
    }

    /// Fence table `name` of `database`, if it exists (and has the fence table's shape).
    pub(crate) fn fence(&self, database: &str, name: &str) -> Option<&FenceTable> {
        match self.tables.get(database)?.get(name)? {
            Table::Fence(rows) => Some(rows),
            _ => None,
        }
    }

    /// Fence table `name` of `database` for writing, if it exists.
    pub(crate) fn fence_mut(&mut self, database: &str, name: &str) -> Option<&mut FenceTable> {
        match self.tables.get_mut(database)?.get_mut(name)? {
            Table::Fence(rows) => Some(rows),
            _ => None,
        }
    }

    /// Table `name` of `database` of the lease row's shape `kind` (the lease table's, or the
    /// shard members'), if it exists with that shape.
    pub(crate) fn lease(&self, database: &str, name: &str) -> Option<&LeaseTable> {
        self.leases(database, name, TableKind::Lease)
    }

    /// Lease table `name` of `database` for writing, if it exists.
    pub(crate) fn lease_mut(&mut self, database: &str, name: &str) -> Option<&mut LeaseTable> {
        self.leases_mut(database, name, TableKind::Lease)
    }

    /// Table `name` of `database` of the lease row's shape and of `kind`
    /// ([`TableKind::Lease`] or [`TableKind::Members`]), if it exists.
    pub(crate) fn leases(
        &self,
        database: &str,
        name: &str,
        kind: TableKind,
    ) -> Option<&LeaseTable> {
        match self.tables.get(database)?.get(name)? {
            Table::Lease(shape, rows) if *shape == kind => Some(rows),
            _ => None,
        }
    }

    /// [`Storage::leases`] for writing.
    pub(crate) fn leases_mut(
        &mut self,
        database: &str,
        name: &str,
        kind: TableKind,
    ) -> Option<&mut LeaseTable> {
        match self.tables.get_mut(database)?.get_mut(name)? {
            Table::Lease(shape, rows) if *shape == kind => Some(rows),
            _ => None,
        }
    }

    /// Owners' table `name` of `database`, if it exists.
    pub(crate) fn owners(&self, database: &str, name: &str) -> Option<&OwnerTable> {
        match self.tables.get(database)?.get(name)? {
            Table::Owners(rows) => Some(rows),
            _ => None,
        }
    }

    /// Owners' table `name` of `database` for writing, if it exists.
    pub(crate) fn owners_mut(&mut self, database: &str, name: &str) -> Option<&mut OwnerTable> {
        match self.tables.get_mut(database)?.get_mut(name)? {
            Table::Owners(rows) => Some(rows),
            _ => None,
        }
    }

    /// `nextval` of sequence `name` of `database`: 1 first, then one more each call, back to
    /// 1 after `i32::MAX` (`CYCLE`); `None` when no such sequence exists.
    pub(crate) fn next_value(&mut self, database: &str, name: &str) -> Option<i32> {
        match self.tables.get_mut(database)?.get_mut(name)? {
            Table::Sequence(last) => {
                let next = match *last {
                    Some(i32::MAX) | None => 1,
                    Some(value) => value + 1,
                };
                *last = Some(next);
                Some(next)
            }
            _ => None,
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
        assert!(storage.create("db", "m", TableKind::Members));
        assert!(
            storage.lease("db", "m").is_none(),
            "a members' table is no lease table"
        );
        assert!(storage.leases("db", "m", TableKind::Members).is_some());
        assert!(storage.create("db", "o", TableKind::Owners));
        assert!(storage.owners("db", "o").is_some() && storage.owners("db", "m").is_none());
        assert!(storage.create("db", "s", TableKind::Sequence));
        assert_eq!(storage.next_value("db", "s"), Some(1));
        assert_eq!(storage.next_value("db", "s"), Some(2));
        assert_eq!(storage.next_value("db", "o"), None);
    }
}
