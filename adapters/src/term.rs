//! Terms of leadership as seen by the service: cancellation tokens that end with the term.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use plexsphere_leader_core::work::{Interruption, TermStatus};
use plexsphere_leader_core::{TermEndCause, TermId};
use tokio_util::sync::CancellationToken;

/// One term's shared state: its end, and the tokens handed out for it.
#[derive(Debug)]
pub(crate) struct TermShared {
    id: TermId,
    state: Mutex<TermState>,
}

#[derive(Debug, Default)]
struct TermState {
    ended: Option<TermEndCause>,
    tokens: BTreeMap<u64, CancellationToken>,
    next_key: u64,
}

impl TermShared {
    pub(crate) fn new(id: TermId) -> Arc<Self> {
        Arc::new(Self {
            id,
            state: Mutex::new(TermState::default()),
        })
    }

    pub(crate) fn id(&self) -> TermId {
        self.id
    }

    /// Ends the term: records the cause and cancels every token handed out for it. Idempotent.
    pub(crate) fn end(&self, cause: TermEndCause) {
        let tokens = {
            let mut state = self.lock();
            if state.ended.is_some() {
                return;
            }
            state.ended = Some(cause);
            std::mem::take(&mut state.tokens)
        };
        for token in tokens.into_values() {
            token.cancel();
        }
    }

    /// A [`Term`] whose token is a child of `parent`, or `None` when the term already ended.
    pub(crate) fn handle(self: &Arc<Self>, parent: &CancellationToken) -> Option<Term> {
        let token = parent.child_token();
        let key = {
            let mut state = self.lock();
            if state.ended.is_some() {
                return None;
            }
            let key = state.next_key;
            state.next_key += 1;
            state.tokens.insert(key, token.clone());
            key
        };
        Some(Term {
            shared: Arc::clone(self),
            token,
            parent: parent.clone(),
            key,
        })
    }

    fn ended(&self) -> Option<TermEndCause> {
        self.lock().ended
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TermState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A handle on the current term of leadership: the spec's `Term(parent)` context.
///
/// Its [`token`](Self::token) is cancelled when the parent token is cancelled or the term ends
/// (leadership lost, or the election stopped), whichever comes first; [`cause`](Self::cause)
/// then tells which. Dropping the `Term` cancels its token (the spec's "always call the cancel
/// function" is automatic) and forgets it, so long terms do not accumulate handles.
#[derive(Debug)]
pub struct Term {
    shared: Arc<TermShared>,
    token: CancellationToken,
    parent: CancellationToken,
    key: u64,
}

impl Term {
    /// The term's identifier: strictly increasing over the life of the elector.
    pub fn id(&self) -> TermId {
        self.shared.id
    }

    /// The token that is cancelled when the term ends or the parent is cancelled. Clones of it
    /// are cancelled too when this `Term` is dropped.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Waits until the token is cancelled. Cancel-safe.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Whether the term still holds and the parent is not cancelled.
    pub fn is_live(&self) -> bool {
        self.cause().is_none()
    }

    /// Why the token was cancelled, or `None` while it is not: the end of the term
    /// ([`Interruption::Term`], with [`TermEndCause::LeadershipLost`] after a loss: the spec's
    /// `context.Cause` = `ErrLeadershipLost`) takes precedence over a cancelled parent
    /// ([`Interruption::ParentCancelled`]).
    pub fn cause(&self) -> Option<Interruption> {
        if let Some(cause) = self.shared.ended() {
            return Some(Interruption::Term(cause));
        }
        self.parent
            .is_cancelled()
            .then_some(Interruption::ParentCancelled)
    }

    pub(crate) fn status(&self) -> TermStatus {
        self.cause().map_or(TermStatus::Live, TermStatus::Ended)
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        self.token.cancel();
        self.shared.lock().tokens.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_the_term_cancels_its_tokens_with_the_cause() {
        let shared = TermShared::new(TermId::new(1));
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        assert!(term.is_live());
        shared.end(TermEndCause::LeadershipLost);
        assert!(term.token().is_cancelled());
        assert_eq!(
            term.cause(),
            Some(Interruption::Term(TermEndCause::LeadershipLost))
        );
        assert!(!parent.is_cancelled());
    }

    #[test]
    fn a_cancelled_parent_cancels_the_term_token_with_parent_cancelled() {
        let shared = TermShared::new(TermId::new(1));
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        parent.cancel();
        assert!(term.token().is_cancelled());
        assert_eq!(term.cause(), Some(Interruption::ParentCancelled));
    }

    #[test]
    fn no_handle_after_the_end_and_dropped_handles_are_forgotten() {
        let shared = TermShared::new(TermId::new(1));
        let parent = CancellationToken::new();
        for _ in 0..1000 {
            let term = shared.handle(&parent).unwrap();
            let clone = term.token().clone();
            drop(term);
            assert!(clone.is_cancelled(), "dropping a Term cancels its token");
        }
        assert!(shared.lock().tokens.is_empty());
        shared.end(TermEndCause::Stopped);
        assert!(shared.handle(&parent).is_none());
    }
}
