//! The configuration parameters (GUCs) a session can set, with PostgreSQL's parsing and
//! display rules for them.
//!
//! Besides the built-in parameters in [`Guc`], a name with a dot (`plexsphere.leader_session`)
//! is a custom placeholder, as PostgreSQL accepts for an extension's prefix: `SET` and
//! `set_config` create it, its value is text, and a placeholder never set does not exist
//! (`current_setting` fails with 42704 unless `missing_ok`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::reply::{SqlError, sqlstate};

/// The largest timeout, `INT_MAX` milliseconds.
const MAX_TIMEOUT_MS: i64 = i32::MAX as i64;

/// A parameter the simulated server knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Guc {
    /// `idle_session_timeout`, an integer in milliseconds; 0 disables it.
    IdleSessionTimeout,
    /// `idle_in_transaction_session_timeout`, an integer in milliseconds; 0 disables it.
    IdleInTransactionSessionTimeout,
    /// `lock_timeout`, an integer in milliseconds; 0 (the default) waits without a limit.
    LockTimeout,
    /// `statement_timeout`, an integer in milliseconds: kept and shown, not enforced (no
    /// simulated role or database sets one; the elector's queued wait sets it locally so that
    /// its `lock_timeout` alone bounds the wait).
    StatementTimeout,
    /// `application_name`, reported to the client with ParameterStatus.
    ApplicationName,
    /// `synchronous_commit`, one of PostgreSQL's five levels (`on` by default): kept and
    /// shown, with no effect (the simulated server loses no committed transaction).
    SynchronousCommit,
    /// `client_min_messages`: the least severity of the notices sent to the client
    /// (`notice` by default; `warning` keeps a `CREATE TABLE IF NOT EXISTS` quiet).
    ClientMinMessages,
    /// `default_transaction_read_only` (`off` by default), and `transaction_read_only`, which
    /// shows it: the simulated server runs every statement in a transaction of its own, so a
    /// session's transactions are read-only exactly when its default says so. Kept and shown;
    /// only the elector's grant statement reads it (the simulated tables take writes all the
    /// same).
    ReadOnly,
    /// A setting fixed at server start, which sizes the lock table
    /// ([`ServerConfig::with_lock_table`](super::ServerConfig::with_lock_table)): shown, never
    /// set (55P02).
    Server(ServerSetting),
    /// A custom placeholder (its name has a dot), lowercased.
    Custom(String),
}

/// A setting fixed at server start ([`Guc::Server`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerSetting {
    /// `max_locks_per_transaction`.
    LocksPerTransaction,
    /// `max_connections`.
    Connections,
    /// `max_prepared_transactions`.
    PreparedTransactions,
}

/// The server-start settings that size PostgreSQL's shared lock table:
/// `max_locks_per_transaction × (max_connections + max_prepared_transactions)` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockTableSettings {
    pub(crate) max_locks_per_transaction: u32,
    pub(crate) max_connections: u32,
    pub(crate) max_prepared_transactions: u32,
}

impl Default for LockTableSettings {
    /// PostgreSQL's defaults: 64, 100 and 0 (6,400 slots).
    fn default() -> Self {
        Self {
            max_locks_per_transaction: 64,
            max_connections: 100,
            max_prepared_transactions: 0,
        }
    }
}

impl LockTableSettings {
    /// The lock table's slots, as the sharded registration computes them.
    pub(crate) fn capacity(&self) -> u64 {
        u64::from(self.max_locks_per_transaction)
            * (u64::from(self.max_connections) + u64::from(self.max_prepared_transactions))
    }

    fn value(&self, setting: ServerSetting) -> u32 {
        match setting {
            ServerSetting::LocksPerTransaction => self.max_locks_per_transaction,
            ServerSetting::Connections => self.max_connections,
            ServerSetting::PreparedTransactions => self.max_prepared_transactions,
        }
    }
}

/// A session's values of the parameters in [`Guc`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Gucs {
    pub(crate) idle_session_timeout: Duration,
    pub(crate) idle_in_transaction_session_timeout: Duration,
    pub(crate) lock_timeout: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) application_name: String,
    /// `synchronous_commit`, as `SHOW` shows it; `None` for the default (`on`).
    pub(crate) synchronous_commit: Option<&'static str>,
    /// `client_min_messages`, as `SHOW` shows it; `None` for the default (`notice`).
    pub(crate) client_min_messages: Option<&'static str>,
    /// `default_transaction_read_only`.
    pub(crate) read_only: bool,
    /// The server's lock-table settings (the same in every session).
    pub(crate) server: LockTableSettings,
    /// The custom placeholders that exist in the session, by lowercased name.
    pub(crate) custom: BTreeMap<String, String>,
}

impl Guc {
    /// Looks a parameter up by name, case-insensitively, as PostgreSQL does. A name with a
    /// dot is a custom placeholder (whether or not it exists yet).
    pub(crate) fn lookup(name: &str) -> Result<Self, SqlError> {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "idle_session_timeout" => Ok(Self::IdleSessionTimeout),
            "idle_in_transaction_session_timeout" => Ok(Self::IdleInTransactionSessionTimeout),
            "lock_timeout" => Ok(Self::LockTimeout),
            "statement_timeout" => Ok(Self::StatementTimeout),
            "application_name" => Ok(Self::ApplicationName),
            "synchronous_commit" => Ok(Self::SynchronousCommit),
            "client_min_messages" => Ok(Self::ClientMinMessages),
            "default_transaction_read_only" | "transaction_read_only" => Ok(Self::ReadOnly),
            "max_locks_per_transaction" => Ok(Self::Server(ServerSetting::LocksPerTransaction)),
            "max_connections" => Ok(Self::Server(ServerSetting::Connections)),
            "max_prepared_transactions" => Ok(Self::Server(ServerSetting::PreparedTransactions)),
            custom if custom.contains('.') => Ok(Self::Custom(lower)),
            _ => Err(unrecognized(name)),
        }
    }

    /// The parameter's name.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::IdleSessionTimeout => "idle_session_timeout",
            Self::IdleInTransactionSessionTimeout => "idle_in_transaction_session_timeout",
            Self::LockTimeout => "lock_timeout",
            Self::StatementTimeout => "statement_timeout",
            Self::ApplicationName => "application_name",
            Self::SynchronousCommit => "synchronous_commit",
            Self::ClientMinMessages => "client_min_messages",
            Self::ReadOnly => "default_transaction_read_only",
            Self::Server(ServerSetting::LocksPerTransaction) => "max_locks_per_transaction",
            Self::Server(ServerSetting::Connections) => "max_connections",
            Self::Server(ServerSetting::PreparedTransactions) => "max_prepared_transactions",
            Self::Custom(name) => name,
        }
    }

    /// The error of setting (or resetting) a server-start setting in a session, `None` for
    /// the others.
    pub(crate) fn fixed(&self) -> Option<SqlError> {
        matches!(self, Self::Server(_)).then(|| {
            SqlError::error(
                sqlstate::CANT_CHANGE_RUNTIME_PARAM,
                format!(
                    "parameter \"{}\" cannot be changed without restarting the server",
                    self.name()
                ),
            )
        })
    }
}

/// 42704 `unrecognized configuration parameter "name"`.
pub(crate) fn unrecognized(name: &str) -> SqlError {
    SqlError::error(
        sqlstate::UNDEFINED_OBJECT,
        format!("unrecognized configuration parameter \"{name}\""),
    )
}

impl Gucs {
    /// Sets `guc` from its text form, or fails without changing anything. Setting a custom
    /// placeholder creates it.
    pub(crate) fn set(&mut self, guc: &Guc, value: &str) -> Result<(), SqlError> {
        if let Some(error) = guc.fixed() {
            return Err(error);
        }
        match guc {
            Guc::IdleSessionTimeout => {
                self.idle_session_timeout = parse_timeout(guc.name(), value)?;
            }
            Guc::IdleInTransactionSessionTimeout => {
                self.idle_in_transaction_session_timeout = parse_timeout(guc.name(), value)?;
            }
            Guc::LockTimeout => self.lock_timeout = parse_timeout(guc.name(), value)?,
            Guc::StatementTimeout => self.statement_timeout = parse_timeout(guc.name(), value)?,
            Guc::ApplicationName => self.application_name = clean_application_name(value),
            Guc::SynchronousCommit => {
                self.synchronous_commit = Some(parse_synchronous_commit(value)?);
            }
            Guc::ClientMinMessages => {
                self.client_min_messages = Some(parse_client_min_messages(value)?);
            }
            Guc::ReadOnly => self.read_only = parse_bool(guc.name(), value)?,
            Guc::Server(_) => {}
            Guc::Custom(name) => {
                self.custom.insert(name.clone(), value.to_owned());
            }
        }
        Ok(())
    }

    /// Resets `guc` to its default (an existing placeholder to the empty string).
    pub(crate) fn reset(&mut self, guc: &Guc) {
        match guc {
            Guc::IdleSessionTimeout => self.idle_session_timeout = Duration::ZERO,
            Guc::IdleInTransactionSessionTimeout => {
                self.idle_in_transaction_session_timeout = Duration::ZERO;
            }
            Guc::LockTimeout => self.lock_timeout = Duration::ZERO,
            Guc::StatementTimeout => self.statement_timeout = Duration::ZERO,
            Guc::ApplicationName => self.application_name.clear(),
            Guc::SynchronousCommit => self.synchronous_commit = None,
            Guc::ClientMinMessages => self.client_min_messages = None,
            Guc::ReadOnly => self.read_only = false,
            Guc::Server(_) => {}
            Guc::Custom(name) => {
                self.custom.insert(name.clone(), String::new());
            }
        }
    }

    /// The text `SHOW`, `current_setting` and `set_config` return for `guc`; `None` for a
    /// placeholder that does not exist.
    pub(crate) fn show(&self, guc: &Guc) -> Option<String> {
        Some(match guc {
            Guc::IdleSessionTimeout => format_timeout(self.idle_session_timeout),
            Guc::IdleInTransactionSessionTimeout => {
                format_timeout(self.idle_in_transaction_session_timeout)
            }
            Guc::LockTimeout => format_timeout(self.lock_timeout),
            Guc::StatementTimeout => format_timeout(self.statement_timeout),
            Guc::ApplicationName => self.application_name.clone(),
            Guc::SynchronousCommit => self.synchronous_commit.unwrap_or("on").to_owned(),
            Guc::ClientMinMessages => self.client_min_messages.unwrap_or("notice").to_owned(),
            Guc::ReadOnly => if self.read_only { "on" } else { "off" }.to_owned(),
            Guc::Server(setting) => self.server.value(*setting).to_string(),
            Guc::Custom(name) => self.custom.get(name)?.clone(),
        })
    }
}

/// Parses a timeout parameter's value: an integer with an optional unit among `us`,
/// `ms` (the default), `s`, `min`, `h`, `d`, within 0 to `INT_MAX` milliseconds.
pub(crate) fn parse_timeout(name: &str, value: &str) -> Result<Duration, SqlError> {
    let invalid = || invalid_value(name, value);
    let text = value.trim();
    let digits_end = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(text.len(), |(i, _)| i);
    let number: i64 = text[..digits_end].parse().map_err(|_| invalid())?;
    let ms = match text[digits_end..].trim() {
        "" | "ms" => Some(number),
        "us" => Some((number + 500) / 1000),
        "s" => number.checked_mul(1000),
        "min" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        "d" => number.checked_mul(86_400_000),
        _ => return Err(invalid()),
    };
    match ms {
        Some(ms @ 0..=MAX_TIMEOUT_MS) => Ok(Duration::from_millis(ms.unsigned_abs())),
        _ => Err(SqlError::error(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{} ms is outside the valid range for parameter \"{name}\" (0 .. {MAX_TIMEOUT_MS})",
                ms.map_or_else(|| text.to_owned(), |ms| ms.to_string())
            ),
        )),
    }
}

/// 22023 `invalid value for parameter "name": "value"`.
fn invalid_value(name: &str, value: &str) -> SqlError {
    SqlError::error(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!("invalid value for parameter \"{name}\": \"{value}\""),
    )
}

/// A boolean parameter's value, as PostgreSQL reads one.
fn parse_bool(name: &str, value: &str) -> Result<bool, SqlError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(SqlError::error(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("parameter \"{name}\" requires a Boolean value"),
        )),
    }
}

/// Parses `synchronous_commit` as PostgreSQL does: a level, case-insensitively, or one of the
/// hidden boolean spellings (`true`, `yes`, `1` are `on`; `false`, `no`, `0` are `off`);
/// returns the level `SHOW` then shows.
fn parse_synchronous_commit(value: &str) -> Result<&'static str, SqlError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "local" => Ok("local"),
        "remote_write" => Ok("remote_write"),
        "remote_apply" => Ok("remote_apply"),
        "on" | "true" | "yes" | "1" => Ok("on"),
        "off" | "false" | "no" | "0" => Ok("off"),
        _ => Err(invalid_value("synchronous_commit", value)),
    }
}

/// Parses `client_min_messages` as PostgreSQL does: one of its levels, case-insensitively
/// (`debug` is `debug2`); returns the level `SHOW` then shows.
fn parse_client_min_messages(value: &str) -> Result<&'static str, SqlError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "debug5" => Ok("debug5"),
        "debug4" => Ok("debug4"),
        "debug3" => Ok("debug3"),
        "debug2" | "debug" => Ok("debug2"),
        "debug1" => Ok("debug1"),
        "log" => Ok("log"),
        "notice" => Ok("notice"),
        "warning" => Ok("warning"),
        "error" => Ok("error"),
        _ => Err(invalid_value("client_min_messages", value)),
    }
}

impl Gucs {
    /// Whether a notice of `warning` severity (`false`: a NOTICE) reaches the client under
    /// `client_min_messages`.
    pub(crate) fn sends_notice(&self, warning: bool) -> bool {
        match self.client_min_messages.unwrap_or("notice") {
            "error" => false,
            "warning" => warning,
            _ => true,
        }
    }
}

/// Formats a timeout as `SHOW` does: 0 as `0`, otherwise in the largest unit that divides
/// it exactly (`20000` ms shows as `20s`).
pub(crate) fn format_timeout(timeout: Duration) -> String {
    let ms = timeout.as_millis();
    if ms == 0 {
        return "0".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("min", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// An `application_name` as PostgreSQL 15 keeps it: each byte outside printable ASCII
/// becomes `?`, then the name is cut to `NAMEDATALEN - 1` = 63 bytes (PostgreSQL also sends a
/// NOTICE then, which is not modelled).
fn clean_application_name(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if (b' '..=b'~').contains(&b) {
                char::from(b)
            } else {
                '?'
            }
        })
        .take(63)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Result<Duration, SqlError> {
        Ok(Duration::from_millis(n))
    }

    #[test]
    fn plain_integer_is_milliseconds() {
        assert_eq!(parse_timeout("t", "20000"), ms(20_000));
        assert_eq!(parse_timeout("t", " 0 "), ms(0));
    }

    #[test]
    fn units_are_converted() {
        assert_eq!(parse_timeout("t", "20s"), ms(20_000));
        assert_eq!(parse_timeout("t", "1500ms"), ms(1500));
        assert_eq!(parse_timeout("t", "2 min"), ms(120_000));
        assert_eq!(parse_timeout("t", "1h"), ms(3_600_000));
        assert_eq!(parse_timeout("t", "1d"), ms(86_400_000));
        assert_eq!(parse_timeout("t", "1500us"), ms(2));
    }

    #[test]
    fn garbage_and_out_of_range_are_22023() {
        for bad in ["abc", "10 parsecs", "", "-1", "2147483648", "25d"] {
            let err = parse_timeout("t", bad).err();
            assert_eq!(
                err.map(|e| e.code),
                Some(sqlstate::INVALID_PARAMETER_VALUE),
                "{bad}"
            );
        }
    }

    #[test]
    fn show_picks_largest_exact_unit() {
        assert_eq!(format_timeout(Duration::ZERO), "0");
        assert_eq!(format_timeout(Duration::from_millis(20_000)), "20s");
        assert_eq!(format_timeout(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_timeout(Duration::from_millis(120_000)), "2min");
        assert_eq!(format_timeout(Duration::from_millis(7_200_000)), "2h");
    }

    #[test]
    fn synchronous_commit_takes_postgres_levels_and_boolean_spellings() {
        let mut gucs = Gucs::default();
        assert_eq!(gucs.show(&Guc::SynchronousCommit).as_deref(), Some("on"));
        for (value, shown) in [
            ("OFF", "off"),
            ("1", "on"),
            ("no", "off"),
            ("Remote_Apply", "remote_apply"),
            ("local", "local"),
        ] {
            assert_eq!(gucs.set(&Guc::SynchronousCommit, value), Ok(()));
            assert_eq!(gucs.show(&Guc::SynchronousCommit).as_deref(), Some(shown));
        }
        let refused = gucs.set(&Guc::SynchronousCommit, "bogus").err();
        assert_eq!(
            refused.map(|e| (e.code, e.message)),
            Some((
                sqlstate::INVALID_PARAMETER_VALUE,
                "invalid value for parameter \"synchronous_commit\": \"bogus\"".to_owned()
            ))
        );
        gucs.reset(&Guc::SynchronousCommit);
        assert_eq!(gucs.show(&Guc::SynchronousCommit).as_deref(), Some("on"));
    }

    #[test]
    fn unknown_parameter_is_42704() {
        assert_eq!(
            Guc::lookup("work_mem").err().map(|e| e.code),
            Some(sqlstate::UNDEFINED_OBJECT)
        );
        assert_eq!(
            Guc::lookup("Idle_Session_Timeout").ok(),
            Some(Guc::IdleSessionTimeout)
        );
        assert_eq!(
            Guc::lookup("Plexsphere.Leader_Session").ok(),
            Some(Guc::Custom("plexsphere.leader_session".to_owned()))
        );
    }
}
