//! The operator's requests (resign, eligibility) on their way from an elector's handles to the
//! task running it: one queue, whichever mode's events it carries, and one way to make
//! each request, whichever machine it goes to (the machine says what the request is and
//! whether a run takes it).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use plexsphere_leader_core::{Control, Machine};
use tokio::sync::Notify;

use crate::leadership::Resignation;

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

    /// Asks the running election `machine` to resign for `hold_off`: queued for its driver,
    /// with the election still locked; [`Resignation::NotRunning`] when no run is in progress
    /// (there is nothing to give up).
    pub(crate) fn resign<M>(&self, machine: MutexGuard<'_, M>, hold_off: Duration) -> Resignation
    where
        M: Machine<Event = E>,
    {
        if !machine.is_running() {
            return Resignation::NotRunning;
        }
        self.push(M::control(Control::Resign { hold_off }));
        drop(machine);
        Resignation::Requested
    }

    /// Makes the replica of `machine` eligible or not: queued for the driver while a run is in
    /// progress, else applied at once (the machine keeps the setting for the next run).
    pub(crate) fn set_eligible<M>(&self, mut machine: MutexGuard<'_, M>, eligible: bool)
    where
        M: Machine<Event = E>,
    {
        let request = M::control(Control::SetEligible { eligible });
        if machine.is_running() {
            self.push(request);
        } else {
            let _ = machine.handle_event(crate::clock::now(), request);
        }
    }

    /// Takes the queued requests, oldest first.
    pub(crate) fn take(&self) -> Vec<E> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
