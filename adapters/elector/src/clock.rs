//! The clock of the adapter.

/// The current time: the only place the adapter reads the clock, through tokio so that paused
/// time and the simulation's clock apply.
pub(crate) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
