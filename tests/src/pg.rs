//! Small helpers around `tokio_postgres::Config`, connections and pools.

use std::str::FromStr;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use plexsphere_leader::session::ObservedConnect;
use tokio_postgres::{Client, Config, NoTls};

use crate::{DEFAULT_DSN, DSN_ENV, HarnessError};

/// The base configuration: `PLEXSPHERE_TEST_DSN`, or [`DEFAULT_DSN`] when it is unset or empty.
///
/// Its database is the maintenance database that [`crate::TestDb`] connects to for
/// `CREATE DATABASE` and `DROP DATABASE`.
pub fn base_config() -> Result<Config, HarnessError> {
    let dsn = std::env::var(DSN_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_DSN.to_owned());
    Config::from_str(&dsn).map_err(|e| HarnessError::Invalid {
        what: "PLEXSPHERE_TEST_DSN",
        detail: e.to_string(),
    })
}

/// Returns a copy of `base` that connects to `host:port` instead of `base`'s hosts.
///
/// `tokio_postgres::Config` can add hosts but not remove them, so this copies the session
/// settings (user, password, database, options, application name, timeouts, keepalives, TLS
/// mode, target session attributes, channel binding) into a new config.
pub fn retarget(base: &Config, host: &str, port: u16) -> Config {
    let mut c = Config::new();
    c.host(host).port(port);
    if let Some(user) = base.get_user() {
        c.user(user);
    }
    if let Some(password) = base.get_password() {
        c.password(password);
    }
    if let Some(dbname) = base.get_dbname() {
        c.dbname(dbname);
    }
    if let Some(options) = base.get_options() {
        c.options(options);
    }
    if let Some(app) = base.get_application_name() {
        c.application_name(app);
    }
    if let Some(t) = base.get_connect_timeout() {
        c.connect_timeout(*t);
    }
    if let Some(t) = base.get_tcp_user_timeout() {
        c.tcp_user_timeout(*t);
    }
    c.keepalives(base.get_keepalives())
        .keepalives_idle(base.get_keepalives_idle());
    if let Some(i) = base.get_keepalives_interval() {
        c.keepalives_interval(i);
    }
    if let Some(r) = base.get_keepalives_retries() {
        c.keepalives_retries(r);
    }
    c.ssl_mode(base.get_ssl_mode())
        .target_session_attrs(base.get_target_session_attrs())
        .channel_binding(base.get_channel_binding());
    c
}

/// Connects without TLS and drives the connection on a spawned task.
///
/// The task ends when the connection closes (dropping the client closes it). Must be called
/// inside a tokio runtime.
pub async fn connect(config: &Config) -> Result<Client, HarnessError> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "harness connection ended with an error");
        }
    });
    Ok(client)
}

/// Builds a `deadpool_postgres::Pool` for `config` with `RecyclingMethod::Fast` and at most
/// `max_size` connections, whose connections signal their end to the elector
/// ([`ObservedConnect`]), as the README recommends. The pool opens connections lazily.
pub fn pool_for(config: Config, max_size: usize) -> Result<Pool, HarnessError> {
    let manager = Manager::from_connect(
        config,
        ObservedConnect::new(NoTls),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .build()?)
}

/// Every row `statement` returns over the simple query protocol, each column as text (`None`
/// for `NULL`): the rows a pooled `LockSession::query` hands the statement parsers, for tests
/// that replay a statement of `plexsphere_leader::sql` or `shard_sql` on a client of their own.
///
/// # Errors
/// The server's error.
pub async fn simple_rows(
    client: &Client,
    statement: &str,
) -> Result<Vec<plexsphere_leader::session::Row>, tokio_postgres::Error> {
    let messages = client.simple_query(statement).await?;
    Ok(messages
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}
