//! Executes one simple Query against the shared state and builds the whole reply, up to
//! and including ReadyForQuery; or one statement of an extended-protocol Execute, whose
//! reply is its rows in the Bind's formats and its CommandComplete (see `extended`).
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

mod lease;
mod shards;

use std::collections::VecDeque;
use std::time::Duration;

use super::guc::{Guc, Gucs, unrecognized};
use super::locks::{LockKey, LockMode};
use super::log::Event;
use super::reply::TransactionStatus;
use super::reply::{self, PgType, Reply, SqlError, sqlstate};
use super::rows::RowId;
use super::sql::{self, Expr, Func, LockColumn, LockCond, SetValue, Statement};
use super::state::{FenceCheck, LockWait, State, WaitEnd};
use super::storage::TableKind;
use super::timestamp::timestamp_text;

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
    match statement {
        Statement::Select(columns) => Some(
            describe(columns)
                .into_iter()
                .map(|(name, ty)| (name.to_owned(), ty))
                .collect(),
        ),
        Statement::SelectEpoch { .. } | Statement::AdvanceEpoch { .. } => {
            Some(vec![("epoch".to_owned(), PgType::Int8)])
        }
        Statement::Show(name) => {
            let name = Guc::lookup(name).map_or_else(|_| name.clone(), |g| g.name().to_owned());
            Some(vec![(name, PgType::Text)])
        }
        Statement::Shard(statement) => Some(shards::columns(statement)),
        Statement::Lease(statement) => Some(lease::columns(statement)),
        Statement::Set { .. }
        | Statement::Begin
        | Statement::Commit
        | Statement::Rollback
        | Statement::CreateTable { .. } => None,
    }
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

/// The server's wall clock at simulated time zero, in unix seconds (2026-01-01T00:00:00Z):
/// `clock_timestamp()` reads this plus the simulated time.
pub(crate) const CLOCK_BASE: Duration = Duration::from_secs(1_767_225_600);

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
    fn text(&self) -> Option<String> {
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

    fn type_name(&self) -> &'static str {
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

    /// `SET`, or `SET LOCAL` (`local`): a local value lasts until the transaction ends, and
    /// outside a block, explicit or implicit (where it would end with the statement),
    /// PostgreSQL warns 25P01.
    fn set(&mut self, name: &str, value: &SetValue, local: bool) -> Result<(), SqlError> {
        let guc = Guc::lookup(name)?;
        if let Some(error) = guc.fixed() {
            return Err(error);
        }
        if local && self.transaction() == TransactionStatus::Idle && !self.implicit_block {
            self.notify(&SqlError::warning(
                sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                "SET LOCAL can only be used in transaction blocks",
            ));
        }
        match value {
            SetValue::Value(text) => self.set_guc(&guc, text, local)?,
            SetValue::Default if local => {
                let default = Gucs::default();
                let text = default.show(&guc).unwrap_or_default();
                self.set_guc(&guc, &text, true)?;
            }
            SetValue::Default => {
                let session = self.state.sessions.get_mut(&self.pid).ok_or_else(gone)?;
                session.gucs.reset(&guc);
                if let Some(base) = &mut session.local_base {
                    base.reset(&guc);
                }
            }
        }
        self.reply.command_complete("SET");
        Ok(())
    }

    /// Sets `guc` for the session (`local` false) or until the transaction ends.
    fn set_guc(&mut self, guc: &Guc, value: &str, local: bool) -> Result<(), SqlError> {
        let session = self.state.sessions.get_mut(&self.pid).ok_or_else(gone)?;
        if local {
            let mut base = session
                .local_base
                .take()
                .unwrap_or_else(|| session.gucs.clone());
            let set = session.gucs.set(guc, value);
            // A placeholder a local set created exists afterwards, empty (its reset value).
            if set.is_ok()
                && let Guc::Custom(name) = guc
            {
                base.custom.entry(name.clone()).or_default();
            }
            session.local_base = Some(base);
            return set;
        }
        session.gucs.set(guc, value)?;
        if let Some(base) = &mut session.local_base {
            base.set(guc, value)?;
        }
        Ok(())
    }

    fn show(&mut self, name: &str) -> Result<(), SqlError> {
        let guc = Guc::lookup(name)?;
        let session = self.state.sessions.get(&self.pid).ok_or_else(gone)?;
        let text = session.gucs.show(&guc).ok_or_else(|| unrecognized(name))?;
        let columns = [(guc.name(), PgType::Text)];
        self.describe_row(&columns);
        self.send_row(&columns, &[Some(text)]);
        self.reply.command_complete("SHOW");
        Ok(())
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

    /// The committed epoch of a fence row, if the row exists.
    fn committed_epoch(&self, row: &RowId) -> Option<i64> {
        let storage = self.state.storage.borrow();
        storage
            .fence(&row.database, &row.table)?
            .get(&row.key)
            .copied()
    }

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

    /// The epoch upsert. When the row exists and another session share-locks it, the
    /// statement waits ([`Stop::Blocked`]) and, resumed, reads the committed epoch again.
    fn advance_epoch(&mut self, table: &str, key: (i64, i64), initial: i64) -> Result<(), Stop> {
        let database = self.database()?;
        if self
            .state
            .storage
            .borrow()
            .fence(&database, table)
            .is_none()
        {
            return Err(no_table(table).into());
        }
        self.read_only("INSERT")?;
        let key = int4_key(key)?;
        let row = RowId {
            database,
            table: table.to_owned(),
            key,
        };
        if self.committed_epoch(&row).is_some() && !self.state.update_or_wait(self.pid, &row) {
            return Err(Stop::Blocked);
        }
        let epoch = self.write_epoch(row, initial)?;
        self.describe_row(&EPOCH_COLUMN);
        self.send_row(&EPOCH_COLUMN, &[Some(epoch.to_string())]);
        self.reply.command_complete("INSERT 0 1");
        Ok(())
    }

    /// Commits the advance of fence row `row` (to `initial` when it is missing) and logs it
    /// with how long the statement waited for the row; the new epoch. The caller waited for
    /// other sessions' share locks.
    fn write_epoch(&mut self, row: RowId, initial: i64) -> Result<i64, Stop> {
        let epoch = {
            let mut storage = self.state.storage.borrow_mut();
            let rows = storage
                .fence_mut(&row.database, &row.table)
                .ok_or_else(|| no_table(&row.table))?;
            let epoch = match rows.get(&row.key) {
                None => initial,
                Some(epoch) => epoch.checked_add(1).ok_or_else(|| {
                    SqlError::error(sqlstate::NUMERIC_VALUE_OUT_OF_RANGE, "bigint out of range")
                })?,
            };
            rows.insert(row.key, epoch);
            epoch
        };
        let waited = self
            .blocked_since
            .map_or(Duration::ZERO, |since| self.at.saturating_sub(since));
        let event = Event::EpochAdvanced {
            pid: self.pid,
            row,
            epoch,
            waited,
        };
        self.state.record(self.at, event);
        Ok(epoch)
    }

    /// The fence read. `FOR SHARE` share-locks the row it returns until the transaction ends
    /// (see `rows`); in a transaction block the first such read is the block's fence check,
    /// logged ([`Event::FenceChecked`]) and logged again if the block commits.
    fn select_epoch(
        &mut self,
        table: &str,
        key: (i64, i64),
        for_share: bool,
    ) -> Result<(), SqlError> {
        let database = self.database()?;
        let epoch = {
            let storage = self.state.storage.borrow();
            let rows = storage
                .fence(&database, table)
                .ok_or_else(|| no_table(table))?;
            int4_key(key).ok().and_then(|key| rows.get(&key).copied())
        };
        if for_share {
            self.read_only("SELECT FOR SHARE")?;
            if let (Some(epoch), Ok(key)) = (epoch, int4_key(key)) {
                let row = RowId {
                    database,
                    table: table.to_owned(),
                    key,
                };
                self.lock_for_share(row, epoch);
            }
        }
        self.describe_row(&EPOCH_COLUMN);
        match epoch {
            Some(epoch) => {
                self.send_row(&EPOCH_COLUMN, &[Some(epoch.to_string())]);
                self.reply.command_complete("SELECT 1");
            }
            None => self.reply.command_complete("SELECT 0"),
        }
        Ok(())
    }

    /// Share-locks `row`, read at `epoch`; in a block, the first one is the fence check.
    fn lock_for_share(&mut self, row: RowId, epoch: i64) {
        self.state.share_row(self.pid, row.clone());
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        if session.transaction != TransactionStatus::InBlock || session.fence_check.is_some() {
            return;
        }
        session.fence_check = Some(FenceCheck {
            row: row.clone(),
            epoch,
            at: self.at,
        });
        let event = Event::FenceChecked {
            pid: self.pid,
            row,
            epoch,
        };
        self.state.record(self.at, event);
    }

    fn eval(&mut self, expr: &Expr) -> Result<Value, Stop> {
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
    fn exists(&mut self, conds: &[LockCond]) -> Result<Value, SqlError> {
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

    fn call(&mut self, func: Func, args: &[Value]) -> Result<Value, Stop> {
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
            (Func::ClockTimestamp, []) => {
                let micros = (CLOCK_BASE + at).as_micros();
                Ok(Value::Timestamp(i64::try_from(micros).unwrap_or(i64::MAX)))
            }
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

    /// The text of `guc`; a missing placeholder is NULL when `missing_ok`, else 42704.
    fn setting(&self, guc: &Guc, name: &str, missing_ok: bool) -> Result<Value, SqlError> {
        let session = self.state.sessions.get(&self.pid).ok_or_else(gone)?;
        match session.gucs.show(guc) {
            Some(text) => Ok(Value::Text(text)),
            None if missing_ok => Ok(Value::Null),
            None => Err(unrecognized(name)),
        }
    }
}

/// The one column the fence statements return.
const EPOCH_COLUMN: [(&str, PgType); 1] = [("epoch", PgType::Int8)];

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

/// An `int4` key pair of the fence table; 22003 when a value does not fit.
fn int4_key((classid, objid): (i64, i64)) -> Result<(i32, i32), SqlError> {
    match (i32::try_from(classid), i32::try_from(objid)) {
        (Ok(classid), Ok(objid)) => Ok((classid, objid)),
        _ => Err(SqlError::error(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            "integer out of range",
        )),
    }
}

/// An `int4` as the unsigned `oid` `pg_locks` shows it.
fn oid(value: i32) -> i64 {
    i64::from(value.cast_unsigned())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a parse failure is the assertion

    use fallible_iterator::FallibleIterator;
    use postgres_protocol::message::backend::Message;

    use super::*;
    use crate::config::ServerConfig;
    use crate::state::Startup;

    const GRANT: &str = "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
                         set_config('idle_session_timeout', '20000', false) IS NOT NULL ELSE false END";

    fn server() -> (State, i32, i32) {
        let mut state = State::new(ServerConfig::default());
        state.start(Duration::ZERO);
        let mut open = |name: &str| {
            state.open_session(
                Startup {
                    user: name.to_owned(),
                    database: "db".to_owned(),
                    application_name: String::new(),
                },
                Duration::ZERO,
            )
        };
        let (a, b) = (open("a"), open("b"));
        (state, a, b)
    }

    /// Runs `query` and renders the reply one line per message.
    fn run(state: &mut State, pid: i32, query: &str) -> Vec<String> {
        let Some(Run::Done(reply)) = run_query(state, pid, query, Duration::from_millis(5)) else {
            panic!("{query:?} did not complete");
        };
        let mut buf = reply.into_bytes();
        let mut out = Vec::new();
        while let Some(message) = Message::parse(&mut buf).unwrap() {
            out.push(render(message));
        }
        out
    }

    fn render(message: Message) -> String {
        match message {
            Message::RowDescription(body) => {
                let fields: Vec<String> = body
                    .fields()
                    .map(|f| Ok(format!("{}:{}", f.name(), f.type_oid())))
                    .collect()
                    .unwrap();
                format!("T {}", fields.join(","))
            }
            Message::DataRow(body) => {
                let values: Vec<String> = body
                    .ranges()
                    .map(|r| {
                        Ok(r.map_or("NULL".to_owned(), |r| {
                            String::from_utf8_lossy(&body.buffer()[r]).into_owned()
                        }))
                    })
                    .collect()
                    .unwrap();
                format!("D {}", values.join(","))
            }
            Message::CommandComplete(body) => format!("C {}", body.tag().unwrap()),
            Message::ReadyForQuery(body) => format!("Z {}", char::from(body.status())),
            Message::EmptyQueryResponse => "I".to_owned(),
            Message::ParameterStatus(body) => {
                format!("S {}={}", body.name().unwrap(), body.value().unwrap())
            }
            Message::ErrorResponse(body) => format!("E {}", code(body.fields())),
            Message::NoticeResponse(body) => format!("N {}", code(body.fields())),
            _ => "?".to_owned(),
        }
    }

    fn code(mut fields: postgres_protocol::message::backend::ErrorFields<'_>) -> String {
        while let Some(field) = fields.next().unwrap() {
            if field.type_() == b'C' {
                return String::from_utf8_lossy(field.value_bytes()).into_owned();
            }
        }
        String::new()
    }

    #[test]
    fn grant_is_true_then_false_and_bounds_only_the_winner() {
        let (mut state, a, b) = server();
        assert_eq!(
            run(&mut state, a, GRANT),
            ["T case:16", "D t", "C SELECT 1", "Z I"]
        );
        assert_eq!(
            run(&mut state, b, GRANT),
            ["T case:16", "D f", "C SELECT 1", "Z I"]
        );
        assert_eq!(
            state.sessions[&a].gucs.idle_session_timeout,
            Duration::from_secs(20)
        );
        assert_eq!(state.sessions[&b].gucs.idle_session_timeout, Duration::ZERO);
    }

    #[test]
    fn release_if_held_unlocks_only_a_held_lock_and_never_warns() {
        let (mut state, a, b) = server();
        let release = plexsphere_leader::sql::release_if_held(plexsphere_leader::LockKey::DEFAULT);
        assert_eq!(
            run(&mut state, a, "SELECT pg_advisory_lock(1886156915, 1)"),
            ["T pg_advisory_lock:2278", "D ", "C SELECT 1", "Z I"]
        );
        // The two RESETs of the idle bounds come first (the model tags them SET).
        assert_eq!(
            run(&mut state, b, &release),
            ["C SET", "C SET", "T case:16", "D f", "C SELECT 1", "Z I"]
        );
        assert_eq!(
            run(&mut state, a, &release),
            ["C SET", "C SET", "T case:16", "D t", "C SELECT 1", "Z I"]
        );
        assert_eq!(
            run(&mut state, a, &release),
            ["C SET", "C SET", "T case:16", "D f", "C SELECT 1", "Z I"]
        );
    }

    #[test]
    fn select_one_is_an_int4_row() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SELECT 1"),
            ["T ?column?:23", "D 1", "C SELECT 1", "Z I"]
        );
    }

    #[test]
    fn unlock_not_held_is_false_with_warning_between_description_and_row() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SELECT pg_advisory_unlock(1886156915, 1)"),
            [
                "T pg_advisory_unlock:16",
                "N 01000",
                "D f",
                "C SELECT 1",
                "Z I"
            ]
        );
    }

    #[test]
    fn unlock_all_returns_void_and_frees_every_count() {
        let (mut state, a, b) = server();
        run(
            &mut state,
            a,
            "SELECT pg_try_advisory_lock(7); SELECT pg_try_advisory_lock(7)",
        );
        assert_eq!(
            run(&mut state, a, "SELECT pg_advisory_unlock_all()"),
            ["T pg_advisory_unlock_all:2278", "D ", "C SELECT 1", "Z I"]
        );
        assert_eq!(
            run(&mut state, b, "SELECT pg_try_advisory_lock(7)")[1],
            "D t"
        );
    }

    #[test]
    fn int4_pair_out_of_range_is_undefined_function() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SELECT pg_try_advisory_lock(4294967296, 1)"),
            ["E 42883", "Z I"]
        );
    }

    #[test]
    fn empty_query_gets_empty_query_response() {
        let (mut state, a, _) = server();
        assert_eq!(run(&mut state, a, " "), ["I", "Z I"]);
    }

    #[test]
    fn error_in_block_fails_it_until_rollback_which_restores_settings() {
        let (mut state, a, _) = server();
        assert_eq!(run(&mut state, a, "BEGIN"), ["C BEGIN", "Z T"]);
        run(&mut state, a, "SET idle_session_timeout = 1000");
        assert_eq!(run(&mut state, a, "SELECT nope()"), ["E 42883", "Z E"]);
        assert_eq!(run(&mut state, a, "SELECT 1"), ["E 25P02", "Z E"]);
        assert_eq!(run(&mut state, a, "COMMIT"), ["C ROLLBACK", "Z I"]);
        assert_eq!(state.sessions[&a].gucs.idle_session_timeout, Duration::ZERO);
    }

    #[test]
    fn commit_keeps_settings_and_stray_commit_warns() {
        let (mut state, a, _) = server();
        run(&mut state, a, "BEGIN; SET idle_session_timeout TO '2s'");
        assert_eq!(run(&mut state, a, "COMMIT"), ["C COMMIT", "Z I"]);
        assert_eq!(
            run(&mut state, a, "SHOW idle_session_timeout"),
            ["T idle_session_timeout:25", "D 2s", "C SHOW", "Z I"]
        );
        assert_eq!(run(&mut state, a, "COMMIT"), ["N 25P01", "C COMMIT", "Z I"]);
    }

    #[test]
    fn session_lock_taken_in_rolled_back_block_stays_held() {
        let (mut state, a, b) = server();
        run(&mut state, a, "BEGIN");
        run(&mut state, a, "SELECT pg_try_advisory_lock(1886156915, 1)");
        run(&mut state, a, "ROLLBACK");
        assert_eq!(run(&mut state, b, GRANT)[1], "D f");
    }

    #[test]
    fn failed_implicit_transaction_undoes_its_settings() {
        let (mut state, a, _) = server();
        let reply = run(
            &mut state,
            a,
            "SELECT set_config('idle_session_timeout', '5000', false); \
             SELECT pg_try_advisory_lock(4294967296, 1)",
        );
        assert_eq!(
            reply,
            ["T set_config:25", "D 5s", "C SELECT 1", "E 42883", "Z I"]
        );
        assert_eq!(state.sessions[&a].gucs.idle_session_timeout, Duration::ZERO);
    }

    #[test]
    fn application_name_change_is_reported_before_ready_for_query() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SET application_name = 'replica-1'"),
            ["C SET", "S application_name=replica-1", "Z I"]
        );
    }

    #[test]
    fn bad_timeout_value_is_22023_and_changes_nothing() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SET idle_session_timeout = -1"),
            ["E 22023", "Z I"]
        );
        assert_eq!(state.sessions[&a].gucs.idle_session_timeout, Duration::ZERO);
    }

    #[test]
    fn extended_message_fails_open_block() {
        let (mut state, a, _) = server();
        run(&mut state, a, "BEGIN");
        reject_extended(&mut state, a, b'P');
        assert_eq!(state.sessions[&a].transaction, TransactionStatus::Failed);
    }

    #[test]
    fn backend_pid_and_recovery_state() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SELECT pg_backend_pid()")[1],
            format!("D {a}")
        );
        assert_eq!(run(&mut state, a, "SELECT pg_is_in_recovery()")[1], "D f");
    }

    #[test]
    fn a_blocked_statement_resumes_where_it_stopped_without_repeating_side_effects() {
        let (mut state, a, b) = server();
        let wait = "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid()) \
                    THEN 'shared' WHEN set_config('lock_timeout', '100', true) IS NULL THEN 'x' \
                    WHEN pg_advisory_lock(1886156915, 1) IS NULL THEN 'x' ELSE 'granted' END, \
                    pg_try_advisory_lock(5)";
        run(&mut state, a, "SELECT pg_try_advisory_lock(1886156915, 1)");
        let Some(Run::Blocked(blocked)) = run_query(&mut state, b, wait, Duration::ZERO) else {
            panic!("not blocked");
        };
        assert_eq!(
            state.sessions[&b].gucs.lock_timeout,
            Duration::from_millis(100)
        );
        run(&mut state, a, "SELECT pg_advisory_unlock(1886156915, 1)");
        assert!(state.end_wait(b));
        let Some(Run::Done(reply)) =
            resume(&mut state, b, blocked, WaitEnd::Granted, Duration::ZERO)
        else {
            panic!("not done");
        };
        let mut buf = reply.into_bytes();
        let mut out = Vec::new();
        while let Some(message) = Message::parse(&mut buf).unwrap() {
            out.push(render(message));
        }
        // EXISTS was answered from the journal (false), not re-read (true after the grant).
        assert_eq!(
            out,
            [
                "T case:25,pg_try_advisory_lock:16",
                "D granted,t",
                "C SELECT 1",
                "Z I"
            ]
        );
        assert_eq!(state.sessions[&b].gucs.lock_timeout, Duration::ZERO);
        assert_eq!(
            state
                .locks
                .held_by(b)
                .iter()
                .map(|(_, n)| *n)
                .collect::<Vec<_>>(),
            [1, 1]
        );
    }

    /// The reply rendered one line per message.
    fn lines(reply: Reply) -> Vec<String> {
        let mut buf = reply.into_bytes();
        let mut out = Vec::new();
        while let Some(message) = Message::parse(&mut buf).unwrap() {
            out.push(render(message));
        }
        out
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A server whose fence table exists with epoch 1, and sessions a and b.
    fn fenced_server(config: ServerConfig) -> (State, i32, i32) {
        let (mut state, a, b) = server();
        state.config = config;
        run(&mut state, a, plexsphere_leader::sql::FENCE_SETUP);
        assert_eq!(run(&mut state, a, &advance())[1], "D 1");
        (state, a, b)
    }

    fn advance() -> String {
        plexsphere_leader::sql::advance_epoch(plexsphere_leader::LockKey::DEFAULT)
    }

    /// The default key's fence check.
    const CHECK: &str = "SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1 FOR SHARE";

    #[test]
    fn the_check_constant_is_the_default_keys_fence_check() {
        assert_eq!(
            CHECK,
            plexsphere_leader::sql::fence_check(plexsphere_leader::LockKey::DEFAULT)
        );
    }

    /// The fence events of the log, rendered.
    fn fence_log(state: &State) -> Vec<String> {
        state
            .log
            .iter()
            .filter_map(|entry| match &entry.event {
                Event::EpochAdvanced {
                    pid, epoch, waited, ..
                } => Some(format!(
                    "{:?} advance {pid} {epoch} waited {waited:?}",
                    entry.at
                )),
                Event::FenceChecked { pid, epoch, .. } => {
                    Some(format!("{:?} check {pid} {epoch}", entry.at))
                }
                Event::FencedCommit {
                    pid,
                    epoch,
                    checked_at,
                    current,
                    ..
                } => Some(format!(
                    "{:?} commit {pid} {epoch} checked {checked_at:?} current {current:?}",
                    entry.at
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_advance_waits_for_a_fence_check_until_its_block_commits_then_reads_the_new_epoch() {
        let (mut state, a, b) = fenced_server(ServerConfig::default());
        run(&mut state, a, "BEGIN");
        assert_eq!(
            lines(match run_query(&mut state, a, CHECK, ms(10)) {
                Some(Run::Done(reply)) => reply,
                _ => panic!("the check waits"),
            }),
            ["T epoch:20", "D 1", "C SELECT 1", "Z T"]
        );
        let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &advance(), ms(20)) else {
            panic!("the advance did not wait");
        };
        assert_eq!(state.rows.waiters().len(), 1);
        assert!(!state.wait_granted(b));
        let Some(Run::Done(reply)) = run_query(&mut state, a, "COMMIT", ms(50)) else {
            panic!("COMMIT did not complete");
        };
        assert_eq!(lines(reply), ["C COMMIT", "Z I"]);
        assert!(
            state.wait_granted(b),
            "the commit wakes the waiting advance"
        );
        assert!(state.end_wait(b));
        let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, ms(51))
        else {
            panic!("the advance did not complete");
        };
        assert_eq!(lines(reply), ["T epoch:20", "D 2", "C INSERT 0 1", "Z I"]);
        assert_eq!(
            fence_log(&state)[1..],
            [
                format!("10ms check {a} 1"),
                format!("50ms commit {a} 1 checked 10ms current Some(1)"),
                format!("51ms advance {b} 2 waited 31ms"),
            ]
        );
        assert_eq!(state.rows.shared(), vec![]);
    }

    #[test]
    fn a_fence_read_outside_a_block_locks_the_row_only_for_its_statement() {
        let (mut state, a, b) = fenced_server(ServerConfig::default());
        assert_eq!(run(&mut state, a, CHECK)[1], "D 1");
        assert_eq!(state.rows.shared(), vec![]);
        assert_eq!(run(&mut state, b, &advance())[1], "D 2");
        assert_eq!(fence_log(&state).len(), 2, "no fence check outside a block");
    }

    #[test]
    fn a_rolled_back_or_failed_block_releases_its_row_without_a_fenced_commit() {
        let (mut state, a, b) = fenced_server(ServerConfig::default());
        run(&mut state, a, "BEGIN");
        run(&mut state, a, CHECK);
        assert_eq!(run(&mut state, a, "SELECT nope()"), ["E 42883", "Z E"]);
        assert!(
            matches!(
                run_query(&mut state, b, &advance(), ms(5)),
                Some(Run::Blocked(_))
            ),
            "a failed block keeps its row lock"
        );
        assert!(!state.end_wait(b), "b gives up waiting");
        run(&mut state, a, "ROLLBACK");
        assert_eq!(run(&mut state, b, &advance())[1], "D 2");
        let log = fence_log(&state);
        assert!(log.iter().all(|line| !line.contains("commit")), "{log:?}");
    }

    #[test]
    fn the_end_of_a_session_releases_its_row_and_wakes_the_waiting_advance() {
        let (mut state, a, b) = fenced_server(ServerConfig::default());
        run(
            &mut state,
            a,
            "BEGIN; SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1 FOR SHARE",
        );
        let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &advance(), ms(5)) else {
            panic!("the advance did not wait");
        };
        state.end_session(a, crate::EndReason::Terminated, ms(9));
        assert!(state.end_wait(b));
        let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, ms(9)) else {
            panic!("the advance did not complete");
        };
        assert_eq!(lines(reply)[1], "D 2");
    }

    #[test]
    fn a_waiting_advance_whose_lock_timeout_expires_fails_with_55p03_and_changes_nothing() {
        let (mut state, a, b) = fenced_server(ServerConfig::default());
        run(&mut state, a, "BEGIN");
        run(&mut state, a, CHECK);
        let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &advance(), ms(5)) else {
            panic!("the advance did not wait");
        };
        assert!(
            !state.end_wait(b),
            "nothing woke it: the lock timeout ends the wait"
        );
        assert_eq!(state.rows.waiters(), vec![], "it left the queue");
        let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::TimedOut, ms(105))
        else {
            panic!("the advance did not fail");
        };
        assert_eq!(lines(reply), ["E 55P03", "Z I"]);
        run(&mut state, a, "COMMIT");
        assert_eq!(run(&mut state, b, CHECK)[1], "D 1");
    }

    #[test]
    fn a_share_lock_is_granted_while_an_advance_waits_which_then_waits_for_both() {
        let (mut state, a, b) = fenced_server(ServerConfig::default());
        let startup = Startup {
            user: "c".to_owned(),
            database: "db".to_owned(),
            application_name: String::new(),
        };
        let c = state.open_session(startup, Duration::ZERO);
        run(&mut state, a, "BEGIN");
        run(&mut state, a, CHECK);
        let Some(Run::Blocked(_)) = run_query(&mut state, b, &advance(), ms(5)) else {
            panic!("the advance did not wait");
        };
        run(&mut state, c, "BEGIN");
        assert_eq!(
            run(&mut state, c, CHECK),
            ["T epoch:20", "D 1", "C SELECT 1", "Z T"]
        );
        run(&mut state, a, "COMMIT");
        assert!(!state.wait_granted(b), "c still shares the row");
        run(&mut state, c, "COMMIT");
        assert!(state.wait_granted(b));
    }

    #[test]
    fn without_row_locks_an_advance_does_not_wait_and_the_commit_shows_the_newer_epoch() {
        let (mut state, a, b) = fenced_server(ServerConfig::default().with_row_locks(false));
        run(&mut state, a, "BEGIN");
        run(&mut state, a, CHECK);
        assert_eq!(run(&mut state, b, &advance())[1], "D 2");
        run(&mut state, a, "COMMIT");
        let log = fence_log(&state);
        assert!(
            log[3].ends_with("commit 1000 1 checked 5ms current Some(2)"),
            "{log:?}"
        );
    }

    #[test]
    fn set_local_lasts_until_the_block_ends_and_warns_outside_one() {
        let (mut state, a, _) = server();
        assert_eq!(
            run(&mut state, a, "SET LOCAL lock_timeout = 100"),
            ["N 25P01", "C SET", "Z I"]
        );
        assert_eq!(state.sessions[&a].gucs.lock_timeout, Duration::ZERO);
        run(
            &mut state,
            a,
            "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '50ms'",
        );
        assert_eq!(
            state.sessions[&a].gucs.idle_in_transaction_session_timeout,
            ms(50)
        );
        run(
            &mut state,
            a,
            "SET LOCAL idle_in_transaction_session_timeout TO DEFAULT",
        );
        assert_eq!(
            state.sessions[&a].gucs.idle_in_transaction_session_timeout,
            Duration::ZERO
        );
        run(&mut state, a, "SET LOCAL lock_timeout = '1s'");
        run(&mut state, a, "COMMIT");
        assert_eq!(state.sessions[&a].gucs.lock_timeout, Duration::ZERO);
    }

    /// The lease statements of the default key.
    mod lease_statements {
        use plexsphere_leader::LockKey;
        use plexsphere_leader::sql::lease;

        pub(super) fn claim(holder: &str) -> String {
            lease::claim(
                plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
                LockKey::DEFAULT,
                holder,
                300,
                50,
            )
        }

        pub(super) fn renew(holder: &str) -> String {
            lease::renew(
                plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
                LockKey::DEFAULT,
                holder,
                300,
            )
        }

        pub(super) fn release(holder: &str) -> String {
            lease::release(
                plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
                LockKey::DEFAULT,
                holder,
            )
        }

        pub(super) fn who_holds() -> String {
            lease::who_holds(
                plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
                LockKey::DEFAULT,
            )
        }
    }

    /// Runs `query` for `pid` at `at` ms; the reply rendered, or `blocked`.
    fn lease_run(state: &mut State, pid: i32, query: &str, at: u64) -> Vec<String> {
        match run_query(state, pid, query, ms(at)) {
            Some(Run::Done(reply)) => lines(reply),
            Some(Run::Blocked(_)) => vec!["blocked".to_owned()],
            None => vec!["gone".to_owned()],
        }
    }

    /// A server with the lease setup run, and sessions a and b.
    fn lease_server() -> (State, i32, i32) {
        let (mut state, a, b) = server();
        let setup = run(
            &mut state,
            a,
            &plexsphere_leader::sql::lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA),
        );
        assert_eq!(
            setup,
            [
                "C SET",
                "T pg_advisory_xact_lock:2278",
                "D ",
                "C SELECT 1",
                "C CREATE TABLE",
                "C CREATE TABLE",
                "Z I"
            ]
        );
        // Again: the tables exist, and the setup says nothing of it.
        let again = run(
            &mut state,
            b,
            &plexsphere_leader::sql::lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA),
        );
        assert_eq!(again, setup);
        (state, a, b)
    }

    /// The lease events of the log, rendered.
    fn lease_log(state: &State) -> Vec<String> {
        state
            .log
            .iter()
            .filter_map(|entry| match &entry.event {
                Event::LeaseClaimed {
                    pid,
                    holder,
                    expires,
                    ..
                } => Some(format!(
                    "{:?} claim {pid} {holder} until {expires:?}",
                    entry.at
                )),
                Event::LeaseRenewed {
                    pid,
                    holder,
                    expires,
                    ..
                } => Some(format!(
                    "{:?} renew {pid} {holder} until {expires:?}",
                    entry.at
                )),
                Event::LeaseReleased { pid, holder, .. } => {
                    Some(format!("{:?} release {pid} {holder}", entry.at))
                }
                Event::EpochAdvanced { pid, epoch, .. } => {
                    Some(format!("{:?} advance {pid} {epoch}", entry.at))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_claim_takes_a_missing_expired_or_own_lease_and_advances_the_fence_row() {
        use lease_statements::{claim, renew, who_holds};
        let (mut state, a, b) = lease_server();
        assert_eq!(
            lease_run(&mut state, a, &claim("ha"), 10),
            [
                "C SET",
                "C SET",
                "T pg_advisory_xact_lock:2278",
                "D ",
                "C SELECT 1",
                "T epoch:20,schemas:25",
                "D 1,NULL",
                "C SELECT 1",
                "Z I"
            ]
        );
        assert_eq!(
            lease_run(&mut state, b, &claim("hb"), 20)[5..],
            ["T epoch:20,schemas:25", "D NULL,NULL", "C SELECT 1", "Z I"],
            "a's lease runs until 310 ms"
        );
        assert_eq!(
            lease_run(&mut state, a, &claim("ha"), 30)[6],
            "D 2,NULL",
            "its own"
        );
        assert_eq!(
            lease_run(&mut state, b, &renew("hb"), 40)[1..3],
            ["C UPDATE 0".to_owned(), "Z I".to_owned()][..]
        );
        assert_eq!(
            lease_run(&mut state, b, &claim("hb"), 329)[6],
            "D NULL,NULL"
        );
        assert_eq!(
            lease_run(&mut state, b, &claim("hb"), 330)[6],
            "D 3,NULL",
            "expired at 330 ms"
        );
        assert_eq!(
            lease_run(&mut state, a, &renew("ha"), 340),
            ["T ?column?:23", "C UPDATE 0", "Z I"],
            "the row is b's"
        );
        let who = lease_run(&mut state, a, &who_holds(), 350);
        assert_eq!(who[0], "T holder:25,epoch:20,date_part:701,?column?:16");
        assert_eq!(who[1], "D hb,3,1767225600.63,t");
        assert_eq!(
            lease_log(&state),
            [
                format!("10ms claim {a} ha until 310ms"),
                format!("10ms advance {a} 1"),
                format!("30ms claim {a} ha until 330ms"),
                format!("30ms advance {a} 2"),
                format!("330ms claim {b} hb until 630ms"),
                format!("330ms advance {b} 3"),
            ]
        );
    }

    #[test]
    fn a_renewal_extends_an_unexpired_lease_from_any_session_and_never_revives_an_expired_one() {
        use lease_statements::{claim, release, renew, who_holds};
        let (mut state, a, b) = lease_server();
        assert_eq!(
            lease_run(&mut state, a, &who_holds(), 1),
            [
                "T holder:25,epoch:20,date_part:701,?column?:16",
                "C SELECT 0",
                "Z I"
            ]
        );
        lease_run(&mut state, a, &claim("ha"), 10);
        assert_eq!(
            lease_run(&mut state, b, &renew("ha"), 200),
            ["T ?column?:23", "D 1", "C UPDATE 1", "Z I"],
            "the holder's unexpired row (until 310 ms), on any session"
        );
        assert_eq!(
            lease_run(&mut state, b, &release("hb"), 410)[1],
            "C UPDATE 0"
        );
        assert_eq!(lease_run(&mut state, a, &release("ha"), 420)[1], "D 1");
        assert_eq!(
            lease_run(&mut state, a, &release("ha"), 421)[1],
            "C UPDATE 0",
            "expired"
        );
        assert_eq!(
            lease_run(&mut state, b, &renew("ha"), 430)[1],
            "C UPDATE 0",
            "a renewal arriving after the release does not revive the lease"
        );
        assert_eq!(
            lease_run(&mut state, b, &who_holds(), 432)[1],
            "D ha,1,1767225600.42,f"
        );
        assert_eq!(lease_run(&mut state, b, &claim("hb"), 432)[6], "D 2,NULL");
        assert_eq!(
            lease_log(&state)[2..4],
            [
                format!("200ms renew {b} ha until 500ms"),
                format!("420ms release {a} ha")
            ]
        );
    }

    #[test]
    fn a_claim_waits_for_a_fenced_transaction_writing_nothing_and_its_lock_timeout_fails_it() {
        use lease_statements::{claim, who_holds};
        let (mut state, a, b) = lease_server();
        lease_run(&mut state, a, &claim("ha"), 10);
        run(&mut state, a, "BEGIN");
        lease_run(&mut state, a, CHECK, 20);
        let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &claim("hb"), ms(400)) else {
            panic!("the claim did not wait for the fence row");
        };
        assert_eq!(
            lease_run(&mut state, a, &who_holds(), 401)[1],
            "D ha,1,1767225600.31,f"
        );
        assert!(!state.end_wait(b));
        let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::TimedOut, ms(450))
        else {
            panic!("the claim did not fail");
        };
        // The settings and the transaction lock answered before the claim waited.
        assert_eq!(
            lines(reply),
            [
                "C SET",
                "C SET",
                "T pg_advisory_xact_lock:2278",
                "D ",
                "C SELECT 1",
                "E 55P03",
                "Z I"
            ]
        );
        assert_eq!(
            lease_run(&mut state, b, &who_holds(), 451)[1],
            "D ha,1,1767225600.31,f"
        );
        let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &claim("hb"), ms(460)) else {
            panic!("the claim did not wait for the fence row");
        };
        run(&mut state, a, "COMMIT");
        assert!(state.end_wait(b), "the commit wakes the claim");
        let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, ms(470))
        else {
            panic!("the claim did not complete");
        };
        assert_eq!(
            lines(reply)[5..8],
            ["T epoch:20,schemas:25", "D 2,NULL", "C SELECT 1"]
        );
        assert_eq!(
            lease_log(&state)[2..],
            [
                format!("470ms claim {b} hb until 760ms"),
                format!("470ms advance {b} 2"),
            ],
            "now() is the claim's start, 460 ms"
        );
    }

    #[test]
    fn lease_statements_need_the_tables_and_a_writable_server() {
        use lease_statements::{claim, renew, who_holds};
        let (mut state, a, _b) = server();
        assert_eq!(
            lease_run(&mut state, a, &claim("ha"), 1),
            [
                "C SET",
                "C SET",
                "T pg_advisory_xact_lock:2278",
                "D ",
                "C SELECT 1",
                "E 42P01",
                "Z I"
            ]
        );
        assert_eq!(
            lease_run(&mut state, a, &who_holds(), 1),
            ["E 42P01", "Z I"]
        );
        run(
            &mut state,
            a,
            &plexsphere_leader::sql::lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA),
        );
        state.in_recovery = true;
        assert_eq!(
            lease_run(&mut state, a, &renew("ha"), 2),
            ["E 25006", "Z I"]
        );
        assert_eq!(lease_run(&mut state, a, &who_holds(), 2)[1], "C SELECT 0");
    }
}
