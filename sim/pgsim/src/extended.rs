//! The extended query protocol, for statements without parameters: what `tokio_postgres`
//! sends for `query`, `execute` and `prepare` (Parse, Describe, Sync; then Bind, Execute,
//! Sync; and Close, Sync when the statement is dropped), so that library code that runs its
//! statements that way, such as `plexsphere_leader::fencing::check`, runs unmodified.
//!
//! Modelled: Parse of one statement `sql` knows, named or unnamed; Describe of a prepared
//! statement (a ParameterDescription without parameters, then RowDescription or NoData) or of
//! a portal (its columns in the Bind's formats); Bind with text or binary result formats;
//! Execute of the whole result; Close; Sync (ReadyForQuery). An error makes an open block
//! failed, and the session skips messages until Sync (as in PostgreSQL; the skipping is the
//! session's). Not modelled: parameters (`$1` does not parse; a Bind that supplies values
//! fails with 08P01), row limits and PortalSuspended, portals outliving their transaction,
//! FunctionCall. An implicit transaction ends with each Execute rather than at the next
//! Sync: tokio-postgres sends Sync right after every Execute, so no client can tell.

use super::exec;
use super::frontend::Target;
use super::prepared::{Portal, Prepared};
use super::reply::TransactionStatus;
use super::reply::{Reply, SqlError, sqlstate};
use super::sql::{self, Statement};
use super::state::State;

/// What an Execute runs.
pub(crate) enum Execution {
    /// A statement, with the result formats of its Bind.
    Statement(Statement, Vec<i16>),
    /// Nothing to run: the whole reply (EmptyQueryResponse, or an error).
    Reply(Reply),
}

/// `P` Parse: prepares `query` as statement `name`.
pub(crate) fn parse(state: &mut State, pid: i32, name: &str, query: &str) -> Reply {
    let parsed = match sql::parse(query) {
        Ok(statements) if statements.len() > 1 => Err(SqlError::error(
            sqlstate::SYNTAX_ERROR,
            "cannot insert multiple commands into a prepared statement",
        )),
        Ok(statements) => Ok(statements.into_iter().next()),
        Err(error) => Err(error),
    };
    let statement = match parsed.and_then(|statement| allowed(state, pid, statement)) {
        Ok(statement) => statement,
        Err(error) => return failure(state, pid, &error),
    };
    let Some(prepared) = prepared(state, pid) else {
        return Reply::default();
    };
    if !name.is_empty() && prepared.statements.contains_key(name) {
        let error = SqlError::error(
            sqlstate::DUPLICATE_PREPARED_STATEMENT,
            format!("prepared statement \"{name}\" already exists"),
        );
        return failure(state, pid, &error);
    }
    prepared.statements.insert(name.to_owned(), statement);
    let mut reply = Reply::default();
    reply.parse_complete();
    reply
}

/// `B` Bind: makes portal `portal` of statement `statement`, which must take no parameter.
pub(crate) fn bind(
    state: &mut State,
    pid: i32,
    portal: &str,
    statement: &str,
    params: usize,
    formats: Vec<i16>,
) -> Reply {
    let found = match find_statement(state, pid, statement) {
        Ok(found) => found,
        Err(error) => return failure(state, pid, &error),
    };
    if params != 0 {
        let error = SqlError::error(
            sqlstate::PROTOCOL_VIOLATION,
            format!(
                "bind message supplies {params} parameters, but prepared statement \"{statement}\" requires 0"
            ),
        );
        return failure(state, pid, &error);
    }
    let found = match allowed(state, pid, found) {
        Ok(found) => found,
        Err(error) => return failure(state, pid, &error),
    };
    let Some(prepared) = prepared(state, pid) else {
        return Reply::default();
    };
    let bound = Portal {
        statement: found,
        formats,
    };
    prepared.portals.insert(portal.to_owned(), bound);
    let mut reply = Reply::default();
    reply.bind_complete();
    reply
}

/// `D` Describe of a prepared statement or a portal.
pub(crate) fn describe(state: &mut State, pid: i32, target: Target, name: &str) -> Reply {
    let found = match target {
        Target::Statement => find_statement(state, pid, name).map(|s| (s, Vec::new())),
        Target::Portal => find_portal(state, pid, name).map(|p| (p.statement, p.formats)),
    };
    let (statement, formats) = match found {
        Ok(found) => found,
        Err(error) => return failure(state, pid, &error),
    };
    let mut reply = Reply::default();
    if target == Target::Statement {
        reply.no_parameters();
    }
    match statement.as_ref().and_then(exec::result_columns) {
        Some(columns) => {
            let columns: Vec<(&str, _)> = columns.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            reply.row_description_in(&columns, &formats);
        }
        None => reply.no_data(),
    }
    reply
}

/// `E` Execute: what portal `portal` runs.
pub(crate) fn execution(state: &mut State, pid: i32, portal: &str) -> Execution {
    match find_portal(state, pid, portal) {
        Ok(Portal {
            statement: Some(statement),
            formats,
        }) => Execution::Statement(statement, formats),
        Ok(Portal {
            statement: None, ..
        }) => {
            let mut reply = Reply::default();
            reply.empty_query_response();
            Execution::Reply(reply)
        }
        Err(error) => Execution::Reply(failure(state, pid, &error)),
    }
}

/// `C` Close of a prepared statement or a portal; closing one that does not exist is fine.
pub(crate) fn close(state: &mut State, pid: i32, target: Target, name: &str) -> Reply {
    if let Some(prepared) = prepared(state, pid) {
        match target {
            Target::Statement => prepared.statements.remove(name).map(|_| ()),
            Target::Portal => prepared.portals.remove(name).map(|_| ()),
        };
    }
    let mut reply = Reply::default();
    reply.close_complete();
    reply
}

fn prepared(state: &mut State, pid: i32) -> Option<&mut Prepared> {
    state.sessions.get_mut(&pid).map(|s| &mut s.prepared)
}

fn find_statement(state: &mut State, pid: i32, name: &str) -> Result<Option<Statement>, SqlError> {
    prepared(state, pid)
        .and_then(|p| p.statements.get(name).cloned())
        .ok_or_else(|| {
            SqlError::error(
                sqlstate::INVALID_SQL_STATEMENT_NAME,
                format!("prepared statement \"{name}\" does not exist"),
            )
        })
}

fn find_portal(state: &mut State, pid: i32, name: &str) -> Result<Portal, SqlError> {
    prepared(state, pid)
        .and_then(|p| p.portals.get(name).cloned())
        .ok_or_else(|| {
            SqlError::error(
                sqlstate::INVALID_CURSOR_NAME,
                format!("portal \"{name}\" does not exist"),
            )
        })
}

/// In a failed block only `COMMIT` and `ROLLBACK` may be parsed and bound (25P02).
fn allowed(
    state: &State,
    pid: i32,
    statement: Option<Statement>,
) -> Result<Option<Statement>, SqlError> {
    let failed = state
        .sessions
        .get(&pid)
        .is_some_and(|s| s.transaction == TransactionStatus::Failed);
    if failed && !statement.as_ref().is_some_and(Statement::ends_transaction) {
        return Err(SqlError::error(
            sqlstate::IN_FAILED_SQL_TRANSACTION,
            "current transaction is aborted, commands ignored until end of transaction block",
        ));
    }
    Ok(statement)
}

/// The reply to an extended-protocol message the simulated server does not model (`F`
/// FunctionCall): 0A000, and an open block becomes failed.
pub(crate) fn reject(state: &mut State, pid: i32, tag: u8) -> Reply {
    let tag = char::from(tag);
    let message = format!(
        "the simulated server supports only the simple query protocol (got message '{tag}')"
    );
    let error = SqlError::error(sqlstate::FEATURE_NOT_SUPPORTED, message);
    failure(state, pid, &error)
}

/// An ErrorResponse; an open block becomes failed.
fn failure(state: &mut State, pid: i32, error: &SqlError) -> Reply {
    if let Some(session) = state.sessions.get_mut(&pid)
        && session.transaction == TransactionStatus::InBlock
    {
        session.transaction = TransactionStatus::Failed;
    }
    let mut reply = Reply::default();
    reply.error(error);
    reply
}
