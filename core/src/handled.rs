//! What became of an input to either machine: applied, or ignored and why; and the refusal of a
//! second start.

use std::fmt;

/// What became of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The input changed the election (possibly queuing actions).
    Applied,
    /// The input was ignored; nothing changed and no action was queued.
    Ignored(Ignored),
}

/// Why an input was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// The election is not running.
    NotRunning,
    /// The completion names a connection the election no longer waits on (it timed out, was
    /// closed, or belongs to an earlier check).
    StaleConnection,
    /// The completion names the awaited connection but answers another operation than the one
    /// in flight (for example `PingAnswered` while the grant statement runs).
    Unexpected,
    /// The election is already stopping; a second stop request changes nothing. Also a resign
    /// request while the run's last release is in progress (a resign during a release that
    /// leaves the replica a standby is applied: its hold-off follows the release).
    AlreadyStopping,
    /// [`Control::SetEligible`](crate::Control::SetEligible) with the setting the election
    /// already has.
    Unchanged,
}

/// [`Election::start`](crate::Election::start) was called while a run is in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyRunning;

impl fmt::Display for AlreadyRunning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the election is already running")
    }
}

impl std::error::Error for AlreadyRunning {}
