//! The check interval and the durations derived from it.

use std::fmt;
use std::time::Duration;

/// The check interval used when none is configured (the spec's `DefaultCheckInterval`).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest check interval accepted: 50 ms.
///
/// Every check must be answered within one interval, and a standby's check may have to open a
/// connection first (a backend fork and authentication: a few milliseconds on a local server,
/// more over a network or TLS). A check that misses its deadline has an unknown outcome, so its
/// connection is discarded and the next check opens another: below this, on a loaded server,
/// checks miss their deadline, nobody leads steadily, and every replica reconnects at the
/// interval's rate. Measured with the demo on a local PostgreSQL 15, 2 cores under load
/// (`timeout -s INT 6 cargo run --release --example demo -- --check-interval 5ms`, and the
/// sessions counted in `pg_stat_database`): at 2 ms 4,568 WARN lines and 956 sessions in 6 s,
/// at 5 ms 281 and 230, at 10 and 20 ms leadership still lost to missed deadlines, at 50 ms one
/// term and no WARN in 10 s.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// The longest check interval accepted: four of them must fit PostgreSQL's
/// `idle_session_timeout`, an `int4` count of milliseconds (about 6.2 days).
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(i32::MAX as u64 / 4);

/// How long a graceful release may wait for `pg_advisory_unlock` (the spec's 2-second context).
pub const UNLOCK_BUDGET: Duration = Duration::from_secs(2);

/// How many check intervals an idle lock session may live: the orphan bound.
pub const IDLE_SESSION_TIMEOUT_INTERVALS: u32 = 4;

/// A validated check interval: how often a standby tries the lock and the leader verifies it, and
/// how long each of those checks may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckInterval(Duration);

impl CheckInterval {
    /// Validates `interval`. Zero means [`DEFAULT_CHECK_INTERVAL`], as in the spec (Rust has no
    /// negative `Duration`, the spec's other way of asking for the default).
    ///
    /// # Errors
    /// [`IntervalError::TooShort`] below [`MIN_CHECK_INTERVAL`], [`IntervalError::TooLong`] above
    /// [`MAX_CHECK_INTERVAL`].
    pub fn new(interval: Duration) -> Result<Self, IntervalError> {
        if interval.is_zero() {
            return Ok(Self::default());
        }
        if interval < MIN_CHECK_INTERVAL {
            return Err(IntervalError::TooShort { given: interval });
        }
        if interval > MAX_CHECK_INTERVAL {
            return Err(IntervalError::TooLong { given: interval });
        }
        Ok(Self(interval))
    }

    /// The interval itself.
    pub const fn get(self) -> Duration {
        self.0
    }

    /// The `idle_session_timeout` set on the lock session: four intervals, rounded up to the whole
    /// millisecond so the bound is never shorter than four intervals. Always at least 200 and at
    /// most `i32::MAX`.
    pub fn idle_session_timeout_millis(self) -> u32 {
        let nanos = self.0.as_nanos() * u128::from(IDLE_SESSION_TIMEOUT_INTERVALS);
        let millis = nanos.div_ceil(1_000_000);
        // MAX_CHECK_INTERVAL keeps four intervals within i32::MAX milliseconds.
        u32::try_from(millis).unwrap_or(i32::MAX as u32)
    }

    /// The hold-off of a resign when none is configured, for either mode: two intervals,
    /// time for another replica's check (the next survey, with shards) to take over.
    pub fn default_hold_off(self) -> Duration {
        self.0 * 2
    }

    /// Half the interval in whole milliseconds, rounded up, at least 1 and at most `i32::MAX`:
    /// the `lock_timeout` of the fencing epoch's advance, so that the server ends a wait for the
    /// fence row before the election's own deadline of one interval gives up on the answer.
    pub fn half_millis(self) -> u32 {
        timeout_millis(self.0 / 2)
    }

    /// After how many whole seconds without a leader's check a lock found on a pooled session is
    /// taken for stranded: the idle timeout rounded up to the second, plus one second for the
    /// truncation of the two server timestamps compared. A live leader checks every interval,
    /// and the server itself ends a direct session idle that long.
    pub fn stranded_after_secs(self) -> u64 {
        u64::from(self.idle_session_timeout_millis()).div_ceil(1000) + 1
    }

    /// [`Self::idle_session_timeout_millis`] as a `Duration`.
    pub fn idle_session_timeout(self) -> Duration {
        Duration::from_millis(u64::from(self.idle_session_timeout_millis()))
    }
}

/// `duration` as a PostgreSQL timeout setting takes it: whole milliseconds, rounded up (never
/// shorter than asked), at least 1 (0 would disable the timeout), at most `i32::MAX`.
pub(crate) fn timeout_millis(duration: Duration) -> u32 {
    let millis = duration.as_nanos().div_ceil(1_000_000).max(1);
    u32::try_from(millis).map_or(i32::MAX as u32, |ms| ms.min(i32::MAX as u32))
}

impl Default for CheckInterval {
    fn default() -> Self {
        Self(DEFAULT_CHECK_INTERVAL)
    }
}

impl fmt::Display for CheckInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A check interval that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IntervalError {
    /// The interval is shorter than [`MIN_CHECK_INTERVAL`].
    TooShort {
        /// The interval asked for.
        given: Duration,
    },
    /// Four intervals exceed what `idle_session_timeout` can hold ([`MAX_CHECK_INTERVAL`]).
    TooLong {
        /// The interval asked for.
        given: Duration,
    },
}

impl fmt::Display for IntervalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { given } => write!(
                f,
                "check_interval {given:?} is below the minimum of {MIN_CHECK_INTERVAL:?} (each \
                 check, which may open a connection, must be answered within one interval)"
            ),
            Self::TooLong { given } => write!(
                f,
                "check_interval {given:?} is above the maximum of {MAX_CHECK_INTERVAL:?} \
                 (4 intervals must fit idle_session_timeout, at most {} ms)",
                i32::MAX
            ),
        }
    }
}

impl std::error::Error for IntervalError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_uses_the_default_of_five_seconds() {
        assert_eq!(
            CheckInterval::new(Duration::ZERO).unwrap().get(),
            Duration::from_secs(5)
        );
        assert_eq!(CheckInterval::default().get(), DEFAULT_CHECK_INTERVAL);
    }

    #[test]
    fn the_default_hold_off_is_two_intervals() {
        let interval = CheckInterval::new(Duration::from_millis(300)).unwrap();
        assert_eq!(interval.default_hold_off(), Duration::from_millis(600));
    }

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(
            CheckInterval::new(MIN_CHECK_INTERVAL).unwrap().get(),
            MIN_CHECK_INTERVAL
        );
        assert_eq!(
            CheckInterval::new(MAX_CHECK_INTERVAL).unwrap().get(),
            MAX_CHECK_INTERVAL
        );
    }

    #[test]
    fn below_fifty_milliseconds_is_rejected_and_the_minimum_named() {
        for given in [
            Duration::from_nanos(1),
            Duration::from_millis(1),
            MIN_CHECK_INTERVAL - Duration::from_nanos(1),
        ] {
            let err = CheckInterval::new(given).unwrap_err();
            assert_eq!(err, IntervalError::TooShort { given });
            assert!(err.to_string().contains("check_interval"));
            assert!(err.to_string().contains("minimum of 50ms"), "{err}");
        }
        assert_eq!(MIN_CHECK_INTERVAL, Duration::from_millis(50));
    }

    #[test]
    fn above_the_idle_session_timeout_range_is_rejected_and_named() {
        let given = MAX_CHECK_INTERVAL + Duration::from_millis(1);
        let err = CheckInterval::new(given).unwrap_err();
        assert_eq!(err, IntervalError::TooLong { given });
        assert!(err.to_string().contains("idle_session_timeout"));
    }

    #[test]
    fn idle_session_timeout_is_four_intervals_rounded_up_to_the_millisecond() {
        let of = |d| CheckInterval::new(d).unwrap().idle_session_timeout_millis();
        assert_eq!(of(Duration::from_secs(5)), 20_000);
        assert_eq!(of(Duration::from_millis(200)), 800);
        assert_eq!(of(Duration::from_micros(50_200)), 201);
        assert_eq!(of(MIN_CHECK_INTERVAL), 200);
        assert_eq!(of(MAX_CHECK_INTERVAL), (i32::MAX as u32 / 4) * 4);
        assert!(u64::from(of(MAX_CHECK_INTERVAL)) <= i32::MAX as u64);
        let interval = CheckInterval::new(Duration::from_micros(50_200)).unwrap();
        assert_eq!(interval.idle_session_timeout(), Duration::from_millis(201));
        assert_eq!(interval.to_string(), "50.2ms");
    }

    #[test]
    fn the_advances_lock_timeout_is_half_an_interval_rounded_up_and_never_zero() {
        let of = |d| CheckInterval::new(d).unwrap().half_millis();
        assert_eq!(of(Duration::from_secs(5)), 2_500);
        assert_eq!(of(Duration::from_millis(200)), 100);
        assert_eq!(of(Duration::from_micros(50_200)), 26);
        assert_eq!(of(MIN_CHECK_INTERVAL), 25);
        assert!(u64::from(of(MAX_CHECK_INTERVAL)) <= i32::MAX as u64);
    }
}
