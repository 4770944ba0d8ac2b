//! `EXISTS` over `pg_locks`: the lock table's granted and waiting advisory locks as the
//! view's rows, matched against the conditions of the adapter's queries.

use super::Ctx;
use super::value::Value;
use crate::locks::LockKey;
use crate::reply::{SqlError, sqlstate};
use crate::sql::{Expr, Func, LockColumn, LockCond};

impl Ctx<'_> {
    /// `EXISTS` over the session database's rows of `pg_locks` (granted and waiting).
    pub(super) fn exists(&mut self, conds: &[LockCond]) -> Result<Value, SqlError> {
        let database = self.database()?;
        let granted = self
            .state
            .locks
            .held()
            .into_iter()
            .map(|l| (l.id, l.pid, true));
        let waiting = self
            .state
            .locks
            .waiters()
            .into_iter()
            .map(|(id, pid)| (id, pid, false));
        for (id, pid, granted) in granted.chain(waiting) {
            if id.database != database {
                continue;
            }
            let mut all = true;
            for cond in conds {
                all &= self.row_matches(id.key, pid, granted, cond)?;
            }
            if all {
                return Ok(Value::Bool(true));
            }
        }
        Ok(Value::Bool(false))
    }

    /// Whether the `pg_locks` row of `key` held (`granted`) or awaited by `pid` meets `cond`.
    fn row_matches(
        &self,
        key: LockKey,
        pid: i32,
        granted: bool,
        cond: &LockCond,
    ) -> Result<bool, SqlError> {
        let (classid, objid, objsubid) = match key {
            LockKey::Pair(a, b) => (oid(a), oid(b), 2),
            LockKey::BigInt(k) => (k >> 32 & 0xffff_ffff, k & 0xffff_ffff, 1),
        };
        let want = match &cond.value {
            Expr::Call(Func::BackendPid, _) => Value::Int(i64::from(self.pid)),
            Expr::Int(n) => Value::Int(*n),
            Expr::Text(t) => Value::Text(t.clone()),
            Expr::Bool(b) => Value::Bool(*b),
            _ => Value::Null,
        };
        let mismatch = |column: &str, ty: &str| {
            SqlError::error(
                sqlstate::UNDEFINED_FUNCTION,
                format!(
                    "operator does not exist: {ty} = {} (pg_locks.{column})",
                    want.type_name()
                ),
            )
        };
        let int = |column: &str, ty: &str, have: i64, oid_column: bool| match &want {
            Value::Int(n) if oid_column => Ok(i32::try_from(*n).map_or(*n, oid) == have),
            Value::Int(n) => Ok(*n == have),
            Value::Text(t) => Ok(t.trim().parse::<i64>().ok() == Some(have)),
            _ => Err(mismatch(column, ty)),
        };
        match cond.column {
            LockColumn::LockType => match &want {
                Value::Text(t) => Ok(t == "advisory"),
                _ => Err(mismatch("locktype", "text")),
            },
            LockColumn::ClassId => int("classid", "oid", classid, true),
            LockColumn::ObjId => int("objid", "oid", objid, true),
            LockColumn::ObjSubId => int("objsubid", "smallint", objsubid, false),
            LockColumn::Pid => int("pid", "integer", i64::from(pid), false),
            LockColumn::Granted => match &want {
                Value::Bool(b) => Ok(*b == granted),
                _ => Err(mismatch("granted", "boolean")),
            },
        }
    }
}

/// An `int4` as the unsigned `oid` `pg_locks` shows it.
fn oid(value: i32) -> i64 {
    i64::from(value.cast_unsigned())
}
