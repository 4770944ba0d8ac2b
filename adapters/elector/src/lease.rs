//! The lease mechanism's setup ([`Config::lease`](crate::Config::lease)): the tables it needs.

#[cfg(feature = "deadpool")]
use crate::fencing::{FenceClient, FenceError};

/// Creates the lease table and the fence table if they do not exist
/// ([`sql::lease::setup`](crate::sql::lease::setup)). Idempotent; run it once per database
/// before electing with a lease, from a migration or at start-up (on any connection: a
/// transaction-mode pooler carries it).
///
/// # Errors
/// [`FenceError::Query`] with the server's error (for example a missing `CREATE` privilege).
#[cfg(feature = "deadpool")]
pub async fn setup(client: &impl FenceClient) -> Result<(), FenceError> {
    client
        .fence_batch(&crate::sql::lease::setup())
        .await
        .map_err(FenceError::from)
}

/// The statement [`setup`] runs, for backends of their own (sqlx: `sqlx::raw_sql`).
pub fn setup_statement() -> String {
    crate::sql::lease::setup()
}
