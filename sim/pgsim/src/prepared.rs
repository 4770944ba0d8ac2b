//! The prepared statements and portals of one session of the extended query protocol, which
//! the session's state keeps and [`extended`](super::extended) runs.

use std::collections::BTreeMap;

use super::sql::Statement;

/// A bound portal: its statement (`None` for an empty query) and the result formats.
#[derive(Debug, Clone)]
pub(crate) struct Portal {
    pub(crate) statement: Option<Statement>,
    pub(crate) formats: Vec<i16>,
}

/// The prepared statements and portals of one session; the unnamed ones are named `""`.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// Statements by name; `None` is an empty query.
    pub(crate) statements: BTreeMap<String, Option<Statement>>,
    pub(crate) portals: BTreeMap<String, Portal>,
}
