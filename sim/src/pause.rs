//! A pause of a replica's process (SIGSTOP, a frozen VM, a stalled runtime): its election and
//! its service make no progress while the simulation's clock, and the server's, run on.
//!
//! Turmoil cannot suspend a host, so the replica's software runs its election and its service
//! behind a [`Gate`]: while the gate is paused, a gated future is not polled (its timers may
//! fire; it looks at them only once the gate opens), and the nemesis holds the replica's links
//! so nothing it sent or was sent moves meanwhile (delivered on release, as a paused process's
//! socket buffers would). When the gate opens the future runs on from where it stopped: its
//! deadlines have passed, as on a real resume.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Whether a replica's process is paused, shared by its gated futures and the harness.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    paused: Cell<bool>,
    waiting: RefCell<Vec<Waker>>,
}

impl Gate {
    /// Stops every gated future at its next poll.
    pub(crate) fn pause(&self) {
        self.paused.set(true);
    }

    /// Lets the gated futures run on, and wakes those that waited.
    pub(crate) fn resume(&self) {
        self.paused.set(false);
        for waker in self.waiting.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Whether the process is paused.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.get()
    }

    /// `future`, run only while the gate is open.
    pub(crate) fn gated<F: Future>(self: &Rc<Self>, future: F) -> Gated<F> {
        Gated {
            gate: Rc::clone(self),
            future: Box::pin(future),
        }
    }
}

/// A future that makes progress only while its [`Gate`] is open.
pub(crate) struct Gated<F> {
    gate: Rc<Gate>,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.gate.is_paused() {
            self.gate.waiting.borrow_mut().push(cx.waker().clone());
            return Poll::Pending;
        }
        self.future.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_paused_gate_holds_its_future_and_resuming_runs_it_on() {
        let gate = Rc::new(Gate::default());
        let ran = Rc::new(Cell::new(0));
        let counted = Rc::clone(&ran);
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                gate.pause();
                let task = tokio::task::spawn_local(gate.gated(async move {
                    counted.set(1);
                }));
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                assert_eq!(ran.get(), 0, "nothing runs while paused");
                gate.resume();
                task.await.unwrap();
                assert_eq!(ran.get(), 1);
            })
            .await;
    }
}
