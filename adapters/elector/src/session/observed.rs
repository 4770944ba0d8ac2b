//! Sessions whose end is an event: a connector that owns each connection's task and signals
//! its end, found again by backend pid when the elector takes the lock session out of its pool.
//!
//! deadpool-postgres keeps a connection's task handle private, so a pool built with its default
//! connector cannot tell the elector when a session ends; the elector then looks at the
//! client's closed flag every few milliseconds. A pool built with [`ObservedConnect`] (or with a
//! custom connector that calls [`observe_connection`]) signals the end itself, and the leader's
//! driver wakes on it: no timer runs for it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use deadpool_postgres::Connect;
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, SimpleQueryMessage, Socket};
use tokio_util::sync::CancellationToken;

type Live = BTreeMap<i32, Vec<(u64, CancellationToken)>>;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Where observed connections register their end signals, by backend pid, and where the
/// elector finds the one of its lock session. Cloning gives another handle on the same
/// registry.
///
/// [`SessionEnds::global`] is the process-wide one that [`ObservedConnect::new`] and
/// [`Config::new`](crate::Config::new) use by default. Two live connections share a pid only
/// when they reach different servers; a lookup of such a pid finds no single connection and the
/// elector falls back to the closed-flag watch. Give a pool its own registry (on both sides:
/// [`ObservedConnect::with_ends`] and [`PoolSessions::session_ends`](super::PoolSessions::session_ends))
/// to keep its lookups apart from other pools', as the simulation does for each run.
#[derive(Clone, Default)]
pub struct SessionEnds {
    live: Arc<Mutex<Live>>,
}

impl SessionEnds {
    /// A new, empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide registry.
    pub fn global() -> Self {
        static GLOBAL: OnceLock<SessionEnds> = OnceLock::new();
        GLOBAL.get_or_init(Self::new).clone()
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The end signal of the live observed connection of backend `pid`, when exactly one is
    /// known.
    pub(crate) fn end_of(&self, pid: i32) -> Option<CancellationToken> {
        match self.live().get(&pid).map(Vec::as_slice) {
            Some([(_, ended)]) => Some(ended.clone()),
            _ => None,
        }
    }
}

impl std::fmt::Debug for SessionEnds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEnds")
            .field("live_pids", &self.live().len())
            .finish()
    }
}

struct Shared {
    id: u64,
    ended: CancellationToken,
    pid: OnceLock<i32>,
    ends: SessionEnds,
}

/// The end of one connection, from [`observe_connection`]: register it under its backend pid
/// once the connection runs.
pub struct ConnectionEnd {
    shared: Arc<Shared>,
}

impl ConnectionEnd {
    /// Asks `client` its backend pid (`SELECT pg_backend_pid()`, one round trip per new
    /// connection) and registers the connection's end under it. The connection's task must be
    /// running (spawned) for the query to be answered.
    ///
    /// # Errors
    /// The query's error, or an answer that is not one integer; the connection is then not
    /// registered (the elector falls back to the closed-flag watch for it).
    pub async fn register(self, client: &Client) -> Result<(), tokio_postgres::Error> {
        let messages = client.simple_query("SELECT pg_backend_pid()").await?;
        let pid = messages.iter().find_map(|message| match message {
            SimpleQueryMessage::Row(row) => row.get(0).and_then(|pid| pid.parse::<i32>().ok()),
            _ => None,
        });
        let Some(pid) = pid else { return Ok(()) };
        let _ = self.shared.pid.set(pid);
        let mut live = self.shared.ends.live();
        if !self.shared.ended.is_cancelled() {
            live.entry(pid)
                .or_default()
                .push((self.shared.id, self.shared.ended.clone()));
        }
        Ok(())
    }
}

/// Signals the end when dropped: the connection future returned, failed or was dropped.
struct EndGuard(Arc<Shared>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.ended.cancel();
        if let Some(pid) = self.0.pid.get() {
            let mut live = self.0.ends.live();
            if let Some(entries) = live.get_mut(pid) {
                entries.retain(|(id, _)| *id != self.0.id);
                if entries.is_empty() {
                    live.remove(pid);
                }
            }
        }
    }
}

/// Wraps a tokio-postgres connection future (the second half of `connect`) so that its end —
/// it returned, failed, or its task was aborted — is signalled to the elector through `ends`.
/// Spawn the returned future as the connection's task, then
/// [`register`](ConnectionEnd::register) the end with the client.
pub fn observe_connection<F>(
    ends: &SessionEnds,
    connection: F,
) -> (ConnectionEnd, impl Future<Output = F::Output> + use<F>)
where
    F: Future,
{
    let shared = Arc::new(Shared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        ended: CancellationToken::new(),
        pid: OnceLock::new(),
        ends: ends.clone(),
    });
    let guard = EndGuard(Arc::clone(&shared));
    let observed = async move {
        let _guard = guard;
        connection.await
    };
    (ConnectionEnd { shared }, observed)
}

/// A deadpool-postgres connector (`Manager::from_connect`) that makes connections like
/// deadpool's default one (`tokio_postgres::Config::connect` with `tls`, the connection task
/// spawned on the runtime) and signals each connection's end, so that the elector learns of a
/// closed lock session at once, without a timer.
///
/// ```no_run
/// use deadpool_postgres::{Manager, ManagerConfig, Pool};
/// use plexsphere_leader::session::ObservedConnect;
///
/// # fn pool() -> Result<Pool, Box<dyn std::error::Error>> {
/// let pg: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse()?;
/// let manager =
///     Manager::from_connect(pg, ObservedConnect::new(tokio_postgres::NoTls), ManagerConfig::default());
/// let pool = Pool::builder(manager).max_size(4).build()?;
/// # Ok(pool) }
/// ```
#[derive(Debug, Clone)]
pub struct ObservedConnect<T> {
    tls: T,
    ends: SessionEnds,
}

impl<T> ObservedConnect<T> {
    /// A connector that makes its connections with `tls` and registers their ends in
    /// [`SessionEnds::global`].
    pub fn new(tls: T) -> Self {
        Self::with_ends(tls, SessionEnds::global())
    }

    /// A connector that registers its connections' ends in `ends` (give the elector the same
    /// registry: [`PoolSessions::session_ends`](super::PoolSessions::session_ends)).
    pub fn with_ends(tls: T, ends: SessionEnds) -> Self {
        Self { tls, ends }
    }
}

impl<T> Connect for ObservedConnect<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let (tls, pg_config, ends) = (self.tls.clone(), pg_config.clone(), self.ends.clone());
        Box::pin(async move {
            let (client, connection) = pg_config.connect(tls).await?;
            let (end, connection) = observe_connection(&ends, connection);
            let task = tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(target: "plexsphere_leader", %error, "connection ended");
                }
            });
            end.register(&client).await?;
            Ok((client, task))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connections_end_is_signalled_and_forgotten_whichever_way_it_ends() {
        // Registered by hand (no server): the pid lookup finds the one live connection.
        let ends = SessionEnds::new();
        let (end, connection) = observe_connection(&ends, std::future::pending::<()>());
        let shared = Arc::clone(&end.shared);
        shared.pid.set(42).unwrap();
        ends.live()
            .entry(42)
            .or_default()
            .push((shared.id, shared.ended.clone()));
        let signal = ends.end_of(42).expect("one live connection");
        assert!(!signal.is_cancelled());
        assert!(
            SessionEnds::new().end_of(42).is_none(),
            "registries are apart"
        );
        // Its task is aborted (the pool dropped the client): signalled, and forgotten.
        let task = tokio::spawn(connection);
        task.abort();
        let _ = task.await;
        assert!(signal.is_cancelled());
        assert!(ends.end_of(42).is_none());
    }

    #[test]
    fn a_pid_shared_by_two_live_connections_finds_none() {
        let ends = SessionEnds::new();
        let tokens = [CancellationToken::new(), CancellationToken::new()];
        ends.live()
            .entry(43)
            .or_default()
            .extend([(1, tokens[0].clone()), (2, tokens[1].clone())]);
        assert!(ends.end_of(43).is_none());
    }
}
