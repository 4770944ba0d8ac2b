//! The executor's driver: runs one simple Query against the shared state and builds the whole
//! reply, up to and including ReadyForQuery; or one statement of an extended-protocol Execute,
//! whose reply is its rows in the Bind's formats and its CommandComplete (see `extended`).
//! Transactions and result columns are here; `settings`, `fence`, `eval`, `shards` and `lease`
//! hold what their statements do.
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

mod candidacy;
mod eval;
mod fence;
mod lease;
mod settings;
mod shard_lease;
mod shards;
#[cfg(test)]
mod tests;

use std::cell::Ref;
use std::collections::VecDeque;
use std::time::Duration;

use super::guc::{Guc, Gucs};
use super::locks::LockMode;
use super::log::Event;
use super::reply::TransactionStatus;
use super::reply::{self, PgType, Reply, SqlError, sqlstate};
use super::sql::{self, Expr, Func, Statement};
use super::state::{State, WaitEnd};
use super::storage::{Storage, TableKind};
use eval::Value;

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
        Statement::ShardLease(statement) => shard_lease::columns(statement).to_vec(),
        Statement::Candidacy(statement) => candidacy::columns(statement).to_vec(),
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
    let blocked = *blocked;
    let mut ctx = Ctx::new(state, pid, at);
    ctx.protocol = blocked.protocol;
    ctx.reply = blocked.reply;
    ctx.notices = blocked.notices;
    ctx.blocked_since = Some(blocked.since);
    let before = blocked.before;
    match end {
        WaitEnd::Granted => {
            ctx.replay = blocked.journal.into();
            ctx.replay.push_back(Value::Void);
            ctx.drive(blocked.statements, blocked.next, before)
        }
        WaitEnd::TimedOut => {
            if let Some(Statement::Select(columns)) = blocked.statements.get(blocked.next) {
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

/// The server's wall clock at simulated time zero, in unix seconds (2026-01-01T00:00:00Z):
/// `clock_timestamp()` reads this plus the simulated time.
const CLOCK_BASE: Duration = Duration::from_secs(1_767_225_600);

/// Simulated time `at` on the server's clock as a `timestamptz`: microseconds since the
/// unix epoch.
fn server_micros(at: Duration) -> i64 {
    i64::try_from((CLOCK_BASE + at).as_micros()).unwrap_or(i64::MAX)
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

    /// Ends an implicit transaction that succeeded: transaction-local values revert and its
    /// row locks end.
    fn commit_implicit(&mut self) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        if session.transaction != TransactionStatus::Idle {
            return;
        }
        if let Some(base) = session.local_base.take() {
            session.gucs = base;
        }
        self.state.end_row_locks(self.pid);
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

    /// Sends `error`; an open block becomes failed (keeping its row locks until it ends), an
    /// implicit transaction is undone and its row locks end.
    fn fail(&mut self, error: &SqlError, before: &Gucs) {
        self.reply.error(error);
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        match session.transaction {
            TransactionStatus::InBlock => session.transaction = TransactionStatus::Failed,
            TransactionStatus::Idle => {
                session.gucs = before.clone();
                session.local_base = None;
                self.state.end_row_locks(self.pid);
            }
            TransactionStatus::Failed => {}
        }
    }

    fn transaction(&self) -> TransactionStatus {
        self.state
            .sessions
            .get(&self.pid)
            .map_or(TransactionStatus::Idle, |s| s.transaction)
    }

    /// The committed tables, for reading.
    fn storage(&self) -> Ref<'_, Storage> {
        self.state.storage.borrow()
    }

    fn database(&self) -> Result<String, SqlError> {
        self.state
            .sessions
            .get(&self.pid)
            .map(|s| s.database.clone())
            .ok_or_else(gone)
    }

    fn execute(&mut self, statement: &Statement) -> Result<(), Stop> {
        match statement {
            Statement::Select(columns) => self.select(columns),
            Statement::Set { name, value, local } => Ok(self.set(name, value, *local)?),
            Statement::Show(name) => Ok(self.show(name)?),
            Statement::Begin => {
                self.begin();
                Ok(())
            }
            Statement::Commit | Statement::Rollback => {
                self.end_block(*statement == Statement::Commit);
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
            Statement::ShardLease(statement) => self.shard_lease(statement),
            Statement::Candidacy(statement) => self.candidacy(statement),
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

    /// A whole result of `rows`: RowDescription, a DataRow each, and the CommandComplete of
    /// `command` with the row count (`SELECT 2`, `UPDATE 0`, `INSERT 0 1`; `SHOW` has none).
    fn send_result<R: AsRef<[Option<String>]>>(
        &mut self,
        columns: &[(&str, PgType)],
        rows: &[R],
        command: &str,
    ) {
        self.describe_row(columns);
        for row in rows {
            self.send_row(columns, row.as_ref());
        }
        let tag = match command {
            "SHOW" => command.to_owned(),
            "INSERT" => format!("INSERT 0 {}", rows.len()),
            _ => format!("{command} {}", rows.len()),
        };
        self.reply.command_complete(&tag);
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

    fn begin(&mut self) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        if session.transaction == TransactionStatus::Idle {
            session.transaction = TransactionStatus::InBlock;
            session.saved_gucs = Some(session.gucs.clone());
        } else {
            self.notify(&SqlError::warning(
                sqlstate::ACTIVE_SQL_TRANSACTION,
                "there is already a transaction in progress",
            ));
        }
        self.reply.command_complete("BEGIN");
    }

    /// `COMMIT` (`commit` true) or `ROLLBACK`; a failed block's COMMIT rolls back. The
    /// block's row locks end; a committed block that checked a fence row is logged
    /// ([`Event::FencedCommit`]).
    fn end_block(&mut self, commit: bool) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        let committed = commit && session.transaction == TransactionStatus::InBlock;
        let fence_check = session.fence_check.take();
        let tag = match session.transaction {
            TransactionStatus::Idle => {
                if session.gucs.sends_notice(true) {
                    self.reply.notice(&SqlError::warning(
                        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                        "there is no transaction in progress",
                    ));
                }
                if commit { "COMMIT" } else { "ROLLBACK" }
            }
            TransactionStatus::InBlock if commit => {
                session.saved_gucs = None;
                if let Some(base) = session.local_base.take() {
                    session.gucs = base;
                }
                "COMMIT"
            }
            TransactionStatus::InBlock | TransactionStatus::Failed => {
                if let Some(saved) = session.saved_gucs.take() {
                    session.gucs = saved;
                }
                session.local_base = None;
                "ROLLBACK"
            }
        };
        session.transaction = TransactionStatus::Idle;
        self.reply.command_complete(tag);
        if let Some(check) = fence_check.filter(|_| committed) {
            let current = self.committed_epoch(&check.row);
            let event = Event::FencedCommit {
                pid: self.pid,
                epoch: check.epoch,
                checked_at: check.at,
                current,
                row: check.row,
            };
            self.state.record(self.at, event);
        }
        self.state.end_row_locks(self.pid);
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

    fn create_table(
        &mut self,
        name: &str,
        kind: TableKind,
        if_not_exists: bool,
    ) -> Result<(), SqlError> {
        let command = match kind {
            TableKind::Sequence => "CREATE SEQUENCE",
            _ => "CREATE TABLE",
        };
        self.read_only(command)?;
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
        self.reply.command_complete(command);
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

fn gone() -> SqlError {
    SqlError::error(sqlstate::PROTOCOL_VIOLATION, "session is gone")
}

fn no_table(table: &str) -> SqlError {
    SqlError::error(
        sqlstate::UNDEFINED_TABLE,
        format!("relation \"{table}\" does not exist"),
    )
}

/// The RowDescription columns of a `SELECT` list.
fn describe(columns: &[Expr]) -> Vec<(&'static str, PgType)> {
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
