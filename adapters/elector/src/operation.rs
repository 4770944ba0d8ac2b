//! An operation in flight on the lock session, as the driver runs it: a boxed future that
//! answers with the event to report to the core, the session an acquire borrowed, and the
//! mode's extra. Every mode's statements are written as these; the driver awaits them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::CheckError;
use crate::session::{LockSession, SessionSource};

/// What an operation in flight produces: the event to report, the session of an acquire, and
/// the mode's extra.
pub(crate) struct Completion<E, X> {
    pub(crate) event: E,
    pub(crate) acquired: Option<Box<dyn LockSession>>,
    pub(crate) extra: X,
}

impl<E, X: Default> Completion<E, X> {
    pub(crate) fn of(event: E) -> Self {
        Self {
            event,
            acquired: None,
            extra: X::default(),
        }
    }
}

/// An operation in flight on one connection, or a drain of an ended term's work.
pub(crate) type Operation<E, X> = Pin<Box<dyn Future<Output = Completion<E, X>> + Send>>;

/// Borrows a session from `source`: `acquired` when one came, `failed` with the cause
/// otherwise.
pub(crate) fn acquire<E: Send + 'static, X: Default + Send + 'static>(
    source: Arc<dyn SessionSource>,
    acquired: E,
    failed: impl FnOnce(CheckError) -> E + Send + 'static,
) -> Operation<E, X> {
    Box::pin(async move {
        match source.acquire().await {
            Ok(session) => Completion {
                acquired: Some(session),
                ..Completion::of(acquired)
            },
            Err(cause) => Completion::of(failed(cause)),
        }
    })
}
