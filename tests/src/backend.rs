//! The two session backends of the elector, so that one real-server scenario runs on both:
//! deadpool-postgres over tokio-postgres (`Config::new`) and sqlx
//! (`plexsphere_leader_sqlx::config`).

use std::fmt;

use deadpool_postgres::Pool;
use plexsphere_leader::Config;
use plexsphere_leader::sharded::ShardConfig;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_postgres::config::Host;

use crate::error::HarnessError;
use crate::pg::pool_for;

/// Which driver the elector's lock sessions come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// deadpool-postgres over tokio-postgres, with `ObservedConnect` (the default backend).
    Deadpool,
    /// An sqlx `PgPool` (`plexsphere-leader-sqlx`).
    Sqlx,
}

impl Backend {
    /// Both backends.
    pub const ALL: [Self; 2] = [Self::Deadpool, Self::Sqlx];

    /// The command-line name: `deadpool` or `sqlx`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Deadpool => "deadpool",
            Self::Sqlx => "sqlx",
        }
    }

    /// The backend named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|backend| backend.name() == name)
    }

    /// A pool of this backend on `config` (its hosts, port, user, database and
    /// `application_name`), of at most `max_size` connections, connecting lazily.
    ///
    /// # Errors
    /// The pool cannot be built, or (sqlx) `config` names no single TCP host and port.
    pub fn pool(
        self,
        config: &tokio_postgres::Config,
        max_size: usize,
    ) -> Result<BackendPool, HarnessError> {
        match self {
            Self::Deadpool => Ok(BackendPool::Deadpool(pool_for(config.clone(), max_size)?)),
            Self::Sqlx => {
                let options = sqlx_options(config)?;
                let pool = PgPoolOptions::new()
                    .max_connections(u32::try_from(max_size).unwrap_or(u32::MAX))
                    .min_connections(0)
                    .connect_lazy_with(options);
                Ok(BackendPool::Sqlx(pool))
            }
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The sqlx connection options of a one-host tokio-postgres config.
fn sqlx_options(config: &tokio_postgres::Config) -> Result<PgConnectOptions, HarnessError> {
    let (Some(Host::Tcp(host)), Some(port)) =
        (config.get_hosts().first(), config.get_ports().first())
    else {
        return Err(HarnessError::Unsupported(
            "an sqlx pool needs a config with one TCP host and port".into(),
        ));
    };
    let mut options = PgConnectOptions::new_without_pgpass()
        .host(host)
        .port(*port);
    if let Some(user) = config.get_user() {
        options = options.username(user);
    }
    if let Some(password) = config.get_password() {
        options = options.password(&String::from_utf8_lossy(password));
    }
    if let Some(database) = config.get_dbname() {
        options = options.database(database);
    }
    if let Some(name) = config.get_application_name() {
        options = options.application_name(name);
    }
    Ok(options)
}

/// A pool of either backend.
#[derive(Clone, Debug)]
pub enum BackendPool {
    /// deadpool-postgres.
    Deadpool(Pool),
    /// sqlx.
    Sqlx(sqlx::PgPool),
}

impl BackendPool {
    /// A configuration with the spec's defaults on this pool.
    pub fn config(&self) -> Config {
        match self {
            Self::Deadpool(pool) => Config::new(pool.clone()),
            Self::Sqlx(pool) => plexsphere_leader_sqlx::config(pool.clone()),
        }
    }

    /// A sharded election's configuration of `shards` shards on this pool.
    pub fn shard_config(&self, shards: u32) -> ShardConfig {
        match self {
            Self::Deadpool(pool) => ShardConfig::new(pool.clone(), shards),
            Self::Sqlx(pool) => ShardConfig::with_sessions(
                plexsphere_leader_sqlx::PgPoolSessions::new(pool.clone()),
                shards,
            ),
        }
    }

    /// Runs the lease mechanism's setup with this backend's own helper
    /// (`plexsphere_leader::lease::setup` on a deadpool client, `plexsphere_leader_sqlx::lease::setup`
    /// on the sqlx pool).
    ///
    /// # Errors
    /// No connection, or the setup failed on the server.
    pub async fn lease_setup(&self) -> Result<(), plexsphere_leader::fencing::FenceError> {
        match self {
            Self::Deadpool(pool) => {
                let client = pool.get().await.map_err(|error| {
                    plexsphere_leader::fencing::FenceError::query(
                        plexsphere_leader::session::CheckError::Pool(error),
                    )
                })?;
                plexsphere_leader::lease::setup(&client).await
            }
            Self::Sqlx(pool) => plexsphere_leader_sqlx::lease::setup(pool).await,
        }
    }

    /// The connections the pool holds (idle or handed out).
    pub fn size(&self) -> usize {
        match self {
            Self::Deadpool(pool) => pool.status().size,
            Self::Sqlx(pool) => usize::try_from(pool.size()).unwrap_or(usize::MAX),
        }
    }

    /// The connections idle in the pool.
    pub fn idle(&self) -> usize {
        match self {
            Self::Deadpool(pool) => pool.status().available,
            Self::Sqlx(pool) => pool.num_idle(),
        }
    }

    /// Callers waiting for a connection (`None` for sqlx, which does not count them).
    pub fn waiting(&self) -> Option<usize> {
        match self {
            Self::Deadpool(pool) => Some(pool.status().waiting),
            Self::Sqlx(_) => None,
        }
    }

    /// Borrows a connection and runs `SELECT 1` on it: whether the pool still serves.
    ///
    /// # Errors
    /// The pool's or the statement's error, as text.
    pub async fn probe(&self) -> Result<(), String> {
        match self {
            Self::Deadpool(pool) => {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Self::Sqlx(pool) => {
                sqlx::Executor::execute(pool, "SELECT 1")
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Borrows a connection and keeps it until the returned value is dropped (to starve the
    /// pool).
    ///
    /// # Errors
    /// The pool's error, as text.
    pub async fn hold(&self) -> Result<Box<dyn std::any::Any + Send>, String> {
        match self {
            Self::Deadpool(pool) => Ok(Box::new(pool.get().await.map_err(|e| e.to_string())?)),
            Self::Sqlx(pool) => Ok(Box::new(pool.acquire().await.map_err(|e| e.to_string())?)),
        }
    }

    /// Closes the pool: its idle connections close, handed-out ones close when returned.
    pub async fn close(&self) {
        match self {
            Self::Deadpool(pool) => {
                pool.retain(|_, _| false);
                pool.close();
            }
            Self::Sqlx(pool) => pool.close().await,
        }
    }
}

impl From<Pool> for BackendPool {
    fn from(pool: Pool) -> Self {
        Self::Deadpool(pool)
    }
}
