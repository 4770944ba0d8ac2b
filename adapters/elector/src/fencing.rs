//! Fencing tokens: a per-term epoch that a pass checks, inside the transaction of its writes,
//! so that a leader which lost the lock without knowing it (cut off, paused) cannot write after
//! a newer leader began.
//!
//! With [`Config::fencing`](crate::Config::fencing) on, a new leader advances the epoch of the
//! election's key in the table `plexsphere_leader_fence` on its lock session, right after the
//! grant and before its term begins ([`Term::epoch`](crate::Term::epoch)). A fenced write with
//! deadpool-postgres (the same call takes a tokio-postgres `Client` or `Transaction`, as you
//! hold them: [`FenceClient`]):
//!
//! ```no_run
//! # #[cfg(feature = "deadpool")]
//! # async fn pass(
//! #     pool: &plexsphere_leader::deadpool_postgres::Pool,
//! #     elector: &plexsphere_leader::Elector,
//! #     term: &plexsphere_leader::Term,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use plexsphere_leader::fencing;
//!
//! let Some(epoch) = term.epoch() else { return Ok(()) }; // fencing is off
//! let mut client = pool.get().await?;
//! let transaction = client.transaction().await?;
//! // Row-locks the fence of the elector's key until the transaction ends:
//! fencing::check(&transaction, elector.key(), epoch).await?;
//! transaction.execute("UPDATE jobs SET done = true WHERE id = 1", &[]).await?;
//! transaction.commit().await?;
//! # Ok(()) }
//! ```
//!
//! With sqlx, `plexsphere_leader_sqlx::fencing::check(&mut transaction, key, epoch)` does the
//! same. With a lease ([`Config::lease`](crate::Config::lease)) check in the lease's schema,
//! whatever the writer's `search_path`: [`check_in`]`(&transaction, elector.lease_schema(),
//! elector.key(), epoch)`.
//!
//! **The contract: no fenced write commits after a newer term began.** It is not "no write after
//! my term ended": a pass that outlives its term (a graceful stop whose grace ran out, a leader
//! cut off from the database) still commits its fenced writes until a newer leader advances the
//! epoch, because until then no other leader's writes can conflict with them; from the instant
//! the newer epoch exists, every fenced write of the older term is rejected
//! ([`FenceError::Stale`]). A pass that must not write once its own term ended checks its term
//! token too.
//!
//! [`check`] reads the epoch `FOR SHARE`: a newer leader's advance waits until the transaction
//! ends, so a write either commits before the new epoch exists or sees it and is rejected. The
//! same in SQL, for writes made elsewhere (`sql::fence_check`, feature `wire`; here for the
//! default key):
//! `SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1 FOR SHARE`,
//! then write only when it equals the term's epoch.

use crate::error::CheckError;
use crate::key::LockKey;
use crate::sql;

#[cfg(feature = "deadpool")]
pub(crate) use self::postgres::run_setup;
#[cfg(feature = "deadpool")]
pub use self::postgres::{FenceClient, check, check_in, setup};
pub use crate::sql::{FENCE_SETUP, FENCE_TABLE};

/// The statement [`setup`] runs ([`FENCE_SETUP`], without the NOTICE a table that exists
/// raises, serialized as every setup is: safe from every replica at once), for backends of
/// their own (sqlx: `sqlx::raw_sql`).
pub fn setup_statement() -> String {
    crate::sql::fence_setup()
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
    /// The fence table does not exist in the transaction's database (SQLSTATE 42P01).
    #[error(
        "the fence table plexsphere_leader_fence does not exist: run fencing::setup (or \
         sql::FENCE_SETUP) once in this database"
    )]
    MissingTable,
    /// The check failed on the server or the connection broke. Its text includes the driver's
    /// error, so it has no `source()` (a chain printer would repeat it).
    #[error("fence check: {0}")]
    Query(CheckError),
    /// A setup ([`setup`], [`floor::setup`](crate::floor::setup),
    /// [`lease::setup`](crate::lease::setup), …) failed on the server or the connection broke
    /// (for example a missing `CREATE` privilege, or a schema that does not exist). Its text
    /// names the setup and includes the driver's error, so it has no `source()`.
    #[error("{setup} failed: {cause}")]
    Setup {
        /// The setup function that failed, by its path (`"fencing::setup"`,
        /// `"lease::setup_shards"`, …).
        setup: &'static str,
        /// The server's or the connection's error.
        cause: CheckError,
    },
}

impl FenceError {
    /// The failure of the check statement as a fence error: a missing table is
    /// [`FenceError::MissingTable`]. For session backends other than tokio-postgres.
    pub fn query(cause: CheckError) -> Self {
        match cause.sqlstate() {
            Some("42P01") => Self::MissingTable,
            _ => Self::Query(cause),
        }
    }

    /// The failure of the setup function `setup` (its path, `"fencing::setup"`) as a fence
    /// error: [`FenceError::Setup`]. For session backends other than tokio-postgres.
    pub fn setup(setup: &'static str, cause: CheckError) -> Self {
        Self::Setup { setup, cause }
    }
}

/// The verdict on the epoch a check read (`current`, `None` when the key has no row) for a term
/// of epoch `epoch`. Shared by every backend's `check`.
///
/// # Errors
/// [`FenceError::Stale`] when `current` is another epoch, [`FenceError::NoEpoch`] without a row.
pub fn verdict(current: Option<i64>, epoch: u64) -> Result<(), FenceError> {
    let current = current.ok_or(FenceError::NoEpoch)?;
    let current = u64::try_from(current).unwrap_or(0);
    if current == epoch {
        Ok(())
    } else {
        Err(FenceError::Stale { epoch, current })
    }
}

/// The statement [`check`] runs for `key` (`sql::fence_check`, feature `wire`), for backends
/// of their own.
pub fn check_statement(key: LockKey) -> String {
    sql::fence_check(key)
}

/// The statement `check_in` runs for the fence table in `schema` (`sql::fence_check_in`,
/// feature `wire`), for backends of their own.
pub fn check_statement_in(schema: &str, key: LockKey) -> String {
    sql::fence_check_in(schema, key)
}

/// The tokio-postgres and deadpool-postgres side.
#[cfg(feature = "deadpool")]
mod postgres {
    use super::{FenceError, verdict};
    use crate::error::CheckError;
    use crate::key::LockKey;
    use crate::session::BoxFuture;
    use crate::sql;

    /// What [`check`] and [`setup`] run on: a tokio-postgres `Client` or `Transaction`, or a
    /// deadpool-postgres `Client` (a pool's `Object`) or `Transaction`, passed as you hold them
    /// (`&transaction`, `&client`). Sealed: the four are all there is.
    pub trait FenceClient: Sync + sealed::Sealed {
        /// Runs the fence check `statement` (extended protocol, in the caller's transaction)
        /// and returns the epoch of its one row, `None` without a row.
        #[doc(hidden)]
        fn fence_epoch<'a>(
            &'a self,
            statement: &'a str,
        ) -> BoxFuture<'a, Result<Option<i64>, tokio_postgres::Error>>;

        /// Runs `statement` (one or more statements, simple protocol).
        #[doc(hidden)]
        fn fence_batch<'a>(
            &'a self,
            statement: &'a str,
        ) -> BoxFuture<'a, Result<(), tokio_postgres::Error>>;
    }

    mod sealed {
        pub trait Sealed {}
        impl Sealed for tokio_postgres::Client {}
        impl Sealed for tokio_postgres::Transaction<'_> {}
        impl Sealed for deadpool_postgres::Client {}
        impl Sealed for deadpool_postgres::Transaction<'_> {}
    }

    /// The epoch of the first row of `statement`'s answer on `client`.
    async fn epoch_of(
        client: &impl tokio_postgres::GenericClient,
        statement: &str,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        let rows = client.query(statement, &[]).await?;
        rows.first().map(|row| row.try_get::<_, i64>(0)).transpose()
    }

    macro_rules! fence_client {
        ($ty:ty, $client:ident => $inner:expr) => {
            impl FenceClient for $ty {
                fn fence_epoch<'a>(
                    &'a self,
                    statement: &'a str,
                ) -> BoxFuture<'a, Result<Option<i64>, tokio_postgres::Error>> {
                    let $client = self;
                    Box::pin(epoch_of($inner, statement))
                }

                fn fence_batch<'a>(
                    &'a self,
                    statement: &'a str,
                ) -> BoxFuture<'a, Result<(), tokio_postgres::Error>> {
                    let $client = self;
                    Box::pin(tokio_postgres::GenericClient::batch_execute(
                        $inner, statement,
                    ))
                }
            }
        };
    }

    fence_client!(tokio_postgres::Client, client => client);
    fence_client!(tokio_postgres::Transaction<'_>, client => client);
    // A deadpool client derefs to its tokio-postgres client, a deadpool transaction to its
    // tokio-postgres transaction: the same statements run on them.
    fence_client!(deadpool_postgres::Client, client => &***client);
    fence_client!(deadpool_postgres::Transaction<'_>, client => &**client);

    /// A tokio-postgres error of the fenced transaction, so that `?` works in a fenced pass.
    impl From<tokio_postgres::Error> for FenceError {
        fn from(error: tokio_postgres::Error) -> Self {
            Self::query(CheckError::from(error))
        }
    }

    /// Creates the fence table if it does not exist ([`sql::FENCE_SETUP`]). Idempotent, and
    /// safe to run from every replica at the same start: every setup of this crate takes one
    /// transaction-level advisory lock before its `CREATE … IF NOT EXISTS` (feature `wire`:
    /// `sql::lease::serialized_setup`). Run it before enabling fencing, from a migration or at
    /// start-up.
    ///
    /// # Errors
    /// [`FenceError::Setup`] naming `fencing::setup`, with the server's error (for example a
    /// missing `CREATE` privilege).
    pub async fn setup(client: &impl FenceClient) -> Result<(), FenceError> {
        run_setup(client, "fencing::setup", &sql::fence_setup()).await
    }

    /// Runs the (serialized) setup `statement` on `client`; a failure names `setup`. What every
    /// setup of this backend shares.
    pub(crate) async fn run_setup(
        client: &impl FenceClient,
        setup: &'static str,
        statement: &str,
    ) -> Result<(), FenceError> {
        client
            .fence_batch(statement)
            .await
            .map_err(|error| FenceError::setup(setup, CheckError::from(error)))
    }

    /// Checks, inside the caller's transaction, that `epoch` is still the current one of the
    /// election `key` ([`Elector::key`](crate::Elector::key)), and holds the fence row (`FOR
    /// SHARE`) until the transaction ends, so no newer term can begin before the caller commits
    /// or rolls back. Call it in the transaction of the fenced writes, never outside one (the
    /// row lock would end with the statement). Bound the transaction's idle time (`SET LOCAL
    /// idle_in_transaction_session_timeout`, or the writer role's setting): a leader cut off
    /// inside a fenced transaction holds the row until the server ends that session, and every
    /// newer term's epoch advance waits for it. Cancel-safe: dropping the future abandons the
    /// statement (roll the transaction back).
    ///
    /// # Errors
    /// [`FenceError::Stale`] when a newer term began (do not write; roll back),
    /// [`FenceError::NoEpoch`] when no term of the election was fenced yet (fencing off),
    /// [`FenceError::MissingTable`] when [`setup`] never ran in this database,
    /// [`FenceError::Query`] for another server error.
    pub async fn check(
        transaction: &impl FenceClient,
        key: LockKey,
        epoch: u64,
    ) -> Result<(), FenceError> {
        let current = transaction.fence_epoch(&sql::fence_check(key)).await?;
        verdict(current, epoch)
    }

    /// [`check`] of the fence table in `schema`, named with it: a lease's epochs live in its
    /// schema's fence table ([`Elector::lease_schema`](crate::Elector::lease_schema)), which a
    /// writer whose `search_path` resolves `plexsphere_leader_fence` elsewhere (another schema
    /// first on its path) would miss with [`check`], and so check an epoch no leader advances.
    ///
    /// # Errors
    /// As [`check`].
    pub async fn check_in(
        transaction: &impl FenceClient,
        schema: &str,
        key: LockKey,
        epoch: u64,
    ) -> Result<(), FenceError> {
        let current = transaction
            .fence_epoch(&sql::fence_check_in(schema, key))
            .await?;
        verdict(current, epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_admits_only_the_current_epoch() {
        assert!(verdict(Some(3), 3).is_ok());
        assert!(matches!(
            verdict(Some(4), 3),
            Err(FenceError::Stale {
                epoch: 3,
                current: 4
            })
        ));
        assert!(matches!(verdict(None, 3), Err(FenceError::NoEpoch)));
        assert!(matches!(
            verdict(Some(-1), 3),
            Err(FenceError::Stale {
                epoch: 3,
                current: 0
            })
        ));
    }

    #[test]
    fn a_missing_table_names_the_setup_step() {
        let missing = FenceError::query(CheckError::backend(
            std::io::Error::other("relation \"plexsphere_leader_fence\" does not exist"),
            Some("42P01".into()),
        ));
        assert!(matches!(missing, FenceError::MissingTable));
        assert!(missing.to_string().contains("run fencing::setup"));
        let other = FenceError::query(CheckError::backend(
            std::io::Error::other("permission denied"),
            Some("42501".into()),
        ));
        assert!(matches!(other, FenceError::Query(_)));
    }

    #[test]
    fn a_failed_setup_names_the_setup_not_the_check() {
        let failed = FenceError::setup(
            "floor::setup",
            CheckError::backend(
                std::io::Error::other("permission denied for schema public"),
                Some("42501".into()),
            ),
        );
        let text = failed.to_string();
        assert!(text.starts_with("floor::setup failed: "), "{text}");
        assert!(text.contains("permission denied"), "{text}");
        assert!(!text.contains("fence check"), "{text}");
    }

    #[test]
    fn every_setup_statement_takes_the_one_setup_lock_first() {
        let lock = format!(
            "SELECT pg_advisory_xact_lock({}); ",
            crate::sql::lease::SETUP_LOCK
        );
        let schema = crate::sql::lease::DEFAULT_SCHEMA;
        for statement in [
            setup_statement(),
            crate::floor::setup_statement(),
            crate::lease::setup_statement(schema),
            crate::lease::setup_shards_statement(schema),
        ] {
            let Some((before, after)) = statement.split_once(&lock) else {
                panic!("no setup lock in {statement}");
            };
            assert_eq!(before, crate::sql::QUIET_SETUP, "{statement}");
            assert!(after.starts_with("CREATE "), "{statement}");
        }
    }
}
