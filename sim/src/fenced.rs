//! Fencing and lease runs: the setup every replica incarnation runs before its elector (the
//! fence table, or the lease table and the fence table), and the simulated service's fenced
//! unit of leader work.
//!
//! A fenced unit does what `plexsphere_leader::fencing` documents, on a pooled connection:
//! `START TRANSACTION`, `SET LOCAL idle_in_transaction_session_timeout` (so that a leader cut
//! off mid-transaction holds the fence row for a bounded time), `fencing::check` against the
//! term's epoch, then the work itself (a sleep of the unit's length) and `COMMIT`; a stale
//! epoch rolls back. The whole unit has a budget; a unit that fails or runs out of it closes
//! its connection rather than return it to the pool, as a careful service would.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use plexsphere_leader::fencing::{self, FenceError};
use tokio::time::{Instant, sleep, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::record::{FenceOutcome, SharedRecorder, WorkGuard, sim_time};
use crate::setup::{Mechanism, Params};

/// Runs the setup of `mechanism` (`fencing::setup`, or `lease::setup`: the lease table and
/// the fence table) on a pooled connection until it succeeds or `shutdown` fires. Each
/// attempt may take one check interval; a failed one closes its connection and the next one
/// follows half an interval later. The setup is idempotent (`CREATE TABLE IF NOT EXISTS`).
pub(crate) async fn set_up(
    pool: &Pool,
    shutdown: &CancellationToken,
    params: &Params,
    mechanism: Mechanism,
    sharded: bool,
) {
    while !shutdown.is_cancelled() {
        // The connection and the setup each within one interval. A setup that did not answer
        // leaves its connection with a request in flight: it is discarded, never given back
        // to the pool, where the next attempt would queue behind the lost answer for good.
        if let Ok(Ok(object)) = timeout(params.interval, pool.get()).await {
            match timeout(params.interval, mechanism.set_up(client(&object), sharded)).await {
                Ok(Ok(())) => return,
                Ok(Err(_)) | Err(_) => discard(object),
            }
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = sleep(params.interval / 2) => {}
        }
    }
}

/// What one fenced unit of work needs.
pub(crate) struct FencedUnit {
    pub(crate) recorder: SharedRecorder,
    pub(crate) replica: usize,
    pub(crate) incarnation: u32,
    /// The term the unit runs in, and its epoch.
    pub(crate) term: u64,
    pub(crate) epoch: Option<u64>,
    /// The election's key, whose fence row the unit checks.
    pub(crate) key: plexsphere_leader::LockKey,
    /// How long the work itself lasts, between the check and the commit.
    pub(crate) length: Duration,
}

impl FencedUnit {
    /// Runs the unit on a connection of `pool` and records it (see [`FenceOutcome`]).
    pub(crate) async fn run(self, pool: &Pool, params: &Params) {
        let deadline = Instant::now() + params.fenced_budget;
        let record = {
            let at = sim_time(&self.recorder);
            self.recorder
                .borrow_mut()
                .begin_fenced(self.replica, self.incarnation, self.epoch, at)
        };
        let outcome = match self.epoch {
            None => FenceOutcome::Failed("the term has no fencing epoch".to_owned()),
            Some(epoch) => match timeout_at(deadline, pool.get()).await {
                Err(_) => FenceOutcome::Failed("no pooled connection within the budget".into()),
                Ok(Err(error)) => FenceOutcome::Failed(format!("pool: {error}")),
                Ok(Ok(mut object)) => {
                    let written = self.write(&mut object, epoch, record, params);
                    match timeout_at(deadline, written).await {
                        Ok(Ok(outcome)) => outcome,
                        Ok(Err(error)) => {
                            discard(object);
                            FenceOutcome::Failed(error)
                        }
                        Err(_) => {
                            discard(object);
                            FenceOutcome::Failed("budget exhausted".to_owned())
                        }
                    }
                }
            },
        };
        let at = sim_time(&self.recorder);
        self.recorder.borrow_mut().end_fenced(record, at, outcome);
    }

    /// The transaction: accepted and committed, or stale and rolled back; `Err` with the
    /// error's text otherwise.
    async fn write(
        &self,
        object: &mut Object,
        epoch: u64,
        record: usize,
        params: &Params,
    ) -> Result<FenceOutcome, String> {
        let client: &mut tokio_postgres::Client = object;
        let transaction = client.transaction().await.map_err(|e| describe(&e))?;
        let bound = format!(
            "SET LOCAL idle_in_transaction_session_timeout = {}",
            params.fenced_idle_timeout.as_millis()
        );
        transaction
            .batch_execute(&bound)
            .await
            .map_err(|e| describe(&e))?;
        let checked = fencing::check(&transaction, self.key, epoch).await;
        let at = sim_time(&self.recorder);
        self.recorder.borrow_mut().fence_checked(record, at);
        match checked {
            Ok(()) => {
                let acting = WorkGuard::begin(
                    std::rc::Rc::clone(&self.recorder),
                    self.replica,
                    self.incarnation,
                    0,
                    self.term,
                );
                sleep(self.length).await;
                drop(acting);
                transaction.commit().await.map_err(|e| describe(&e))?;
                Ok(FenceOutcome::Accepted)
            }
            Err(FenceError::Stale { current, .. }) => {
                transaction.rollback().await.map_err(|e| describe(&e))?;
                Ok(FenceOutcome::Stale { current })
            }
            Err(FenceError::Query(error)) => Err(format!(
                "fence check: {}",
                error
                    .db_error()
                    .map_or_else(|| error.to_string(), describe_db)
            )),
            Err(error) => Err(error.to_string()),
        }
    }
}

/// A client error with the server's SQLSTATE and message, when it has them.
fn describe(error: &tokio_postgres::Error) -> String {
    error
        .as_db_error()
        .map_or_else(|| error.to_string(), describe_db)
}

/// The severity, SQLSTATE and message of a server error.
fn describe_db(db: &tokio_postgres::error::DbError) -> String {
    format!("{} {}: {}", db.severity(), db.code().code(), db.message())
}

/// The `tokio_postgres` client of a pooled connection.
fn client(object: &Object) -> &tokio_postgres::Client {
    object
}

/// Closes a pooled connection instead of returning it to the pool: it may be wedged, or in
/// the middle of a transaction.
fn discard(object: Object) {
    drop(Object::take(object));
}
