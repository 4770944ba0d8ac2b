//! Leader-gated background loops: the spec's "Which loops run on the leader".
//!
//! Two launchers place a loop, and gates cover the parts of every-replica loops that only one
//! replica may do:
//!
//! - [`LeaderTicker`] (the spec's `runLeaderTicker`): ticks a pass on a fixed cadence and asks the
//!   election's Do ([`LeaderSource::run_if_leader`]) before each tick, so a standby runs no pass. It
//!   keeps the loop's readiness probe ([`LoopProbe`](crate::LoopProbe)) and catches a pass that
//!   panics as a failed tick.
//! - [`WhileLeader`] (the spec's `runWhileLeader`): hands a self-paced loop the token of one term
//!   and starts it again in the next term.
//! - [`EveryReplica`]: ticks a loop that stays on every replica (the spec's third table), ungated,
//!   on a fixed cadence.
//! - [`Gate`]: a predicate (usually the Elector's `is_leader`) that an every-replica loop asks
//!   before its gated part; a gate given no predicate stays open.
//!
//! [`Background`] collects the loops of a service, runs their boot passes (on every replica,
//! ungated) and starts them under a [`Supervisor`](crate::Supervisor). [`wire_background`] is
//! the boot step that wires every loop when there is an Elector and none when there is not.
//!
//! See `docs/loops.md` for which launcher to choose and how probes and gates behave.

mod background;
mod every_replica;
mod gate;
mod source;
mod ticker;
mod unfit;
mod while_leader;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use background::{
    Background, BootOutcome, BootReport, ELECTION_WORKER, Placement, Wired, WiringError,
    wire_background,
};
pub use every_replica::{EveryReplica, REPEATED_FAILURE_LOG_INTERVAL};
pub use gate::Gate;
pub use source::{LeaderSource, LeaderTerm};
pub use ticker::{LeaderTicker, TICKS_METRIC, TickMetrics};
pub use unfit::{UNFIT_PATIENCE_MAX_DOUBLINGS, UNFIT_PATIENCE_PERIODS};
pub use while_leader::{DEFAULT_STOP_GRACE, WhileLeader};

pub use crate::task::{BoxError, BoxFuture};

/// A pass of a loop: called with a token that is cancelled when the pass should stop (the
/// term's token on the leader, the shutdown token for a boot pass).
pub type PassFn = Arc<dyn Fn(CancellationToken) -> BoxFuture<Result<(), BoxError>> + Send + Sync>;

/// Boxes an async closure into a [`PassFn`].
pub fn pass_fn<F, Fut, E>(pass: F) -> PassFn
where
    F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    Arc::new(move |token| {
        let fut = pass(token);
        Box::pin(async move { fut.await.map_err(Into::into) })
    })
}
