//! The lease mechanism's setup on an sqlx pool (`Config::lease`, for a transaction-mode
//! pooler): the tables it needs, made once per database.

use sqlx::{Acquire, Postgres};

pub use plexsphere_leader::fencing::FenceError;
pub use plexsphere_leader::lease::{DEFAULT_SCHEMA, setup_shards_statement, setup_statement};

/// Creates the lease table and the fence table in the default schema, `public`, if they do
/// not exist ([`setup_in`] with [`DEFAULT_SCHEMA`]).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use plexsphere_leader_sqlx::{Elector, lease};
///
/// lease::setup(&pool).await?;
/// let elector = Elector::new(plexsphere_leader_sqlx::config(pool).lease(Duration::ZERO))?;
/// # let _ = elector; Ok(()) }
/// ```
///
/// # Errors
/// As [`setup_in`].
pub async fn setup<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
) -> Result<(), FenceError> {
    setup_in(connection, DEFAULT_SCHEMA).await
}

/// Creates the lease table and the fence table in `schema` if they do not exist
/// ([`setup_statement`], through `sqlx::raw_sql`: one query string in the simple protocol, so
/// a transaction-mode pooler carries it). Idempotent and quiet, and safe to run from every
/// replica at the same start (every setup takes one transaction-level advisory lock first).
/// Run it before electing with a lease, from a migration or at start-up, and give the elector
/// the same schema (`Config::lease_schema`). Pass what you hold: `&pool`, `&mut connection`
/// or `&mut transaction`.
///
/// # Errors
/// [`FenceError::Setup`] naming `lease::setup`, with the server's error (for example a
/// missing `CREATE` privilege, or a schema that does not exist: 3F000).
pub async fn setup_in<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
    schema: &str,
) -> Result<(), FenceError> {
    crate::fencing::run_setup(connection, "lease::setup", &setup_statement(schema)).await
}

/// Creates the tables of shard spaces held by leases (`ShardConfig::lease`) in `schema`
/// (which must exist) if they do not exist ([`setup_shards_statement`]): the members'
/// sequence and table, the owners' table and the fence table. Idempotent, quiet and safe to
/// run from every replica at the same start, as [`setup_in`]; give the elector the same
/// schema (`ShardConfig::lease_schema`).
///
/// # Errors
/// [`FenceError::Setup`] naming `lease::setup_shards`, with the server's error.
pub async fn setup_shards<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
    schema: &str,
) -> Result<(), FenceError> {
    let statement = setup_shards_statement(schema);
    crate::fencing::run_setup(connection, "lease::setup_shards", &statement).await
}
