//! Expression evaluation: literals, operators, `CASE`, casts, and the journal that answers a
//! resumed statement's calls and `EXISTS` without running their side effects again.

use super::value::Value;
use super::{Ctx, Stop};
use crate::reply::{SqlError, sqlstate};
use crate::sql::Expr;

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
