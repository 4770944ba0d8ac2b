//! The statement recogniser: the small SQL subset the simulated server understands.
//!
//! Whitespace- and case-insensitive. A query string is split on `;` into statements,
//! each parsed whole before anything runs, as PostgreSQL does. Supported:
//!
//! - `SELECT <expr>, <expr>, …` (one row) where `<expr>` is an integer, string,
//!   `true`/`false`/`null`, a call of a function in [`Func`], `NOT <expr>`,
//!   `<expr> IS [NOT] NULL`, `<expr>::bigint` (or `::int8`), `CASE WHEN <expr> THEN <expr> …
//!   [ELSE <expr>] END`,
//!   `EXISTS (SELECT 1 FROM pg_locks WHERE <cond> AND …)` (see [`LockCond`]), or a
//!   parenthesised `<expr>`; this covers the adapter's grant and check statements;
//! - the fencing statements of the adapter, and only their shape: `CREATE TABLE [IF NOT
//!   EXISTS] t (classid int4 NOT NULL, objid int4 NOT NULL, epoch bigint NOT NULL, PRIMARY
//!   KEY (classid, objid))`, `INSERT INTO t AS f (classid, objid, epoch) VALUES (a, b, n)
//!   ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch` and
//!   `SELECT epoch FROM t WHERE classid = a AND objid = b [FOR SHARE]`; and the lease table's
//!   `CREATE TABLE [IF NOT EXISTS] t (classid int4 NOT NULL, objid int4 NOT NULL, holder text
//!   NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (classid, objid))`;
//! - the statements of the lease mechanism, exactly as `plexsphere_leader::sql::lease` builds
//!   them, recognised whole (see `lease`); a claim's query string runs as its `SET LOCAL
//!   lock_timeout` and then the claim;
//! - `SET [SESSION | LOCAL] <name> {=|TO} {<value>|DEFAULT}`, `RESET <name>`, `SHOW <name>`;
//! - `BEGIN`/`START TRANSACTION`, `COMMIT`/`END`, `ROLLBACK`/`ABORT`;
//! - `SELECT pg_terminate_backend(pid)` of another backend (terminating one's own backend is
//!   not modelled: the reply comes before the FATAL);
//! - the statements of a sharded election, exactly as `plexsphere_leader::shard_sql` builds
//!   them, recognised whole (see `shard`), and those of a lease shard space,
//!   `shard_sql::lease` (see `shard_lease`), after their `SET LOCAL`s and a take's transaction
//!   lock, which the general parser reads; the lease space's setup is the general parser's
//!   (its `CREATE SEQUENCE … AS int4 MINVALUE 1 CYCLE` and the two tables' shapes).
//!
//! Anything else fails with 0A000 (an unsupported statement), 42601 (malformed) or
//! 42883 (unknown function). Unlike PostgreSQL, which looks functions up statement by
//! statement, unknown function names fail the whole query string before anything runs. To add a statement, add a variant to [`Statement`] or
//! [`Func`] here and its effect in `exec`.

use super::candidacy::{self, CandidacyStatement};
use super::lease::{self, LeaseStatement};
use super::reply::{SqlError, sqlstate};
use super::shard::{self, ShardStatement};
use super::shard_lease::{self, ShardLeaseStatement};
use super::storage::TableKind;

/// One parsed statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Statement {
    /// `SELECT <expr>, …`: one row, a column per expression.
    Select(Vec<Expr>),
    /// `CREATE TABLE [IF NOT EXISTS] name (…)` of the fence table's or the lease table's
    /// shape.
    CreateTable {
        name: String,
        kind: TableKind,
        if_not_exists: bool,
    },
    /// The epoch upsert: insert `(classid, objid, initial)` or add one to the epoch;
    /// returns the new epoch.
    AdvanceEpoch {
        table: String,
        classid: i64,
        objid: i64,
        initial: i64,
    },
    /// `SELECT epoch FROM table WHERE classid = … AND objid = … [FOR SHARE]`.
    SelectEpoch {
        table: String,
        classid: i64,
        objid: i64,
        for_share: bool,
    },
    /// `SET name = value`, `SET name TO DEFAULT`, `RESET name`; `SET LOCAL` (`local`) until
    /// the transaction ends.
    Set {
        name: String,
        value: SetValue,
        local: bool,
    },
    /// `SHOW name`.
    Show(String),
    /// `BEGIN`.
    Begin,
    /// `COMMIT`.
    Commit,
    /// `ROLLBACK`.
    Rollback,
    /// A statement of a sharded election (`plexsphere_leader::shard_sql`), recognised whole.
    Shard(ShardStatement),
    /// A statement of the lease mechanism (`plexsphere_leader::sql::lease`), recognised whole;
    /// a claim comes after the `SET LOCAL lock_timeout` of its query string.
    Lease(LeaseStatement),
    /// A statement of a lease shard space (`plexsphere_leader::shard_sql::lease`), recognised
    /// whole; it comes after the `SET LOCAL`s (and a take's transaction lock) of its query
    /// string.
    ShardLease(ShardLeaseStatement),
    /// A ranked replica's survey (`plexsphere_leader::sql::candidacy`), recognised whole.
    Candidacy(CandidacyStatement),
}

impl Statement {
    /// Whether the statement is allowed in an aborted transaction block.
    pub(crate) fn ends_transaction(&self) -> bool {
        matches!(self, Self::Commit | Self::Rollback)
    }
}

/// The right-hand side of `SET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetValue {
    /// A value in text form.
    Value(String),
    /// `DEFAULT` (or `RESET`).
    Default,
}

/// An expression of a `SELECT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    Int(i64),
    Bool(bool),
    Text(String),
    Null,
    Call(Func, Vec<Expr>),
    IsNull {
        expr: Box<Expr>,
        negated: bool,
    },
    Not(Box<Expr>),
    /// `<left> = <right>`.
    Equals(Box<Expr>, Box<Expr>),
    /// `<expr>::bigint`.
    CastInt8(Box<Expr>),
    /// `EXISTS (SELECT 1 FROM pg_locks WHERE <conds joined by AND>)`.
    Exists(Vec<LockCond>),
    Case {
        arms: Vec<(Expr, Expr)>,
        otherwise: Box<Expr>,
    },
}

/// A column of `pg_locks` a condition of [`Expr::Exists`] can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockColumn {
    /// `locktype` (text; always `advisory` in the model).
    LockType,
    /// `classid` (oid): the first int4 key, or the high half of a bigint key.
    ClassId,
    /// `objid` (oid): the second int4 key, or the low half of a bigint key.
    ObjId,
    /// `objsubid` (int2): 2 for the two-int4 form, 1 for the bigint form.
    ObjSubId,
    /// `pid` (int4): the holding or waiting backend.
    Pid,
    /// `granted` (bool): held, or waited for.
    Granted,
}

impl LockColumn {
    fn lookup(name: &str) -> Option<Self> {
        Some(match name {
            "locktype" => Self::LockType,
            "classid" => Self::ClassId,
            "objid" => Self::ObjId,
            "objsubid" => Self::ObjSubId,
            "pid" => Self::Pid,
            "granted" => Self::Granted,
            _ => return None,
        })
    }
}

/// One condition of [`Expr::Exists`]: `column = value`, where `value` is a literal or
/// `pg_backend_pid()`; a bare `granted` is `granted = true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockCond {
    pub(crate) column: LockColumn,
    pub(crate) value: Expr,
}

/// The functions the server implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    /// `pg_try_advisory_lock(int4, int4)` or `(bigint)` → bool.
    TryAdvisoryLock,
    /// `pg_advisory_unlock(int4, int4)` or `(bigint)` → bool.
    AdvisoryUnlock,
    /// `pg_advisory_lock(int4, int4)` or `(bigint)` → void: waits in the lock's queue.
    AdvisoryLock,
    /// `pg_advisory_xact_lock(int4, int4)` or `(bigint)` → void: a transaction-level lock. The
    /// simulated server runs a query string of statements that do not wait in one step, so no
    /// other session can take the same transaction-level lock meanwhile: it is granted at once
    /// and ends with the step; a key another session holds as a session lock is not modelled
    /// (0A000). `lease::setup` is its one user.
    AdvisoryXactLock,
    /// `pg_advisory_unlock_all()` → void: every advisory lock of the session, in either mode.
    AdvisoryUnlockAll,
    /// `pg_try_advisory_lock_shared(int4, int4)` or `(bigint)` → bool.
    TryAdvisoryLockShared,
    /// `pg_advisory_unlock_shared(int4, int4)` or `(bigint)` → bool.
    AdvisoryUnlockShared,
    /// `set_config(name, value, is_local)` → text.
    SetConfig,
    /// `current_setting(name [, missing_ok])` → text.
    CurrentSetting,
    /// `pg_backend_pid()` → int4.
    BackendPid,
    /// `current_database()` → name (as text): the database the session connected to.
    CurrentDatabase,
    /// `pg_is_in_recovery()` → bool: whether the instance is a hot standby.
    IsInRecovery,
    /// `pg_terminate_backend(pid)` → bool: asks backend `pid` to end with FATAL 57P01.
    TerminateBackend,
    /// `clock_timestamp()` → timestamptz: the server's clock (see `exec::CLOCK_BASE`).
    ClockTimestamp,
    /// `date_part('epoch', timestamptz)` → double precision.
    DatePart,
    /// `trunc(double precision)` → double precision.
    Trunc,
    /// `concat(any, …)` → text: the arguments' texts, NULLs left out.
    Concat,
    /// `nullif(a, b)` → the type of `a`: NULL when `a` equals `b`, else `a`.
    NullIf,
}

impl Func {
    fn lookup(name: &str) -> Option<Self> {
        Some(match name {
            "pg_try_advisory_lock" => Self::TryAdvisoryLock,
            "pg_advisory_unlock" => Self::AdvisoryUnlock,
            "pg_advisory_lock" => Self::AdvisoryLock,
            "pg_advisory_xact_lock" => Self::AdvisoryXactLock,
            "pg_advisory_unlock_all" => Self::AdvisoryUnlockAll,
            "pg_try_advisory_lock_shared" => Self::TryAdvisoryLockShared,
            "pg_advisory_unlock_shared" => Self::AdvisoryUnlockShared,
            "set_config" => Self::SetConfig,
            "current_setting" => Self::CurrentSetting,
            "pg_backend_pid" => Self::BackendPid,
            "current_database" => Self::CurrentDatabase,
            "pg_is_in_recovery" => Self::IsInRecovery,
            "pg_terminate_backend" => Self::TerminateBackend,
            "clock_timestamp" => Self::ClockTimestamp,
            "date_part" => Self::DatePart,
            "trunc" => Self::Trunc,
            "concat" => Self::Concat,
            "nullif" => Self::NullIf,
            _ => return None,
        })
    }

    /// The function's SQL name, also the result column's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::TryAdvisoryLock => "pg_try_advisory_lock",
            Self::AdvisoryUnlock => "pg_advisory_unlock",
            Self::AdvisoryLock => "pg_advisory_lock",
            Self::AdvisoryXactLock => "pg_advisory_xact_lock",
            Self::AdvisoryUnlockAll => "pg_advisory_unlock_all",
            Self::TryAdvisoryLockShared => "pg_try_advisory_lock_shared",
            Self::AdvisoryUnlockShared => "pg_advisory_unlock_shared",
            Self::SetConfig => "set_config",
            Self::CurrentSetting => "current_setting",
            Self::BackendPid => "pg_backend_pid",
            Self::CurrentDatabase => "current_database",
            Self::IsInRecovery => "pg_is_in_recovery",
            Self::TerminateBackend => "pg_terminate_backend",
            Self::ClockTimestamp => "clock_timestamp",
            Self::DatePart => "date_part",
            Self::Trunc => "trunc",
            Self::Concat => "concat",
            Self::NullIf => "nullif",
        }
    }
}

/// Parses a simple-Query string into its statements; empty statements are dropped, so an
/// empty or all-`;` string gives an empty list (EmptyQueryResponse).
pub(crate) fn parse(query: &str) -> Result<Vec<Statement>, SqlError> {
    let query = &lease::unqualified(query);
    if let Some(statement) = shard::recognise(query) {
        return statement.map(|statement| vec![Statement::Shard(statement)]);
    }
    if let Some(statement) = shard_lease::recognise(query) {
        let statement = statement?;
        let mut statements = match shard_lease::proper(&statement) {
            Some(proper) => general(query.split_once(proper).map_or("", |(before, _)| before))?,
            None => Vec::new(),
        };
        statements.push(Statement::ShardLease(statement));
        return Ok(statements);
    }
    if let Some(statement) = lease::recognise(query) {
        return lease_statements(query, statement?);
    }
    if let Some(statement) = candidacy::recognise(query) {
        return statement.map(|statement| vec![Statement::Candidacy(statement)]);
    }
    general(query)
}

/// A lease statement as the statements it runs: a claim's `SET LOCAL`s and its transaction
/// lock (the text before its `WITH`, which the general parser reads: the lock is taken, and
/// waited for, as any `pg_advisory_xact_lock`) and then the claim; any other alone.
fn lease_statements(query: &str, statement: LeaseStatement) -> Result<Vec<Statement>, SqlError> {
    let mut statements = match (&statement, query.split_once(lease::CLAIM_CTE)) {
        (LeaseStatement::Claim { .. }, Some((before, _claim))) => general(before)?,
        _ => Vec::new(),
    };
    statements.push(Statement::Lease(statement));
    Ok(statements)
}

/// Parses `query` with the general parser (and the fencing statements' patterns).
fn general(query: &str) -> Result<Vec<Statement>, SqlError> {
    let tokens = tokenize(query)?;
    tokens
        .split(|t| *t == Tok::Semi)
        .filter(|part| !part.is_empty())
        .map(|part| {
            fence_statement(part).map_or_else(|| Parser { toks: part, at: 0 }.statement(), Ok)
        })
        .collect()
}

const CREATE_FENCE: &str = "create table $name ( classid int4 not null , objid int4 not null , \
     epoch bigint not null , primary key ( classid , objid ) )";
const CREATE_FENCE_IF_NOT_EXISTS: &str = "create table if not exists $name ( classid int4 not \
     null , objid int4 not null , epoch bigint not null , primary key ( classid , objid ) )";
const CREATE_LEASE: &str = "create table $name ( classid int4 not null , objid int4 not null , \
     holder text not null , expires_at timestamptz not null , primary key ( classid , objid ) )";
const CREATE_LEASE_IF_NOT_EXISTS: &str = "create table if not exists $name ( classid int4 not \
     null , objid int4 not null , holder text not null , expires_at timestamptz not null , \
     primary key ( classid , objid ) )";
const CREATE_MEMBERS_IF_NOT_EXISTS: &str = "create table if not exists $name ( classid int4 not \
     null , member int4 not null , holder text not null , expires_at timestamptz not null , \
     primary key ( classid , member ) )";
const CREATE_OWNERS_IF_NOT_EXISTS: &str = "create table if not exists $name ( classid int4 not \
     null , shard int4 not null , member int4 , primary key ( classid , shard ) )";
const CREATE_CANDIDATES_IF_NOT_EXISTS: &str = "create unlogged table if not exists $name ( \
     classid int4 not null , objid int4 not null , holder text not null , candidacy text not \
     null , seen_ms int8 not null , age_ms int8 not null , primary key ( classid , objid , \
     holder ) )";
const CREATE_FLOOR_IF_NOT_EXISTS: &str = "create table if not exists $name ( classid int4 not \
     null , objid int4 not null , version text not null , sort_key text not null , primary key \
     ( classid , objid ) )";
const CREATE_SEQUENCE_IF_NOT_EXISTS: &str =
    "create sequence if not exists $name as int4 minvalue 1 cycle";
const ADVANCE_EPOCH: &str = "insert into $name as $name ( classid , objid , epoch ) values \
     ( $int , $int , $int ) on conflict ( classid , objid ) do update set epoch = $name . epoch \
     + 1 returning $name . epoch";
const SELECT_EPOCH: &str = "select epoch from $name where classid = $int and objid = $int";
const SELECT_EPOCH_FOR_SHARE: &str =
    "select epoch from $name where classid = $int and objid = $int for share";

/// Recognises the fencing statements and the creation of the lease table and of a lease
/// shard space's tables and sequence, which are matched as whole token patterns.
fn fence_statement(toks: &[Tok]) -> Option<Statement> {
    let create =
        |text, kind, if_not_exists| pattern(toks, text).map(|caps| (caps, kind, if_not_exists));
    let created = create(CREATE_FENCE_IF_NOT_EXISTS, TableKind::Fence, true)
        .or_else(|| create(CREATE_FENCE, TableKind::Fence, false))
        .or_else(|| create(CREATE_LEASE_IF_NOT_EXISTS, TableKind::Lease, true))
        .or_else(|| create(CREATE_LEASE, TableKind::Lease, false))
        .or_else(|| create(CREATE_MEMBERS_IF_NOT_EXISTS, TableKind::Members, true))
        .or_else(|| create(CREATE_OWNERS_IF_NOT_EXISTS, TableKind::Owners, true))
        .or_else(|| create(CREATE_CANDIDATES_IF_NOT_EXISTS, TableKind::Candidates, true))
        .or_else(|| create(CREATE_FLOOR_IF_NOT_EXISTS, TableKind::Floor, true))
        .or_else(|| create(CREATE_SEQUENCE_IF_NOT_EXISTS, TableKind::Sequence, true));
    if let Some((caps, kind, if_not_exists)) = created {
        let name = caps.first().map(tok_name)?;
        return Some(Statement::CreateTable {
            name,
            kind,
            if_not_exists,
        });
    }
    if let Some(caps) = pattern(toks, ADVANCE_EPOCH) {
        let [
            table,
            alias,
            Tok::Int(classid),
            Tok::Int(objid),
            Tok::Int(initial),
            a1,
            a2,
        ] = caps.as_slice()
        else {
            return None;
        };
        let alias = tok_name(alias);
        if tok_name(a1) != alias || tok_name(a2) != alias {
            return None;
        }
        return Some(Statement::AdvanceEpoch {
            table: tok_name(table),
            classid: *classid,
            objid: *objid,
            initial: *initial,
        });
    }
    let (caps, for_share) = match pattern(toks, SELECT_EPOCH_FOR_SHARE) {
        Some(caps) => (caps, true),
        None => (pattern(toks, SELECT_EPOCH)?, false),
    };
    let [table, Tok::Int(classid), Tok::Int(objid)] = caps.as_slice() else {
        return None;
    };
    Some(Statement::SelectEpoch {
        table: tok_name(table),
        classid: *classid,
        objid: *objid,
        for_share,
    })
}

fn tok_name(tok: &Tok) -> String {
    match tok {
        Tok::Word(w) | Tok::Ident(w) => w.clone(),
        other => show(other),
    }
}

/// Matches `toks` against `pattern` (written in SQL, lowercase), where `$name` stands for
/// an identifier and `$int` for an integer; returns the tokens the placeholders matched.
fn pattern(toks: &[Tok], pattern: &str) -> Option<Vec<Tok>> {
    let want = tokenize(pattern).ok()?;
    let mut caps = Vec::new();
    let (mut w, mut t) = (0, 0);
    while let Some(expected) = want.get(w) {
        let got = toks.get(t)?;
        if *expected == Tok::Other('$') {
            let ok = match want.get(w + 1)? {
                Tok::Word(kind) if kind == "name" => matches!(got, Tok::Word(_) | Tok::Ident(_)),
                _ => matches!(got, Tok::Int(_)),
            };
            if !ok {
                return None;
            }
            caps.push(got.clone());
            w += 2;
        } else if expected == got {
            w += 1;
        } else {
            return None;
        }
        t += 1;
    }
    (t == toks.len()).then_some(caps)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// A keyword or unquoted identifier, lowercased.
    Word(String),
    /// A double-quoted identifier, as written.
    Ident(String),
    Int(i64),
    Str(String),
    LParen,
    RParen,
    Comma,
    Eq,
    Semi,
    Other(char),
}

fn tokenize(query: &str) -> Result<Vec<Tok>, SqlError> {
    let chars: Vec<char> = query.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let start = i;
        i += 1;
        let tok = match c {
            c if c.is_whitespace() => continue,
            '-' if chars.get(i) == Some(&'-') => {
                i = skip_line_comment(&chars, i);
                continue;
            }
            '/' if chars.get(i) == Some(&'*') => {
                i = skip_block_comment(&chars, i)?;
                continue;
            }
            '(' => Tok::LParen,
            ')' => Tok::RParen,
            ',' => Tok::Comma,
            '=' => Tok::Eq,
            ';' => Tok::Semi,
            '\'' => {
                let (text, next) = quoted(&chars, i, '\'')?;
                i = next;
                Tok::Str(text)
            }
            'e' | 'E' if chars.get(i) == Some(&'\'') => {
                let (text, next) = escape_string(&chars, i + 1)?;
                i = next;
                Tok::Str(text)
            }
            '"' => {
                let (text, next) = quoted(&chars, i, '"')?;
                i = next;
                Tok::Ident(text)
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i).is_some_and(char::is_ascii_digit)) =>
            {
                i = scan(&chars, i, |c| c.is_ascii_digit());
                let text: String = chars[start..i].iter().collect();
                Tok::Int(text.parse().map_err(|_| {
                    SqlError::error(
                        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
                        format!("value \"{text}\" is out of range for type bigint"),
                    )
                })?)
            }
            c if c.is_alphabetic() || c == '_' => {
                i = scan(&chars, i, |c| c.is_alphanumeric() || c == '_' || c == '$');
                Tok::Word(chars[start..i].iter().collect::<String>().to_lowercase())
            }
            other => Tok::Other(other),
        };
        toks.push(tok);
    }
    Ok(toks)
}

fn scan(chars: &[char], mut i: usize, keep: impl Fn(char) -> bool) -> usize {
    while chars.get(i).is_some_and(|&c| keep(c)) {
        i += 1;
    }
    i
}

fn skip_line_comment(chars: &[char], i: usize) -> usize {
    scan(chars, i, |c| c != '\n')
}

fn skip_block_comment(chars: &[char], mut i: usize) -> Result<usize, SqlError> {
    i += 1;
    while i + 1 < chars.len() {
        if chars[i] == '*' && chars[i + 1] == '/' {
            return Ok(i + 2);
        }
        i += 1;
    }
    Err(syntax("unterminated /* comment"))
}

/// Reads a quoted string whose opening quote is just before `i`; a doubled quote is an
/// escaped one. Returns the text and the index after the closing quote.
fn quoted(chars: &[char], mut i: usize, quote: char) -> Result<(String, usize), SqlError> {
    let mut text = String::new();
    loop {
        match chars.get(i) {
            None => return Err(syntax("unterminated quoted string")),
            Some(&c) if c == quote => {
                if chars.get(i + 1) == Some(&quote) {
                    text.push(quote);
                    i += 2;
                } else {
                    return Ok((text, i + 1));
                }
            }
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

/// Reads an escape string constant (`E'…'`) whose opening quote is just before `i`: a
/// backslash escapes the next character (only `\\` and `\'` are modelled), a doubled quote
/// is a quote. Returns the text and the index after the closing quote.
fn escape_string(chars: &[char], mut i: usize) -> Result<(String, usize), SqlError> {
    let mut text = String::new();
    loop {
        match chars.get(i) {
            None => return Err(syntax("unterminated quoted string")),
            Some('\\') => match chars.get(i + 1) {
                Some(&c @ ('\\' | '\'')) => {
                    text.push(c);
                    i += 2;
                }
                _ => {
                    return Err(SqlError::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "the simulated server models only \\\\ and \\' in escape strings",
                    ));
                }
            },
            Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                text.push('\'');
                i += 2;
            }
            Some('\'') => return Ok((text, i + 1)),
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

fn syntax(message: impl Into<String>) -> SqlError {
    SqlError::error(sqlstate::SYNTAX_ERROR, message)
}

struct Parser<'a> {
    toks: &'a [Tok],
    at: usize,
}

impl<'a> Parser<'a> {
    fn statement(mut self) -> Result<Statement, SqlError> {
        let first = match self.next() {
            Some(Tok::Word(word)) => word.clone(),
            other => return Err(unexpected(other)),
        };
        let statement = match first.as_str() {
            "select" => {
                let mut columns = vec![self.expr()?];
                while self.peek() == Some(&Tok::Comma) {
                    self.at += 1;
                    columns.push(self.expr()?);
                }
                Statement::Select(columns)
            }
            "set" => self.set()?,
            "reset" => Statement::Set {
                name: self.name()?,
                value: SetValue::Default,
                local: false,
            },
            "show" => Statement::Show(self.name()?),
            "begin" => {
                self.optional_words(&["work", "transaction"]);
                Statement::Begin
            }
            "start" => {
                self.expect_word("transaction")?;
                Statement::Begin
            }
            "commit" | "end" => {
                self.optional_words(&["work", "transaction"]);
                Statement::Commit
            }
            "rollback" | "abort" => {
                self.optional_words(&["work", "transaction"]);
                Statement::Rollback
            }
            other => {
                return Err(SqlError::error(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!(
                        "the simulated server does not support {} statements",
                        other.to_uppercase()
                    ),
                ));
            }
        };
        match self.next() {
            None => Ok(statement),
            other => Err(unexpected(other)),
        }
    }

    fn set(&mut self) -> Result<Statement, SqlError> {
        let local = self.peek_word("local");
        self.optional_words(&["session", "local"]);
        let name = self.name()?;
        match self.next() {
            Some(Tok::Eq) => {}
            Some(Tok::Word(word)) if word == "to" => {}
            other => return Err(unexpected(other)),
        }
        let value = match self.next() {
            Some(Tok::Word(word)) if word == "default" => SetValue::Default,
            Some(Tok::Word(word) | Tok::Ident(word) | Tok::Str(word)) => {
                SetValue::Value(word.clone())
            }
            Some(Tok::Int(n)) => SetValue::Value(n.to_string()),
            other => return Err(unexpected(other)),
        };
        Ok(Statement::Set { name, value, local })
    }

    fn name(&mut self) -> Result<String, SqlError> {
        match self.next() {
            Some(Tok::Word(word) | Tok::Ident(word)) => Ok(word.clone()),
            other => Err(unexpected(other)),
        }
    }

    /// `NOT` binds more loosely than `IS [NOT] NULL`, as in PostgreSQL's grammar.
    fn expr(&mut self) -> Result<Expr, SqlError> {
        if self.peek_word("not") {
            self.at += 1;
            return Ok(Expr::Not(Box::new(self.expr()?)));
        }
        let mut expr = self.primary()?;
        while self.peek() == Some(&Tok::Other(':'))
            && self.toks.get(self.at + 1) == Some(&Tok::Other(':'))
        {
            self.at += 2;
            match self.next() {
                Some(Tok::Word(ty)) if ty == "bigint" || ty == "int8" => {
                    expr = Expr::CastInt8(Box::new(expr));
                }
                Some(Tok::Word(ty)) => {
                    return Err(SqlError::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        format!("the simulated server casts only to bigint, not to {ty}"),
                    ));
                }
                other => return Err(unexpected(other)),
            }
        }
        while self.peek_word("is") {
            self.at += 1;
            let negated = self.peek_word("not");
            if negated {
                self.at += 1;
            }
            self.expect_word("null")?;
            expr = Expr::IsNull {
                expr: Box::new(expr),
                negated,
            };
        }
        if self.peek() == Some(&Tok::Eq) {
            self.at += 1;
            let right = self.primary()?;
            expr = Expr::Equals(Box::new(expr), Box::new(right));
        }
        Ok(expr)
    }

    fn primary(&mut self) -> Result<Expr, SqlError> {
        match self.next() {
            Some(Tok::Int(n)) => Ok(Expr::Int(*n)),
            Some(Tok::Str(text)) => Ok(Expr::Text(text.clone())),
            Some(Tok::LParen) => {
                let expr = self.expr()?;
                self.expect(&Tok::RParen)?;
                Ok(expr)
            }
            Some(Tok::Word(word)) => match word.as_str() {
                "true" => Ok(Expr::Bool(true)),
                "false" => Ok(Expr::Bool(false)),
                "null" => Ok(Expr::Null),
                "case" => self.case(),
                "exists" if self.peek() == Some(&Tok::LParen) => self.exists(),
                name if self.peek() == Some(&Tok::LParen) => self.call(name),
                _ => Err(unexpected(Some(&Tok::Word(word.clone())))),
            },
            other => Err(unexpected(other)),
        }
    }

    fn case(&mut self) -> Result<Expr, SqlError> {
        let mut arms = Vec::new();
        while self.peek_word("when") {
            self.at += 1;
            let when = self.expr()?;
            self.expect_word("then")?;
            arms.push((when, self.expr()?));
        }
        if arms.is_empty() {
            let next = self.next();
            return Err(unexpected(next));
        }
        let otherwise = if self.peek_word("else") {
            self.at += 1;
            self.expr()?
        } else {
            Expr::Null
        };
        self.expect_word("end")?;
        Ok(Expr::Case {
            arms,
            otherwise: Box::new(otherwise),
        })
    }

    /// `EXISTS (SELECT 1 FROM pg_locks WHERE <cond> [AND <cond>]…)`, the word `exists` read.
    fn exists(&mut self) -> Result<Expr, SqlError> {
        self.expect(&Tok::LParen)?;
        self.expect_word("select")?;
        self.primary()?;
        self.expect_word("from")?;
        match self.next() {
            Some(Tok::Word(table)) if table == "pg_locks" => {}
            Some(Tok::Word(table) | Tok::Ident(table)) => {
                return Err(SqlError::error(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!("the simulated server supports EXISTS only over pg_locks, not {table}"),
                ));
            }
            other => return Err(unexpected(other)),
        }
        self.expect_word("where")?;
        let mut conds = vec![self.lock_cond()?];
        while self.peek_word("and") {
            self.at += 1;
            conds.push(self.lock_cond()?);
        }
        self.expect(&Tok::RParen)?;
        Ok(Expr::Exists(conds))
    }

    fn lock_cond(&mut self) -> Result<LockCond, SqlError> {
        let name = self.name()?;
        let column = LockColumn::lookup(&name).ok_or_else(|| {
            SqlError::error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                format!("the simulated server does not model column pg_locks.{name}"),
            )
        })?;
        if column == LockColumn::Granted && self.peek() != Some(&Tok::Eq) {
            return Ok(LockCond {
                column,
                value: Expr::Bool(true),
            });
        }
        self.expect(&Tok::Eq)?;
        let value = self.primary()?;
        match value {
            Expr::Int(_) | Expr::Text(_) | Expr::Bool(_) => {}
            Expr::Call(Func::BackendPid, ref args) if args.is_empty() => {}
            _ => {
                return Err(SqlError::error(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    "the simulated server compares pg_locks columns only with literals and pg_backend_pid()",
                ));
            }
        }
        Ok(LockCond { column, value })
    }

    fn call(&mut self, name: &str) -> Result<Expr, SqlError> {
        let func = Func::lookup(name).ok_or_else(|| {
            SqlError::error(
                sqlstate::UNDEFINED_FUNCTION,
                format!("function {name} does not exist"),
            )
        })?;
        self.expect(&Tok::LParen)?;
        let mut args = Vec::new();
        if self.peek() == Some(&Tok::RParen) {
            self.at += 1;
            return Ok(Expr::Call(func, args));
        }
        loop {
            args.push(self.expr()?);
            match self.next() {
                Some(Tok::Comma) => {}
                Some(Tok::RParen) => return Ok(Expr::Call(func, args)),
                other => return Err(unexpected(other)),
            }
        }
    }

    fn next(&mut self) -> Option<&'a Tok> {
        let tok = self.toks.get(self.at);
        self.at += 1;
        tok
    }

    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.at)
    }

    fn peek_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if w == word)
    }

    fn optional_words(&mut self, words: &[&str]) {
        if words.iter().any(|w| self.peek_word(w)) {
            self.at += 1;
        }
    }

    fn expect_word(&mut self, word: &str) -> Result<(), SqlError> {
        if self.peek_word(word) {
            self.at += 1;
            return Ok(());
        }
        let next = self.next();
        Err(unexpected(next))
    }

    fn expect(&mut self, tok: &Tok) -> Result<(), SqlError> {
        match self.next() {
            Some(t) if t == tok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(tok: Option<&Tok>) -> SqlError {
    match tok {
        None => syntax("syntax error at end of input"),
        Some(tok) => syntax(format!("syntax error at or near \"{}\"", show(tok))),
    }
}

fn show(tok: &Tok) -> String {
    match tok {
        Tok::Word(w) | Tok::Ident(w) => w.clone(),
        Tok::Int(n) => n.to_string(),
        Tok::Str(s) => format!("'{s}'"),
        Tok::LParen => "(".to_owned(),
        Tok::RParen => ")".to_owned(),
        Tok::Comma => ",".to_owned(),
        Tok::Eq => "=".to_owned(),
        Tok::Semi => ";".to_owned(),
        Tok::Other(c) => c.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(query: &str) -> Statement {
        match parse(query) {
            Ok(mut statements) if statements.len() == 1 => statements.remove(0),
            other => panic!("{query:?} parsed to {other:?}"),
        }
    }

    fn code(query: &str) -> &'static str {
        match parse(query) {
            Err(e) => e.code,
            Ok(s) => panic!("{query:?} parsed to {s:?}"),
        }
    }

    fn select1(expr: Expr) -> Statement {
        Statement::Select(vec![expr])
    }

    fn call(func: Func, args: Vec<Expr>) -> Expr {
        Expr::Call(func, args)
    }

    #[test]
    fn adapter_grant_statement_parses() {
        let query = "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
                     set_config('idle_session_timeout', '20000', false) IS NOT NULL ELSE false END";
        let expected = select1(Expr::Case {
            arms: vec![(
                call(
                    Func::TryAdvisoryLock,
                    vec![Expr::Int(1_886_156_915), Expr::Int(1)],
                ),
                Expr::IsNull {
                    expr: Box::new(call(
                        Func::SetConfig,
                        vec![
                            Expr::Text("idle_session_timeout".to_owned()),
                            Expr::Text("20000".to_owned()),
                            Expr::Bool(false),
                        ],
                    )),
                    negated: true,
                },
            )],
            otherwise: Box::new(Expr::Bool(false)),
        });
        assert_eq!(one(query), expected);
        let spaced = "  select\n case when PG_TRY_ADVISORY_LOCK ( 1886156915 ,1 )then \
                      SET_CONFIG('idle_session_timeout','20000',FALSE)is not null else FALSE end ; ";
        assert_eq!(one(spaced), expected);
    }

    #[test]
    fn select_one_and_unlock_statements_parse() {
        assert_eq!(one("SELECT 1"), select1(Expr::Int(1)));
        assert_eq!(
            one("SELECT pg_advisory_unlock(1886156915, 1)"),
            select1(call(
                Func::AdvisoryUnlock,
                vec![Expr::Int(1_886_156_915), Expr::Int(1)]
            ))
        );
        assert_eq!(
            one("select pg_advisory_unlock_all()"),
            select1(call(Func::AdvisoryUnlockAll, vec![]))
        );
        assert_eq!(
            one("SELECT pg_try_advisory_lock(-5)"),
            select1(call(Func::TryAdvisoryLock, vec![Expr::Int(-5)]))
        );
        assert_eq!(
            one("SELECT pg_backend_pid()"),
            select1(call(Func::BackendPid, vec![]))
        );
        assert_eq!(
            one("SELECT pg_is_in_recovery()"),
            select1(call(Func::IsInRecovery, vec![]))
        );
    }

    #[test]
    fn set_forms_parse() {
        let timeout = |value: &str| Statement::Set {
            name: "idle_session_timeout".to_owned(),
            value: SetValue::Value(value.to_owned()),
            local: false,
        };
        assert_eq!(one("SET idle_session_timeout = 20000"), timeout("20000"));
        assert_eq!(one("set idle_session_timeout to '20s'"), timeout("20s"));
        assert_eq!(one("SET SESSION idle_session_timeout TO 5"), timeout("5"));
        assert_eq!(
            one("SET application_name = 'replica-1'"),
            Statement::Set {
                name: "application_name".to_owned(),
                value: SetValue::Value("replica-1".to_owned()),
                local: false,
            }
        );
        assert_eq!(
            one("SET idle_session_timeout TO DEFAULT"),
            Statement::Set {
                name: "idle_session_timeout".to_owned(),
                value: SetValue::Default,
                local: false,
            }
        );
        assert_eq!(
            one("RESET idle_session_timeout"),
            Statement::Set {
                name: "idle_session_timeout".to_owned(),
                value: SetValue::Default,
                local: false,
            }
        );
        assert_eq!(
            one("SET LOCAL idle_in_transaction_session_timeout = '50ms'"),
            Statement::Set {
                name: "idle_in_transaction_session_timeout".to_owned(),
                value: SetValue::Value("50ms".to_owned()),
                local: true,
            }
        );
        assert_eq!(
            one("SHOW idle_session_timeout"),
            Statement::Show("idle_session_timeout".to_owned())
        );
    }

    #[test]
    fn transaction_statements_parse() {
        assert_eq!(one("BEGIN"), Statement::Begin);
        assert_eq!(one("start transaction"), Statement::Begin);
        assert_eq!(one("COMMIT"), Statement::Commit);
        assert_eq!(one("end"), Statement::Commit);
        assert_eq!(one("ROLLBACK"), Statement::Rollback);
        assert_eq!(one("abort work"), Statement::Rollback);
    }

    #[test]
    fn empty_query_and_semicolons_give_no_statements() {
        assert_eq!(parse(""), Ok(vec![]));
        assert_eq!(parse(" ; ;\n"), Ok(vec![]));
        assert_eq!(parse("-- nothing\n"), Ok(vec![]));
    }

    #[test]
    fn several_statements_split_on_semicolons_outside_quotes() {
        assert_eq!(
            parse("SELECT 1; SET application_name = 'a;b'"),
            Ok(vec![
                select1(Expr::Int(1)),
                Statement::Set {
                    name: "application_name".to_owned(),
                    value: SetValue::Value("a;b".to_owned()),
                    local: false,
                },
            ])
        );
    }

    #[test]
    fn quotes_and_comments_are_handled() {
        assert_eq!(
            one("SELECT /* x */ 'it''s'"),
            select1(Expr::Text("it's".to_owned()))
        );
        assert_eq!(code("SELECT 'open"), sqlstate::SYNTAX_ERROR);
    }

    #[test]
    fn unsupported_and_malformed_statements_are_rejected() {
        assert_eq!(
            code("INSERT INTO t VALUES (1)"),
            sqlstate::FEATURE_NOT_SUPPORTED
        );
        assert_eq!(code("SELECT"), sqlstate::SYNTAX_ERROR);
        assert_eq!(code("SELECT 1 2"), sqlstate::SYNTAX_ERROR);
        assert_eq!(
            code("SELECT pg_try_advisory_lock(1"),
            sqlstate::SYNTAX_ERROR
        );
        assert_eq!(code("SELECT CASE END"), sqlstate::SYNTAX_ERROR);
        assert_eq!(code("SELECT 1 + 1"), sqlstate::SYNTAX_ERROR);
        assert_eq!(code("SELECT now()"), sqlstate::UNDEFINED_FUNCTION);
        assert_eq!(
            code("SELECT 1; INSERT INTO t"),
            sqlstate::FEATURE_NOT_SUPPORTED
        );
        assert_eq!(
            code("SELECT 99999999999999999999"),
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE
        );
    }

    #[test]
    fn adapter_check_statement_parses_to_four_columns_with_exists() {
        let query = "SELECT pg_backend_pid(), pg_is_in_recovery(), EXISTS (select 1 FROM \
                     pg_locks WHERE locktype = 'advisory' AND classid = 1886156915 AND \
                     granted AND pid = pg_backend_pid()), current_setting('x.y', true)";
        let Statement::Select(columns) = one(query) else {
            panic!("not a select");
        };
        assert_eq!(columns.len(), 4);
        assert_eq!(
            columns[2],
            Expr::Exists(vec![
                LockCond {
                    column: LockColumn::LockType,
                    value: Expr::Text("advisory".to_owned()),
                },
                LockCond {
                    column: LockColumn::ClassId,
                    value: Expr::Int(1_886_156_915),
                },
                LockCond {
                    column: LockColumn::Granted,
                    value: Expr::Bool(true),
                },
                LockCond {
                    column: LockColumn::Pid,
                    value: call(Func::BackendPid, vec![]),
                },
            ])
        );
        assert_eq!(
            code("SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = 1)"),
            sqlstate::FEATURE_NOT_SUPPORTED
        );
    }

    #[test]
    fn the_grant_time_expression_and_escape_strings_parse() {
        assert_eq!(
            one(
                "SELECT concat(E'a\\\\b''c since ', trunc(date_part('epoch', clock_timestamp()))::bigint)"
            ),
            select1(call(
                Func::Concat,
                vec![
                    Expr::Text("a\\b'c since ".to_owned()),
                    Expr::CastInt8(Box::new(call(
                        Func::Trunc,
                        vec![call(
                            Func::DatePart,
                            vec![
                                Expr::Text("epoch".to_owned()),
                                call(Func::ClockTimestamp, vec![])
                            ]
                        )]
                    ))),
                ]
            ))
        );
        assert_eq!(
            one("SELECT e'it\\'s'"),
            select1(Expr::Text("it's".to_owned()))
        );
        assert_eq!(code("SELECT 1::text"), sqlstate::FEATURE_NOT_SUPPORTED);
        assert_eq!(code("SELECT E'\\n'"), sqlstate::FEATURE_NOT_SUPPORTED);
    }

    #[test]
    fn not_binds_more_loosely_than_is_null() {
        assert_eq!(
            one("SELECT NOT pg_advisory_lock(1, 2) IS NULL"),
            select1(Expr::Not(Box::new(Expr::IsNull {
                expr: Box::new(call(Func::AdvisoryLock, vec![Expr::Int(1), Expr::Int(2)])),
                negated: false,
            })))
        );
    }

    #[test]
    fn fence_statements_parse_in_any_case_and_spacing() {
        assert_eq!(
            one(
                "create table IF NOT EXISTS plexsphere_leader_fence (classid int4 NOT NULL, \
                 objid int4 NOT NULL, epoch bigint NOT NULL, PRIMARY KEY (classid,objid))"
            ),
            Statement::CreateTable {
                name: "plexsphere_leader_fence".to_owned(),
                kind: TableKind::Fence,
                if_not_exists: true,
            }
        );
        assert_eq!(
            one(
                "INSERT INTO t AS g (classid, objid, epoch) VALUES (7, 8, 1) ON CONFLICT \
                 (classid, objid) DO UPDATE SET epoch = g.epoch + 1 RETURNING g.epoch"
            ),
            Statement::AdvanceEpoch {
                table: "t".to_owned(),
                classid: 7,
                objid: 8,
                initial: 1,
            }
        );
        assert_eq!(
            code(
                "INSERT INTO t AS g (classid, objid, epoch) VALUES (7, 8, 1) ON CONFLICT \
                  (classid, objid) DO UPDATE SET epoch = h.epoch + 1 RETURNING g.epoch"
            ),
            sqlstate::FEATURE_NOT_SUPPORTED
        );
        assert_eq!(
            one("select epoch from t where classid = 7 and objid = 8 for share"),
            Statement::SelectEpoch {
                table: "t".to_owned(),
                classid: 7,
                objid: 8,
                for_share: true,
            }
        );
    }

    #[test]
    fn the_lease_setup_creates_its_tables_and_a_claim_runs_after_its_set_local() {
        let key = plexsphere_leader::LockKey::DEFAULT;
        let setup = parse(&plexsphere_leader::sql::lease::setup(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
        ))
        .unwrap();
        // The setup quiets its notices, then serializes itself with a transaction-level lock.
        assert!(
            matches!(setup.first(), Some(Statement::Set { local: true, .. })),
            "{setup:?}"
        );
        assert!(
            matches!(setup.get(1), Some(Statement::Select { .. })),
            "{setup:?}"
        );
        let kinds: Vec<_> = setup[2..]
            .iter()
            .map(|s| match s {
                Statement::CreateTable {
                    name,
                    kind,
                    if_not_exists: true,
                } => (name.as_str(), *kind),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("plexsphere_leader_lease", TableKind::Lease),
                ("plexsphere_leader_fence", TableKind::Fence),
                ("plexsphere_leader_candidate", TableKind::Candidates),
                ("plexsphere_leader_floor", TableKind::Floor)
            ]
        );
        let claim = parse(&plexsphere_leader::sql::lease::claim(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            key,
            "h",
            300,
            50,
        ))
        .unwrap();
        assert_eq!(
            claim.first(),
            Some(&Statement::Set {
                name: "lock_timeout".to_owned(),
                value: SetValue::Value("50".to_owned()),
                local: true,
            })
        );
        // Then its durable commit and its transaction lock, read by the general parser.
        assert!(matches!(
            claim.get(3),
            Some(Statement::Lease(LeaseStatement::Claim { ttl_ms: 300, .. }))
        ));
        assert_eq!(claim.len(), 4);
        let renew = plexsphere_leader::sql::lease::renew(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            key,
            "h",
            300,
        );
        assert!(matches!(
            one(&renew),
            Statement::Lease(LeaseStatement::Renew { .. })
        ));
    }
}
