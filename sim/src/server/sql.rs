//! The statement recogniser: the small SQL subset the simulated server understands.
//!
//! Whitespace- and case-insensitive. A query string is split on `;` into statements,
//! each parsed whole before anything runs, as PostgreSQL does. Supported:
//!
//! - `SELECT <expr>` where `<expr>` is an integer, string, `true`/`false`/`null`, a call
//!   of a function in [`Func`], `<expr> IS [NOT] NULL`, `CASE WHEN <expr> THEN <expr> …
//!   [ELSE <expr>] END`, or a parenthesised `<expr>`; this covers the adapter's grant
//!   statement `SELECT CASE WHEN pg_try_advisory_lock(a, b) THEN set_config(…) IS NOT NULL
//!   ELSE false END`;
//! - `SET [SESSION] <name> {=|TO} {<value>|DEFAULT}`, `RESET <name>`, `SHOW <name>`;
//! - `BEGIN`/`START TRANSACTION`, `COMMIT`/`END`, `ROLLBACK`/`ABORT`;
//! - `SELECT pg_terminate_backend(pid)` of another backend (terminating one's own backend is
//!   not modelled: the reply comes before the FATAL).
//!
//! Anything else fails with 0A000 (an unsupported statement), 42601 (malformed) or
//! 42883 (unknown function). Unlike PostgreSQL, which looks functions up statement by
//! statement, unknown function names fail the whole query string before anything runs. To add a statement, add a variant to [`Statement`] or
//! [`Func`] here and its effect in `exec`.

use super::reply::{SqlError, sqlstate};

/// One parsed statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Statement {
    /// `SELECT <expr>`: one row, one column.
    Select(Expr),
    /// `SET name = value`, `SET name TO DEFAULT`, `RESET name`.
    Set { name: String, value: SetValue },
    /// `SHOW name`.
    Show(String),
    /// `BEGIN`.
    Begin,
    /// `COMMIT`.
    Commit,
    /// `ROLLBACK`.
    Rollback,
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
    Case {
        arms: Vec<(Expr, Expr)>,
        otherwise: Box<Expr>,
    },
}

/// The functions the server implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    /// `pg_try_advisory_lock(int4, int4)` or `(bigint)` → bool.
    TryAdvisoryLock,
    /// `pg_advisory_unlock(int4, int4)` or `(bigint)` → bool.
    AdvisoryUnlock,
    /// `pg_advisory_unlock_all()` → void.
    AdvisoryUnlockAll,
    /// `set_config(name, value, is_local)` → text.
    SetConfig,
    /// `current_setting(name)` → text.
    CurrentSetting,
    /// `pg_backend_pid()` → int4.
    BackendPid,
    /// `pg_is_in_recovery()` → bool, always false.
    IsInRecovery,
    /// `pg_terminate_backend(pid)` → bool: asks backend `pid` to end with FATAL 57P01.
    TerminateBackend,
}

impl Func {
    fn lookup(name: &str) -> Option<Self> {
        Some(match name {
            "pg_try_advisory_lock" => Self::TryAdvisoryLock,
            "pg_advisory_unlock" => Self::AdvisoryUnlock,
            "pg_advisory_unlock_all" => Self::AdvisoryUnlockAll,
            "set_config" => Self::SetConfig,
            "current_setting" => Self::CurrentSetting,
            "pg_backend_pid" => Self::BackendPid,
            "pg_is_in_recovery" => Self::IsInRecovery,
            "pg_terminate_backend" => Self::TerminateBackend,
            _ => return None,
        })
    }

    /// The function's SQL name, also the result column's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::TryAdvisoryLock => "pg_try_advisory_lock",
            Self::AdvisoryUnlock => "pg_advisory_unlock",
            Self::AdvisoryUnlockAll => "pg_advisory_unlock_all",
            Self::SetConfig => "set_config",
            Self::CurrentSetting => "current_setting",
            Self::BackendPid => "pg_backend_pid",
            Self::IsInRecovery => "pg_is_in_recovery",
            Self::TerminateBackend => "pg_terminate_backend",
        }
    }
}

/// Parses a simple-Query string into its statements; empty statements are dropped, so an
/// empty or all-`;` string gives an empty list (EmptyQueryResponse).
pub(crate) fn parse(query: &str) -> Result<Vec<Statement>, SqlError> {
    let tokens = tokenize(query)?;
    tokens
        .split(|t| *t == Tok::Semi)
        .filter(|part| !part.is_empty())
        .map(|part| Parser { toks: part, at: 0 }.statement())
        .collect()
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
            "select" => Statement::Select(self.expr()?),
            "set" => self.set()?,
            "reset" => Statement::Set {
                name: self.name()?,
                value: SetValue::Default,
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
        if self.peek_word("local") {
            return Err(SqlError::error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "the simulated server does not support SET LOCAL",
            ));
        }
        self.optional_words(&["session"]);
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
        Ok(Statement::Set { name, value })
    }

    fn name(&mut self) -> Result<String, SqlError> {
        match self.next() {
            Some(Tok::Word(word) | Tok::Ident(word)) => Ok(word.clone()),
            other => Err(unexpected(other)),
        }
    }

    fn expr(&mut self) -> Result<Expr, SqlError> {
        let mut expr = self.primary()?;
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

    fn call(func: Func, args: Vec<Expr>) -> Expr {
        Expr::Call(func, args)
    }

    #[test]
    fn adapter_grant_statement_parses() {
        let query = "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
                     set_config('idle_session_timeout', '20000', false) IS NOT NULL ELSE false END";
        let expected = Statement::Select(Expr::Case {
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
        assert_eq!(one("SELECT 1"), Statement::Select(Expr::Int(1)));
        assert_eq!(
            one("SELECT pg_advisory_unlock(1886156915, 1)"),
            Statement::Select(call(
                Func::AdvisoryUnlock,
                vec![Expr::Int(1_886_156_915), Expr::Int(1)]
            ))
        );
        assert_eq!(
            one("select pg_advisory_unlock_all()"),
            Statement::Select(call(Func::AdvisoryUnlockAll, vec![]))
        );
        assert_eq!(
            one("SELECT pg_try_advisory_lock(-5)"),
            Statement::Select(call(Func::TryAdvisoryLock, vec![Expr::Int(-5)]))
        );
        assert_eq!(
            one("SELECT pg_backend_pid()"),
            Statement::Select(call(Func::BackendPid, vec![]))
        );
        assert_eq!(
            one("SELECT pg_is_in_recovery()"),
            Statement::Select(call(Func::IsInRecovery, vec![]))
        );
    }

    #[test]
    fn set_forms_parse() {
        let timeout = |value: &str| Statement::Set {
            name: "idle_session_timeout".to_owned(),
            value: SetValue::Value(value.to_owned()),
        };
        assert_eq!(one("SET idle_session_timeout = 20000"), timeout("20000"));
        assert_eq!(one("set idle_session_timeout to '20s'"), timeout("20s"));
        assert_eq!(one("SET SESSION idle_session_timeout TO 5"), timeout("5"));
        assert_eq!(
            one("SET application_name = 'replica-1'"),
            Statement::Set {
                name: "application_name".to_owned(),
                value: SetValue::Value("replica-1".to_owned()),
            }
        );
        assert_eq!(
            one("SET idle_session_timeout TO DEFAULT"),
            Statement::Set {
                name: "idle_session_timeout".to_owned(),
                value: SetValue::Default,
            }
        );
        assert_eq!(
            one("RESET idle_session_timeout"),
            Statement::Set {
                name: "idle_session_timeout".to_owned(),
                value: SetValue::Default,
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
                Statement::Select(Expr::Int(1)),
                Statement::Set {
                    name: "application_name".to_owned(),
                    value: SetValue::Value("a;b".to_owned()),
                },
            ])
        );
    }

    #[test]
    fn quotes_and_comments_are_handled() {
        assert_eq!(
            one("SELECT /* x */ 'it''s'"),
            Statement::Select(Expr::Text("it's".to_owned()))
        );
        assert_eq!(code("SELECT 'open"), sqlstate::SYNTAX_ERROR);
    }

    #[test]
    fn unsupported_and_malformed_statements_are_rejected() {
        assert_eq!(
            code("INSERT INTO t VALUES (1)"),
            sqlstate::FEATURE_NOT_SUPPORTED
        );
        assert_eq!(
            code("SET LOCAL idle_session_timeout = 1"),
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
}
