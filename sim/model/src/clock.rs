//! Time as an explicit discrete clock: every instant of the model is a whole number of
//! microseconds since one fixed base [`Instant`], so that equal model states hold equal (and
//! equally hashed) instants inside the core machines.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Microseconds since the model's base instant, on the server's or a replica's clock.
pub type Micros = u64;

/// A clock rate in parts per million of the server's clock (1 000 000 keeps time).
pub type Ppm = u64;

/// The rate of a clock that keeps the server's time.
pub const EXACT: Ppm = 1_000_000;

/// A replica's clock rate as its state holds it: a [`Ppm`] where the clocks drift, nothing
/// (`()`) where every clock keeps the server's time (the state then has no rate to compare).
pub trait Rate: Copy + Debug + Eq + Hash + Send + Sync {
    /// The rate `ppm`, as held.
    fn held(ppm: Ppm) -> Self;
    /// The rate, in parts per million.
    fn ppm(self) -> Ppm;
}

impl Rate for Ppm {
    fn held(ppm: Ppm) -> Self {
        ppm
    }

    fn ppm(self) -> Ppm {
        self
    }
}

impl Rate for () {
    fn held(_: Ppm) -> Self {}

    fn ppm(self) -> Ppm {
        EXACT
    }
}

/// The one base instant of the process: every state maps its clocks onto it.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// The instant `at` microseconds after the base.
pub fn instant(at: Micros) -> Instant {
    base() + Duration::from_micros(at)
}

/// Microseconds from the base to `at`, rounded up (a deadline is never reached early).
pub fn micros(at: Instant) -> Micros {
    let since = at.saturating_duration_since(base());
    let whole = u64::try_from(since.as_micros()).unwrap_or(u64::MAX);
    if Duration::from_micros(whole) < since {
        whole + 1
    } else {
        whole
    }
}

/// A duration in microseconds.
pub fn us(duration: Duration) -> Micros {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// How far a clock at `rate` advances while the server's advances `server`.
pub fn local_delta(server: Micros, rate: Ppm) -> Micros {
    server.saturating_mul(rate) / EXACT
}

/// How long on the server's clock a clock at `rate` takes to advance `local`, rounded up.
pub fn server_delta(local: Micros, rate: Ppm) -> Micros {
    local.saturating_mul(EXACT).div_ceil(rate.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_round_trips_through_micros() {
        assert_eq!(micros(instant(1_234_567)), 1_234_567);
        assert_eq!(micros(instant(5) + Duration::from_nanos(1)), 6);
    }

    #[test]
    fn the_server_delta_always_reaches_the_local_deadline() {
        for rate in [950_000, EXACT, 1_050_000] {
            for local in [1, 999, 2_700_000, 3_000_001] {
                assert!(local_delta(server_delta(local, rate), rate) >= local);
            }
        }
    }
}
