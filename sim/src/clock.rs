//! A replica clock whose rate differs from the simulation's: the lease holder's own clock
//! running fast or slow ([`Config::clock`](plexsphere_leader::Config::clock)).
//!
//! A lease leader trusts its lease for 0.9·TTL of its own clock after sending its last
//! renewal; the server expires it TTL of the server's clock after executing it. A clock that
//! runs at rate `r` (it advances `r` seconds per second of the simulation) ends that trust
//! 0.9·TTL/`r` after the send, before the server's expiry for every `r` above 0.9: the
//! overlap bound rests on the clock's rate, never on its offset. Lease runs give their
//! replicas rates within ±5 % ([`ClockRate::of_lease_replica`]); the sabotage `slow-clock` runs
//! every replica at 0.85, outside the margin, and must be caught.

use std::time::{Duration, Instant};

use plexsphere_leader::config::Clock;

/// A clock rate in parts per million of the simulation's clock: 1 000 000 keeps time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClockRate(u32);

impl ClockRate {
    /// The simulation's own rate.
    pub const EXACT: Self = Self(1_000_000);
    /// The slowest rate a lease run gives a replica: 5 % slow, half the 10 % margin.
    pub const SLOWEST_WITHIN_MARGIN: Self = Self(950_000);
    /// The fastest rate a lease run gives a replica: 5 % fast.
    pub const FASTEST_WITHIN_MARGIN: Self = Self(1_050_000);
    /// The rate of the `slow-clock` sabotage: 15 % slow, outside the 10 % margin.
    pub const OUTSIDE_MARGIN: Self = Self(850_000);

    /// The rate of replica `replica` of `replicas` in lease seed `seed`: one replica (the
    /// seed's `seed % replicas`) at the slowest rate, the next at the fastest, every other
    /// drawn between them from the seed, so that every lease run meets both edges.
    pub fn of_lease_replica(seed: u64, replica: usize, replicas: usize) -> Self {
        let replicas = replicas.max(1) as u64;
        let slow = seed % replicas;
        let index = replica as u64;
        if index == slow {
            return Self::SLOWEST_WITHIN_MARGIN;
        }
        if index == (slow + 1) % replicas {
            return Self::FASTEST_WITHIN_MARGIN;
        }
        let span = u64::from(Self::FASTEST_WITHIN_MARGIN.0 - Self::SLOWEST_WITHIN_MARGIN.0) + 1;
        let mixed = (seed ^ index.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let offset = u32::try_from((mixed >> 11) % span).unwrap_or(0);
        Self(Self::SLOWEST_WITHIN_MARGIN.0 + offset)
    }

    /// How long `local` of a clock at this rate takes on the simulation's clock, rounded up.
    pub fn real(self, local: Duration) -> Duration {
        let nanos = local.as_nanos() * 1_000_000;
        let real = nanos.div_ceil(u128::from(self.0));
        Duration::from_nanos(u64::try_from(real).unwrap_or(u64::MAX))
    }

    /// How much a clock at this rate advances in `real` of the simulation's clock, rounded
    /// down.
    pub fn local(self, real: Duration) -> Duration {
        let local = real.as_nanos() * u128::from(self.0) / 1_000_000;
        Duration::from_nanos(u64::try_from(local).unwrap_or(u64::MAX))
    }
}

/// A clock that starts at the simulation's instant of its creation and runs at a
/// [`ClockRate`] from there. Its readings round down and its wake instants round up, so the
/// driver never wakes before a deadline of this clock is due.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriftingClock {
    origin: tokio::time::Instant,
    rate: ClockRate,
}

impl DriftingClock {
    /// A clock at `rate` from now on (the simulation's now, inside a turmoil host).
    pub(crate) fn new(rate: ClockRate) -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            rate,
        }
    }
}

impl Clock for DriftingClock {
    fn now(&self) -> Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        self.origin.into_std() + self.rate.local(elapsed)
    }

    fn tokio_instant(&self, reading: Instant) -> tokio::time::Instant {
        let local = reading.saturating_duration_since(self.origin.into_std());
        self.origin + self.rate.real(local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_reached_by_its_wake_instant() {
        for ppm in [850_000, 950_000, 999_999, 1_000_000, 1_000_001, 1_050_000] {
            let rate = ClockRate(ppm);
            for micros in [0, 1, 7, 999, 100_000, 270_000, 12_345_678] {
                let local = Duration::from_micros(micros) + Duration::from_nanos(micros % 13);
                assert!(
                    rate.local(rate.real(local)) >= local,
                    "{ppm} ppm, {local:?}"
                );
            }
        }
    }

    #[test]
    fn a_slow_clock_takes_longer_and_a_fast_one_shorter() {
        let ttl = Duration::from_millis(300);
        assert_eq!(ClockRate::EXACT.real(ttl), ttl);
        // 0.9·TTL at 0.95 ends 284.2 ms after the send, before the TTL of 300 ms.
        let trusted = ClockRate::SLOWEST_WITHIN_MARGIN.real(ttl.mul_f64(0.9));
        assert!(
            trusted < ttl && trusted > Duration::from_millis(284),
            "{trusted:?}"
        );
        // At 0.85 it ends 317.6 ms after: past the server's expiry.
        assert!(ClockRate::OUTSIDE_MARGIN.real(ttl.mul_f64(0.9)) > ttl);
        assert!(ClockRate::FASTEST_WITHIN_MARGIN.real(ttl) < ttl);
    }

    #[test]
    fn every_lease_run_meets_both_edges_and_stays_within_them() {
        for seed in 0..200 {
            let rates: Vec<_> = (0..3)
                .map(|r| ClockRate::of_lease_replica(seed, r, 3))
                .collect();
            assert!(
                rates.contains(&ClockRate::SLOWEST_WITHIN_MARGIN),
                "{seed}: {rates:?}"
            );
            assert!(
                rates.contains(&ClockRate::FASTEST_WITHIN_MARGIN),
                "{seed}: {rates:?}"
            );
            assert!(rates.iter().all(|r| {
                (ClockRate::SLOWEST_WITHIN_MARGIN..=ClockRate::FASTEST_WITHIN_MARGIN).contains(r)
            }));
        }
        assert_eq!(
            ClockRate::of_lease_replica(5, 0, 1),
            ClockRate::SLOWEST_WITHIN_MARGIN
        );
    }
}
