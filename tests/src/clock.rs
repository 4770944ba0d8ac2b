//! One monotonic clock for every process of a test: `CLOCK_MONOTONIC`.
//!
//! Replica processes cannot hand a `tokio::time::Instant` to the harness, so each of them stamps
//! its events with [`monotonic_ns`], the raw `CLOCK_MONOTONIC` reading in nanoseconds
//! (`clock_gettime(2)` through `nix`). That clock is system-wide: every process on the host reads
//! the same counter, which never jumps with wall-clock changes and keeps counting while a process
//! is stopped (`SIGSTOP`).
//!
//! On Linux `std::time::Instant` (and so `tokio::time::Instant`, when time is not paused) reads
//! that same clock, so one pair of back-to-back readings taken when the harness first converts a
//! stamp (the *anchor*) turns any stamp into an `Instant` of the harness: [`to_instant`]. The
//! error is the time between the two readings of the anchor, well under a microsecond, far below
//! the lock observer's 50 ms resolution.

use std::sync::OnceLock;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use tokio::time::Instant;

/// The anchor: an `Instant` and the `CLOCK_MONOTONIC` reading taken right after it.
static ANCHOR: OnceLock<(std::time::Instant, u64)> = OnceLock::new();

/// `CLOCK_MONOTONIC` now, in nanoseconds (0 if the clock cannot be read, which Linux never
/// does).
pub fn monotonic_ns() -> u64 {
    read(ClockId::CLOCK_MONOTONIC)
}

/// CPU time of the calling process so far (`CLOCK_PROCESS_CPUTIME_ID`), user and system.
pub fn process_cpu() -> Duration {
    Duration::from_nanos(read(ClockId::CLOCK_PROCESS_CPUTIME_ID))
}

/// The harness `Instant` of a [`monotonic_ns`] stamp taken by any process on this host.
pub fn to_instant(stamp_ns: u64) -> Instant {
    let (anchor, anchor_ns) = *ANCHOR.get_or_init(|| {
        let now = std::time::Instant::now();
        (now, monotonic_ns())
    });
    let at = if stamp_ns >= anchor_ns {
        anchor.checked_add(Duration::from_nanos(stamp_ns - anchor_ns))
    } else {
        anchor.checked_sub(Duration::from_nanos(anchor_ns - stamp_ns))
    };
    Instant::from_std(at.unwrap_or(anchor))
}

fn read(clock: ClockId) -> u64 {
    clock_gettime(clock).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_converts_to_the_instant_it_was_taken_at() {
        let before = Instant::now();
        let stamp = monotonic_ns();
        let after = Instant::now();
        let at = to_instant(stamp);
        // Both clocks are CLOCK_MONOTONIC: the conversion lands between the two readings, up to
        // the anchor's own sub-microsecond error.
        let slack = Duration::from_micros(50);
        assert!(at + slack >= before, "{at:?} before {before:?}");
        assert!(at <= after + slack, "{at:?} after {after:?}");
    }

    #[test]
    fn process_cpu_time_advances() {
        let start = process_cpu();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(process_cpu() > start);
    }
}
