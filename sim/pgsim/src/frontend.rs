//! Frontend (client-to-server) messages of protocol v3: framing and parsing.
//!
//! `postgres-protocol` only encodes frontend messages; the unit tests below feed this
//! parser with its encoders. Parsers take a buffer and consume one message from its
//! front, or return `Ok(None)` and consume nothing while the message is incomplete.

use bytes::{Buf, BytesMut};

/// Protocol version 3.0 as sent in the startup packet.
const PROTOCOL_3_0: i32 = 196_608;
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;
/// PostgreSQL's limit on a startup packet.
const MAX_STARTUP_LEN: usize = 10_000;
/// PostgreSQL's limit on a regular message (`PQ_LARGE_MESSAGE_LIMIT`).
const MAX_MESSAGE_LEN: usize = 1 << 30;

/// A malformed frontend message; the session answers FATAL 08P01 and ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolError {
    /// A length field below its minimum or above PostgreSQL's limit.
    #[error("invalid message length {0}")]
    BadLength(i64),
    /// A string field without its terminating NUL, or not UTF-8.
    #[error("invalid string in message")]
    BadString,
    /// A message body shorter than its fields.
    #[error("insufficient data left in message")]
    Truncated,
}

/// The first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartupPacket {
    /// SSLRequest: answer `N` and read the next startup packet.
    SslRequest,
    /// GSSENCRequest: answer `N` and read the next startup packet.
    GssEncRequest,
    /// CancelRequest: a separate connection asking to cancel a query.
    Cancel,
    /// StartupMessage with its protocol version and parameters, in order.
    Startup {
        version: i32,
        params: Vec<(String, String)>,
    },
}

impl StartupPacket {
    /// Whether this is a protocol 3.0 startup message.
    pub(crate) fn is_v3(version: i32) -> bool {
        version == PROTOCOL_3_0
    }
}

/// A regular message after startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `Q` simple Query.
    Query(String),
    /// `X` Terminate.
    Terminate,
    /// `S` Sync.
    Sync,
    /// `H` Flush.
    Flush,
    /// `P` Parse: a statement to prepare, with the types of its parameters.
    Parse {
        name: String,
        query: String,
        param_types: usize,
    },
    /// `B` Bind: a portal of a prepared statement, with how many parameter values it
    /// supplies and the format codes of the result columns.
    Bind {
        portal: String,
        statement: String,
        params: usize,
        result_formats: Vec<i16>,
    },
    /// `D` Describe of a prepared statement (`S`) or a portal (`P`).
    Describe { target: Target, name: String },
    /// `E` Execute of a portal (the row limit is not modelled: every row is sent).
    Execute { portal: String },
    /// `C` Close of a prepared statement (`S`) or a portal (`P`).
    Close { target: Target, name: String },
    /// Another extended-protocol message (`F` FunctionCall), by tag.
    Extended(u8),
    /// A COPY sub-protocol message (`d`, `c`, `f`), ignored outside COPY like PostgreSQL.
    Copy(u8),
    /// Any other tag.
    Unknown(u8),
}

/// What a Describe or Close names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// `S`: a prepared statement.
    Statement,
    /// `P`: a portal.
    Portal,
}

/// Consumes one startup packet from the front of `buf`.
pub(crate) fn parse_startup(buf: &mut BytesMut) -> Result<Option<StartupPacket>, ProtocolError> {
    let Some(len) = peek_i32(buf, 0) else {
        return Ok(None);
    };
    let len_usize = usize::try_from(len).map_err(|_| ProtocolError::BadLength(len.into()))?;
    if !(8..=MAX_STARTUP_LEN).contains(&len_usize) {
        return Err(ProtocolError::BadLength(len.into()));
    }
    if buf.len() < len_usize {
        return Ok(None);
    }
    let mut body = buf.split_to(len_usize);
    body.advance(4);
    let code = body.get_i32();
    Ok(Some(match code {
        SSL_REQUEST => StartupPacket::SslRequest,
        GSSENC_REQUEST => StartupPacket::GssEncRequest,
        CANCEL_REQUEST => StartupPacket::Cancel,
        version => StartupPacket::Startup {
            version,
            params: parse_params(&body)?,
        },
    }))
}

/// Consumes one regular message from the front of `buf`.
pub(crate) fn parse_frame(buf: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
    let Some(len) = peek_i32(buf, 1) else {
        return Ok(None);
    };
    let len_usize = usize::try_from(len).map_err(|_| ProtocolError::BadLength(len.into()))?;
    if !(4..=MAX_MESSAGE_LEN).contains(&len_usize) {
        return Err(ProtocolError::BadLength(len.into()));
    }
    if buf.len() < 1 + len_usize {
        return Ok(None);
    }
    let tag = buf.get_u8();
    let mut body = buf.split_to(len_usize);
    body.advance(4);
    Ok(Some(match tag {
        b'Q' => Frame::Query(read_cstr(&body)?.0),
        b'X' => Frame::Terminate,
        b'S' => Frame::Sync,
        b'H' => Frame::Flush,
        b'P' => parse_parse(&body)?,
        b'B' => parse_bind(&body)?,
        b'D' => {
            let (target, name) = parse_target(&body)?;
            Frame::Describe { target, name }
        }
        b'E' => Frame::Execute {
            portal: read_cstr(&body)?.0,
        },
        b'C' => {
            let (target, name) = parse_target(&body)?;
            Frame::Close { target, name }
        }
        b'F' => Frame::Extended(tag),
        b'd' | b'c' | b'f' => Frame::Copy(tag),
        other => Frame::Unknown(other),
    }))
}

/// `P`: name, query, then an `int16` count of parameter type OIDs and the OIDs.
fn parse_parse(body: &[u8]) -> Result<Frame, ProtocolError> {
    let (name, rest) = read_cstr(body)?;
    let (query, mut rest) = read_cstr(rest)?;
    let count = take_count(&mut rest)?;
    take(&mut rest, count * 4)?;
    Ok(Frame::Parse {
        name,
        query,
        param_types: count,
    })
}

/// `B`: portal, statement, parameter format codes, parameter values (each an `int32`
/// length, -1 for NULL, and that many bytes), result format codes.
fn parse_bind(body: &[u8]) -> Result<Frame, ProtocolError> {
    let (portal, rest) = read_cstr(body)?;
    let (statement, mut rest) = read_cstr(rest)?;
    let formats = take_count(&mut rest)?;
    take(&mut rest, formats * 2)?;
    let params = take_count(&mut rest)?;
    for _ in 0..params {
        let len = i32::from_be_bytes(take_array(&mut rest)?);
        if let Ok(len) = usize::try_from(len) {
            take(&mut rest, len)?;
        }
    }
    let results = take_count(&mut rest)?;
    let mut result_formats = Vec::with_capacity(results);
    for _ in 0..results {
        result_formats.push(i16::from_be_bytes(take_array(&mut rest)?));
    }
    Ok(Frame::Bind {
        portal,
        statement,
        params,
        result_formats,
    })
}

/// `D` and `C`: a target byte (`S` or `P`) and a name.
fn parse_target(body: &[u8]) -> Result<(Target, String), ProtocolError> {
    let (&kind, rest) = body.split_first().ok_or(ProtocolError::Truncated)?;
    let target = match kind {
        b'S' => Target::Statement,
        b'P' => Target::Portal,
        _ => return Err(ProtocolError::Truncated),
    };
    Ok((target, read_cstr(rest)?.0))
}

/// Takes `n` bytes off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], ProtocolError> {
    if rest.len() < n {
        return Err(ProtocolError::Truncated);
    }
    let (taken, left) = rest.split_at(n);
    *rest = left;
    Ok(taken)
}

fn take_array<const N: usize>(rest: &mut &[u8]) -> Result<[u8; N], ProtocolError> {
    let bytes = take(rest, N)?;
    bytes.try_into().map_err(|_| ProtocolError::Truncated)
}

/// An `int16` count, never negative.
fn take_count(rest: &mut &[u8]) -> Result<usize, ProtocolError> {
    let count = i16::from_be_bytes(take_array(rest)?);
    usize::try_from(count).map_err(|_| ProtocolError::BadLength(count.into()))
}

fn peek_i32(buf: &[u8], at: usize) -> Option<i32> {
    let bytes = buf.get(at..at + 4)?;
    Some(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Reads a NUL-terminated UTF-8 string; returns it and the bytes after the NUL.
fn read_cstr(bytes: &[u8]) -> Result<(String, &[u8]), ProtocolError> {
    let nul = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or(ProtocolError::BadString)?;
    let text = std::str::from_utf8(&bytes[..nul]).map_err(|_| ProtocolError::BadString)?;
    Ok((text.to_owned(), &bytes[nul + 1..]))
}

/// Startup parameters: `name\0value\0` pairs ended by a lone `\0`.
fn parse_params(mut bytes: &[u8]) -> Result<Vec<(String, String)>, ProtocolError> {
    let mut params = Vec::new();
    loop {
        match bytes {
            [0] => return Ok(params),
            [] => return Err(ProtocolError::BadString),
            _ => {}
        }
        let (name, rest) = read_cstr(bytes)?;
        let (value, rest) = read_cstr(rest)?;
        params.push((name, value));
        bytes = rest;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed encode is the assertion

    use postgres_protocol::message::frontend;

    use super::*;

    #[test]
    fn startup_message_round_trips() {
        let mut buf = BytesMut::new();
        frontend::startup_message([("user", "app"), ("database", "plexsphere")], &mut buf).unwrap();
        let whole = buf.clone();
        let mut partial = BytesMut::from(&whole[..whole.len() - 1]);
        assert_eq!(parse_startup(&mut partial), Ok(None));
        assert_eq!(partial.len(), whole.len() - 1, "nothing consumed");
        let packet = parse_startup(&mut buf).unwrap().unwrap();
        assert_eq!(
            packet,
            StartupPacket::Startup {
                version: PROTOCOL_3_0,
                params: vec![
                    ("user".to_owned(), "app".to_owned()),
                    ("database".to_owned(), "plexsphere".to_owned()),
                ],
            }
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn ssl_and_cancel_requests_are_recognised() {
        let mut buf = BytesMut::new();
        frontend::ssl_request(&mut buf);
        frontend::cancel_request(1001, 7, &mut buf);
        assert_eq!(parse_startup(&mut buf), Ok(Some(StartupPacket::SslRequest)));
        assert_eq!(parse_startup(&mut buf), Ok(Some(StartupPacket::Cancel)));
    }

    #[test]
    fn short_startup_length_is_rejected() {
        let mut buf = BytesMut::from(&[0, 0, 0, 4, 0, 0, 0, 0][..]);
        assert_eq!(parse_startup(&mut buf), Err(ProtocolError::BadLength(4)));
    }

    #[test]
    fn query_terminate_and_extended_frames_parse_in_order() {
        let mut buf = BytesMut::new();
        frontend::query("SELECT 1", &mut buf).unwrap();
        frontend::parse("", "SELECT 1", [], &mut buf).unwrap();
        frontend::sync(&mut buf);
        frontend::flush(&mut buf);
        frontend::terminate(&mut buf);
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Query("SELECT 1".to_owned())))
        );
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Parse {
                name: String::new(),
                query: "SELECT 1".to_owned(),
                param_types: 0
            }))
        );
        assert_eq!(parse_frame(&mut buf), Ok(Some(Frame::Sync)));
        assert_eq!(parse_frame(&mut buf), Ok(Some(Frame::Flush)));
        assert_eq!(parse_frame(&mut buf), Ok(Some(Frame::Terminate)));
        assert_eq!(parse_frame(&mut buf), Ok(None));
    }

    #[test]
    fn incomplete_frame_consumes_nothing() {
        let mut full = BytesMut::new();
        frontend::query("SELECT 1", &mut full).unwrap();
        let mut buf = BytesMut::from(&full[..6]);
        assert_eq!(parse_frame(&mut buf), Ok(None));
        assert_eq!(buf.len(), 6);
    }

    #[test]
    fn negative_frame_length_is_rejected() {
        let mut buf = BytesMut::from(&[b'Q', 0xff, 0xff, 0xff, 0xff][..]);
        assert_eq!(parse_frame(&mut buf), Err(ProtocolError::BadLength(-1)));
    }

    #[test]
    fn what_tokio_postgres_sends_for_a_query_parses_field_by_field() {
        let mut buf = BytesMut::new();
        frontend::parse("s0", "SELECT $1", [20], &mut buf).unwrap();
        frontend::describe(b'S', "s0", &mut buf).unwrap();
        frontend::bind(
            "",
            "s0",
            [1],
            [Some(7_i64)],
            |value, buf| {
                buf.extend_from_slice(&value.unwrap().to_be_bytes());
                Ok(postgres_protocol::IsNull::No)
            },
            Some(1),
            &mut buf,
        )
        .map_err(|_| "bind")
        .unwrap();
        frontend::execute("", 0, &mut buf).unwrap();
        frontend::close(b'P', "", &mut buf).unwrap();
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Parse {
                name: "s0".to_owned(),
                query: "SELECT $1".to_owned(),
                param_types: 1
            }))
        );
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Describe {
                target: Target::Statement,
                name: "s0".to_owned()
            }))
        );
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Bind {
                portal: String::new(),
                statement: "s0".to_owned(),
                params: 1,
                result_formats: vec![1]
            }))
        );
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Execute {
                portal: String::new()
            }))
        );
        assert_eq!(
            parse_frame(&mut buf),
            Ok(Some(Frame::Close {
                target: Target::Portal,
                name: String::new()
            }))
        );
    }

    #[test]
    fn a_truncated_bind_is_a_protocol_error() {
        let mut buf = BytesMut::from(&[b'B', 0, 0, 0, 8, 0, 0, 0, 5][..]);
        assert_eq!(parse_frame(&mut buf), Err(ProtocolError::Truncated));
    }
}
