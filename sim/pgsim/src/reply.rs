//! Backend (server-to-client) messages of protocol v3, encoded by hand.
//!
//! `postgres-protocol` only parses backend messages; the unit tests below check every
//! encoder against that parser.

use bytes::{BufMut, BytesMut};

/// The transaction state of a session, as ReadyForQuery reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TransactionStatus {
    /// Not in a transaction block (`I`); the idle session timeout applies.
    Idle,
    /// In a transaction block (`T`).
    InBlock,
    /// In a failed transaction block (`E`), until `COMMIT` or `ROLLBACK`.
    Failed,
}

/// Severity of an ErrorResponse or NoticeResponse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    /// The statement failed; the session goes on.
    Error,
    /// The session ends after this message.
    Fatal,
    /// A notice the statement raised.
    Warning,
    /// An informational notice.
    Notice,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Self::Error => "ERROR",
            Self::Fatal => "FATAL",
            Self::Warning => "WARNING",
            Self::Notice => "NOTICE",
        }
    }
}

/// The fields of an ErrorResponse or NoticeResponse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SqlError {
    pub(crate) severity: Severity,
    /// Five-character SQLSTATE.
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl SqlError {
    /// An ERROR with `code` and `message`.
    pub(crate) fn error(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            code,
            message: message.into(),
        }
    }

    /// A FATAL with `code` and `message`.
    pub(crate) fn fatal(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Fatal,
            code,
            message: message.into(),
        }
    }

    /// A NOTICE with `code` and `message`.
    pub(crate) fn notice(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Notice,
            code,
            message: message.into(),
        }
    }

    /// A WARNING notice with `code` and `message`.
    pub(crate) fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            code,
            message: message.into(),
        }
    }
}

/// SQLSTATE codes the server sends.
pub(crate) mod sqlstate {
    /// Plain warning.
    pub(crate) const WARNING: &str = "01000";
    /// feature_not_supported.
    pub(crate) const FEATURE_NOT_SUPPORTED: &str = "0A000";
    /// protocol_violation.
    pub(crate) const PROTOCOL_VIOLATION: &str = "08P01";
    /// invalid_parameter_value.
    pub(crate) const INVALID_PARAMETER_VALUE: &str = "22023";
    /// numeric_value_out_of_range.
    pub(crate) const NUMERIC_VALUE_OUT_OF_RANGE: &str = "22003";
    /// active_sql_transaction (BEGIN inside a block, a warning).
    pub(crate) const ACTIVE_SQL_TRANSACTION: &str = "25001";
    /// no_active_sql_transaction (COMMIT outside a block, a warning).
    pub(crate) const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
    /// in_failed_sql_transaction.
    pub(crate) const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
    /// invalid_authorization_specification (no user in the startup packet).
    pub(crate) const INVALID_AUTHORIZATION: &str = "28000";
    /// syntax_error.
    pub(crate) const SYNTAX_ERROR: &str = "42601";
    /// undefined_function.
    pub(crate) const UNDEFINED_FUNCTION: &str = "42883";
    /// undefined_object (unknown configuration parameter).
    pub(crate) const UNDEFINED_OBJECT: &str = "42704";
    /// admin_shutdown (pg_terminate_backend).
    pub(crate) const ADMIN_SHUTDOWN: &str = "57P01";
    /// idle_session_timeout.
    pub(crate) const IDLE_SESSION_TIMEOUT: &str = "57P05";
    /// idle_in_transaction_session_timeout.
    pub(crate) const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";
    /// lock_not_available (`lock_timeout` expired).
    /// `cant_change_runtime_param`: a server-start setting set in a session.
    pub(crate) const CANT_CHANGE_RUNTIME_PARAM: &str = "55P02";
    pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
    /// read_only_sql_transaction (a write on a hot standby).
    pub(crate) const READ_ONLY_SQL_TRANSACTION: &str = "25006";
    /// datatype_mismatch (`NOT` of a non-boolean).
    pub(crate) const DATATYPE_MISMATCH: &str = "42804";
    /// `cannot_coerce`: a cast between types that have none.
    pub(crate) const CANNOT_COERCE: &str = "42846";
    /// `invalid_text_representation`: a text that is not a value of the type.
    pub(crate) const INVALID_TEXT_REPRESENTATION: &str = "22P02";
    /// undefined_table.
    pub(crate) const UNDEFINED_TABLE: &str = "42P01";
    /// duplicate_table (also the notice of `CREATE TABLE IF NOT EXISTS`).
    pub(crate) const DUPLICATE_TABLE: &str = "42P07";
    /// `unique_violation`.
    pub(crate) const UNIQUE_VIOLATION: &str = "23505";
    /// duplicate_prepared_statement.
    pub(crate) const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
    /// invalid_sql_statement_name (no such prepared statement).
    pub(crate) const INVALID_SQL_STATEMENT_NAME: &str = "26000";
    /// invalid_cursor_name (no such portal).
    pub(crate) const INVALID_CURSOR_NAME: &str = "34000";
}

/// Result column types, by PostgreSQL type OID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PgType {
    Bool,
    Int4,
    Int8,
    Float8,
    Timestamptz,
    Text,
    Void,
}

impl PgType {
    fn oid(self) -> i32 {
        match self {
            Self::Bool => 16,
            Self::Int8 => 20,
            Self::Int4 => 23,
            Self::Float8 => 701,
            Self::Timestamptz => 1184,
            Self::Text => 25,
            Self::Void => 2278,
        }
    }

    fn size(self) -> i16 {
        match self {
            Self::Bool => 1,
            Self::Int4 | Self::Void => 4,
            Self::Int8 | Self::Float8 | Self::Timestamptz => 8,
            Self::Text => -1,
        }
    }
}

/// A byte buffer of backend messages, appended in the order the client must see them.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    buf: BytesMut,
    /// Whether an ErrorResponse was appended.
    failed: bool,
}

impl Reply {
    /// The encoded messages.
    pub(crate) fn into_bytes(self) -> BytesMut {
        self.buf
    }

    /// Whether the reply carries an ErrorResponse (the extended protocol then skips messages
    /// until Sync).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// `R` AuthenticationOk.
    pub(crate) fn authentication_ok(&mut self) {
        self.message(b'R', |b| b.put_i32(0));
    }

    /// `S` ParameterStatus.
    pub(crate) fn parameter_status(&mut self, name: &str, value: &str) {
        self.message(b'S', |b| {
            put_cstr(b, name);
            put_cstr(b, value);
        });
    }

    /// `K` BackendKeyData.
    pub(crate) fn backend_key_data(&mut self, pid: i32, secret: i32) {
        self.message(b'K', |b| {
            b.put_i32(pid);
            b.put_i32(secret);
        });
    }

    /// `Z` ReadyForQuery.
    pub(crate) fn ready_for_query(&mut self, status: TransactionStatus) {
        let byte = match status {
            TransactionStatus::Idle => b'I',
            TransactionStatus::InBlock => b'T',
            TransactionStatus::Failed => b'E',
        };
        self.message(b'Z', |b| b.put_u8(byte));
    }

    /// `T` RowDescription of text-format columns.
    pub(crate) fn row_description(&mut self, columns: &[(&str, PgType)]) {
        self.row_description_in(columns, &[]);
    }

    /// `T` RowDescription with the format codes a Bind asked for (see [`format_of`]).
    pub(crate) fn row_description_in(&mut self, columns: &[(&str, PgType)], formats: &[i16]) {
        self.message(b'T', |b| {
            b.put_i16(len_i16(columns.len()));
            for (index, (name, ty)) in columns.iter().enumerate() {
                put_cstr(b, name);
                b.put_i32(0); // table oid
                b.put_i16(0); // column attribute number
                b.put_i32(ty.oid());
                b.put_i16(ty.size());
                b.put_i32(-1); // type modifier
                b.put_i16(format_of(formats, index));
            }
        });
    }

    /// `D` DataRow of encoded values, text or binary (`None` is SQL NULL).
    pub(crate) fn data_row_bytes(&mut self, values: &[Option<&[u8]>]) {
        self.message(b'D', |b| {
            b.put_i16(len_i16(values.len()));
            for value in values {
                match value {
                    Some(bytes) => {
                        b.put_i32(len_i32(bytes.len()));
                        b.put_slice(bytes);
                    }
                    None => b.put_i32(-1),
                }
            }
        });
    }

    /// `1` ParseComplete.
    pub(crate) fn parse_complete(&mut self) {
        self.message(b'1', |_| {});
    }

    /// `2` BindComplete.
    pub(crate) fn bind_complete(&mut self) {
        self.message(b'2', |_| {});
    }

    /// `3` CloseComplete.
    pub(crate) fn close_complete(&mut self) {
        self.message(b'3', |_| {});
    }

    /// `n` NoData: the described statement or portal returns no rows.
    pub(crate) fn no_data(&mut self) {
        self.message(b'n', |_| {});
    }

    /// `t` ParameterDescription of a statement without parameters.
    pub(crate) fn no_parameters(&mut self) {
        self.message(b't', |b| b.put_i16(0));
    }

    /// `C` CommandComplete.
    pub(crate) fn command_complete(&mut self, tag: &str) {
        self.message(b'C', |b| put_cstr(b, tag));
    }

    /// `I` EmptyQueryResponse.
    pub(crate) fn empty_query_response(&mut self) {
        self.message(b'I', |_| {});
    }

    /// `E` ErrorResponse.
    pub(crate) fn error(&mut self, error: &SqlError) {
        self.failed = true;
        self.message(b'E', |b| put_fields(b, error));
    }

    /// `N` NoticeResponse.
    pub(crate) fn notice(&mut self, notice: &SqlError) {
        self.message(b'N', |b| put_fields(b, notice));
    }

    fn message(&mut self, tag: u8, body: impl FnOnce(&mut BytesMut)) {
        self.buf.put_u8(tag);
        let at = self.buf.len();
        self.buf.put_i32(0);
        body(&mut self.buf);
        let len = len_i32(self.buf.len() - at);
        self.buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
}

/// The format code of result column `index` under a Bind's `formats`: none means text, one
/// applies to every column, otherwise one per column.
pub(crate) fn format_of(formats: &[i16], index: usize) -> i16 {
    match formats {
        [] => 0,
        [one] => *one,
        many => many.get(index).copied().unwrap_or(0),
    }
}

/// A value in PostgreSQL's binary send format for `ty` (from its text form): `bool` one
/// byte, `int4` and `int8` big-endian, `text` its bytes, `void` nothing. `None` when the
/// text does not fit the type.
pub(crate) fn binary(ty: PgType, text: &str) -> Option<Vec<u8>> {
    match ty {
        PgType::Bool => Some(vec![u8::from(text == "t")]),
        PgType::Int4 => text.parse::<i32>().ok().map(|n| n.to_be_bytes().to_vec()),
        PgType::Int8 => text.parse::<i64>().ok().map(|n| n.to_be_bytes().to_vec()),
        PgType::Float8 => text.parse::<f64>().ok().map(|x| x.to_be_bytes().to_vec()),
        // Only the text form of a timestamp is modelled.
        PgType::Timestamptz | PgType::Text => Some(text.as_bytes().to_vec()),
        PgType::Void => Some(Vec::new()),
    }
}

fn put_fields(b: &mut BytesMut, fields: &SqlError) {
    for (kind, value) in [
        (b'S', fields.severity.as_str()),
        (b'V', fields.severity.as_str()),
        (b'C', fields.code),
        (b'M', fields.message.as_str()),
    ] {
        b.put_u8(kind);
        put_cstr(b, value);
    }
    b.put_u8(0);
}

fn put_cstr(b: &mut BytesMut, s: &str) {
    b.put_slice(s.as_bytes());
    b.put_u8(0);
}

fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

fn len_i16(len: usize) -> i16 {
    i16::try_from(len).unwrap_or(i16::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a parse failure is the assertion

    use fallible_iterator::FallibleIterator;
    use postgres_protocol::message::backend::Message;

    use super::*;

    fn parse_all(reply: Reply) -> Vec<Message> {
        let mut buf = reply.into_bytes();
        let mut out = Vec::new();
        while let Some(message) = Message::parse(&mut buf).unwrap() {
            out.push(message);
        }
        assert!(buf.is_empty(), "trailing bytes");
        out
    }

    #[test]
    fn startup_messages_parse() {
        let mut reply = Reply::default();
        reply.authentication_ok();
        reply.parameter_status("server_version", "16.0");
        reply.backend_key_data(1001, 42);
        reply.ready_for_query(TransactionStatus::Idle);
        let messages = parse_all(reply);
        assert!(matches!(messages[0], Message::AuthenticationOk));
        let Message::ParameterStatus(body) = &messages[1] else {
            panic!("not a ParameterStatus");
        };
        assert_eq!(
            (body.name().unwrap(), body.value().unwrap()),
            ("server_version", "16.0")
        );
        let Message::BackendKeyData(body) = &messages[2] else {
            panic!("not BackendKeyData");
        };
        assert_eq!((body.process_id(), body.secret_key()), (1001, 42));
        let Message::ReadyForQuery(body) = &messages[3] else {
            panic!("not ReadyForQuery");
        };
        assert_eq!(body.status(), b'I');
    }

    #[test]
    fn row_messages_parse() {
        let mut reply = Reply::default();
        reply.row_description(&[("case", PgType::Bool), ("x", PgType::Text)]);
        reply.data_row_bytes(&[Some(b"t"), None]);
        reply.command_complete("SELECT 1");
        reply.empty_query_response();
        let messages = parse_all(reply);
        let Message::RowDescription(body) = &messages[0] else {
            panic!("not RowDescription");
        };
        let fields: Vec<_> = body
            .fields()
            .map(|f| Ok((f.name().to_owned(), f.type_oid())))
            .collect()
            .unwrap();
        assert_eq!(fields, vec![("case".to_owned(), 16), ("x".to_owned(), 25)]);
        let Message::DataRow(body) = &messages[1] else {
            panic!("not DataRow");
        };
        let ranges: Vec<_> = body.ranges().collect().unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!(&body.buffer()[ranges[0].clone().unwrap()], b"t");
        assert!(ranges[1].is_none());
        let Message::CommandComplete(body) = &messages[2] else {
            panic!("not CommandComplete");
        };
        assert_eq!(body.tag().unwrap(), "SELECT 1");
        assert!(matches!(messages[3], Message::EmptyQueryResponse));
    }

    #[test]
    fn error_and_notice_fields_parse() {
        let mut reply = Reply::default();
        reply.error(&SqlError::fatal(sqlstate::IDLE_SESSION_TIMEOUT, "bye"));
        reply.notice(&SqlError::warning(sqlstate::WARNING, "careful"));
        let messages = parse_all(reply);
        let Message::ErrorResponse(body) = &messages[0] else {
            panic!("not ErrorResponse");
        };
        let fields: Vec<_> = body
            .fields()
            .map(|f| {
                Ok((
                    f.type_(),
                    String::from_utf8_lossy(f.value_bytes()).into_owned(),
                ))
            })
            .collect()
            .unwrap();
        assert_eq!(
            fields,
            vec![
                (b'S', "FATAL".to_owned()),
                (b'V', "FATAL".to_owned()),
                (b'C', "57P05".to_owned()),
                (b'M', "bye".to_owned()),
            ]
        );
        assert!(matches!(messages[1], Message::NoticeResponse(_)));
    }

    #[test]
    fn extended_protocol_messages_and_binary_rows_parse() {
        let mut reply = Reply::default();
        reply.parse_complete();
        reply.no_parameters();
        reply.row_description_in(&[("epoch", PgType::Int8)], &[1]);
        reply.bind_complete();
        let epoch = binary(PgType::Int8, "7").unwrap();
        reply.data_row_bytes(&[Some(&epoch)]);
        reply.no_data();
        reply.close_complete();
        assert!(!reply.failed());
        let messages = parse_all(reply);
        assert!(matches!(messages[0], Message::ParseComplete));
        let Message::ParameterDescription(body) = &messages[1] else {
            panic!("not ParameterDescription");
        };
        assert_eq!(body.parameters().count().unwrap(), 0);
        let Message::RowDescription(body) = &messages[2] else {
            panic!("not RowDescription");
        };
        let fields: Vec<_> = body
            .fields()
            .map(|f| Ok((f.type_oid(), f.format())))
            .collect()
            .unwrap();
        assert_eq!(fields, vec![(20, 1)]);
        assert!(matches!(messages[3], Message::BindComplete));
        let Message::DataRow(body) = &messages[4] else {
            panic!("not DataRow");
        };
        let ranges: Vec<_> = body.ranges().collect().unwrap();
        assert_eq!(
            &body.buffer()[ranges[0].clone().unwrap()],
            &7_i64.to_be_bytes()
        );
        assert!(matches!(messages[5], Message::NoData));
        assert!(matches!(messages[6], Message::CloseComplete));
    }

    #[test]
    fn binary_forms_and_format_codes() {
        assert_eq!(binary(PgType::Bool, "t"), Some(vec![1]));
        assert_eq!(
            binary(PgType::Int4, "-2"),
            Some((-2_i32).to_be_bytes().to_vec())
        );
        assert_eq!(binary(PgType::Int4, "x"), None);
        assert_eq!(binary(PgType::Void, ""), Some(vec![]));
        assert_eq!(format_of(&[], 3), 0);
        assert_eq!(format_of(&[1], 3), 1);
        assert_eq!(format_of(&[0, 1], 1), 1);
        let mut reply = Reply::default();
        reply.error(&SqlError::error(sqlstate::SYNTAX_ERROR, "no"));
        assert!(reply.failed());
    }
}
