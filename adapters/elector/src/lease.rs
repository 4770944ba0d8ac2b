//! The lease mechanism's setup ([`Config::lease`](crate::Config::lease)): the tables it needs.

#[cfg(feature = "deadpool")]
use crate::fencing::{FenceClient, FenceError};

pub use crate::sql::lease::DEFAULT_SCHEMA;

/// Creates the lease table and the fence table in the default schema, `public`, if they do
/// not exist: [`setup_in`] with [`DEFAULT_SCHEMA`].
///
/// ```no_run
/// # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use plexsphere_leader::{Config, Elector, lease};
///
/// lease::setup(&pool.get().await?).await?;
/// let elector = Elector::new(Config::new(pool).lease(Duration::ZERO))?;
/// # let _ = elector; Ok(()) }
/// ```
///
/// # Errors
/// As [`setup_in`].
#[cfg(feature = "deadpool")]
pub async fn setup(client: &impl FenceClient) -> Result<(), FenceError> {
    setup_in(client, DEFAULT_SCHEMA).await
}

/// Creates the lease table and the fence table in `schema` (which must exist), named with
/// it, if they do not exist (the statement of [`setup_statement`]). Idempotent and quiet (no
/// NOTICE when the tables exist), and safe to run from every replica at the same start: every
/// setup of this crate takes one transaction-level advisory lock first (feature `wire`:
/// `sql::lease::serialized_setup`). Run it before electing with a lease, from a migration or
/// at start-up, on any connection: a transaction-mode pooler carries it. Give the elector the
/// same schema ([`Config::lease_schema`](crate::Config::lease_schema)).
/// `client` is what you hold: a deadpool-postgres `Client` (`&pool.get().await?`) or
/// `Transaction`, or a tokio-postgres `Client` or `Transaction` ([`FenceClient`]).
///
/// An election whose tables are missing does not lead: each check fails with SQLSTATE 42P01,
/// logged once at ERROR with the advice to run this function (then at most a WARN a minute),
/// and [`Elector::check_failure`](crate::Elector::check_failure) reports it as permanent.
///
/// # Errors
/// [`FenceError::Setup`] naming `lease::setup`, with the server's error (for example a
/// missing `CREATE` privilege, or a schema that does not exist: 3F000).
#[cfg(feature = "deadpool")]
pub async fn setup_in(client: &impl FenceClient, schema: &str) -> Result<(), FenceError> {
    crate::fencing::run_setup(client, "lease::setup", &setup_statement(schema)).await
}

/// The statement [`setup_in`] runs for `schema`, for backends of their own (sqlx:
/// `sqlx::raw_sql`) and migrations.
pub fn setup_statement(schema: &str) -> String {
    crate::sql::lease::setup(schema)
}

/// Creates the tables of shard spaces held by leases
/// ([`ShardConfig::lease`](crate::sharded::ShardConfig::lease)) in `schema` (which must
/// exist), if they do not exist (the statement of [`setup_shards_statement`]):
/// the members' sequence and table, the owners' table and the fence table. Idempotent, quiet
/// and safe to run from every replica at the same start, on any connection, as [`setup_in`];
/// give the elector the same schema
/// ([`ShardConfig::lease_schema`](crate::sharded::ShardConfig::lease_schema)).
///
/// ```no_run
/// # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use plexsphere_leader::lease;
/// use plexsphere_leader::sharded::{ShardConfig, ShardedElector};
///
/// lease::setup_shards(&pool.get().await?, lease::DEFAULT_SCHEMA).await?;
/// let space = ShardedElector::new(ShardConfig::new(pool, 16_384).lease(Duration::ZERO))?;
/// # let _ = space; Ok(()) }
/// ```
///
/// # Errors
/// [`FenceError::Setup`] naming `lease::setup_shards`, with the server's error.
#[cfg(feature = "deadpool")]
pub async fn setup_shards(client: &impl FenceClient, schema: &str) -> Result<(), FenceError> {
    crate::fencing::run_setup(
        client,
        "lease::setup_shards",
        &setup_shards_statement(schema),
    )
    .await
}

/// The statement [`setup_shards`] runs for `schema`, for backends of their own (sqlx:
/// `sqlx::raw_sql`) and migrations.
pub fn setup_shards_statement(schema: &str) -> String {
    crate::shard_sql::lease::setup(schema)
}
