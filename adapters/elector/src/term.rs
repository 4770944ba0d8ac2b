//! Terms of leadership as seen by the service: cancellation tokens that end with the term.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use futures_util::future::{AbortHandle, Abortable};
use plexsphere_leader_core::work::{Interruption, TermStatus, WorkOutcome};
use plexsphere_leader_core::{TermEndCause, TermId};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

tokio::task_local! {
    /// The name of the work running in this task, given by [`named_work`].
    static WORK_NAME: Arc<str>;
}

/// Runs `work` under `name`: a [`Term`] taken inside it (directly, or through
/// [`Elector::run_if_leader`](crate::Elector::run_if_leader)) carries the name, so a graceful
/// stop whose grace ends before the work returned names it in its WARN line. The loop launchers
/// of `plexsphere-leader-service` name their passes after their loop.
pub async fn named_work<F: Future>(name: &str, work: F) -> F::Output {
    WORK_NAME.scope(Arc::from(name), work).await
}

/// Runs `work` in `term` (the spec's `Do` for a term already looked up): skipped without a term,
/// its own result when the term held until it returned, `Ok(false)` (logged at INFO) when the
/// term ended under it. See [`Elector::run_if_leader`](crate::Elector::run_if_leader).
pub(crate) async fn run_in<T, E, Fut: Future<Output = Result<T, E>>>(
    term: Option<Term>,
    work: impl FnOnce(CancellationToken) -> Fut,
) -> Result<bool, E> {
    let Some(term) = term else {
        return WorkOutcome::<T, E>::Skipped.into_result();
    };
    let (abort, registration) = AbortHandle::new_pair();
    term.abort_with(abort);
    let outcome = match Abortable::new(work(term.token().clone()), registration).await {
        Ok(result) => WorkOutcome::settle(term.status(), result),
        // Only the work deadline aborts, and only after the term ended.
        Err(_aborted) => match term.status() {
            TermStatus::Ended(why) => WorkOutcome::Interrupted(why),
            TermStatus::Live => WorkOutcome::Skipped,
        },
    };
    if let Some(kind) = outcome.log_kind() {
        tracing::info!(
            target: "plexsphere_leader",
            term = term.id().get(),
            cause = %term.cause().map(|c| c.to_string()).unwrap_or_default(),
            "{}",
            kind.message()
        );
    }
    outcome.into_result()
}

/// One term's shared state: its end, and the tokens handed out for it.
#[derive(Debug)]
pub(crate) struct TermShared {
    id: TermId,
    epoch: Option<u64>,
    state: Mutex<TermState>,
    /// Signalled when the last handle is dropped.
    drained: Notify,
    /// Why the term ended, published once it did (for [`Term::ended`]).
    end: watch::Sender<Option<TermEndCause>>,
}

#[derive(Debug, Default)]
struct TermState {
    ended: Option<TermEndCause>,
    tokens: BTreeMap<u64, Handle>,
    next_key: u64,
}

/// One live [`Term`] of the term.
#[derive(Debug)]
struct Handle {
    token: CancellationToken,
    /// The handle's parent token: cancelled before the term ended, it is the first cause.
    parent: CancellationToken,
    /// The first cause of the handle's cancellation, set by whichever came first.
    first: Arc<OnceLock<Interruption>>,
    /// The work it runs, given by [`named_work`].
    name: Option<Arc<str>>,
    /// Aborts the work, when it was started through
    /// [`Elector::run_if_leader`](crate::Elector::run_if_leader).
    abort: Option<AbortHandle>,
}

impl TermShared {
    pub(crate) fn new(id: TermId, epoch: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            id,
            epoch,
            state: Mutex::new(TermState::default()),
            drained: Notify::new(),
            end: watch::Sender::new(None),
        })
    }

    /// Resolves once no handle of the term is alive (at once if none is). Cancel-safe.
    pub(crate) async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().tokens.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// The names of the work that still holds a handle of the term (`unnamed` for a handle
    /// taken outside [`named_work`]), sorted, each once.
    pub(crate) fn running_work(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .lock()
            .tokens
            .values()
            .map(|handle| handle.name.as_deref().unwrap_or("unnamed").to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    pub(crate) fn id(&self) -> TermId {
        self.id
    }

    /// Ends the term: records the cause (each handle keeps its first cause: a parent cancelled
    /// before now stays the cause), cancels every token handed out for it and wakes
    /// [`Term::ended`]. Idempotent. The handles stay counted until they are dropped, so a
    /// graceful stop can await them.
    pub(crate) fn end(&self, cause: TermEndCause) {
        let tokens: Vec<CancellationToken> = {
            let mut state = self.lock();
            if state.ended.is_some() {
                return;
            }
            state.ended = Some(cause);
            state
                .tokens
                .values()
                .map(|handle| {
                    handle.first.get_or_init(|| {
                        if handle.parent.is_cancelled() {
                            Interruption::ParentCancelled
                        } else {
                            Interruption::Term(cause)
                        }
                    });
                    handle.token.clone()
                })
                .collect()
        };
        self.end.send_replace(Some(cause));
        for token in tokens {
            token.cancel();
        }
    }

    /// A [`Term`] whose token is a child of `parent`, or `None` when the term already ended.
    pub(crate) fn handle(self: &Arc<Self>, parent: &CancellationToken) -> Option<Term> {
        let token = parent.child_token();
        let first = Arc::new(OnceLock::new());
        let key = {
            let mut state = self.lock();
            if state.ended.is_some() {
                return None;
            }
            let key = state.next_key;
            state.next_key += 1;
            let name = WORK_NAME.try_with(Arc::clone).ok();
            state.tokens.insert(
                key,
                Handle {
                    token: token.clone(),
                    parent: parent.clone(),
                    first: Arc::clone(&first),
                    name,
                    abort: None,
                },
            );
            key
        };
        Some(Term {
            shared: Arc::clone(self),
            token,
            parent: parent.clone(),
            first,
            key,
        })
    }

    /// Why the term ended, once it did.
    pub(crate) fn ended(&self) -> Option<TermEndCause> {
        self.lock().ended
    }

    /// Aborts the work of every live handle that can be aborted; returns how many were.
    pub(crate) fn abort_work(&self) -> usize {
        let handles: Vec<AbortHandle> = self
            .lock()
            .tokens
            .values()
            .filter_map(|handle| handle.abort.clone())
            .collect();
        for handle in &handles {
            handle.abort();
        }
        handles.len()
    }

    /// How many handles of the term are alive.
    pub(crate) fn live_handles(&self) -> usize {
        self.lock().tokens.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TermState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A handle on the current term of leadership: the spec's `Term(parent)` context.
///
/// Its [`token`](Self::token) is cancelled when the parent token is cancelled or the term ends
/// (leadership lost, or the election stopped), whichever comes first; [`cause`](Self::cause)
/// then tells which, and [`ended`](Self::ended) waits for the term's own end. Dropping the
/// `Term` cancels its token (the spec's "always call the cancel function" is automatic) and
/// forgets it, so long terms do not accumulate handles.
///
/// ```no_run
/// use plexsphere_leader::{Elector, TermEndCause, leadership::Interruption};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example(elector: Elector, shutdown: CancellationToken) {
/// if let Some(term) = elector.term(&shutdown) {
///     // A self-paced loop: work until the term's token is cancelled.
///     term.cancelled().await;
///     match term.cause() {
///         Some(Interruption::Term(TermEndCause::Lost(reason))) => eprintln!("lost: {reason}"),
///         Some(Interruption::ParentCancelled) => eprintln!("shutting down"),
///         other => eprintln!("ended: {other:?}"),
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Term {
    shared: Arc<TermShared>,
    token: CancellationToken,
    parent: CancellationToken,
    first: Arc<OnceLock<Interruption>>,
    key: u64,
}

impl Term {
    /// The term's identifier: strictly increasing over the life of the elector.
    pub fn id(&self) -> TermId {
        self.shared.id
    }

    /// The term's fencing epoch when fencing is on ([`Config::fencing`](crate::Config::fencing)):
    /// strictly greater than the epoch of every earlier term of any replica, across restarts,
    /// crashes and failover to a synchronous standby. Pass it to
    /// [`fencing::check`](crate::fencing::check) inside the transaction of a fenced write.
    pub fn epoch(&self) -> Option<u64> {
        self.shared.epoch
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

    /// Why the token was cancelled, or `None` while it is not. The first cause is kept, as
    /// Go's `context.Cause` does: the end of the term ([`Interruption::Term`], with
    /// [`TermEndCause::Lost`] after a loss: the spec's `ErrLeadershipLost`) when it came first,
    /// [`Interruption::ParentCancelled`] when the parent was cancelled before the term ended.
    pub fn cause(&self) -> Option<Interruption> {
        if let Some(first) = self.first.get() {
            return Some(*first);
        }
        if self.parent.is_cancelled() {
            return Some(*self.first.get_or_init(|| Interruption::ParentCancelled));
        }
        None
    }

    /// Waits until the term itself ends (not merely the parent) and returns why: lost (with
    /// its [`LossReason`](crate::LossReason)), stopped, or resigned. Resolves at once for a term
    /// that already ended. Cancel-safe.
    pub async fn ended(&self) -> TermEndCause {
        let mut end = self.shared.end.subscribe();
        loop {
            if let Some(cause) = *end.borrow_and_update() {
                return cause;
            }
            // The sender lives in the shared state this `Term` holds: it is never dropped while
            // this waits, so `changed` only returns with a new value.
            if end.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Where the term stood: ended (with this handle's first cause) or live. A parent
    /// cancelled while the term holds leaves it live: the work's own result stands.
    pub(crate) fn status(&self) -> TermStatus {
        match self.shared.ended() {
            Some(_) => self.cause().map_or(TermStatus::Live, TermStatus::Ended),
            None => TermStatus::Live,
        }
    }

    /// Lets the work deadline abort the work this handle runs ([`crate::config::OnOverdue::Abort`]).
    pub(crate) fn abort_with(&self, abort: AbortHandle) {
        if let Some(handle) = self.shared.lock().tokens.get_mut(&self.key) {
            handle.abort = Some(abort);
        }
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        self.token.cancel();
        let drained = {
            let mut state = self.shared.lock();
            state.tokens.remove(&self.key);
            state.tokens.is_empty()
        };
        if drained {
            self.shared.drained.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_the_term_cancels_its_tokens_with_the_cause() {
        let shared = TermShared::new(TermId::new(1), None);
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        assert!(term.is_live());
        let lost = TermEndCause::Lost(plexsphere_leader_core::LossReason::CheckTimedOut);
        shared.end(lost);
        assert!(term.token().is_cancelled());
        assert_eq!(term.cause(), Some(Interruption::Term(lost)));
        assert!(!parent.is_cancelled());
    }

    #[test]
    fn a_cancelled_parent_cancels_the_term_token_with_parent_cancelled() {
        let shared = TermShared::new(TermId::new(1), None);
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        parent.cancel();
        assert!(term.token().is_cancelled());
        assert_eq!(term.cause(), Some(Interruption::ParentCancelled));
        assert_eq!(term.status(), TermStatus::Live, "the term itself holds");
    }

    #[test]
    fn the_first_cause_is_kept_whichever_came_first() {
        // The parent first, then the term's end (read only after both): the parent.
        let shared = TermShared::new(TermId::new(1), None);
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        parent.cancel();
        shared.end(TermEndCause::Stopped);
        assert_eq!(term.cause(), Some(Interruption::ParentCancelled));
        assert_eq!(
            term.status(),
            TermStatus::Ended(Interruption::ParentCancelled)
        );
        // The term's end first, then the parent: the term's end.
        let shared = TermShared::new(TermId::new(2), None);
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        shared.end(TermEndCause::Resigned);
        parent.cancel();
        assert_eq!(
            term.cause(),
            Some(Interruption::Term(TermEndCause::Resigned))
        );
    }

    #[tokio::test]
    async fn ended_waits_for_the_terms_own_end_not_the_parent() {
        let shared = TermShared::new(TermId::new(1), None);
        let parent = CancellationToken::new();
        let term = shared.handle(&parent).unwrap();
        parent.cancel();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), term.ended());
        assert!(
            waiting.await.is_err(),
            "a cancelled parent does not end the term"
        );
        let lost = TermEndCause::Lost(plexsphere_leader_core::LossReason::SessionEnded);
        let ender = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move { shared.end(lost) })
        };
        assert_eq!(term.ended().await, lost);
        ender.await.unwrap();
        assert_eq!(term.ended().await, lost, "at once once ended");
    }

    #[test]
    fn no_handle_after_the_end_and_dropped_handles_are_forgotten() {
        let shared = TermShared::new(TermId::new(1), None);
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

    #[tokio::test]
    async fn drained_waits_for_the_last_handle_and_names_the_running_work() {
        let shared = TermShared::new(TermId::new(1), Some(3));
        let parent = CancellationToken::new();
        shared.drained().await; // no handle: at once
        let first = named_work("sweep", async { shared.handle(&parent).unwrap() }).await;
        let second = shared.handle(&parent).unwrap();
        assert_eq!(first.epoch(), Some(3));
        assert_eq!(shared.running_work(), vec!["sweep", "unnamed"]);
        shared.end(TermEndCause::Stopped);
        let waiter = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move { shared.drained().await })
        };
        tokio::task::yield_now().await;
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert_eq!(shared.running_work(), vec!["unnamed"]);
        drop(second);
        waiter.await.unwrap();
    }
}
