//! What a launcher asks of an election.

use std::fmt;
use std::sync::Arc;

use plexsphere_leader_core::TermId;
use plexsphere_leader_core::work::Interruption;
use tokio_util::sync::CancellationToken;

use super::{BoxError, BoxFuture, PassFn};
use plexsphere_leader::{Elector, Term};

/// The election as the launchers see it: the spec's `Do`, `Term` and `IsLeader`.
///
/// [`Elector`] implements it; a test or another election may too.
pub trait LeaderSource: Clone + Send + Sync + 'static {
    /// Whether this replica leads (an atomic read).
    fn is_leader(&self) -> bool;

    /// The current term, `None` on a standby (the spec's `Term(parent)`).
    fn leader_term(&self, parent: &CancellationToken) -> Option<LeaderTerm>;

    /// Runs `work` only on the leader, with the term's token (the spec's `Do`): `Ok(false)`
    /// without calling it on a standby; `Ok(true)` or its error when the term held until it
    /// returned, whether or not `parent` was cancelled meanwhile (a `parent` already cancelled
    /// still calls `work`, with a cancelled token); `Ok(false)` when the term itself ended
    /// while it ran. A panic in `work` propagates. [`Elector::run_if_leader`] has the full
    /// table.
    fn run_if_leader(
        &self,
        parent: &CancellationToken,
        work: PassFn,
    ) -> BoxFuture<Result<bool, BoxError>>;

    /// Waits until this replica leads and returns the term, or `None` once `parent` is
    /// cancelled first. [`WhileLeader`](crate::loops::WhileLeader) awaits it while standing by;
    /// it must wake on the election's own signal, never by polling.
    fn next_term(&self, parent: &CancellationToken) -> BoxFuture<Option<LeaderTerm>>;

    /// This replica cannot do some of the leader's work (`why`, the loop and its cause): give
    /// up leadership so that a replica able to do it takes over. Called by a
    /// [`LeaderTicker`](crate::LeaderTicker) whose pass failed for good on every tick of its
    /// patience (see [`UNFIT_PATIENCE_PERIODS`](crate::loops::UNFIT_PATIENCE_PERIODS)), and when
    /// a while-leader worker stopped for good. Called on a standby too: it must then do
    /// nothing. The [`Elector`] resigns (its resign hold-off, then it is a candidate again); the
    /// default does nothing.
    fn step_down(&self, why: &str) {
        let _ = why;
    }
}

impl LeaderSource for Elector {
    fn is_leader(&self) -> bool {
        Elector::is_leader(self)
    }

    fn leader_term(&self, parent: &CancellationToken) -> Option<LeaderTerm> {
        self.term(parent).map(LeaderTerm::from_term)
    }

    fn run_if_leader(
        &self,
        parent: &CancellationToken,
        work: PassFn,
    ) -> BoxFuture<Result<bool, BoxError>> {
        let (elector, parent) = (self.clone(), parent.clone());
        Box::pin(
            async move { Elector::run_if_leader(&elector, &parent, |token| work(token)).await },
        )
    }

    /// On the leader, logs `why` at ERROR and resigns ([`Elector::resign`]); nothing on a
    /// standby.
    fn step_down(&self, why: &str) {
        if self.is_leader() {
            tracing::error!(
                target: "plexsphere_leader",
                cause = %why,
                "leader: resigning: its work fails with an error that retrying cannot fix: {why}"
            );
            let _ = self.resign();
        }
    }

    /// [`Elector::next_term`]: wakes on the published leadership.
    fn next_term(&self, parent: &CancellationToken) -> BoxFuture<Option<LeaderTerm>> {
        let (elector, parent) = (self.clone(), parent.clone());
        Box::pin(async move {
            let term = elector.next_term(&parent).await.ok()?;
            Some(LeaderTerm::from_term(term))
        })
    }
}

/// One term of leadership handed to a launcher: its id, a token cancelled when it ends, and why
/// it ended.
pub struct LeaderTerm {
    id: TermId,
    token: CancellationToken,
    source: Source,
}

enum Source {
    Elector(Term),
    Custom(Arc<dyn Fn() -> Option<Interruption> + Send + Sync>),
}

impl LeaderTerm {
    /// Wraps an [`Elector`]'s term. Dropping the `LeaderTerm` drops it, which cancels its token.
    pub fn from_term(term: Term) -> Self {
        Self {
            id: term.id(),
            token: term.token().clone(),
            source: Source::Elector(term),
        }
    }

    /// A term of another election: `token` is cancelled when it ends, `cause` says why (`None`
    /// while it holds).
    pub fn custom(
        id: TermId,
        token: CancellationToken,
        cause: impl Fn() -> Option<Interruption> + Send + Sync + 'static,
    ) -> Self {
        Self {
            id,
            token,
            source: Source::Custom(Arc::new(cause)),
        }
    }

    /// The term's id.
    pub fn id(&self) -> TermId {
        self.id
    }

    /// The token cancelled when the term ends or the parent is cancelled.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Why the token was cancelled; `None` while the term holds.
    pub fn cause(&self) -> Option<Interruption> {
        match &self.source {
            Source::Elector(term) => term.cause(),
            Source::Custom(cause) => cause(),
        }
    }
}

impl fmt::Debug for LeaderTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderTerm")
            .field("id", &self.id)
            .field("cause", &self.cause())
            .finish()
    }
}
