//! [`FaultProxy`]: a TCP proxy for fault injection between a client and PostgreSQL.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::Config;

use crate::{HarnessError, retarget};

/// Bytes read from a socket at once.
const CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction before the reader waits for the writer (backpressure).
const QUEUE: usize = 64;

/// One direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Bytes the client sends to the server (queries, pings, unlocks).
    ClientToServer,
    /// Bytes the server sends to the client (results, errors).
    ServerToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Self::ClientToServer => 0,
            Self::ServerToClient => 1,
        }
    }
}

/// What the proxy does with the bytes of one direction.
///
/// A mode applies to existing connections and new ones, from the moment it is set. The proxy
/// always reads what arrives (so the sender's socket buffer drains); the mode decides, for each
/// chunk read, whether and when it is written on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Write each chunk on at once.
    #[default]
    Forward,
    /// Write each chunk on once it is this old. The delay in force is re-read while a chunk
    /// waits, so switching back to `Forward` releases the waiting chunks at once.
    Delay(Duration),
    /// Read and silently drop the bytes: both sockets stay open, no FIN, no RST. A chunk is
    /// dropped when the mode is `Blackhole` when it is read or when it is due to be written; the
    /// dropped bytes are gone for good. An end of stream read in this mode is held back and
    /// forwarded (as a FIN) only when the mode leaves `Blackhole`.
    Blackhole,
}

/// How to end the proxied connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// `SO_LINGER` 0 then close: both peers get a RST.
    Reset,
    /// `shutdown(Write)` then close: both peers get a FIN.
    Close,
}

struct ConnEntry {
    kill: oneshot::Sender<Kill>,
    task: JoinHandle<()>,
}

struct Shared {
    modes: [watch::Sender<Mode>; 2],
    dropped: [AtomicU64; 2],
    refuse: AtomicBool,
    accepted: AtomicU64,
    refused: AtomicU64,
    open: AtomicUsize,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, ConnEntry>>,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, ConnEntry>> {
        // A panic while holding this lock leaves the map consistent: recover it.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A TCP proxy on `127.0.0.1:<ephemeral>` in front of one upstream address.
///
/// Per [`Direction`] a [`Mode`] (forward, delay, blackhole) is settable at any time; the actions
/// [`Self::reset_all`] (RST) and [`Self::close_all`] (FIN) end the current connections; and
/// [`Self::set_refuse_new`] makes it accept and reset new connections at once, as an unreachable
/// server would. Dropping the proxy stops accepting and aborts every connection task (the
/// kernel then closes both sockets of each connection, normally with a FIN).
///
/// Runs on the tokio runtime it was started in.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("c2s", &self.mode(Direction::ClientToServer))
            .field("s2c", &self.mode(Direction::ServerToClient))
            .field("open", &self.open_count())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream`, forwarding in both directions.
    pub async fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| HarnessError::io("bind the proxy listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| HarnessError::io("proxy listener address", e))?;
        let shared = Arc::new(Shared {
            modes: [
                watch::Sender::new(Mode::Forward),
                watch::Sender::new(Mode::Forward),
            ],
            dropped: [AtomicU64::new(0), AtomicU64::new(0)],
            refuse: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let accept_task = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        Ok(Self {
            addr,
            upstream,
            shared,
            accept_task,
        })
    }

    /// Starts a proxy in front of the first TCP host and port of `config`.
    pub async fn in_front_of(config: &Config) -> Result<Self, HarnessError> {
        Self::start(upstream_of(config).await?).await
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// `base` (user, database, application name, …) pointed at the proxy.
    pub fn pg_config(&self, base: &Config) -> Config {
        retarget(base, &self.addr.ip().to_string(), self.addr.port())
    }

    /// Sets the mode of one direction, for existing and new connections.
    pub fn set_mode(&self, direction: Direction, mode: Mode) {
        self.shared.modes[direction.index()].send_replace(mode);
    }

    /// Sets the mode of both directions.
    pub fn set_both(&self, mode: Mode) {
        self.set_mode(Direction::ClientToServer, mode);
        self.set_mode(Direction::ServerToClient, mode);
    }

    /// The mode of one direction.
    pub fn mode(&self, direction: Direction) -> Mode {
        *self.shared.modes[direction.index()].borrow()
    }

    /// While `true`, new connections are accepted and reset at once (RST, nothing forwarded),
    /// as from a server that is down. Existing connections are not touched.
    pub fn set_refuse_new(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Resets every current connection: `SO_LINGER` 0 and close on both sockets, so the client
    /// and the server each get a RST. Returns how many connections it ended, once they have.
    pub async fn reset_all(&self) -> usize {
        self.kill_all(Kill::Reset).await
    }

    /// Closes every current connection gracefully: both the client and the server get a FIN.
    /// Returns how many connections it ended, once they have.
    pub async fn close_all(&self) -> usize {
        self.kill_all(Kill::Close).await
    }

    /// Connections accepted and forwarded so far (refused ones not included).
    pub fn accepted_count(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections refused (reset at once) so far under [`Self::set_refuse_new`].
    pub fn refused_count(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    pub fn open_count(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Bytes dropped so far in one direction under [`Mode::Blackhole`].
    pub fn dropped_bytes(&self, direction: Direction) -> u64 {
        self.shared.dropped[direction.index()].load(Ordering::SeqCst)
    }

    /// Waits until [`Self::open_count`] equals `n`. The count changes a little after the client
    /// sees its connect or close complete, so tests wait for it rather than read it once.
    pub async fn wait_open_count(&self, n: usize, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        while self.open_count() != n {
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: format!("{n} open proxy connections (have {})", self.open_count()),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    async fn kill_all(&self, kill: Kill) -> usize {
        let entries: Vec<ConnEntry> = self.shared.conns().drain().map(|(_, e)| e).collect();
        let n = entries.len();
        let mut tasks = Vec::with_capacity(n);
        for entry in entries {
            // The task may have just ended on its own; then there is nothing to kill.
            let _ = entry.kill.send(kill);
            tasks.push(entry.task);
        }
        for task in tasks {
            if let Err(e) = task.await {
                tracing::debug!(error = %e, "proxy connection task ended abnormally");
            }
        }
        n
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        // Release the lock before aborting: an aborted task's guard takes it.
        let entries: Vec<ConnEntry> = self.shared.conns().drain().map(|(_, e)| e).collect();
        for entry in entries {
            entry.task.abort();
        }
    }
}

/// Resolves the first TCP host and port of `config`.
async fn upstream_of(config: &Config) -> Result<SocketAddr, HarnessError> {
    use tokio_postgres::config::Host;
    let host = config
        .get_hosts()
        .iter()
        .find_map(|h| match h {
            Host::Tcp(name) => Some(name.clone()),
            _ => None,
        })
        .ok_or_else(|| HarnessError::Invalid {
            what: "proxy upstream",
            detail: "the config has no TCP host".to_owned(),
        })?;
    let port = config.get_ports().first().copied().unwrap_or(5432);
    tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| HarnessError::io(format!("resolve {host}:{port}"), e))?
        .next()
        .ok_or_else(|| HarnessError::Invalid {
            what: "proxy upstream",
            detail: format!("{host}:{port} resolves to no address"),
        })
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(e) => {
                tracing::debug!(error = %e, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.refuse.load(Ordering::SeqCst) {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            reset(&socket);
            continue;
        }
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        shared.open.fetch_add(1, Ordering::SeqCst);
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (kill, kill_rx) = oneshot::channel();
        // Hold the lock across spawn and insert, so that a task that ends at once removes its
        // entry only after it was inserted.
        let mut conns = shared.conns();
        let task = tokio::spawn(run_connection(
            id,
            socket,
            upstream,
            Arc::clone(&shared),
            kill_rx,
        ));
        conns.insert(id, ConnEntry { kill, task });
    }
}

/// Removes the connection's entry and decrements the open count when its task ends or is
/// aborted.
struct ConnGuard {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shared.conns().remove(&self.id);
        self.shared.open.fetch_sub(1, Ordering::SeqCst);
    }
}

fn reset(socket: &TcpStream) {
    if let Err(e) = socket.set_zero_linger() {
        tracing::debug!(error = %e, "set SO_LINGER 0");
    }
}

/// How the pumps of one connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PumpEnd {
    /// End of stream read and forwarded as a FIN.
    Eof,
    /// A read or write failed: the other side gets a RST.
    Failed,
}

async fn run_connection(
    id: u64,
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    kill_rx: oneshot::Receiver<Kill>,
) {
    let _guard = ConnGuard {
        id,
        shared: Arc::clone(&shared),
    };
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(e) => {
            tracing::debug!(error = %e, %upstream, "proxy could not reach the upstream");
            reset(&client);
            return;
        }
    };
    // Nagle would add latency to small protocol messages; the sockets are local anyway.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let how = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let c2s = pump(
            client_read,
            server_write,
            &shared,
            Direction::ClientToServer,
        );
        let s2c = pump(
            server_read,
            client_write,
            &shared,
            Direction::ServerToClient,
        );
        tokio::select! {
            kill = kill_rx => kill.unwrap_or(Kill::Close),
            end = both(c2s, s2c) => match end {
                PumpEnd::Eof => Kill::Close,
                PumpEnd::Failed => Kill::Reset,
            },
        }
    };
    match how {
        Kill::Reset => {
            reset(&client);
            reset(&server);
        }
        Kill::Close => {
            let _ = client.shutdown().await;
            let _ = server.shutdown().await;
        }
    }
}

/// Runs both directions; ends at the first failure or when both reached end of stream.
async fn both(c2s: impl Future<Output = PumpEnd>, s2c: impl Future<Output = PumpEnd>) -> PumpEnd {
    tokio::pin!(c2s, s2c);
    let (mut c2s_done, mut s2c_done) = (false, false);
    while !(c2s_done && s2c_done) {
        let end = tokio::select! {
            end = &mut c2s, if !c2s_done => { c2s_done = true; end }
            end = &mut s2c, if !s2c_done => { s2c_done = true; end }
        };
        if end == PumpEnd::Failed {
            return PumpEnd::Failed;
        }
    }
    PumpEnd::Eof
}

/// A unit of work for the writer half of a pump.
enum Item {
    Bytes { read_at: Instant, data: Vec<u8> },
    Eof { read_at: Instant },
}

/// Moves bytes of one direction from `reader` to `writer` under the direction's mode.
async fn pump<R, W>(reader: R, writer: W, shared: &Shared, direction: Direction) -> PumpEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let modes = &shared.modes[direction.index()];
    let dropped = &shared.dropped[direction.index()];
    let (tx, rx) = mpsc::channel(QUEUE);
    let read_side = read_half(reader, modes.subscribe(), dropped, tx);
    let write_side = write_half(writer, modes.subscribe(), dropped, rx);
    match tokio::try_join!(read_side, write_side) {
        Ok(((), ())) => PumpEnd::Eof,
        Err(()) => PumpEnd::Failed,
    }
}

async fn read_half<R: AsyncRead + Unpin>(
    mut reader: R,
    mode: watch::Receiver<Mode>,
    dropped: &AtomicU64,
    tx: mpsc::Sender<Item>,
) -> Result<(), ()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "proxy read failed");
                return Err(());
            }
        };
        let read_at = Instant::now();
        if n == 0 {
            // The writer ended only on a write error, which it reports itself.
            let _ = tx.send(Item::Eof { read_at }).await;
            return Ok(());
        }
        if *mode.borrow() == Mode::Blackhole {
            dropped.fetch_add(n as u64, Ordering::SeqCst);
            continue;
        }
        let data = buf[..n].to_vec();
        if tx.send(Item::Bytes { read_at, data }).await.is_err() {
            return Ok(());
        }
    }
}

async fn write_half<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut mode: watch::Receiver<Mode>,
    dropped: &AtomicU64,
    mut rx: mpsc::Receiver<Item>,
) -> Result<(), ()> {
    while let Some(item) = rx.recv().await {
        match item {
            Item::Bytes { read_at, data } => {
                if !due(read_at, &mut mode).await {
                    dropped.fetch_add(data.len() as u64, Ordering::SeqCst);
                    continue;
                }
                if let Err(e) = writer.write_all(&data).await {
                    tracing::debug!(error = %e, "proxy write failed");
                    return Err(());
                }
            }
            Item::Eof { read_at } => {
                // Hold the FIN back while blackholed: the peer must not learn anything.
                while !due(read_at, &mut mode).await {
                    if mode.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                let _ = writer.shutdown().await;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Waits until a chunk read at `read_at` is due under the current mode. Returns `false` when
/// the mode is `Blackhole` (drop the chunk), `true` when it is to be written now.
async fn due(read_at: Instant, mode: &mut watch::Receiver<Mode>) -> bool {
    loop {
        let current = *mode.borrow_and_update();
        let deadline = match current {
            Mode::Blackhole => return false,
            Mode::Forward => return true,
            Mode::Delay(d) => read_at + d,
        };
        if Instant::now() >= deadline {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return true,
            changed = mode.changed() => if changed.is_err() { return true },
        }
    }
}
