//! Expression evaluation: the value an expression computes; literals, operators, `CASE`,
//! casts; `EXISTS` over `pg_locks` (the lock table's granted and waiting advisory locks as the
//! view's rows); the built-in functions (advisory locks, settings, backend and server facts,
//! the clock, a few scalars); and the journal that answers a resumed statement's calls and
//! `EXISTS` without running their side effects again.

use super::{Ctx, Stop, not_owned, server_micros};
use crate::guc::Guc;
use crate::locks::{LockKey, LockMode};
use crate::reply::{SqlError, sqlstate};
use crate::sql::{Expr, Func, LockColumn, LockCond};
use crate::state::LockWait;
use crate::timestamp::timestamp_text;

/// A value computed by an expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A `timestamptz`, in microseconds since the unix epoch.
    Timestamp(i64),
    Text(String),
    Void,
}

impl Value {
    /// The text output of the value; `None` for NULL.
    pub(super) fn text(&self) -> Option<String> {
        match self {
            Self::Null => None,
            Self::Bool(b) => Some(if *b { "t" } else { "f" }.to_owned()),
            Self::Int(n) => Some(n.to_string()),
            // Shortest round-trip digits, as PostgreSQL's float8 output (which switches to an
            // exponent from 1e15, a range the simulation never reaches).
            Self::Float(x) => Some(x.to_string()),
            Self::Timestamp(micros) => Some(timestamp_text(*micros)),
            Self::Text(s) => Some(s.clone()),
            Self::Void => Some(String::new()),
        }
    }

    /// The SQL name of the value's type, as error messages name it.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Self::Null | Self::Text(_) => "unknown",
            Self::Bool(_) => "boolean",
            Self::Int(n) if i32::try_from(*n).is_ok() => "integer",
            Self::Int(_) => "bigint",
            Self::Float(_) => "double precision",
            Self::Timestamp(_) => "timestamp with time zone",
            Self::Void => "void",
        }
    }
}

impl Ctx<'_> {
    /// The value of `expr`; a call or `EXISTS` goes through the journal.
    pub(super) fn eval(&mut self, expr: &Expr) -> Result<Value, Stop> {
        match expr {
            Expr::Int(n) => Ok(Value::Int(*n)),
            Expr::Bool(b) => Ok(Value::Bool(*b)),
            Expr::Text(s) => Ok(Value::Text(s.clone())),
            Expr::Null => Ok(Value::Null),
            Expr::IsNull { expr, negated } => {
                let is_null = self.eval(expr)? == Value::Null;
                Ok(Value::Bool(is_null != *negated))
            }
            Expr::Equals(left, right) => match (self.eval(left)?, self.eval(right)?) {
                (Value::Null, _) | (_, Value::Null) => Ok(Value::Null),
                (left, right) if left.type_name() == right.type_name() => {
                    Ok(Value::Bool(left == right))
                }
                (left, right) => Err(SqlError::error(
                    sqlstate::UNDEFINED_FUNCTION,
                    format!(
                        "operator does not exist: {} = {}",
                        left.type_name(),
                        right.type_name()
                    ),
                )
                .into()),
            },
            Expr::Not(expr) => match self.eval(expr)? {
                Value::Bool(b) => Ok(Value::Bool(!b)),
                Value::Null => Ok(Value::Null),
                other => Err(SqlError::error(
                    sqlstate::DATATYPE_MISMATCH,
                    format!(
                        "argument of NOT must be type boolean, not type {}",
                        other.type_name()
                    ),
                )
                .into()),
            },
            Expr::Case { arms, otherwise } => {
                for (when, then) in arms {
                    if self.eval(when)? == Value::Bool(true) {
                        return self.eval(then);
                    }
                }
                self.eval(otherwise)
            }
            Expr::CastInt8(expr) => Ok(cast_int8(self.eval(expr)?)?),
            Expr::Exists(conds) => self.journaled(|ctx| Ok(ctx.exists(conds)?)),
            Expr::Call(func, args) => {
                let mut values = Vec::with_capacity(args.len());
                for arg in args {
                    values.push(self.eval(arg)?);
                }
                self.journaled(|ctx| ctx.call(*func, &values))
            }
        }
    }

    /// Answers from the replay journal when resuming, else evaluates `f` and journals it.
    fn journaled(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<Value, Stop>,
    ) -> Result<Value, Stop> {
        let value = match self.replay.pop_front() {
            Some(value) => value,
            None => f(self)?,
        };
        self.journal.push(value.clone());
        Ok(value)
    }

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

    /// The result of `func` on the evaluated `args`; NULL in, NULL out for the lock functions.
    pub(super) fn call(&mut self, func: Func, args: &[Value]) -> Result<Value, Stop> {
        let (pid, at) = (self.pid, self.at);
        match (func, args) {
            (
                Func::TryAdvisoryLock
                | Func::AdvisoryUnlock
                | Func::AdvisoryLock
                | Func::AdvisoryXactLock
                | Func::TryAdvisoryLockShared
                | Func::AdvisoryUnlockShared,
                _,
            ) if args.contains(&Value::Null) => Ok(Value::Null),
            (Func::TryAdvisoryLock | Func::TryAdvisoryLockShared, _) => {
                let key = lock_key(func, args)?;
                Ok(Value::Bool(self.state.try_lock_in(
                    pid,
                    key,
                    mode_of(func),
                    at,
                )))
            }
            (Func::AdvisoryUnlock | Func::AdvisoryUnlockShared, _) => {
                let (key, mode) = (lock_key(func, args)?, mode_of(func));
                let released = self.state.unlock_in(pid, key, mode, at);
                if !released {
                    self.notices.push(not_owned(mode));
                }
                Ok(Value::Bool(released))
            }
            (Func::AdvisoryLock, _) => {
                let key = lock_key(func, args)?;
                match self.state.lock_or_wait(pid, key, at) {
                    LockWait::Granted => Ok(Value::Void),
                    LockWait::Queued(_) => Err(Stop::Blocked),
                }
            }
            (Func::AdvisoryXactLock, _) => {
                let key = lock_key(func, args)?;
                if self.state.free_for(pid, key) {
                    Ok(Value::Void)
                } else {
                    Err(SqlError::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "the simulated server does not model a transaction-level advisory lock \
                         on a key another session holds",
                    )
                    .into())
                }
            }
            (Func::AdvisoryUnlockAll, []) => {
                self.state.unlock_all(pid, at);
                Ok(Value::Void)
            }
            (Func::SetConfig, [Value::Text(name), Value::Text(value), Value::Bool(local)]) => {
                let guc = Guc::lookup(name)?;
                self.set_guc(&guc, value, *local)?;
                Ok(self.setting(&guc, name, false)?)
            }
            (Func::CurrentSetting, [Value::Text(name)]) => {
                let guc = Guc::lookup(name)?;
                Ok(self.setting(&guc, name, false)?)
            }
            (Func::CurrentSetting, [Value::Text(name), Value::Bool(missing_ok)]) => {
                match Guc::lookup(name) {
                    Ok(guc) => Ok(self.setting(&guc, name, *missing_ok)?),
                    Err(_) if *missing_ok => Ok(Value::Null),
                    Err(error) => Err(error.into()),
                }
            }
            (Func::BackendPid, []) => Ok(Value::Int(i64::from(pid))),
            (Func::CurrentDatabase, []) => Ok(Value::Text(self.database().unwrap_or_default())),
            (Func::IsInRecovery, []) => Ok(Value::Bool(self.state.in_recovery)),
            (Func::TerminateBackend, [Value::Int(target)]) => {
                let signalled =
                    i32::try_from(*target).is_ok_and(|target| self.state.request_terminate(target));
                if !signalled {
                    self.notices.push(SqlError::warning(
                        sqlstate::WARNING,
                        format!("PID {target} is not a PostgreSQL backend process"),
                    ));
                }
                Ok(Value::Bool(signalled))
            }
            (Func::ClockTimestamp, []) => Ok(Value::Timestamp(server_micros(at))),
            (Func::DatePart, [Value::Text(field), Value::Timestamp(micros)]) => {
                if field.eq_ignore_ascii_case("epoch") {
                    // As PostgreSQL's float8: exact for whole seconds below 2^53.
                    Ok(Value::Float(*micros as f64 / 1e6))
                } else {
                    Err(SqlError::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        format!("the simulated server's date_part knows only epoch, not {field}"),
                    )
                    .into())
                }
            }
            (Func::Trunc, [Value::Float(x)]) => Ok(Value::Float(x.trunc())),
            (Func::DatePart | Func::Trunc, _) if args.contains(&Value::Null) => Ok(Value::Null),
            (Func::Concat, _) => Ok(Value::Text(
                args.iter().filter_map(Value::text).collect::<String>(),
            )),
            (Func::NullIf, [a, b]) => Ok(if a != &Value::Null && a == b {
                Value::Null
            } else {
                a.clone()
            }),
            _ => Err(no_such_function(func, args).into()),
        }
    }
}

/// `value::bigint`: a float rounds half to even (as `rint`), a text must be an integer.
fn cast_int8(value: Value) -> Result<Value, SqlError> {
    let out_of_range =
        || SqlError::error(sqlstate::NUMERIC_VALUE_OUT_OF_RANGE, "bigint out of range");
    match value {
        Value::Null | Value::Int(_) => Ok(value),
        // Range-checked before the cast.
        Value::Float(x) => {
            let x = x.round_ties_even();
            if (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&x) {
                Ok(Value::Int(x as i64))
            } else {
                Err(out_of_range())
            }
        }
        Value::Text(text) => text.trim().parse().map(Value::Int).map_err(|_| {
            SqlError::error(
                sqlstate::INVALID_TEXT_REPRESENTATION,
                format!("invalid input syntax for type bigint: \"{text}\""),
            )
        }),
        other => Err(SqlError::error(
            sqlstate::CANNOT_COERCE,
            format!("cannot cast type {} to bigint", other.type_name()),
        )),
    }
}

/// An `int4` as the unsigned `oid` `pg_locks` shows it.
fn oid(value: i32) -> i64 {
    i64::from(value.cast_unsigned())
}

/// The mode of an advisory lock function: shared for the `_shared` ones.
fn mode_of(func: Func) -> LockMode {
    match func {
        Func::TryAdvisoryLockShared | Func::AdvisoryUnlockShared => LockMode::Shared,
        _ => LockMode::Exclusive,
    }
}

fn lock_key(func: Func, args: &[Value]) -> Result<LockKey, SqlError> {
    match args {
        [Value::Int(key)] => Ok(LockKey::BigInt(*key)),
        [Value::Int(a), Value::Int(b)] => match (i32::try_from(*a), i32::try_from(*b)) {
            (Ok(a), Ok(b)) => Ok(LockKey::Pair(a, b)),
            _ => Err(no_such_function(func, args)),
        },
        _ => Err(no_such_function(func, args)),
    }
}

fn no_such_function(func: Func, args: &[Value]) -> SqlError {
    let types: Vec<&str> = args.iter().map(Value::type_name).collect();
    SqlError::error(
        sqlstate::UNDEFINED_FUNCTION,
        format!(
            "function {}({}) does not exist",
            func.name(),
            types.join(", ")
        ),
    )
}
