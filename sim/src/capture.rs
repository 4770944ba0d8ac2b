//! Captures the adapter's `tracing` events (target `plexsphere_leader`) into the run's trace,
//! stamped with the simulated time of the step and the replica whose future emitted them.
//!
//! The subscriber is installed per run with `tracing::subscriber::with_default`, so runs on
//! other threads are unaffected; everything it records goes to thread-local storage.

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// One captured event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Captured {
    pub(crate) at: Duration,
    pub(crate) replica: Option<usize>,
    pub(crate) level: Level,
    pub(crate) text: String,
}

thread_local! {
    static CAPTURED: RefCell<Vec<Captured>> = const { RefCell::new(Vec::new()) };
    static REPLICA: Cell<Option<usize>> = const { Cell::new(None) };
    static NOW: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Sets the simulated time that events emitted from now on are stamped with.
pub(crate) fn set_now(now: Duration) {
    NOW.with(|cell| cell.set(now));
}

/// Takes every event captured so far on this thread.
pub(crate) fn drain() -> Vec<Captured> {
    CAPTURED.with(|captured| std::mem::take(&mut *captured.borrow_mut()))
}

/// The subscriber: keeps the adapter's INFO, WARN and ERROR events, and nothing else (every
/// other callsite is disabled once and for all, so turmoil's own tracing costs nothing).
#[derive(Debug, Default)]
pub(crate) struct Capture;

impl Capture {
    fn wants(metadata: &Metadata<'_>) -> bool {
        metadata.is_event()
            && metadata.target().starts_with("plexsphere_leader")
            && *metadata.level() <= Level::INFO
    }
}

impl Subscriber for Capture {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if Self::wants(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        Self::wants(metadata)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut visitor = Text::default();
        event.record(&mut visitor);
        let captured = Captured {
            at: NOW.with(Cell::get),
            replica: REPLICA.with(Cell::get),
            level: *event.metadata().level(),
            text: visitor.finish(),
        };
        CAPTURED.with(|all| all.borrow_mut().push(captured));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Renders an event as its message followed by its other fields, `name=value` (except the
/// `cause`, which the adapter's messages already end with, and the constant `interval`).
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Text {
    fn finish(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else {
            format!("{} [{}]", self.message, self.fields.trim_start())
        }
    }
}

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else if !matches!(field.name(), "interval" | "cause") {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else if !matches!(field.name(), "interval" | "cause") {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

/// A future that marks the events it emits (and the ones its drop emits, as when turmoil
/// crashes its host) as coming from `replica`.
pub(crate) struct Tagged<F> {
    replica: usize,
    inner: Option<Pin<Box<F>>>,
}

impl<F> Tagged<F> {
    pub(crate) fn new(replica: usize, inner: F) -> Self {
        Self {
            replica,
            inner: Some(Box::pin(inner)),
        }
    }
}

impl<F: Future> Future for Tagged<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _tag = TagGuard::enter(self.replica);
        match self.inner.as_mut() {
            Some(inner) => inner.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl<F> Drop for Tagged<F> {
    fn drop(&mut self) {
        let _tag = TagGuard::enter(self.replica);
        drop(self.inner.take());
    }
}

struct TagGuard(Option<usize>);

impl TagGuard {
    fn enter(replica: usize) -> Self {
        Self(REPLICA.with(|cell| cell.replace(Some(replica))))
    }
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        REPLICA.with(|cell| cell.set(self.0));
    }
}
