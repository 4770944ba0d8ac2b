//! Catching a panic of a pass or a worker as a value, with the stack where it happened.
//!
//! The stack comes from a process-wide panic hook, installed once by the first [`CatchPanic`]
//! and chained to the hook that was there before. While a `CatchPanic` polls its future, the
//! hook captures a backtrace (`Backtrace::force_capture`) and the panic's location into a
//! thread-local, and does not call the previous hook: the loop logs the panic itself, at ERROR
//! with the `loop`, `panic` and `stack` fields. Outside a `CatchPanic` the previous hook runs as
//! before. When another hook replaced ours later, `stack` says it was not captured.

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

/// Polls a future, and turns a panic during a poll into `Err(Caught)`.
pub(crate) struct CatchPanic<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> CatchPanic<F> {
    pub(crate) fn new(future: F) -> Self {
        install_hook();
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
                    .unwrap_or_else(|| "<not captured: another panic hook is installed>".into());
                Poll::Ready(Err(Caught {
                    value: panic_value(payload.as_ref()),
                    stack,
                }))
            }
        }
    }
}

fn install_hook() {
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
