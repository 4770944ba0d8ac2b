//! Who holds a lease election's lease ([`Config::lease`](crate::Config::lease)), read from its
//! lease row: `pg_locks` shows no lock for the lease mechanism.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::StatusError;
use crate::error::CheckError;
use crate::key::LockKey;
use crate::session::{LockSession, Row};
use crate::sql;

/// The lease of one election, as its row says.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseStatus {
    /// The election's key.
    pub key: LockKey,
    /// The holder as written: `<identity> <nonce of the run>`.
    pub holder: String,
    /// The holder's identity ([`Config::identity`](crate::Config::identity)): the holder without
    /// its run's nonce.
    pub identity: String,
    /// The epoch of the holder's term (the fence row's), when the fence row exists.
    pub epoch: Option<u64>,
    /// Until when the lease lasts, by the server's clock; a released lease expired at its
    /// release.
    pub expires_at: SystemTime,
    /// Whether the lease is still held by the server's clock (`expires_at` lies ahead).
    pub held: bool,
}

impl std::fmt::Display for LeaseStatus {
    /// One line for operators:
    /// `billing@web-3 holds the lease of 1886156915:1 until 2025-12-02T10:30:00Z (epoch 7)`,
    /// or `… held the lease … until …` once it expired; the expiry in UTC, to the second.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.held { "holds" } else { "held" };
        write!(
            f,
            "{} {verb} the lease of {} until {}",
            self.identity,
            self.key,
            humantime::format_rfc3339_seconds(self.expires_at.max(UNIX_EPOCH))
        )?;
        match self.epoch {
            Some(epoch) => write!(f, " (epoch {epoch})"),
            None => Ok(()),
        }
    }
}

/// Who holds the lease of election `key` in `client`'s current database, in the tables of
/// `schema` (the election's [`Config::lease_schema`](crate::Config::lease_schema), `public`
/// by default: [`lease::DEFAULT_SCHEMA`](crate::lease::DEFAULT_SCHEMA)): `None` when no replica
/// ever claimed it. One statement (`sql::lease::who_holds`, feature `wire`) over the simple
/// query protocol, so it also works through a transaction-mode pooler.
///
/// # Errors
/// [`StatusError::Query`] when the query fails (the lease table does not exist: `42P01`) or
/// answers a row of another shape. Cancel-safe.
#[cfg(feature = "deadpool")]
pub async fn lease_holder(
    client: &tokio_postgres::Client,
    schema: &str,
    key: LockKey,
) -> Result<Option<LeaseStatus>, StatusError> {
    let messages = client
        .simple_query(&sql::lease::who_holds(schema, key))
        .await?;
    lease_of(key, &crate::session::text_rows(messages)?)
}

/// [`lease_holder`] on a session of any backend.
///
/// # Errors
/// As [`lease_holder`].
pub(crate) async fn lease_holder_on(
    session: &dyn LockSession,
    schema: &str,
    key: LockKey,
) -> Result<Option<LeaseStatus>, StatusError> {
    let rows = session
        .query(&sql::lease::who_holds(schema, key))
        .await
        .map_err(crate::session::QueryError::into_cause)?;
    lease_of(key, &rows)
}

fn lease_of(key: LockKey, rows: &[Row]) -> Result<Option<LeaseStatus>, StatusError> {
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let [Some(holder), epoch, Some(expires), Some(held)] = row.as_slice() else {
        return Err(unexpected(format!("{row:?}")).into());
    };
    let epoch = epoch
        .as_deref()
        .map(|epoch| epoch.parse::<u64>())
        .transpose()
        .map_err(|_| unexpected(format!("epoch {epoch:?}")))?;
    let seconds: f64 = expires
        .parse()
        .map_err(|_| unexpected(format!("expiry {expires:?}")))?;
    let expires_at = Duration::try_from_secs_f64(seconds.abs())
        .map(|since| {
            if seconds >= 0.0 {
                UNIX_EPOCH + since
            } else {
                UNIX_EPOCH - since
            }
        })
        .map_err(|_| unexpected(format!("expiry {expires:?}")))?;
    let identity = holder
        .rsplit_once(' ')
        .map_or(holder.as_str(), |(identity, _nonce)| identity)
        .to_owned();
    Ok(Some(LeaseStatus {
        key,
        holder: holder.clone(),
        identity,
        epoch,
        expires_at,
        held: held == "t",
    }))
}

fn unexpected(detail: String) -> CheckError {
    CheckError::UnexpectedReply {
        statement: "the lease holder query",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[Option<&str>]) -> Row {
        cells.iter().map(|cell| cell.map(str::to_owned)).collect()
    }

    #[test]
    fn a_lease_row_reads_as_its_holder_identity_epoch_and_expiry() {
        let rows = [row(&[
            Some("billing@web-3 00ff00ff00ff00ff"),
            Some("7"),
            Some("1764669000.25"),
            Some("t"),
        ])];
        let status = lease_of(LockKey::DEFAULT, &rows).unwrap().unwrap();
        assert_eq!(status.identity, "billing@web-3");
        assert_eq!(status.epoch, Some(7));
        assert_eq!(
            status.expires_at,
            UNIX_EPOCH + Duration::from_millis(1_764_669_000_250)
        );
        assert!(status.held);
        assert_eq!(
            status.to_string(),
            "billing@web-3 holds the lease of 1886156915:1 until 2025-12-02T09:50:00Z (epoch 7)"
        );
        assert_eq!(lease_of(LockKey::DEFAULT, &[]).unwrap(), None);
        let no_fence = [row(&[Some("a b"), None, Some("1"), Some("f")])];
        let status = lease_of(LockKey::DEFAULT, &no_fence).unwrap().unwrap();
        assert_eq!((status.epoch, status.held), (None, false));
        let short = [row(&[Some("a b"), None])];
        assert!(lease_of(LockKey::DEFAULT, &short).is_err());
    }
}
