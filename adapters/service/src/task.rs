//! What passes and workers are: the types both the loops and the supervisor name.

use std::future::Future;
use std::pin::Pin;

/// The error a pass or a worker returns: any error, rendered with `Display` in logs and probes.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A boxed, sendable future: what passes and workers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
