//! Executes one simple Query against the shared state and builds the whole reply, up to
//! and including ReadyForQuery.
//!
//! Synchronous and clock-free: the caller passes the simulated time `at`.

use std::time::Duration;

use super::guc::{Guc, Gucs};
use super::handle::TransactionStatus;
use super::locks::LockKey;
use super::reply::{PgType, Reply, SqlError, sqlstate};
use super::sql::{self, Expr, Func, SetValue, Statement};
use super::state::State;

/// Runs `query` for session `pid` at time `at`; `None` when the session is gone.
pub(crate) fn run_query(state: &mut State, pid: i32, query: &str, at: Duration) -> Option<Reply> {
    let session = state.sessions.get_mut(&pid)?;
    session.last_query_at = Some(at);
    let before = session.gucs.clone();
    let mut ctx = Ctx {
        state,
        pid,
        at,
        reply: Reply::default(),
    };
    match sql::parse(query) {
        Err(error) => ctx.fail(&error, &before),
        Ok(statements) if statements.is_empty() => ctx.reply.empty_query_response(),
        Ok(statements) => ctx.run_all(&statements, &before),
    }
    let session = ctx.state.sessions.get(&pid)?;
    let transaction = session.transaction;
    let application_name = session.gucs.application_name.clone();
    if application_name != before.application_name {
        ctx.reply
            .parameter_status("application_name", &application_name);
    }
    ctx.reply.ready_for_query(transaction);
    Some(ctx.reply)
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

/// A value computed by an expression.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Text(String),
    Void,
}

impl Value {
    fn text(&self) -> Option<String> {
        match self {
            Self::Null => None,
            Self::Bool(b) => Some(if *b { "t" } else { "f" }.to_owned()),
            Self::Int(n) => Some(n.to_string()),
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
            Self::Void => "void",
        }
    }
}

struct Ctx<'a> {
    state: &'a mut State,
    pid: i32,
    at: Duration,
    reply: Reply,
}

impl Ctx<'_> {
    fn run_all(&mut self, statements: &[Statement], before: &Gucs) {
        for statement in statements {
            if self.transaction() == TransactionStatus::Failed && !statement.ends_transaction() {
                let error = SqlError::error(
                    sqlstate::IN_FAILED_SQL_TRANSACTION,
                    "current transaction is aborted, commands ignored until end of transaction block",
                );
                self.fail(&error, before);
                return;
            }
            if let Err(error) = self.execute(statement) {
                self.fail(&error, before);
                return;
            }
        }
    }

    /// Sends `error`; an open block becomes failed, an implicit transaction is undone.
    fn fail(&mut self, error: &SqlError, before: &Gucs) {
        self.reply.error(error);
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        match session.transaction {
            TransactionStatus::InBlock => session.transaction = TransactionStatus::Failed,
            TransactionStatus::Idle => session.gucs = before.clone(),
            TransactionStatus::Failed => {}
        }
    }

    fn transaction(&self) -> TransactionStatus {
        self.state
            .sessions
            .get(&self.pid)
            .map_or(TransactionStatus::Idle, |s| s.transaction)
    }

    fn execute(&mut self, statement: &Statement) -> Result<(), SqlError> {
        match statement {
            Statement::Select(expr) => self.select(expr),
            Statement::Set { name, value } => self.set(name, value),
            Statement::Show(name) => self.show(name),
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
        }
    }

    fn select(&mut self, expr: &Expr) -> Result<(), SqlError> {
        let mut notices = Vec::new();
        let value = self.eval(expr, &mut notices);
        let column = column_name(expr);
        if value.is_ok() {
            self.reply.row_description(&[(column, type_of(expr))]);
        }
        for notice in &notices {
            self.reply.notice(notice);
        }
        let text = value?.text();
        self.reply.data_row(&[text.as_deref()]);
        self.reply.command_complete("SELECT 1");
        Ok(())
    }

    fn set(&mut self, name: &str, value: &SetValue) -> Result<(), SqlError> {
        let guc = Guc::lookup(name)?;
        let gucs = self.gucs_mut()?;
        match value {
            SetValue::Value(text) => gucs.set(guc, text)?,
            SetValue::Default => gucs.reset(guc),
        }
        self.reply.command_complete("SET");
        Ok(())
    }

    fn show(&mut self, name: &str) -> Result<(), SqlError> {
        let guc = Guc::lookup(name)?;
        let text = self.gucs_mut()?.show(guc);
        self.reply.row_description(&[(guc.name(), PgType::Text)]);
        self.reply.data_row(&[Some(&text)]);
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
            self.reply.notice(&SqlError::warning(
                sqlstate::ACTIVE_SQL_TRANSACTION,
                "there is already a transaction in progress",
            ));
        }
        self.reply.command_complete("BEGIN");
    }

    /// `COMMIT` (`commit` true) or `ROLLBACK`; a failed block's COMMIT rolls back.
    fn end_block(&mut self, commit: bool) {
        let Some(session) = self.state.sessions.get_mut(&self.pid) else {
            return;
        };
        let tag = match session.transaction {
            TransactionStatus::Idle => {
                self.reply.notice(&SqlError::warning(
                    sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                    "there is no transaction in progress",
                ));
                if commit { "COMMIT" } else { "ROLLBACK" }
            }
            TransactionStatus::InBlock if commit => {
                session.saved_gucs = None;
                "COMMIT"
            }
            TransactionStatus::InBlock | TransactionStatus::Failed => {
                if let Some(saved) = session.saved_gucs.take() {
                    session.gucs = saved;
                }
                "ROLLBACK"
            }
        };
        session.transaction = TransactionStatus::Idle;
        self.reply.command_complete(tag);
    }

    fn gucs_mut(&mut self) -> Result<&mut Gucs, SqlError> {
        self.state
            .sessions
            .get_mut(&self.pid)
            .map(|s| &mut s.gucs)
            .ok_or_else(|| SqlError::error(sqlstate::PROTOCOL_VIOLATION, "session is gone"))
    }

    fn eval(&mut self, expr: &Expr, notices: &mut Vec<SqlError>) -> Result<Value, SqlError> {
        match expr {
            Expr::Int(n) => Ok(Value::Int(*n)),
            Expr::Bool(b) => Ok(Value::Bool(*b)),
            Expr::Text(s) => Ok(Value::Text(s.clone())),
            Expr::Null => Ok(Value::Null),
            Expr::IsNull { expr, negated } => {
                let is_null = self.eval(expr, notices)? == Value::Null;
                Ok(Value::Bool(is_null != *negated))
            }
            Expr::Case { arms, otherwise } => {
                for (when, then) in arms {
                    if self.eval(when, notices)? == Value::Bool(true) {
                        return self.eval(then, notices);
                    }
                }
                self.eval(otherwise, notices)
            }
            Expr::Call(func, args) => {
                let mut values = Vec::with_capacity(args.len());
                for arg in args {
                    values.push(self.eval(arg, notices)?);
                }
                self.call(*func, &values, notices)
            }
        }
    }

    fn call(
        &mut self,
        func: Func,
        args: &[Value],
        notices: &mut Vec<SqlError>,
    ) -> Result<Value, SqlError> {
        let (pid, at) = (self.pid, self.at);
        match (func, args) {
            (Func::TryAdvisoryLock | Func::AdvisoryUnlock, _) if args.contains(&Value::Null) => {
                Ok(Value::Null)
            }
            (Func::TryAdvisoryLock, _) => {
                let key = lock_key(func, args)?;
                Ok(Value::Bool(self.state.try_lock(pid, key, at)))
            }
            (Func::AdvisoryUnlock, _) => {
                let key = lock_key(func, args)?;
                let released = self.state.unlock(pid, key, at);
                if !released {
                    notices.push(SqlError::warning(
                        sqlstate::WARNING,
                        "you don't own a lock of type ExclusiveLock",
                    ));
                }
                Ok(Value::Bool(released))
            }
            (Func::AdvisoryUnlockAll, []) => {
                self.state.unlock_all(pid, at);
                Ok(Value::Void)
            }
            (Func::SetConfig, [Value::Text(name), Value::Text(value), Value::Bool(local)]) => {
                self.set_config(name, value, *local)
            }
            (Func::CurrentSetting, [Value::Text(name)]) => {
                let guc = Guc::lookup(name)?;
                Ok(Value::Text(self.gucs_mut()?.show(guc)))
            }
            (Func::BackendPid, []) => Ok(Value::Int(i64::from(pid))),
            (Func::IsInRecovery, []) => Ok(Value::Bool(false)),
            (Func::TerminateBackend, [Value::Int(target)]) => {
                let signalled =
                    i32::try_from(*target).is_ok_and(|target| self.state.request_terminate(target));
                if !signalled {
                    notices.push(SqlError::warning(
                        sqlstate::WARNING,
                        format!("PID {target} is not a PostgreSQL backend process"),
                    ));
                }
                Ok(Value::Bool(signalled))
            }
            _ => Err(no_such_function(func, args)),
        }
    }

    fn set_config(&mut self, name: &str, value: &str, local: bool) -> Result<Value, SqlError> {
        if local {
            return Err(SqlError::error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "the simulated server does not support set_config with is_local = true",
            ));
        }
        let guc = Guc::lookup(name)?;
        let gucs = self.gucs_mut()?;
        gucs.set(guc, value)?;
        Ok(Value::Text(gucs.show(guc)))
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

/// The result column's name, as PostgreSQL derives it.
fn column_name(expr: &Expr) -> &'static str {
    match expr {
        Expr::Call(func, _) => func.name(),
        Expr::Case { .. } => "case",
        Expr::Bool(_) => "bool",
        Expr::Text(_) | Expr::Null | Expr::Int(_) | Expr::IsNull { .. } => "?column?",
    }
}

/// The result column's type, known before evaluation.
fn type_of(expr: &Expr) -> PgType {
    match expr {
        Expr::Int(n) if i32::try_from(*n).is_ok() => PgType::Int4,
        Expr::Int(_) => PgType::Int8,
        Expr::Bool(_) | Expr::IsNull { .. } => PgType::Bool,
        Expr::Text(_) | Expr::Null => PgType::Text,
        Expr::Case { arms, .. } => arms.first().map_or(PgType::Text, |(_, then)| type_of(then)),
        Expr::Call(func, _) => match func {
            Func::TryAdvisoryLock
            | Func::AdvisoryUnlock
            | Func::IsInRecovery
            | Func::TerminateBackend => PgType::Bool,
            Func::AdvisoryUnlockAll => PgType::Void,
            Func::SetConfig | Func::CurrentSetting => PgType::Text,
            Func::BackendPid => PgType::Int4,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a parse failure is the assertion

    use fallible_iterator::FallibleIterator;
    use postgres_protocol::message::backend::Message;

    use super::*;
    use crate::server::config::ServerConfig;
    use crate::server::state::Startup;

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
        let mut buf = run_query(state, pid, query, Duration::from_millis(5))
            .unwrap()
            .into_bytes();
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
}
