//! Fencing tokens with sqlx: the same check as
//! [`plexsphere_leader::fencing`], on whatever sqlx connection the
//! caller holds (`&mut transaction`, `&mut *connection`, a `&mut PgConnection`).
//!
//! ```no_run
//! # async fn pass(
//! #     pool: &sqlx::PgPool,
//! #     elector: &plexsphere_leader_sqlx::Elector,
//! #     term: &plexsphere_leader_sqlx::Term,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use plexsphere_leader_sqlx::fencing;
//!
//! let Some(epoch) = term.epoch() else { return Ok(()) }; // fencing is off
//! let mut transaction = pool.begin().await?;
//! // Row-locks the fence of the elector's key until the transaction ends:
//! fencing::check(&mut transaction, elector.key(), epoch).await?;
//! sqlx::query("UPDATE jobs SET done = true WHERE id = 1")
//!     .execute(&mut *transaction)
//!     .await?;
//! transaction.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The contract is plexsphere-leader's: no fenced write commits after a newer term began (a
//! pass that outlives its own term still commits until a newer leader advances the epoch).

use plexsphere_leader::LockKey;
use sqlx::{Acquire, Postgres};

pub use plexsphere_leader::fencing::{FenceError, verdict};

/// Creates the fence table if it does not exist (`plexsphere_leader::fencing::FENCE_SETUP`).
/// Idempotent, and safe to run from every replica at the same start: every setup takes one
/// transaction-level advisory lock first, as plexsphere-leader's do. Run it before enabling
/// fencing, from a migration or at start-up. Pass what you hold: `&pool`, `&mut connection`
/// or `&mut transaction`.
///
/// # Errors
/// [`FenceError::Setup`] naming `fencing::setup`, with the server's error (for example a
/// missing `CREATE` privilege).
pub async fn setup<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
) -> Result<(), FenceError> {
    let statement = plexsphere_leader::fencing::setup_statement();
    run_setup(connection, "fencing::setup", &statement).await
}

/// Runs the (serialized) setup `statement` on `connection` (`sqlx::raw_sql`: one query string
/// in the simple protocol, one implicit transaction); a failure names `setup`. What every
/// setup of this crate shares.
pub(crate) async fn run_setup<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
    setup: &'static str,
    statement: &str,
) -> Result<(), FenceError> {
    let failed = |error| FenceError::setup(setup, crate::check_error(error));
    let mut connection = connection.acquire().await.map_err(failed)?;
    sqlx::raw_sql(statement)
        .execute(&mut *connection)
        .await
        .map_err(failed)?;
    Ok(())
}

/// Checks, inside the caller's transaction, that `epoch` is still the current one of the
/// election `key` (`Elector::key`), and holds the fence row (`FOR SHARE`) until the transaction
/// ends, so no newer term can begin before the caller commits or rolls back. Pass the
/// transaction of the fenced writes (`&mut transaction`), never a pool or a connection outside
/// a transaction (the row lock would end with the statement). Bound the transaction's idle time
/// as with the default backend (`plexsphere_leader::fencing::check`). Cancel-safe: dropping the
/// future abandons the statement (roll the transaction back).
///
/// # Errors
/// [`FenceError::Stale`] when a newer term began (do not write; roll back),
/// [`FenceError::NoEpoch`] when no term of the election was fenced yet (fencing off),
/// [`FenceError::MissingTable`] when [`setup`] never ran in this database,
/// [`FenceError::Query`] for another server error.
pub async fn check<'c>(
    transaction: impl Acquire<'c, Database = Postgres>,
    key: LockKey,
    epoch: u64,
) -> Result<(), FenceError> {
    let statement = plexsphere_leader::fencing::check_statement(key);
    fence_epoch_is(transaction, &statement, epoch).await
}

/// [`check`] of the fence table in `schema`, named with it (a lease's:
/// `Elector::lease_schema`), whatever the writer's `search_path`
/// (`plexsphere_leader::fencing::check_in`).
///
/// # Errors
/// As [`check`].
pub async fn check_in<'c>(
    transaction: impl Acquire<'c, Database = Postgres>,
    schema: &str,
    key: LockKey,
    epoch: u64,
) -> Result<(), FenceError> {
    let statement = plexsphere_leader::fencing::check_statement_in(schema, key);
    fence_epoch_is(transaction, &statement, epoch).await
}

/// Runs the fence check `statement` in `transaction`: `epoch` is the current one.
async fn fence_epoch_is<'c>(
    transaction: impl Acquire<'c, Database = Postgres>,
    statement: &str,
    epoch: u64,
) -> Result<(), FenceError> {
    let mut connection = transaction.acquire().await.map_err(query_error)?;
    let current: Option<i64> = sqlx::query_scalar(statement)
        .fetch_optional(&mut *connection)
        .await
        .map_err(query_error)?;
    verdict(current, epoch)
}

fn query_error(error: sqlx::Error) -> FenceError {
    FenceError::query(crate::check_error(error))
}
