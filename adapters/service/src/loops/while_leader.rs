//! The while-leader runner: the spec's `runWhileLeader`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{BoxError, LeaderSource, PassFn};

/// How long a self-paced loop may take to return after its term ended before its future is
/// dropped.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(1);

/// Hands a self-paced loop the token of one term of leadership, and starts it again in the next
/// term.
///
/// - While standing by it awaits the next term ([`LeaderSource::next_term`]) and runs
///   nothing.
/// - When a term begins it calls the loop with the term's token. When the term ends (a
///   demotion, the election's stop, the service's shutdown) the token is cancelled; a loop that
///   has not returned within the stop grace (1 s by default) is dropped. Its result is then
///   discarded: a demotion is never a failure.
/// - A loop that returns an error while its term holds makes the runner return that error, so
///   the supervisor restarts it within its budget (an error of a lost or refused connection,
///   [`is_unavailable`](crate::is_unavailable), spends none); a panic propagates the same way.
///   A loop that returns `Ok` while its term holds is done for that term and starts again in
///   the next one.
/// - Wired by [`Background::while_leader`](super::Background::while_leader), a loop that stops
///   for good (its budget exhausted, or a [`Permanent`](crate::Permanent) error) makes a leading
///   replica step down ([`LeaderSource::step_down`]) once, so that a replica that still runs
///   the loop leads instead of this one keeping leadership without it.
pub struct WhileLeader<L> {
    name: Arc<str>,
    leadership: L,
    run: PassFn,
    stop_grace: Duration,
}

impl<L: Clone> Clone for WhileLeader<L> {
    fn clone(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            leadership: self.leadership.clone(),
            run: Arc::clone(&self.run),
            stop_grace: self.stop_grace,
        }
    }
}

impl<L: LeaderSource> WhileLeader<L> {
    /// A runner of the self-paced loop `name`, which `run` starts with a term's token.
    pub fn new(name: &str, leadership: L, run: PassFn) -> Self {
        Self {
            name: name.into(),
            leadership,
            run,
            stop_grace: DEFAULT_STOP_GRACE,
        }
    }

    /// Sets how long the loop may take to return after its term ended.
    #[must_use]
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The election the loop follows.
    pub(crate) fn leadership(&self) -> &L {
        &self.leadership
    }

    /// Runs the loop in every term until `shutdown` is cancelled.
    ///
    /// # Errors
    /// The loop's own error, when it returned one while its term held.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BoxError> {
        loop {
            let Some(term) = self.next_term(&shutdown).await else {
                return Ok(());
            };
            let id = term.id().get();
            tracing::info!(
                target: "plexsphere_leader",
                r#loop = %self.name,
                term = id,
                "background loop started for the term"
            );
            let run = (self.run)(term.token().clone());
            tokio::pin!(run);
            let result = tokio::select! {
                result = &mut run => result,
                () = term.token().cancelled() => {
                    match tokio::time::timeout(self.stop_grace, &mut run).await {
                        Ok(result) => result,
                        Err(_) => {
                            tracing::warn!(
                                target: "plexsphere_leader",
                                r#loop = %self.name,
                                term = id,
                                grace = ?self.stop_grace,
                                "background loop did not stop within its grace after its term ended; dropped"
                            );
                            Ok(())
                        }
                    }
                }
            };
            match (term.cause(), result) {
                (None, Err(error)) => return Err(error),
                (None, Ok(())) => term.token().cancelled().await,
                (Some(cause), _) => tracing::info!(
                    target: "plexsphere_leader",
                    r#loop = %self.name,
                    term = id,
                    cause = %cause,
                    "background loop stopped: {cause}"
                ),
            }
        }
    }

    /// Waits for a term, taken under the loop's name; `None` once `shutdown` is cancelled.
    async fn next_term(&self, shutdown: &CancellationToken) -> Option<super::LeaderTerm> {
        plexsphere_leader::leadership::named_work(&self.name, self.leadership.next_term(shutdown))
            .await
    }
}

impl<L> fmt::Debug for WhileLeader<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WhileLeader")
            .field("name", &self.name)
            .field("stop_grace", &self.stop_grace)
            .finish_non_exhaustive()
    }
}
