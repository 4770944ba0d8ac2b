//! A hand-driven election for the launchers' unit tests.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plexsphere_leader_core::TermEndCause;
use plexsphere_leader_core::TermId;
use plexsphere_leader_core::work::Interruption;
use tokio_util::sync::CancellationToken;

use super::{BoxError, BoxFuture, LeaderTerm, Leadership, PassFn};

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
/// [`demote`](Self::demote) ends it with `LeadershipLost`.
#[derive(Clone, Default)]
pub(crate) struct Manual {
    state: Arc<Mutex<State>>,
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
        id
    }

    pub(crate) fn demote(&self) {
        let open = self.lock().term.take();
        if let Some(open) = open {
            *open.ended.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(TermEndCause::LeadershipLost);
            for token in open.tokens {
                token.cancel();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Leadership for Manual {
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
        let term = self.leader_term(parent);
        Box::pin(async move {
            let Some(term) = term else { return Ok(false) };
            let result = work(term.token().clone()).await;
            if term.cause().is_some() {
                return Ok(false);
            }
            result.map(|()| true)
        })
    }

    fn term_poll_interval(&self) -> Duration {
        Duration::from_millis(10)
    }
}
