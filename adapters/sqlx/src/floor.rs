//! The version floor's setup on an sqlx pool (`Config::version_floor` with the advisory lock):
//! the table `plexsphere_leader_floor`, made in each database before ranked replicas elect.
//! The lease mechanism's setup ([`lease::setup`](crate::lease::setup)) makes its own floor
//! table in the lease's schema.

use sqlx::{Acquire, Postgres};

pub use plexsphere_leader::fencing::FenceError;
pub use plexsphere_leader::floor::{FLOOR_TABLE, setup_statement};

/// Creates the floor table of the advisory lock in the connection's database if it does not
/// exist ([`setup_statement`], through `sqlx::raw_sql`). Idempotent and quiet, and safe to
/// run from every replica at the same start (every setup takes one transaction-level advisory
/// lock first). Pass what you hold: `&pool`, `&mut connection` or `&mut transaction`.
///
/// # Errors
/// [`FenceError::Setup`] naming `floor::setup`, with the server's error (for example a
/// missing `CREATE` privilege).
pub async fn setup<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
) -> Result<(), FenceError> {
    crate::fencing::run_setup(connection, "floor::setup", &setup_statement()).await
}
