//! [`TestDb`]: one fresh database per test.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use crate::{HARNESS_APP_PREFIX, HarnessError, base_config, connect, pool_for};

/// Longest a database name may be (PostgreSQL's `NAMEDATALEN - 1`).
const MAX_IDENT: usize = 63;
/// How long `Drop` waits for the fallback `DROP DATABASE`.
const DROP_TIMEOUT: Duration = Duration::from_secs(15);
/// Leaked `plx_` databases older than this are dropped when a new one is created.
const SWEEP_AGE: &str = "1 hour";
/// Makes names unique within one process; the pid makes them unique across processes.
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh database on the test server, named `plx_<test>_<pid>_<counter>`, dropped afterwards.
///
/// Advisory locks are per database, so tests that each use their own `TestDb` can all take the
/// leader lock at the same time. Prefer `cleanup().await` at the end of a test: it reports
/// errors. When a `TestDb` is dropped without it (a failed assertion, a panic), `Drop` runs the
/// same `DROP DATABASE … WITH (FORCE)` on a short-lived thread with its own runtime and waits for
/// it (at most 15 s), so it works inside or outside a runtime and never needs the test's runtime
/// to make progress. Databases leaked by killed runs (`plx_%`, older than one hour) are swept
/// when a new `TestDb` is created.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    maintenance: Config,
    config: Config,
    admin: Client,
    cleaned: bool,
}

/// One row of `pg_stat_activity` for this database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Backend process id.
    pub pid: i32,
    /// The session's `application_name`.
    pub application_name: String,
    /// `active`, `idle`, `idle in transaction`, … (`None` when not visible).
    pub state: Option<String>,
    /// Client address (`None` for Unix-socket clients).
    pub client_addr: Option<IpAddr>,
    /// Client TCP port (`-1` for Unix sockets, `None` when not visible).
    pub client_port: Option<i32>,
}

impl TestDb {
    /// Creates a database for `test_name` on the server of [`base_config`].
    pub async fn create(test_name: &str) -> Result<Self, HarnessError> {
        Self::create_on(base_config()?, test_name).await
    }

    /// Creates a database for `test_name` on the server of `maintenance`, whose database is used
    /// for `CREATE DATABASE` and `DROP DATABASE` (for example [`crate::Cluster::config`]).
    pub async fn create_on(maintenance: Config, test_name: &str) -> Result<Self, HarnessError> {
        let name = database_name(test_name, std::process::id(), next_counter());
        let maint = connect(&with_app(&maintenance, "plx-harness-maintenance")).await?;
        sweep_leaked(&maint).await;
        create_database(&maint, &name).await?;
        drop(maint);
        let mut config = maintenance.clone();
        config.dbname(&name);
        let admin = match connect(&with_app(&config, "plx-harness-admin")).await {
            Ok(admin) => admin,
            Err(e) => {
                if let Err(drop_err) = drop_database(&maintenance, &name).await {
                    tracing::warn!(db = %name, error = %drop_err, "drop after a failed connect");
                }
                return Err(e);
            }
        };
        Ok(Self {
            name,
            maintenance,
            config,
            admin,
            cleaned: false,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection config for this database (no `application_name` set).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// A connection config for this database with `application_name` set.
    pub fn config_with_app_name(&self, application_name: &str) -> Config {
        with_app(&self.config, application_name)
    }

    /// A pool for this database (`RecyclingMethod::Fast`, at most `max_size` connections).
    pub fn pool(&self, max_size: usize) -> Result<Pool, HarnessError> {
        pool_for(self.config(), max_size)
    }

    /// A pool whose sessions carry `application_name`, so that [`Self::sessions_of`] finds them.
    pub fn pool_with_app_name(
        &self,
        application_name: &str,
        max_size: usize,
    ) -> Result<Pool, HarnessError> {
        pool_for(self.config_with_app_name(application_name), max_size)
    }

    /// A pool of `backend` for this database, whose sessions carry `application_name`.
    pub fn backend_pool(
        &self,
        backend: crate::Backend,
        application_name: &str,
        max_size: usize,
    ) -> Result<crate::BackendPool, HarnessError> {
        backend.pool(&self.config_with_app_name(application_name), max_size)
    }

    /// The harness's own client on this database (`application_name` `plx-harness-admin`).
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// Opens a new client on this database with `application_name`.
    pub async fn connect(&self, application_name: &str) -> Result<Client, HarnessError> {
        connect(&self.config_with_app_name(application_name)).await
    }

    /// The sessions on this database whose `application_name` starts with `prefix`, oldest first
    /// (the admin session itself excluded).
    pub async fn sessions_of(&self, prefix: &str) -> Result<Vec<Session>, HarnessError> {
        let rows = self
            .admin
            .query(
                "SELECT pid, application_name, state, client_addr, client_port \
                 FROM pg_stat_activity \
                 WHERE datname = current_database() AND starts_with(application_name, $1) \
                   AND pid <> pg_backend_pid() \
                 ORDER BY backend_start, pid",
                &[&prefix],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Session {
                    pid: r.try_get(0)?,
                    application_name: r.try_get(1)?,
                    state: r.try_get(2)?,
                    client_addr: r.try_get(3)?,
                    client_port: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// The backend pids holding the default key's leader lock, granted rows of the spec's
    /// `pg_locks` query (`sql::leader_query`) only.
    ///
    /// # Errors
    /// The query failed.
    pub async fn lock_holders(&self) -> Result<Vec<i32>, HarnessError> {
        let query = plexsphere_leader::sql::leader_query(plexsphere_leader::LockKey::DEFAULT);
        let rows = self.admin.query(&query, &[]).await?;
        rows.iter()
            .filter_map(|row| match row.try_get::<_, bool>(1) {
                Ok(true) => Some(row.try_get(0).map_err(HarnessError::from)),
                Ok(false) => None,
                Err(error) => Some(Err(error.into())),
            })
            .collect()
    }

    /// How many sessions on this database have an `application_name` starting with `prefix`.
    pub async fn session_count(&self, prefix: &str) -> Result<usize, HarnessError> {
        Ok(self.sessions_of(prefix).await?.len())
    }

    /// How many client backends are connected to this database, not counting the harness's own
    /// sessions (those whose `application_name` starts with [`HARNESS_APP_PREFIX`]).
    pub async fn backend_count(&self) -> Result<usize, HarnessError> {
        let row = self
            .admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND backend_type = 'client backend' \
                   AND NOT starts_with(application_name, $1)",
                &[&HARNESS_APP_PREFIX],
            )
            .await?;
        let n: i64 = row.try_get(0)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Makes this database's session advisory locks vacuous, as some PostgreSQL-compatible
    /// servers ship them (CockroachDB's stubs; YugabyteDB 2.25.1's two-`int4` lock): its
    /// `pg_catalog` two-`int4` lock functions are replaced by SQL functions that grant every
    /// session (`allow_system_table_mods`, superuser). Only this database is changed, and its
    /// drop undoes it; schema-qualified calls reach the replacements too.
    pub async fn make_advisory_locks_vacuous(&self) -> Result<(), HarnessError> {
        self.admin
            .batch_execute(
                "SET allow_system_table_mods = on; \
                 CREATE OR REPLACE FUNCTION pg_catalog.pg_try_advisory_lock(int4, int4) \
                     RETURNS bool LANGUAGE sql AS 'SELECT true'; \
                 CREATE OR REPLACE FUNCTION pg_catalog.pg_advisory_lock(int4, int4) \
                     RETURNS void LANGUAGE sql AS ''; \
                 CREATE OR REPLACE FUNCTION pg_catalog.pg_advisory_unlock(int4, int4) \
                     RETURNS bool LANGUAGE sql AS 'SELECT true'; \
                 RESET allow_system_table_mods",
            )
            .await?;
        Ok(())
    }

    /// Terminates backend `pid` (`pg_terminate_backend`) and waits up to 5 s for it to exit.
    ///
    /// Returns `false` when no such backend exists or it did not exit in time. The client of
    /// that session sees an error (`57P01 admin_shutdown`) and then a closed connection.
    pub async fn terminate(&self, pid: i32) -> Result<bool, HarnessError> {
        let row = self
            .admin
            .query_one("SELECT pg_terminate_backend($1::int4, 5000::int8)", &[&pid])
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Drops the database (`DROP DATABASE … WITH (FORCE)`, which ends every session on it) and
    /// reports the error, if any. `Drop` does nothing afterwards.
    pub async fn cleanup(mut self) -> Result<(), HarnessError> {
        self.cleaned = true;
        drop_database(&self.maintenance, &self.name).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let maintenance = self.maintenance.clone();
        let name = self.name.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("plx-testdb-drop".to_owned())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| HarnessError::io("build the cleanup runtime", e))
                    .and_then(|rt| rt.block_on(drop_database(&maintenance, &name)));
                // The receiver may have given up waiting; nothing to do then.
                let _ = tx.send(result);
            });
        if let Err(e) = spawned {
            tracing::warn!(db = %self.name, error = %e, "could not spawn the cleanup thread");
            return;
        }
        match rx.recv_timeout(DROP_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(db = %self.name, error = %e, "drop test database"),
            Err(_) => tracing::warn!(db = %self.name, "drop test database timed out"),
        }
    }
}

fn next_counter() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// `plx_<sanitized test name>_<pid>_<counter>`, at most 63 bytes, only `[a-z0-9_]`.
fn database_name(test_name: &str, pid: u32, counter: u32) -> String {
    let suffix = format!("_{pid}_{counter}");
    let room = MAX_IDENT - "plx_".len() - suffix.len();
    let mut stem: String = test_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(room)
        .collect();
    if stem.is_empty() {
        stem.push_str("test");
    }
    format!("plx_{stem}{suffix}")
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn with_app(config: &Config, application_name: &str) -> Config {
    let mut c = config.clone();
    c.application_name(application_name);
    c
}

async fn create_database(maint: &Client, name: &str) -> Result<(), HarnessError> {
    let create = format!("CREATE DATABASE {}", quote_ident(name));
    match maint.batch_execute(&create).await {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => {
            // Same pid and counter as ours: left over by a dead process that had our pid.
            let drop_sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(name));
            maint.batch_execute(&drop_sql).await?;
            Ok(maint.batch_execute(&create).await?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Drops `plx_` databases older than [`SWEEP_AGE`]. Best effort: errors are logged at debug
/// (reading file times needs superuser or `pg_read_server_files`).
async fn sweep_leaked(maint: &Client) {
    let sql = format!(
        "SELECT datname FROM pg_database \
         WHERE datname LIKE 'plx\\_%' \
           AND (pg_stat_file('base/' || oid || '/PG_VERSION', true)).modification \
               < now() - interval '{SWEEP_AGE}'"
    );
    let rows = match maint.query(sql.as_str(), &[]).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!(error = %e, "sweep of leaked test databases skipped");
            return;
        }
    };
    for row in rows {
        let Ok(name) = row.try_get::<_, String>(0) else {
            continue;
        };
        let drop_sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(&name)
        );
        match maint.batch_execute(&drop_sql).await {
            Ok(()) => tracing::info!(db = %name, "dropped a leaked test database"),
            Err(e) => tracing::debug!(db = %name, error = %e, "drop of a leaked test database"),
        }
    }
}

/// `DROP DATABASE IF EXISTS … WITH (FORCE)`, retried a few times: a pool that reconnects while
/// the sessions are being terminated makes one attempt fail with `55006 object_in_use`.
async fn drop_database(maintenance: &Config, name: &str) -> Result<(), HarnessError> {
    let maint = connect(&with_app(maintenance, "plx-harness-maintenance")).await?;
    let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(name));
    let mut attempt = 0;
    loop {
        match maint.batch_execute(&sql).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 5 => {
                tracing::debug!(db = %name, error = %e, attempt, "drop test database, retrying");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized_lowercase_and_bounded() {
        let n = database_name("Observer::sees-Lock!", 4242, 7);
        assert_eq!(n, "plx_observer__sees_lock__4242_7");
        let long = database_name(&"x".repeat(200), u32::MAX, u32::MAX);
        assert_eq!(long.len(), MAX_IDENT);
        assert!(long.ends_with(&format!("_{}_{}", u32::MAX, u32::MAX)));
        assert_eq!(database_name("", 1, 2), "plx_test_1_2");
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
