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
    /// An extended-protocol message (`P`, `B`, `D`, `E`, `C`, `F`), by tag.
    Extended(u8),
    /// A COPY sub-protocol message (`d`, `c`, `f`), ignored outside COPY like PostgreSQL.
    Copy(u8),
    /// Any other tag.
    Unknown(u8),
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
        b'P' | b'B' | b'D' | b'E' | b'C' | b'F' => Frame::Extended(tag),
        b'd' | b'c' | b'f' => Frame::Copy(tag),
        other => Frame::Unknown(other),
    }))
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
        assert_eq!(parse_frame(&mut buf), Ok(Some(Frame::Extended(b'P'))));
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
}
