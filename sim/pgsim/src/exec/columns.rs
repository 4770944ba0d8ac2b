//! The result columns of a `SELECT` list, named and typed before evaluation as PostgreSQL's
//! analysis does (what RowDescription and Describe report).

use crate::reply::PgType;
use crate::sql::{Expr, Func};

/// The RowDescription columns of a `SELECT` list.
pub(super) fn describe(columns: &[Expr]) -> Vec<(&'static str, PgType)> {
    columns
        .iter()
        .map(|expr| (column_name(expr).0, type_of(expr)))
        .collect()
}

/// The result column's name and its strength, as PostgreSQL's `FigureColname` derives
/// them: a function's or `EXISTS`'s name is strong (2); a type name (`bool`) is weak (1);
/// a `CASE` takes its `ELSE`'s name when strong, else is `case`.
fn column_name(expr: &Expr) -> (&'static str, u8) {
    match expr {
        Expr::Call(func, _) => (func.name(), 2),
        Expr::Exists(_) => ("exists", 2),
        Expr::Case { otherwise, .. } => match column_name(otherwise) {
            (name, 2) => (name, 2),
            _ => ("case", 1),
        },
        Expr::Bool(_) => ("bool", 1),
        Expr::CastInt8(inner) => match column_name(inner) {
            (name, 2) => (name, 2),
            _ => ("int8", 1),
        },
        Expr::Text(_)
        | Expr::Null
        | Expr::Int(_)
        | Expr::IsNull { .. }
        | Expr::Not(_)
        | Expr::Equals(..) => ("?column?", 0),
    }
}

/// The result column's type, known before evaluation. An untyped literal (`unknown`) or
/// NULL is text unless another branch of a `CASE` decides.
fn type_of(expr: &Expr) -> PgType {
    match expr {
        Expr::Int(n) if i32::try_from(*n).is_ok() => PgType::Int4,
        Expr::Int(_) | Expr::CastInt8(_) => PgType::Int8,
        Expr::Bool(_) | Expr::IsNull { .. } | Expr::Not(_) | Expr::Exists(_) | Expr::Equals(..) => {
            PgType::Bool
        }
        Expr::Text(_) | Expr::Null => PgType::Text,
        Expr::Case { arms, otherwise } => arms
            .iter()
            .map(|(_, then)| then)
            .chain(std::iter::once(otherwise.as_ref()))
            .find(|e| !matches!(e, Expr::Text(_) | Expr::Null))
            .map_or(PgType::Text, type_of),
        Expr::Call(func, _) => match func {
            Func::TryAdvisoryLock
            | Func::AdvisoryUnlock
            | Func::TryAdvisoryLockShared
            | Func::AdvisoryUnlockShared
            | Func::IsInRecovery
            | Func::TerminateBackend => PgType::Bool,
            Func::AdvisoryUnlockAll | Func::AdvisoryLock | Func::AdvisoryXactLock => PgType::Void,
            Func::SetConfig
            | Func::CurrentSetting
            | Func::Concat
            | Func::CurrentDatabase
            | Func::NullIf => PgType::Text,
            Func::BackendPid => PgType::Int4,
            Func::DatePart | Func::Trunc => PgType::Float8,
            Func::ClockTimestamp => PgType::Timestamptz,
        },
    }
}
