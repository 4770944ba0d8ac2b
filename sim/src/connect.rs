//! Hands the real adapter turmoil connections: a `deadpool_postgres` pool whose
//! [`Connect`](deadpool_postgres::Connect) opens a `turmoil::net::TcpStream` to the current
//! primary and runs `tokio_postgres::Config::connect_raw` over it. Nothing in the adapter knows
//! it runs in a simulation.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, Error, NoTls};
use turmoil::net::TcpStream;

use plexsphere_leader::session::{SessionEnds, observe_connection};
use plexsphere_leader_pgsim::Primary;

/// The connections of one replica's pool: a TCP connect to whichever host [`Primary`] names at
/// the moment, then the PostgreSQL startup. Each connection's end is signalled to the elector
/// through the run's own [`SessionEnds`] (`observe_connection`, as services get it from
/// `ObservedConnect`): one registry per world, since seeds that run in parallel threads hand out
/// the same simulated pids. The connection future runs in a task of the host's
/// `LocalSet` (`spawn_local`; connect only from a turmoil host's software, which runs in
/// one), aborted when the pool drops the client. Not `tokio::spawn`: the runtime shards its
/// task list by a process-wide task id, so when turmoil drops a crashed host's runtime it
/// would drop such tasks, and so close their sockets (their FINs), in an order that differs
/// from one run of a seed to the next; the `LocalSet` keeps one list, in spawn order.
#[derive(Debug, Clone)]
pub struct TurmoilConnect {
    primary: Primary,
    port: u16,
    ends: SessionEnds,
}

impl TurmoilConnect {
    /// Connects to `port` of the host `primary` names, signalling connection ends to `ends`.
    pub fn new(primary: Primary, port: u16, ends: SessionEnds) -> Self {
        Self {
            primary,
            port,
            ends,
        }
    }

    /// A pool of at most `max_size` connections made by this connector, recycled the `Fast`
    /// way (a closed client is discarded, nothing is sent), as services configure it.
    ///
    /// # Errors
    /// The pool cannot be built (never with these settings: no timeouts need a runtime).
    pub fn pool(
        self,
        config: Config,
        max_size: usize,
    ) -> Result<Pool, deadpool_postgres::BuildError> {
        let manager = Manager::from_connect(
            config,
            self,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager).max_size(max_size).build()
    }
}

impl deadpool_postgres::Connect for TurmoilConnect {
    fn connect(
        &self,
        pg_config: &Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), Error>> {
        let host = self.primary.host();
        let port = self.port;
        let config = pg_config.clone();
        let ends = self.ends.clone();
        Box::pin(async move {
            let stream = match TcpStream::connect((host.as_str(), port)).await {
                Ok(stream) => stream,
                Err(error) => return Err(tcp_error(&config, error).await),
            };
            let (client, connection) = config.connect_raw(stream, NoTls).await?;
            let (end, connection) = observe_connection(&ends, connection);
            let task = tokio::task::spawn_local(async move {
                // The outcome reaches the client as a closed connection; nothing to add here.
                let _ended = connection.await;
            });
            end.register(&client).await?;
            Ok((client, task))
        })
    }
}

/// `tokio_postgres::Error` has no public constructor for a failed TCP connect: run the startup
/// over a stream that fails with `error`, which yields the error tokio-postgres itself reports
/// for an I/O failure ("error communicating with the server: ...").
async fn tcp_error(config: &Config, error: io::Error) -> Error {
    match config.connect_raw(FailedStream(Some(error)), NoTls).await {
        Err(error) => error,
        Ok(_) => unreachable!("a startup over a stream that only fails cannot succeed"),
    }
}

/// A stream whose first read or write fails with the stored error.
struct FailedStream(Option<io::Error>);

impl FailedStream {
    fn fail(&mut self) -> io::Error {
        self.0
            .take()
            .unwrap_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl AsyncRead for FailedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.get_mut().fail()))
    }
}

impl AsyncWrite for FailedStream {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(self.get_mut().fail()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.get_mut().fail()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
