//! The operator's requests (resign, eligibility) on their way from an elector's handles to the
//! task running it: one queue, whichever mechanism's events it carries.

use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// Requests queued by the handles, taken by the driver in order; a [`Notify`] wakes the driver.
pub(crate) struct OperatorQueue<E> {
    requests: Mutex<Vec<E>>,
    queued: Notify,
}

impl<E> OperatorQueue<E> {
    pub(crate) fn new() -> Self {
        Self {
            requests: Mutex::new(Vec::new()),
            queued: Notify::new(),
        }
    }

    /// Queues `request` and wakes the driver. Call it with the election locked, so that the
    /// driver, which takes the queue after every input and once more as its run ends, cannot
    /// finish in between unnoticed.
    pub(crate) fn push(&self, request: E) {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request);
        self.queued.notify_one();
    }

    /// Resolves when a request may be queued (a permit is kept if none waits). Cancel-safe.
    pub(crate) async fn queued(&self) {
        self.queued.notified().await;
    }

    /// Takes the queued requests, oldest first.
    pub(crate) fn take(&self) -> Vec<E> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
