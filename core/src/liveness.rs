//! The stuck-leader verdict: a leader whose election is no longer driven.

use std::fmt;
use std::time::{Duration, Instant};

/// A leader is stuck once its last proof of the lock (the grant, then each check that proved
/// it) is older than this many check intervals. A driven leader never gets there: it checks
/// every interval, and a check that does not answer within one interval demotes it.
pub const STUCK_AFTER_INTERVALS: u32 = 2;

/// [`Election::stuck`](crate::Election::stuck): the replica leads, but its last proof of the
/// lock is older than [`STUCK_AFTER_INTERVALS`] check intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StuckLeader {
    /// How long ago the last successful check (or the grant) was.
    pub since_last_check: Duration,
    /// The bound it exceeds: [`STUCK_AFTER_INTERVALS`] × the check interval.
    pub bound: Duration,
}

impl StuckLeader {
    /// The verdict at `now` on a leader last verified at `verified_at`, with check interval
    /// `interval`: stuck only strictly past the bound.
    pub(crate) fn verdict(
        verified_at: Instant,
        now: Instant,
        interval: Duration,
    ) -> Result<(), Self> {
        let bound = interval.saturating_mul(STUCK_AFTER_INTERVALS);
        let since_last_check = now.saturating_duration_since(verified_at);
        if since_last_check > bound {
            Err(Self {
                since_last_check,
                bound,
            })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for StuckLeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the replica leads, but its last successful check was {:?} ago, more than {:?} \
             ({STUCK_AFTER_INTERVALS} check intervals): the election is not being driven (a \
             blocked runtime or thread, or a run future that is no longer polled)",
            self.since_last_check, self.bound
        )
    }
}

impl std::error::Error for StuckLeader {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_stuck_only_strictly_past_two_intervals() {
        let interval = Duration::from_millis(100);
        let start = Instant::now();
        assert_eq!(StuckLeader::verdict(start, start, interval), Ok(()));
        assert_eq!(
            StuckLeader::verdict(start, start + interval * 2, interval),
            Ok(())
        );
        let stuck = StuckLeader::verdict(
            start,
            start + interval * 2 + Duration::from_millis(1),
            interval,
        )
        .unwrap_err();
        assert_eq!(stuck.bound, interval * 2);
        assert_eq!(stuck.since_last_check, Duration::from_millis(201));
        assert!(stuck.to_string().contains("201ms ago, more than 200ms"));
        // An instant before the proof (a clock read out of order) is not stuck.
        assert_eq!(
            StuckLeader::verdict(start + interval, start, interval),
            Ok(())
        );
    }
}
