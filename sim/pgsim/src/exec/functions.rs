//! The built-in functions the simulated server knows: advisory locks, `set_config` and
//! `current_setting`, backend and server facts, `pg_terminate_backend`, the clock and a few
//! scalar helpers.

use super::value::Value;
use super::{Ctx, Stop, not_owned};
use crate::guc::Guc;
use crate::locks::{LockKey, LockMode};
use crate::reply::{SqlError, sqlstate};
use crate::sql::Func;
use crate::state::LockWait;
use crate::timestamp::server_micros;

impl Ctx<'_> {
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
            (Func::TryAdvisoryLock, _) => {
                let key = lock_key(func, args)?;
                Ok(Value::Bool(self.state.try_lock(pid, key, at)))
            }
            (Func::TryAdvisoryLockShared, _) => {
                let key = lock_key(func, args)?;
                Ok(Value::Bool(self.state.try_lock_in(
                    pid,
                    key,
                    LockMode::Shared,
                    at,
                )))
            }
            (Func::AdvisoryUnlockShared, _) => {
                let key = lock_key(func, args)?;
                let released = self.state.unlock_in(pid, key, LockMode::Shared, at);
                if !released {
                    self.notices.push(not_owned(LockMode::Shared));
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
            (Func::AdvisoryUnlock, _) => {
                let key = lock_key(func, args)?;
                let released = self.state.unlock(pid, key, at);
                if !released {
                    self.notices.push(not_owned(LockMode::Exclusive));
                }
                Ok(Value::Bool(released))
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
            (Func::CurrentDatabase, []) => Ok(Value::Text(
                self.state
                    .sessions
                    .get(&pid)
                    .map(|session| session.database.clone())
                    .unwrap_or_default(),
            )),
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
