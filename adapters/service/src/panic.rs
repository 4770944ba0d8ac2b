//! Catching a panic of a pass or a worker as a value, with the stack where it happened.
//!
//! Each poll runs under [`std::panic::catch_unwind`]: a panic ends the pass or the worker, never
//! the task or the process. Where it panicked (the `stack` field of the loop's ERROR line)
//! needs a panic hook, and the crate installs none on its own: a service that wants the stack
//! calls [`capture_panic_stacks`] once at start-up. That hook is chained to the hook that was
//! there before: while a `CatchPanic` polls its future, it captures a backtrace
//! (`Backtrace::force_capture`) and the panic's location into a thread-local, and does not call
//! the previous hook (the loop logs the panic itself, at ERROR with the `loop`, `panic` and
//! `stack` fields); outside a `CatchPanic` the previous hook runs as before. Without it, the
//! previous hook reports the panic as usual (by default to stderr, with its location) and
//! `stack` says how to capture it.

use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use plexsphere_leader_core::readiness::panic_value;

thread_local! {
    /// Whether a `CatchPanic` is polling on this thread.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// The stack of the last panic caught on this thread.
    static STACK: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// What a caught panic left: the payload as text and the stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caught {
    /// The payload (the spec's `<value>`).
    pub(crate) value: String,
    /// Where it panicked and the backtrace.
    pub(crate) stack: String,
}

impl Caught {
    /// Logs the panic of a tick of loop `name` at ERROR with the spec's text
    /// `background loop tick panicked` (fields `loop`, `panic`, `stack`).
    pub(crate) fn log(&self, name: &str) {
        tracing::error!(
            target: "plexsphere_leader",
            r#loop = %name,
            panic = %self.value,
            stack = %self.stack,
            "background loop tick panicked"
        );
    }
}

/// Polls a future, and turns a panic during a poll into `Err(Caught)`.
pub(crate) struct CatchPanic<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> CatchPanic<F> {
    pub(crate) fn new(future: F) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, Caught>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.inner.as_mut();
        let outer = CATCHING.with(|catching| catching.replace(true));
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx)));
        CATCHING.with(|catching| catching.set(outer));
        match polled {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => {
                let stack = STACK
                    .with(|stack| stack.borrow_mut().take())
                    .unwrap_or_else(|| NOT_CAPTURED.into());
                Poll::Ready(Err(Caught {
                    value: panic_value(payload.as_ref()),
                    stack,
                }))
            }
        }
    }
}

/// The `stack` of a caught panic when no capturing hook saw it.
const NOT_CAPTURED: &str = "<not captured: call plexsphere_leader_service::capture_panic_stacks() \
     at start-up, and install no panic hook after it>";

/// Installs, once per process, the panic hook that records where a pass or a worker panicked
/// (its location and a backtrace) for the loop's and the supervisor's ERROR line. Panics
/// outside the loops and workers go on to the hook installed before (the default one prints
/// them to stderr). Calling it again does nothing. Optional: without it the panics are still
/// caught and logged, without their stack.
pub fn capture_panic_stacks() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CATCHING.with(Cell::get) {
                let stack = render(info);
                STACK.with(|slot| *slot.borrow_mut() = Some(stack));
            } else {
                previous(info);
            }
        }));
    });
}

fn render(info: &PanicHookInfo<'_>) -> String {
    let location = info
        .location()
        .map_or_else(|| "<unknown location>".to_owned(), ToString::to_string);
    format!("panicked at {location}\n{}", Backtrace::force_capture())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_a_poll_becomes_a_value_with_its_location_and_stack() {
        capture_panic_stacks();
        let caught = CatchPanic::new(async {
            tokio::task::yield_now().await;
            panic!("bad row {}", 7);
        })
        .await
        .unwrap_err();
        assert_eq!(caught.value, "bad row 7");
        assert!(caught.stack.starts_with("panicked at "), "{}", caught.stack);
        assert!(caught.stack.contains("panic.rs"), "{}", caught.stack);
    }

    #[tokio::test]
    async fn a_future_that_completes_passes_its_output_through() {
        assert_eq!(CatchPanic::new(async { 5 }).await, Ok(5));
    }
}
