//! The terms of the lease mechanism: how long a lease lasts on the server's clock and how long
//! its holder trusts it on its own.
//!
//! Behind a transaction-mode pooler a session advisory lock cannot be held (every statement may
//! run on another server session), so the election can hold a *lease* instead: a row of a lease
//! table naming the holder, with an expiry set by the server's clock (`now() + ttl`) and an
//! epoch that every new term increments. Each statement is one autocommit compare-and-set on
//! any pooled connection.
//!
//! The leader's belief is bounded by its own monotonic clock: it trusts its lease until the
//! instant it *sent* its last successful claim or renewal, plus [`Lease::trusted_for`] (the TTL
//! minus a margin of a tenth), and its term ends by then whatever the server answers. The
//! server's `now()` is read after the statement was sent, so the row outlives the trust as long
//! as the two clocks' rates differ by less than the margin (a tenth of the TTL; hardware clocks
//! and NTP's slewing stay far inside 0.1 %). Clock *offsets* play no part: only durations are
//! compared, each on one clock.

use std::fmt;
use std::time::Duration;

use crate::interval::{CheckInterval, timeout_millis};

/// The lease TTL when none is configured, in check intervals: three. A crashed or cut-off
/// leader's lease expires at most three intervals after its last renewal, and a standby's next
/// check takes it within one more: four intervals, the advisory mechanism's orphan bound
/// ([`IDLE_SESSION_TIMEOUT_INTERVALS`](crate::IDLE_SESSION_TIMEOUT_INTERVALS)). Two renewals in a
/// row may fail before the leader demotes.
pub const LEASE_TTL_INTERVALS: u32 = 3;

/// The shortest TTL accepted, in check intervals: two. The leader renews every interval and
/// each renewal may take one interval to answer; below two intervals the trust would end before
/// a healthy renewal's answer.
pub const MIN_LEASE_TTL_INTERVALS: u32 = 2;

/// The share of the TTL the leader does not trust: a tenth ([`Lease::margin`]), against a
/// difference of clock rates between the leader and the server.
pub const LEASE_MARGIN_DIVISOR: u32 = 10;

/// The validated terms of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    ttl: Duration,
}

impl Lease {
    /// The lease of [`LEASE_TTL_INTERVALS`] check intervals.
    pub fn default_for(interval: CheckInterval) -> Self {
        Self {
            ttl: interval.get() * LEASE_TTL_INTERVALS,
        }
    }

    /// A lease that lasts `ttl` on the server's clock.
    ///
    /// # Errors
    /// [`LeaseTtlError::TooShort`] below [`MIN_LEASE_TTL_INTERVALS`] check intervals,
    /// [`LeaseTtlError::TooLong`] above `i32::MAX` milliseconds (the server takes it as an
    /// `int4` count of milliseconds).
    pub fn new(interval: CheckInterval, ttl: Duration) -> Result<Self, LeaseTtlError> {
        let min = interval.get() * MIN_LEASE_TTL_INTERVALS;
        if ttl < min {
            return Err(LeaseTtlError::TooShort { given: ttl, min });
        }
        let max = Duration::from_millis(i32::MAX as u64);
        if ttl > max {
            return Err(LeaseTtlError::TooLong { given: ttl, max });
        }
        Ok(Self { ttl })
    }

    /// How long a claimed or renewed lease lasts on the server's clock.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// [`ttl`](Self::ttl) in whole milliseconds, rounded up (the server's expiry is never
    /// earlier than the leader's trust allows), at most `i32::MAX`.
    pub fn ttl_millis(&self) -> u32 {
        timeout_millis(self.ttl)
    }

    /// The part of the TTL the leader does not trust: a tenth.
    pub fn margin(&self) -> Duration {
        self.ttl / LEASE_MARGIN_DIVISOR
    }

    /// How long after sending a claim or renewal that succeeded the leader trusts its lease:
    /// the TTL minus the margin.
    pub fn trusted_for(&self) -> Duration {
        self.ttl - self.margin()
    }
}

/// A lease TTL that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseTtlError {
    /// Shorter than [`MIN_LEASE_TTL_INTERVALS`] check intervals.
    TooShort {
        /// The TTL asked for.
        given: Duration,
        /// The shortest accepted with this interval.
        min: Duration,
    },
    /// Longer than the server takes.
    TooLong {
        /// The TTL asked for.
        given: Duration,
        /// The longest accepted.
        max: Duration,
    },
}

impl fmt::Display for LeaseTtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { given, min } => write!(
                f,
                "lease TTL {given:?} is shorter than {MIN_LEASE_TTL_INTERVALS} check intervals \
                 ({min:?}): the leader's trust would end before its renewal answers"
            ),
            Self::TooLong { given, max } => {
                write!(f, "lease TTL {given:?} is longer than {max:?}")
            }
        }
    }
}

impl std::error::Error for LeaseTtlError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(ms: u64) -> CheckInterval {
        CheckInterval::new(Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn the_default_lease_is_three_intervals_trusted_for_nine_tenths() {
        let lease = Lease::default_for(interval(200));
        assert_eq!(lease.ttl(), Duration::from_millis(600));
        assert_eq!(lease.ttl_millis(), 600);
        assert_eq!(lease.margin(), Duration::from_millis(60));
        assert_eq!(lease.trusted_for(), Duration::from_millis(540));
    }

    #[test]
    fn a_ttl_is_at_least_two_intervals_and_fits_an_int4_of_milliseconds() {
        let i = interval(200);
        assert!(Lease::new(i, Duration::from_millis(400)).is_ok());
        let short = Lease::new(i, Duration::from_millis(399)).unwrap_err();
        assert_eq!(
            short,
            LeaseTtlError::TooShort {
                given: Duration::from_millis(399),
                min: Duration::from_millis(400)
            }
        );
        assert!(short.to_string().contains("2 check intervals"), "{short}");
        let max = Duration::from_millis(i32::MAX as u64);
        assert_eq!(Lease::new(i, max).unwrap().ttl_millis(), i32::MAX as u32);
        let long = Lease::new(i, max + Duration::from_millis(1)).unwrap_err();
        assert!(matches!(long, LeaseTtlError::TooLong { .. }), "{long}");
    }

    #[test]
    fn the_server_ttl_is_rounded_up_to_the_millisecond() {
        let lease = Lease::new(interval(200), Duration::from_micros(400_001)).unwrap();
        assert_eq!(lease.ttl_millis(), 401);
    }
}
