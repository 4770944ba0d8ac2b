//! The fixed-rate check schedule: checks fall due on a grid `origin + k × interval`.

use std::time::{Duration, Instant};

/// Check times of one run, on the grid `origin + k × interval`, `k ≥ 0`.
///
/// A grid time that passes while a check is still running is due at once when the check ends:
/// one pending tick, as Go's `time.Ticker` keeps. Any further missed grid times are dropped, so
/// a pause never causes a burst of checks, and the checks after it fall on the grid again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Schedule {
    origin: Instant,
    interval: Duration,
    /// The grid time of the check in progress, or of the last one.
    current: Instant,
}

impl Schedule {
    /// A schedule whose first check is due at `origin`.
    pub(crate) fn starting_at(origin: Instant, interval: Duration) -> Self {
        Self {
            origin,
            interval,
            current: origin,
        }
    }

    /// Records that a check begins at `now`: it stands for the latest grid time at or before
    /// `now` (the one it was due at, or the last one a pause skipped over).
    pub(crate) fn begin(&mut self, now: Instant) {
        self.current = self.grid_at_or_before(now);
    }

    /// When the next check is due, for a check that completed at `now`: the grid time after the
    /// current check's own, or `now` itself when that grid time already passed while the check
    /// ran (the pending tick).
    pub(crate) fn next_after(&self, now: Instant) -> Instant {
        (self.current + self.interval).max(now)
    }

    /// The grid time of the check in progress, or of the last one.
    pub(crate) fn current(&self) -> Instant {
        self.current
    }

    /// The first grid time at or after `t`.
    pub(crate) fn first_at_or_after(&self, t: Instant) -> Instant {
        let before = self.grid_at_or_before(t);
        if before >= t {
            before
        } else {
            before + self.interval
        }
    }

    /// The last grid time at or before `t`.
    fn grid_at_or_before(&self, t: Instant) -> Instant {
        let Some(elapsed) = t.checked_duration_since(self.origin) else {
            return self.origin;
        };
        let steps = elapsed.as_nanos() / self.interval.as_nanos();
        self.origin + nanos(steps * self.interval.as_nanos())
    }
}

/// A `Duration` of `total` nanoseconds (saturating far beyond any real instant range).
fn nanos(total: u128) -> Duration {
    const PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(total / PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below one billion, which always fits.
    Duration::new(secs, (total % PER_SEC) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_secs(5);

    #[test]
    fn a_check_that_completes_early_waits_for_the_next_grid_time() {
        let t0 = Instant::now();
        let schedule = Schedule::starting_at(t0, I);
        assert_eq!(schedule.next_after(t0 + Duration::from_millis(3)), t0 + I);
    }

    #[test]
    fn the_first_grid_time_at_or_after_an_instant() {
        let t0 = Instant::now();
        let schedule = Schedule::starting_at(t0, I);
        assert_eq!(schedule.first_at_or_after(t0 + I), t0 + I);
        assert_eq!(
            schedule.first_at_or_after(t0 + I + Duration::from_nanos(1)),
            t0 + 2 * I
        );
        assert_eq!(schedule.first_at_or_after(t0), t0);
    }

    #[test]
    fn a_check_that_completes_on_a_grid_time_is_followed_at_that_time() {
        let t0 = Instant::now();
        let schedule = Schedule::starting_at(t0, I);
        assert_eq!(schedule.next_after(t0 + I), t0 + I);
    }

    #[test]
    fn a_check_that_overran_its_next_grid_time_is_followed_at_once_then_on_the_grid() {
        let t0 = Instant::now();
        let mut schedule = Schedule::starting_at(t0, I);
        let overran = t0 + I + Duration::from_millis(3);
        assert_eq!(
            schedule.next_after(overran),
            overran,
            "the pending tick runs at once"
        );
        schedule.begin(overran);
        assert_eq!(
            schedule.next_after(overran + Duration::from_millis(5)),
            t0 + I * 2
        );
    }

    #[test]
    fn missed_grid_times_are_dropped_without_a_burst() {
        let t0 = Instant::now();
        let mut schedule = Schedule::starting_at(t0, I);
        let late = t0 + I * 7 + Duration::from_millis(1);
        schedule.begin(late);
        assert_eq!(
            schedule.next_after(late + Duration::from_millis(2)),
            t0 + I * 8
        );
    }

    #[test]
    fn the_next_check_is_strictly_after_the_current_grid_time() {
        let t0 = Instant::now();
        let mut schedule = Schedule::starting_at(t0, I);
        schedule.begin(t0 + I * 2);
        assert_eq!(schedule.next_after(t0 + I * 2), t0 + I * 3);
    }

    #[test]
    fn sub_millisecond_intervals_stay_on_the_grid() {
        let t0 = Instant::now();
        let interval = Duration::from_nanos(1_000_333);
        let mut schedule = Schedule::starting_at(t0, interval);
        schedule.begin(t0 + Duration::from_secs(10));
        let next = schedule.next_after(t0 + Duration::from_secs(10));
        let elapsed = (next - t0).as_nanos();
        assert_eq!(elapsed % interval.as_nanos(), 0);
        assert!(next > t0 + Duration::from_secs(10));
        assert!(next <= t0 + Duration::from_secs(10) + interval);
    }
}
