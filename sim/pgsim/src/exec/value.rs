//! The value an expression computes, with its text output and its SQL type name.

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
