//! The every-replica ticker: the spec's loops that "stay on every replica", ticked on a fixed
//! cadence and ungated.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::panic::{CatchPanic, Caught};
use super::{BoxError, PassFn};

/// Ticks a pass on a fixed cadence on every replica, ungated: the spec's every-replica loops
/// (`capacity-collector`, the consume loops, `sse-relay`, …). A part only one replica may do
/// goes behind a [`Gate`](super::Gate) inside the pass.
///
/// - The first tick comes at once when [`run`](Self::run) starts, then one every period; missed
///   ticks are skipped (no burst after a long pass or a pause).
/// - The pass gets the shutdown token; a pass still running at shutdown is dropped, and its
///   outcome is not logged.
/// - A failed or panicking pass is a failed tick: it writes WARN `background loop tick failed:
///   <cause>` (fields `loop`, `cause`; a panic also ERROR `background loop tick panicked`), and
///   the loop keeps ticking. [`run`](Self::run) never fails by itself.
pub struct EveryReplica {
    name: Arc<str>,
    period: Duration,
    pass: PassFn,
}

impl Clone for EveryReplica {
    fn clone(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            period: self.period,
            pass: Arc::clone(&self.pass),
        }
    }
}

impl EveryReplica {
    /// A ticker of the loop `name` that runs `pass` every `period` on this replica. The period
    /// is at least 1 ms.
    pub fn new(name: &str, period: Duration, pass: PassFn) -> Self {
        Self {
            name: name.into(),
            period: period.max(Duration::from_millis(1)),
            pass,
        }
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tick period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Ticks until `shutdown` is cancelled, then returns `Ok(())`.
    ///
    /// # Errors
    /// None of its own; the signature fits [`Supervisor::add`](crate::Supervisor::add).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BoxError> {
        let mut every = tokio::time::interval(self.period);
        every.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                _ = every.tick() => {}
            }
            let pass = CatchPanic::new((self.pass)(shutdown.clone()));
            let outcome = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                outcome = pass => outcome,
            };
            match outcome {
                Ok(Ok(())) => {}
                // The pass saw the service's own shutdown: not a failed tick.
                Ok(Err(_)) if shutdown.is_cancelled() => return Ok(()),
                Ok(Err(error)) => self.log_failure(&error.to_string()),
                Err(caught) => {
                    self.log_panic(&caught);
                    self.log_failure(&format!("tick panicked: {}", caught.value));
                }
            }
        }
    }

    fn log_failure(&self, cause: &str) {
        tracing::warn!(
            target: "plexsphere_leader",
            r#loop = %self.name,
            cause = %cause,
            "background loop tick failed: {cause}"
        );
    }

    fn log_panic(&self, caught: &Caught) {
        tracing::error!(
            target: "plexsphere_leader",
            r#loop = %self.name,
            panic = %caught.value,
            stack = %caught.stack,
            "background loop tick panicked"
        );
    }
}

impl fmt::Debug for EveryReplica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EveryReplica")
            .field("name", &self.name)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}
