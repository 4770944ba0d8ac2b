//! Connecting an unmodified `tokio_postgres` client to a simulated server.

use std::io;

use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Config, NoTls};
use turmoil::net::TcpStream;

/// The connection half `tokio_postgres` returns for a turmoil socket; poll it (spawn it
/// with `tokio::task::spawn_local`) for the client to make progress. It resolves with the
/// server's error when the server ends the session with FATAL.
pub type SimConnection = tokio_postgres::Connection<TcpStream, NoTlsStream>;

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP connect failed (the server host is down, crashed, or partitioned away).
    /// `tokio_postgres::Error` has no public constructor for this case.
    #[error("tcp connect to {host}:{port}: {source}")]
    Tcp {
        /// Host name the connect was made to.
        host: String,
        /// Port.
        port: u16,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The PostgreSQL startup failed.
    #[error("postgres startup: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// Opens a `turmoil::net::TcpStream` to `host:port` and runs the `tokio_postgres` startup
/// over it with `NoTls`, as `user` on database `db`. Must run inside a turmoil host.
pub async fn connect(
    host: &str,
    port: u16,
    user: &str,
    db: &str,
) -> Result<(Client, SimConnection), ConnectError> {
    let mut config = Config::new();
    config.user(user).dbname(db);
    connect_with(host, port, &config).await
}

/// As [`connect`], with a full client `config` (for example with an `application_name`);
/// its host and port settings are ignored.
pub async fn connect_with(
    host: &str,
    port: u16,
    config: &Config,
) -> Result<(Client, SimConnection), ConnectError> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|source| ConnectError::Tcp {
            host: host.to_owned(),
            port,
            source,
        })?;
    Ok(config.connect_raw(stream, NoTls).await?)
}
