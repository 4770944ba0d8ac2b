//! The driver of the simulated server's executor: runs one simple Query against the shared
//! state and builds the whole reply, up to and including ReadyForQuery; or one statement of
//! an extended-protocol Execute, whose reply is its rows in the Bind's formats and its
//! CommandComplete (see `extended`). It dispatches each statement to the module of its
//! concept: `transaction` (blocks and implicit transactions), `settings` (GUCs, `SET`,
//! `SHOW`), `fence` (the fence table and its row locks), `eval` with `functions` and
//! `pg_locks` (expressions), `columns` (what a Describe reports), `shards` and `lease` (the
//! statements recognised whole).
//!
//! Synchronous and clock-free: the caller passes the simulated time `at`. A statement that
//! must wait in `pg_advisory_lock` stops with [`Run::Blocked`]; the session waits (in
//! simulated time, without holding the state) and then calls [`resume`]. Resuming
//! re-evaluates the waiting statement from its start with every call and `EXISTS` already
//! evaluated answered from a journal, so no side effect runs twice and the statement
//! continues exactly where it stopped.
//!
//! Transactions: a query string outside a transaction block is one implicit transaction.
//! Settings (`SET`, `set_config`) are transactional: an error undoes the implicit
//! transaction's (or the block's, at `ROLLBACK`) changes, and `set_config(…, true)` and
//! `SET LOCAL` values revert when the transaction ends either way. Table writes (the fence
//! table) commit at once, even inside a block that later rolls back: not modelled.
//!
//! Row locks: `SELECT … FOR SHARE` of a fence row share-locks it until the transaction ends
//! (`COMMIT`, `ROLLBACK`, the end of the implicit transaction, the session's end); an epoch
//! advance of a row another session share-locks stops with [`Run::Blocked`] like
//! `pg_advisory_lock`, and resumes, reading the committed epoch again, once no other session
//! share-locks the row (see `rows`).

mod columns;
mod eval;
mod fence;
mod functions;
mod lease;
mod pg_locks;
mod settings;
mod shards;
#[cfg(test)]
mod tests;
mod transaction;
mod value;

use std::collections::VecDeque;
use std::time::Duration;

use super::guc::{Guc, Gucs};
use super::locks::LockMode;
use super::reply::TransactionStatus;
use super::reply::{self, PgType, Reply, SqlError, sqlstate};
use super::sql::{self, Expr, Statement};
use super::state::{State, WaitEnd};
use super::storage::TableKind;
use columns::describe;
use value::Value;

/// What running (or resuming) a query produced.
pub(crate) enum Run {
    /// The whole reply, up to and including ReadyForQuery.
    Done(Reply),
    /// A statement waits in `pg_advisory_lock`, or for a row lock; the session is queued.
    Blocked(Box<Blocked>),
}

/// How a reply carries results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// A simple Query: RowDescription, rows in text, and ReadyForQuery at the end.
    Simple,
    /// An Execute of the extended protocol: rows in the Bind's format codes (see
    /// [`reply::format_of`]); no RowDescription (Describe sends it) and no ReadyForQuery
    /// (Sync does). An implicit transaction ends with the Execute.
    Extended { formats: Vec<i16> },
}

/// A query stopped in a lock wait, to be continued by [`resume`].
pub(crate) struct Blocked {
    protocol: Protocol,
    statements: Vec<Statement>,
    /// The index of the waiting statement.
    next: usize,
    /// Results of the waiting statement's calls so far, in evaluation order.
    journal: Vec<Value>,
    notices: Vec<SqlError>,
    reply: Reply,
    before: Gucs,
    /// When the statement first blocked.
    since: Duration,
}

/// Runs `query` for session `pid` at time `at`; `None` when the session is gone.
pub(crate) fn run_query(state: &mut State, pid: i32, query: &str, at: Duration) -> Option<Run> {
    let session = state.sessions.get_mut(&pid)?;
    session.last_query_at = Some(at);
    let before = session.gucs.clone();
    let mut ctx = Ctx::new(state, pid, at);
    match sql::parse(query) {
        Err(error) => {
            ctx.fail(&error, &before);
            ctx.finish(&before)
        }
        Ok(statements) if statements.is_empty() => {
            ctx.reply.empty_query_response();
            ctx.finish(&before)
        }
        Ok(statements) => ctx.drive(statements, 0, before),
    }
}

/// Executes `statement` for session `pid` as an extended-protocol Execute with the result
/// `formats` of its Bind; `None` when the session is gone.
pub(crate) fn execute(
    state: &mut State,
    pid: i32,
    statement: Statement,
    formats: Vec<i16>,
    at: Duration,
) -> Option<Run> {
    let session = state.sessions.get_mut(&pid)?;
    session.last_query_at = Some(at);
    let before = session.gucs.clone();
    let mut ctx = Ctx::new(state, pid, at);
    ctx.protocol = Protocol::Extended { formats };
    ctx.drive(vec![statement], 0, before)
}

/// The result columns of `statement`, as a Describe reports them; `None` when it returns
/// no rows (NoData).
pub(crate) fn result_columns(statement: &Statement) -> Option<Vec<(String, PgType)>> {
    let columns = match statement {
        Statement::Select(columns) => describe(columns),
        Statement::SelectEpoch { .. } | Statement::AdvanceEpoch { .. } => {
            fence::EPOCH_COLUMN.to_vec()
        }
        Statement::Show(name) => {
            let name = Guc::lookup(name).map_or_else(|_| name.clone(), |g| g.name().to_owned());
            return Some(vec![(name, PgType::Text)]);
        }
        Statement::Shard(statement) => shards::columns(statement).to_vec(),
        Statement::Lease(statement) => lease::columns(statement).to_vec(),
        Statement::Set { .. }
        | Statement::Begin
        | Statement::Commit
        | Statement::Rollback
        | Statement::CreateTable { .. } => return None,
    };
    let owned = columns.into_iter().map(|(name, ty)| (name.to_owned(), ty));
    Some(owned.collect())
}

/// Continues a query whose lock wait ended with `end`; `None` when the session is gone.
pub(crate) fn resume(
    state: &mut State,
    pid: i32,
    blocked: Box<Blocked>,
    end: WaitEnd,
    at: Duration,
) -> Option<Run> {
    state.sessions.get(&pid)?;
    let Blocked {
        protocol,
        statements,
        next,
        journal,
        notices,
        reply,
        before,
        since,
    } = *blocked;
    let mut ctx = Ctx::new(state, pid, at);
    ctx.protocol = protocol;
    ctx.reply = reply;
    ctx.notices = notices;
    ctx.blocked_since = Some(since);
    match end {
        WaitEnd::Granted => {
            ctx.replay = journal.into();
            ctx.replay.push_back(Value::Void);
            ctx.drive(statements, next, before)
        }
        WaitEnd::TimedOut => {
            if let Some(Statement::Select(columns)) = statements.get(next) {
                ctx.describe_row(&describe(columns));
            }
            ctx.flush_notices();
            let error = SqlError::error(
                sqlstate::LOCK_NOT_AVAILABLE,
                "canceling statement due to lock timeout",
            );
            ctx.fail(&error, &before);
            ctx.finish(&before)
        }
    }
}

/// The reply to an extended-protocol message: 0A000, and an open block becomes failed.
pub(crate) fn reject_extended(state: &mut State, pid: i32, tag: u8) -> Reply {
    if let Some(session) = state.sessions.get_mut(&pid)
        && session.transaction == TransactionStatus::InBlock
    {
        session.transaction = TransactionStatus::Failed;
    }
    let mut reply = Reply::default();
    reply.error(&SqlError::error(
        sqlstate::FEATURE_NOT_SUPPORTED,
        format!(
            "the simulated server supports only the simple query protocol (got message '{}')",
            char::from(tag)
        ),
    ));
    reply
}

/// Why an evaluation stopped.
enum Stop {
    Error(SqlError),
    /// Queued in `pg_advisory_lock`.
    Blocked,
}

impl From<SqlError> for Stop {
    fn from(error: SqlError) -> Self {
        Self::Error(error)
    }
}

struct Ctx<'a> {
    state: &'a mut State,
    pid: i32,
    at: Duration,
    protocol: Protocol,
    reply: Reply,
    /// Notices raised by the current statement, sent after its RowDescription.
    notices: Vec<SqlError>,
    /// Results to answer the current statement's calls with, when resuming it.
    replay: VecDeque<Value>,
    /// Results of the current statement's calls so far.
    journal: Vec<Value>,
    /// When the current statement first blocked, when it is being resumed.
    blocked_since: Option<Duration>,
    /// Whether the statements run in an implicit transaction block: a simple Query of several
    /// statements (PostgreSQL's `TBLOCK_IMPLICIT_INPROGRESS`), where `SET LOCAL` lasts until
    /// the end of the query string without the 25P01 warning a lone statement gets.
    implicit_block: bool,
}

impl<'a> Ctx<'a> {
    fn new(state: &'a mut State, pid: i32, at: Duration) -> Self {
        Self {
            state,
            pid,
            at,
            protocol: Protocol::Simple,
            reply: Reply::default(),
            notices: Vec::new(),
            replay: VecDeque::new(),
            journal: Vec::new(),
            blocked_since: None,
            implicit_block: false,
        }
    }

    /// Runs `statements` from index `next`; stops at the first error or lock wait.
    fn drive(mut self, statements: Vec<Statement>, next: usize, before: Gucs) -> Option<Run> {
        self.implicit_block = self.protocol == Protocol::Simple && statements.len() > 1;
        for (index, statement) in statements.iter().enumerate().skip(next) {
            if self.transaction() == TransactionStatus::Failed && !statement.ends_transaction() {
                let error = SqlError::error(
                    sqlstate::IN_FAILED_SQL_TRANSACTION,
                    "current transaction is aborted, commands ignored until end of transaction block",
                );
                self.fail(&error, &before);
                return self.finish(&before);
            }
            match self.execute(statement) {
                Ok(()) => {
                    self.journal.clear();
                    self.replay.clear();
                    self.notices.clear();
                    self.blocked_since = None;
                }
                Err(Stop::Error(error)) => {
                    self.fail(&error, &before);
                    return self.finish(&before);
                }
                Err(Stop::Blocked) => {
                    return Some(Run::Blocked(Box::new(Blocked {
                        protocol: self.protocol,
                        next: index,
                        journal: self.journal,
                        notices: self.notices,
                        reply: self.reply,
                        before,
                        since: self.blocked_since.unwrap_or(self.at),
                        statements,
                    })));
                }
            }
        }
        self.commit_implicit();
        self.finish(&before)
    }

    /// Appends ParameterStatus for a changed `application_name` and ReadyForQuery (a simple
    /// Query; an Execute's reply ends with its statement's).
    fn finish(mut self, before: &Gucs) -> Option<Run> {
        let session = self.state.sessions.get(&self.pid)?;
        if self.protocol != Protocol::Simple {
            return Some(Run::Done(self.reply));
        }
        let transaction = session.transaction;
        let application_name = session.gucs.application_name.clone();
        if application_name != before.application_name {
            self.reply
                .parameter_status("application_name", &application_name);
        }
        self.reply.ready_for_query(transaction);
        Some(Run::Done(self.reply))
    }

    /// The session's database; `gone` when the session ended.
    fn database(&self) -> Result<String, SqlError> {
        self.state
            .sessions
            .get(&self.pid)
            .map(|s| s.database.clone())
            .ok_or_else(gone)
    }

    /// Runs one statement, dispatched to the module of its concept.
    fn execute(&mut self, statement: &Statement) -> Result<(), Stop> {
        match statement {
            Statement::Select(columns) => self.select(columns),
            Statement::Set { name, value, local } => Ok(self.set(name, value, *local)?),
            Statement::Show(name) => Ok(self.show(name)?),
            Statement::Begin => {
                self.begin();
                Ok(())
            }
            Statement::Commit => {
                self.end_block(true);
                Ok(())
            }
            Statement::Rollback => {
                self.end_block(false);
                Ok(())
            }
            Statement::CreateTable {
                name,
                kind,
                if_not_exists,
            } => Ok(self.create_table(name, *kind, *if_not_exists)?),
            Statement::AdvanceEpoch {
                table,
                classid,
                objid,
                initial,
            } => self.advance_epoch(table, (*classid, *objid), *initial),
            Statement::SelectEpoch {
                table,
                classid,
                objid,
                for_share,
            } => Ok(self.select_epoch(table, (*classid, *objid), *for_share)?),
            Statement::Shard(statement) => self.shard(statement),
            Statement::Lease(statement) => self.lease(statement),
        }
    }

    /// Evaluates every column, then sends RowDescription, the notices and the row. An
    /// error found at execution (not at analysis, like an unknown function signature)
    /// comes after the RowDescription, as PostgreSQL's executor sends it first.
    fn select(&mut self, columns: &[Expr]) -> Result<(), Stop> {
        let mut values = Vec::with_capacity(columns.len());
        for expr in columns {
            match self.eval(expr) {
                Ok(value) => values.push(value),
                Err(Stop::Error(error)) if error.code != sqlstate::UNDEFINED_FUNCTION => {
                    self.describe_row(&describe(columns));
                    self.flush_notices();
                    return Err(error.into());
                }
                Err(stop) => return Err(stop),
            }
        }
        self.describe_row(&describe(columns));
        self.flush_notices();
        let texts: Vec<Option<String>> = values.iter().map(Value::text).collect();
        self.send_row(&describe(columns), &texts);
        self.reply.command_complete("SELECT 1");
        Ok(())
    }

    /// RowDescription of a result, in the simple protocol (in the extended one Describe
    /// sends it).
    fn describe_row(&mut self, columns: &[(&str, PgType)]) {
        if self.protocol == Protocol::Simple {
            self.reply.row_description(columns);
        }
    }

    /// A whole result of `rows`: RowDescription, a DataRow each, and CommandComplete `tag`.
    fn send_result<R: AsRef<[Option<String>]>>(
        &mut self,
        columns: &[(&str, PgType)],
        rows: &[R],
        tag: &str,
    ) {
        self.describe_row(columns);
        for row in rows {
            self.send_row(columns, row.as_ref());
        }
        self.reply.command_complete(tag);
    }

    /// A whole result of `rows` tagged `SELECT <rows>`.
    fn send_selected<R: AsRef<[Option<String>]>>(
        &mut self,
        columns: &[(&str, PgType)],
        rows: &[R],
    ) {
        self.send_result(columns, rows, &format!("SELECT {}", rows.len()));
    }

    /// A DataRow of `texts` (NULL as `None`): text in the simple protocol, each column in
    /// its Bind format in the extended one.
    fn send_row(&mut self, columns: &[(&str, PgType)], texts: &[Option<String>]) {
        let formats = match &self.protocol {
            Protocol::Simple => &[][..],
            Protocol::Extended { formats } => formats.as_slice(),
        };
        let encoded: Vec<Option<Vec<u8>>> = texts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let text = text.as_deref()?;
                let ty = columns.get(index).map_or(PgType::Text, |(_, ty)| *ty);
                match reply::format_of(formats, index) {
                    1 => reply::binary(ty, text),
                    _ => Some(text.as_bytes().to_vec()),
                }
            })
            .collect();
        let row: Vec<Option<&[u8]>> = encoded.iter().map(Option::as_deref).collect();
        self.reply.data_row_bytes(&row);
    }

    /// Sends the current statement's pending notices.
    fn flush_notices(&mut self) {
        for notice in std::mem::take(&mut self.notices) {
            self.notify(&notice);
        }
    }

    /// Sends `notice` to the client unless the session's `client_min_messages` holds it back.
    fn notify(&mut self, notice: &SqlError) {
        let warning = notice.severity == crate::reply::Severity::Warning;
        let sent = self
            .state
            .sessions
            .get(&self.pid)
            .is_none_or(|session| session.gucs.sends_notice(warning));
        if sent {
            self.reply.notice(notice);
        }
    }

    /// 25006 for `command` on a hot standby.
    fn read_only(&self, command: &str) -> Result<(), SqlError> {
        if self.state.in_recovery {
            return Err(SqlError::error(
                sqlstate::READ_ONLY_SQL_TRANSACTION,
                format!("cannot execute {command} in a read-only transaction"),
            ));
        }
        Ok(())
    }

    /// `CREATE TABLE [IF NOT EXISTS]` of a fence or lease table.
    fn create_table(
        &mut self,
        name: &str,
        kind: TableKind,
        if_not_exists: bool,
    ) -> Result<(), SqlError> {
        self.read_only("CREATE TABLE")?;
        let database = self.database()?;
        let created = self
            .state
            .storage
            .borrow_mut()
            .create(&database, name, kind);
        if !created {
            let message = format!("relation \"{name}\" already exists");
            if !if_not_exists {
                return Err(SqlError::error(sqlstate::DUPLICATE_TABLE, message));
            }
            self.notify(&SqlError::notice(
                sqlstate::DUPLICATE_TABLE,
                format!("{message}, skipping"),
            ));
        }
        self.reply.command_complete("CREATE TABLE");
        Ok(())
    }
}

/// The WARNING of an unlock of a lock the session does not hold in `mode`.
fn not_owned(mode: LockMode) -> SqlError {
    SqlError::warning(
        sqlstate::WARNING,
        format!("you don't own a lock of type {}", mode.pg_name()),
    )
}

/// The error of a statement whose session ended under it.
fn gone() -> SqlError {
    SqlError::error(sqlstate::PROTOCOL_VIOLATION, "session is gone")
}

/// 42P01 for a missing `table`.
fn no_table(table: &str) -> SqlError {
    SqlError::error(
        sqlstate::UNDEFINED_TABLE,
        format!("relation \"{table}\" does not exist"),
    )
}
