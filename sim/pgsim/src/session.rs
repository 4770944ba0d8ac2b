//! One client connection: startup, then simple queries until the session ends.
//!
//! The idle timeouts follow PostgreSQL's `PostgresMain`: when ReadyForQuery is sent, the
//! timer of `idle_session_timeout` is armed outside a transaction block, and that of
//! `idle_in_transaction_session_timeout` inside an open or failed one (when non-zero); it is
//! disarmed as soon as a complete message has been read, so neither fires while a statement
//! runs or waits for a lock.
//!
//! A statement blocked in `pg_advisory_lock`, or an epoch advance blocked by another
//! session's `FOR SHARE` row lock, waits here, in simulated time, for the lock to be handed
//! over (the row to be free), for `lock_timeout`, or for a terminate request. As in PostgreSQL with
//! `client_connection_check_interval = 0` (the default), the socket is not watched during
//! the wait: a waiter whose client went away stays queued, is granted the lock in its turn,
//! and releases it when the session then ends on the closed socket. A wait granted in the
//! tick its `lock_timeout` is due fails with 55P03 all the same and keeps the advisory lock
//! (PostgreSQL's grant-at-timeout race, see `State::finish_wait`).

use std::io;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use turmoil::net::TcpStream;

use super::exec::{self, Blocked, Run};
use super::extended::{self, Execution};
use super::frontend::{self, Frame, StartupPacket};
use super::log::EndReason;
use super::reply::TransactionStatus;
use super::reply::{Reply, SqlError, sqlstate};
use super::state::{IdleKind, Shared, Startup, State};

/// Serves one accepted connection until the session ends. Dropping the future (server
/// crash) ends the session with [`EndReason::Crash`] and sends nothing.
pub(crate) async fn run(stream: TcpStream, shared: Shared) {
    let mut conn = Conn {
        stream,
        buf: BytesMut::new(),
    };
    let timeout = shared.borrow().config.startup_timeout;
    let Ok(Ok(Some(startup))) = tokio::time::timeout(timeout, read_startup(&mut conn)).await else {
        return;
    };
    let pid = {
        let mut state = shared.borrow_mut();
        let at = state.clock();
        state.open_session(startup, at)
    };
    let guard = SessionGuard {
        shared: shared.clone(),
        pid,
        finished: false,
    };
    let reason = match greet(&mut conn, &shared, pid).await {
        Ok(()) => serve(&mut conn, &shared, pid).await,
        Err(_) => EndReason::ConnectionError,
    };
    guard.finish(reason);
}

/// Ends the session in the shared state when the session future completes or is dropped.
struct SessionGuard {
    shared: Shared,
    pid: i32,
    finished: bool,
}

impl SessionGuard {
    fn finish(mut self, reason: EndReason) {
        self.finished = true;
        let mut state = self.shared.borrow_mut();
        let at = state.clock();
        state.end_session(self.pid, reason, at);
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Dropped mid-session: the server host's software is going away. No host clock
        // can be read here; stamp with the last time the server saw.
        if let Ok(mut state) = self.shared.try_borrow_mut() {
            let at = state.last_time;
            state.end_session(self.pid, EndReason::Crash, at);
        }
    }
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    /// Reads more bytes into the buffer; 0 means EOF. Cancel-safe.
    async fn read_more(&mut self) -> io::Result<usize> {
        self.buf.reserve(4096);
        self.stream.read_buf(&mut self.buf).await
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Sends a FATAL error; the session ends right after, so a failed write is moot.
    async fn fatal(&mut self, code: &'static str, message: impl Into<String>) {
        let mut reply = Reply::default();
        reply.error(&SqlError::fatal(code, message));
        let _ignored = self.send(&reply.into_bytes()).await;
    }
}

/// Reads the startup packet, answering SSL and GSS encryption requests with `N`.
/// `Ok(None)` when the connection ends without a session (cancel request, EOF, or a
/// startup error, which is answered with FATAL).
async fn read_startup(conn: &mut Conn) -> io::Result<Option<Startup>> {
    loop {
        match frontend::parse_startup(&mut conn.buf) {
            Err(error) => {
                conn.fatal(sqlstate::PROTOCOL_VIOLATION, error.to_string())
                    .await;
                return Ok(None);
            }
            Ok(None) => {
                if conn.read_more().await? == 0 {
                    return Ok(None);
                }
            }
            Ok(Some(StartupPacket::SslRequest | StartupPacket::GssEncRequest)) => {
                conn.send(b"N").await?;
            }
            Ok(Some(StartupPacket::Cancel)) => return Ok(None),
            Ok(Some(StartupPacket::Startup { version, params })) => {
                return match startup_params(version, params) {
                    Ok(startup) => Ok(Some(startup)),
                    Err(error) => {
                        conn.fatal(error.code, error.message).await;
                        Ok(None)
                    }
                };
            }
        }
    }
}

fn startup_params(version: i32, params: Vec<(String, String)>) -> Result<Startup, SqlError> {
    if !StartupPacket::is_v3(version) {
        return Err(SqlError::fatal(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!(
                "unsupported frontend protocol {}.{}: server supports 3.0 to 3.0",
                version >> 16,
                version & 0xffff
            ),
        ));
    }
    let get = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let user = get("user").filter(|u| !u.is_empty()).ok_or_else(|| {
        SqlError::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            "no PostgreSQL user name specified in startup packet",
        )
    })?;
    Ok(Startup {
        database: get("database")
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| user.clone()),
        application_name: get("application_name").unwrap_or_default(),
        user,
    })
}

/// Sends AuthenticationOk (trust), ParameterStatus, BackendKeyData and ReadyForQuery.
async fn greet(conn: &mut Conn, shared: &Shared, pid: i32) -> io::Result<()> {
    let mut reply = Reply::default();
    {
        let state = shared.borrow();
        let Some(session) = state.sessions.get(&pid) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        reply.authentication_ok();
        for (name, value) in [
            ("application_name", session.gucs.application_name.as_str()),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("integer_datetimes", "on"),
            ("IntervalStyle", "postgres"),
            ("is_superuser", "off"),
            ("server_encoding", "UTF8"),
            ("server_version", state.config.server_version.as_str()),
            ("session_authorization", session.user.as_str()),
            ("standard_conforming_strings", "on"),
            ("TimeZone", "UTC"),
        ] {
            reply.parameter_status(name, value);
        }
        reply.backend_key_data(pid, session.secret);
        reply.ready_for_query(TransactionStatus::Idle);
    }
    conn.send(&reply.into_bytes()).await
}

/// What interrupted a wait for the next message.
enum Wake {
    Data,
    Eof,
    ReadFailed,
    Signalled,
    IdleTimeout(IdleKind),
}

/// What to do after a message was handled.
enum Next {
    /// Read the next message; `ready` when ReadyForQuery was sent (arms the idle timer).
    Continue {
        ready: bool,
    },
    End(EndReason),
}

/// The message loop; returns why the session ended.
async fn serve(conn: &mut Conn, shared: &Shared, pid: i32) -> EndReason {
    let wake = match shared.borrow().sessions.get(&pid) {
        Some(session) => Rc::clone(&session.wake),
        None => return EndReason::Crash,
    };
    let mut ignore_till_sync = false;
    let mut deadline = idle_deadline(shared, pid);
    loop {
        if shared.borrow_mut().take_terminate(pid) {
            return terminate(conn).await;
        }
        let frame = match frontend::parse_frame(&mut conn.buf) {
            Err(error) => {
                conn.fatal(sqlstate::PROTOCOL_VIOLATION, error.to_string())
                    .await;
                return EndReason::ProtocolViolation;
            }
            Ok(Some(frame)) => frame,
            Ok(None) => match wait(conn, &wake, deadline).await {
                Wake::Data | Wake::Signalled => continue,
                Wake::Eof => return EndReason::ClientClosed,
                Wake::ReadFailed => return EndReason::ConnectionError,
                Wake::IdleTimeout(IdleKind::Session) => {
                    conn.fatal(
                        sqlstate::IDLE_SESSION_TIMEOUT,
                        "terminating connection due to idle-session timeout",
                    )
                    .await;
                    return EndReason::IdleSessionTimeout;
                }
                Wake::IdleTimeout(IdleKind::InTransaction) => {
                    conn.fatal(
                        sqlstate::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                        "terminating connection due to idle-in-transaction timeout",
                    )
                    .await;
                    return EndReason::IdleInTransactionSessionTimeout;
                }
            },
        };
        deadline = None;
        match handle(conn, shared, pid, &wake, frame, &mut ignore_till_sync).await {
            Next::Continue { ready: true } => deadline = idle_deadline(shared, pid),
            Next::Continue { ready: false } => {}
            Next::End(reason) => return reason,
        }
    }
}

fn idle_deadline(shared: &Shared, pid: i32) -> Option<(Instant, IdleKind)> {
    let (timeout, kind) = shared.borrow().idle_timeout(pid)?;
    Some((Instant::now() + timeout, kind))
}

async fn wait(conn: &mut Conn, wake: &Notify, deadline: Option<(Instant, IdleKind)>) -> Wake {
    let idle = async {
        match deadline {
            Some((deadline, kind)) => {
                sleep_until(deadline).await;
                kind
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        () = wake.notified() => Wake::Signalled,
        read = conn.read_more() => match read {
            Ok(0) => Wake::Eof,
            Ok(_) => Wake::Data,
            Err(_) => Wake::ReadFailed,
        },
        kind = idle => Wake::IdleTimeout(kind),
    }
}

async fn terminate(conn: &mut Conn) -> EndReason {
    conn.fatal(
        sqlstate::ADMIN_SHUTDOWN,
        "terminating connection due to administrator command",
    )
    .await;
    EndReason::Terminated
}

async fn handle(
    conn: &mut Conn,
    shared: &Shared,
    pid: i32,
    wake: &Notify,
    frame: Frame,
    ignore_till_sync: &mut bool,
) -> Next {
    let (reply, ready) = match frame {
        Frame::Terminate => return Next::End(EndReason::ClientTerminate),
        Frame::Unknown(tag) => {
            conn.fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!("invalid frontend message type {tag}"),
            )
            .await;
            return Next::End(EndReason::ProtocolViolation);
        }
        Frame::Sync => {
            *ignore_till_sync = false;
            let mut reply = Reply::default();
            reply.ready_for_query(transaction(shared, pid));
            (reply, true)
        }
        _ if *ignore_till_sync => return Next::Continue { ready: false },
        Frame::Flush | Frame::Copy(_) => return Next::Continue { ready: false },
        Frame::Query(query) => {
            let run = |state: &mut State, at| exec::run_query(state, pid, &query, at);
            match statement(conn, shared, pid, wake, run).await {
                Ok(reply) => (reply, true),
                Err(reason) => return Next::End(reason),
            }
        }
        Frame::Execute { portal } => {
            let execution = extended::execution(&mut shared.borrow_mut(), pid, &portal);
            let reply = match execution {
                Execution::Reply(reply) => reply,
                Execution::Statement(statement, formats) => {
                    let run =
                        |state: &mut State, at| exec::execute(state, pid, statement, formats, at);
                    match self::statement(conn, shared, pid, wake, run).await {
                        Ok(reply) => reply,
                        Err(reason) => return Next::End(reason),
                    }
                }
            };
            *ignore_till_sync = reply.failed();
            (reply, false)
        }
        other => {
            let reply = extended_message(&mut shared.borrow_mut(), pid, other);
            *ignore_till_sync = reply.failed();
            (reply, false)
        }
    };
    match conn.send(&reply.into_bytes()).await {
        Ok(()) => Next::Continue { ready },
        Err(_) => Next::End(EndReason::ConnectionError),
    }
}

/// The reply to an extended-protocol message other than Execute and Sync.
fn extended_message(state: &mut State, pid: i32, frame: Frame) -> Reply {
    match frame {
        Frame::Parse { name, query, .. } => extended::parse(state, pid, &name, &query),
        Frame::Bind {
            portal,
            statement,
            params,
            result_formats,
        } => extended::bind(state, pid, &portal, &statement, params, result_formats),
        Frame::Describe { target, name } => extended::describe(state, pid, target, &name),
        Frame::Close { target, name } => extended::close(state, pid, target, &name),
        Frame::Extended(tag) => extended::reject(state, pid, tag),
        _ => Reply::default(),
    }
}

/// Runs a simple Query or an Execute (`run`) as a statement of the statement log: waits out
/// the query latency, runs it, waits while it is queued for a lock; the reply, or why the
/// session ended.
async fn statement(
    conn: &mut Conn,
    shared: &Shared,
    pid: i32,
    wake: &Notify,
    run: impl FnOnce(&mut State, Duration) -> Option<Run>,
) -> Result<Reply, EndReason> {
    let index = {
        let mut state = shared.borrow_mut();
        let at = state.clock();
        state.query_received(pid, at)
    };
    if let Latency::Terminated = latency(shared, wake, pid).await {
        return Err(terminate(conn).await);
    }
    let ran = {
        let mut state = shared.borrow_mut();
        let at = state.clock();
        run(&mut state, at)
    };
    let reply = match ran {
        Some(Run::Done(reply)) => reply,
        Some(Run::Blocked(blocked)) => wait_for_lock(conn, shared, pid, wake, blocked).await?,
        None => return Err(EndReason::Crash),
    };
    let mut state = shared.borrow_mut();
    let at = state.clock();
    state.query_answered(index, at);
    Ok(reply)
}

/// Waits while the query's statement is queued for a lock, then resumes it; the reply, or
/// why the session ended (a terminate request during the wait).
async fn wait_for_lock(
    conn: &mut Conn,
    shared: &Shared,
    pid: i32,
    wake: &Notify,
    mut blocked: Box<Blocked>,
) -> Result<Reply, EndReason> {
    let mut deadline = lock_deadline(shared, pid);
    loop {
        let timed_out = tokio::select! {
            biased;
            () = wake.notified() => false,
            () = sleep_until_some(deadline) => true,
        };
        if timed_out && !shared.borrow().wait_granted(pid) {
            // Sessions woken in this same instant go first: a release among them hands the
            // lock over in the instant the timeout fires, which PostgreSQL answers with 55P03
            // all the same (see `State::finish_wait`).
            tokio::task::yield_now().await;
        }
        let run = {
            let mut state = shared.borrow_mut();
            if state.take_terminate(pid) {
                state.end_wait(pid);
                None
            } else if timed_out || state.wait_granted(pid) {
                // A grant woke it in the tick its lock_timeout is due: the timeout still wins.
                let expired = timed_out || deadline.is_some_and(|due| Instant::now() >= due);
                let at = state.clock();
                let end = state.finish_wait(pid, expired, at);
                Some(exec::resume(&mut state, pid, blocked, end, at))
            } else {
                continue;
            }
        };
        match run {
            None => return Err(terminate(conn).await),
            Some(Some(Run::Done(reply))) => return Ok(reply),
            Some(Some(Run::Blocked(next))) => {
                blocked = next;
                deadline = lock_deadline(shared, pid);
            }
            Some(None) => return Err(EndReason::Crash),
        }
    }
}

/// When a lock wait starting now times out: `lock_timeout` from now, none when it is 0.
fn lock_deadline(shared: &Shared, pid: i32) -> Option<Instant> {
    let timeout = shared.borrow().sessions.get(&pid)?.gucs.lock_timeout;
    (!timeout.is_zero()).then(|| Instant::now() + timeout)
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn transaction(shared: &Shared, pid: i32) -> TransactionStatus {
    shared
        .borrow()
        .sessions
        .get(&pid)
        .map_or(TransactionStatus::Idle, |s| s.transaction)
}

enum Latency {
    Elapsed,
    Terminated,
}

/// Waits out the configured query latency, unless a terminate request comes first.
async fn latency(shared: &Shared, wake: &Notify, pid: i32) -> Latency {
    let delay: Duration = shared.borrow().config.query_latency;
    if delay.is_zero() {
        return Latency::Elapsed;
    }
    let deadline = Instant::now() + delay;
    loop {
        tokio::select! {
            biased;
            () = wake.notified() => {
                if shared.borrow_mut().take_terminate(pid) {
                    return Latency::Terminated;
                }
            }
            () = sleep_until(deadline) => return Latency::Elapsed,
        }
    }
}
