//! A hand-driven election for the launchers' unit tests.

use std::sync::{Arc, Mutex, PoisonError};

use plexsphere_leader_core::TermEndCause;
use plexsphere_leader_core::TermId;
use plexsphere_leader_core::work::Interruption;
use tokio_util::sync::CancellationToken;

use super::{BoxError, BoxFuture, LeaderSource, LeaderTerm, PassFn};

#[derive(Default)]
struct State {
    term: Option<Open>,
    next: u64,
}

struct Open {
    id: TermId,
    ended: Arc<Mutex<Option<TermEndCause>>>,
    tokens: Vec<CancellationToken>,
}

/// An election the test moves by hand: [`lead`](Self::lead) begins a term,
/// [`demote`](Self::demote) ends it with `Lost(CheckFailed)`.
#[derive(Clone, Default)]
pub(crate) struct Manual {
    state: Arc<Mutex<State>>,
    /// Bumped on every lead and demote, for [`LeaderSource::next_term`].
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// Every [`LeaderSource::step_down`], with its reason: it demotes, as a resign would.
    pub(crate) stepped_down: Arc<Mutex<Vec<String>>>,
}

impl Manual {
    pub(crate) fn lead(&self) -> TermId {
        let mut state = self.lock();
        state.next += 1;
        let id = TermId::new(state.next);
        state.term = Some(Open {
            id,
            ended: Arc::default(),
            tokens: Vec::new(),
        });
        drop(state);
        self.changes.send_modify(|n| *n += 1);
        id
    }

    pub(crate) fn demote(&self) {
        let open = self.lock().term.take();
        if let Some(open) = open {
            *open.ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(TermEndCause::Lost(
                plexsphere_leader_core::LossReason::CheckFailed,
            ));
            for token in open.tokens {
                token.cancel();
            }
        }
        self.changes.send_modify(|n| *n += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LeaderSource for Manual {
    fn is_leader(&self) -> bool {
        self.lock().term.is_some()
    }

    fn leader_term(&self, parent: &CancellationToken) -> Option<LeaderTerm> {
        let mut state = self.lock();
        let open = state.term.as_mut()?;
        let token = parent.child_token();
        open.tokens.push(token.clone());
        let (ended, parent) = (Arc::clone(&open.ended), parent.clone());
        Some(LeaderTerm::custom(open.id, token, move || {
            let ended = *ended.lock().unwrap_or_else(PoisonError::into_inner);
            match ended {
                Some(cause) => Some(Interruption::Term(cause)),
                None => parent
                    .is_cancelled()
                    .then_some(Interruption::ParentCancelled),
            }
        }))
    }

    fn run_if_leader(
        &self,
        parent: &CancellationToken,
        work: PassFn,
    ) -> BoxFuture<Result<bool, BoxError>> {
        let ended = self
            .lock()
            .term
            .as_ref()
            .map(|open| Arc::clone(&open.ended));
        let term = self.leader_term(parent);
        Box::pin(async move {
            let (Some(term), Some(ended)) = (term, ended) else {
                return Ok(false);
            };
            let result = work(term.token().clone()).await;
            // Like the Elector: only a term that ended under the work discards its result.
            if ended
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
            {
                return Ok(false);
            }
            result.map(|()| true)
        })
    }

    fn step_down(&self, why: &str) {
        self.stepped_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(why.to_owned());
        self.demote();
    }

    fn next_term(&self, parent: &CancellationToken) -> BoxFuture<Option<LeaderTerm>> {
        let (manual, parent) = (self.clone(), parent.clone());
        Box::pin(async move {
            let mut changes = manual.changes.subscribe();
            loop {
                if parent.is_cancelled() {
                    return None;
                }
                if let Some(term) = manual.leader_term(&parent) {
                    return Some(term);
                }
                tokio::select! {
                    () = parent.cancelled() => return None,
                    _ = changes.changed() => {}
                }
            }
        })
    }
}
