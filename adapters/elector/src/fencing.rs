//! Fencing tokens: a per-term epoch that a pass checks, inside the transaction of its writes,
//! so that a leader which lost the lock without knowing it (cut off, paused) cannot write after
//! a newer leader began.
//!
//! With [`Config::fencing`](crate::Config::fencing) on, a new leader advances the epoch of the
//! election's key in the table `plexsphere_leader_fence` on its lock session, right after the
//! grant and before its term begins ([`Term::epoch`](crate::Term::epoch)). A fenced write:
//!
//! ```no_run
//! # async fn pass(
//! #     client: &mut tokio_postgres::Client,
//! #     elector: &plexsphere_leader::Elector,
//! #     term: &plexsphere_leader::Term,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let epoch = term.epoch().expect("fencing is on");
//! let transaction = client.transaction().await?;
//! // Row-locks the fence of the elector's key:
//! plexsphere_leader::fencing::check(&transaction, elector.key(), epoch).await?;
//! transaction.execute("UPDATE jobs SET done = true WHERE id = 1", &[]).await?;
//! transaction.commit().await?;
//! # Ok(()) }
//! ```
//!
//! [`check`] reads the epoch `FOR SHARE`: a newer leader's advance waits until the transaction
//! ends, so a write either commits before the new epoch exists or sees it and is rejected. The
//! same in SQL, for writes made elsewhere ([`sql::fence_check`], here for the default key):
//! `SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1 FOR SHARE`,
//! then write only when it equals the term's epoch.

use tokio_postgres::GenericClient;

use crate::key::LockKey;
use crate::sql;

/// Creates the fence table if it does not exist ([`sql::FENCE_SETUP`]). Idempotent; run it
/// once per database before enabling fencing, from a migration or at start-up.
///
/// # Errors
/// The server's error (for example a missing `CREATE` privilege).
pub async fn setup(client: &impl GenericClient) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(sql::FENCE_SETUP).await
}

/// Checks, inside the caller's transaction, that `epoch` is still the current one of the
/// election `key` ([`Elector::key`](crate::Elector::key)), and holds
/// the fence row (`FOR SHARE`) until the transaction ends, so no newer term can begin before
/// the caller commits or rolls back. Call it in the transaction of the fenced writes, never
/// outside one (the row lock would end with the statement). Bound the transaction's idle time
/// (`SET LOCAL idle_in_transaction_session_timeout`, or the writer role's setting): a leader cut
/// off inside a fenced transaction holds the row until the server ends that session, and every
/// newer term's epoch advance waits for it.
///
/// # Errors
/// [`FenceError::Stale`] when a newer term began (do not write; roll back),
/// [`FenceError::NoEpoch`] when no term of the election was fenced yet (fencing off, or the
/// table missing), [`FenceError::Query`] for a server error.
pub async fn check(
    transaction: &impl GenericClient,
    key: LockKey,
    epoch: u64,
) -> Result<(), FenceError> {
    let rows = transaction.query(&sql::fence_check(key), &[]).await?;
    let current = rows
        .first()
        .map(|row| row.try_get::<_, i64>(0))
        .transpose()?
        .ok_or(FenceError::NoEpoch)?;
    let current = u64::try_from(current).unwrap_or(0);
    if current == epoch {
        Ok(())
    } else {
        Err(FenceError::Stale { epoch, current })
    }
}

/// Why a fenced write must not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer term began: this term's writes are fenced off.
    #[error("fenced: epoch {epoch} is stale, the current epoch is {current}")]
    Stale {
        /// The caller's epoch.
        epoch: u64,
        /// The current one.
        current: u64,
    },
    /// The fence table has no row for the election's key: no term was ever fenced.
    #[error("no fencing epoch: enable fencing in the elector's config and run fencing::setup")]
    NoEpoch,
    /// The check failed on the server. Its text includes the driver's error, so it has no
    /// `source()` (a chain printer would repeat it).
    #[error("fence check: {0}")]
    Query(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for FenceError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Query(error)
    }
}
