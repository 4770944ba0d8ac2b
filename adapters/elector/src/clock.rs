//! The clocks of the adapter: tokio's, for what the adapter measures, and the election's
//! [`Clock`], on which the core's instants and deadlines run.

use std::fmt;
use std::time::Instant;

/// The current time on tokio's clock, so that paused time and the simulation's clock apply:
/// what the adapter measures for itself (check latencies, the published leadership's instants,
/// the pacing of failure logs).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The wall-clock time, for instants shown to people (when a shard's term began or ended).
pub(crate) fn wall_now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

/// The monotonic clock an [`Elector`](crate::Elector)'s election runs on: every instant its
/// core is given (answers, timers, [`liveness`](crate::Elector::liveness)) is a reading of it,
/// and every deadline the core asks for is a reading the driver sleeps until.
///
/// The default, [`TokioClock`], is tokio's clock. Another clock is a seam for tests: a clock
/// whose rate differs from tokio's shows what the lease's trust window
/// ([`Config::lease`](crate::Config::lease)) does when the replica's clock runs fast or slow.
/// An implementation must be monotonic and must reach every reading it returns from
/// [`Clock::tokio_instant`] by that instant of tokio's clock (or the driver wakes before the
/// deadline is due and sleeps on it again).
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// This clock's reading now.
    fn now(&self) -> Instant;

    /// The instant of tokio's clock at which this clock reads `reading` (or later).
    fn tokio_instant(&self, reading: Instant) -> tokio::time::Instant;
}

/// Tokio's clock (`tokio::time::Instant` in std form): the default [`Clock`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        now()
    }

    fn tokio_instant(&self, reading: Instant) -> tokio::time::Instant {
        tokio::time::Instant::from_std(reading)
    }
}
