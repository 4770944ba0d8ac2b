//! The every-replica ticker: the spec's loops that "stay on every replica", ticked on a fixed
//! cadence and ungated.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{BoxError, PassFn};
use crate::panic::CatchPanic;

/// How often a loop that keeps failing with the same cause says so: one WARN line per minute.
pub const REPEATED_FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Ticks a pass on a fixed cadence on every replica, ungated: the spec's every-replica loops
/// (`capacity-collector`, the consume loops, `sse-relay`, …). A part only one replica may do
/// goes behind a [`Gate`](super::Gate) inside the pass.
///
/// - The first tick comes at once when [`run`](Self::run) starts, then one every period; missed
///   ticks are skipped (no burst after a long pass or a pause).
/// - The pass gets the shutdown token; a pass still running at shutdown is dropped, and its
///   outcome is not logged.
/// - A failed or panicking pass is a failed tick, and the loop keeps its cadence: a database
///   that is down does not slow the loop, so it resumes within one period of the database's
///   return. [`run`](Self::run) never fails by itself.
/// - Its log is rate-limited, because every replica runs it and a shared cause (the database
///   is down) would otherwise write a line per loop, per replica, per period:
///   - the first failed tick, and a failed tick whose cause differs from the one before,
///     write WARN `background loop tick failed: <cause>` (fields `loop`, `cause`; a panic also
///     writes ERROR `background loop tick panicked` with `panic` and `stack`);
///   - further failed ticks of the same cause are held back, and at most once per
///     [`REPEATED_FAILURE_LOG_INTERVAL`] one WARN `background loop tick still failing:
///     <cause>` says so (fields `loop`, `cause`, `failed_ticks` in a row, `not_logged` since
///     the line before);
///   - the first tick that passes after failed ones writes INFO `background loop tick passed
///     again after <n> failed ticks` (fields `loop`, `failed_ticks`).
pub struct EveryReplica {
    name: Arc<str>,
    period: Duration,
    pass: PassFn,
}

impl Clone for EveryReplica {
    fn clone(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            period: self.period,
            pass: Arc::clone(&self.pass),
        }
    }
}

impl EveryReplica {
    /// A ticker of the loop `name` that runs `pass` every `period` on this replica. The period
    /// is at least 1 ms.
    pub fn new(name: &str, period: Duration, pass: PassFn) -> Self {
        Self {
            name: name.into(),
            period: period.max(Duration::from_millis(1)),
            pass,
        }
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tick period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Ticks until `shutdown` is cancelled, then returns `Ok(())`.
    ///
    /// # Errors
    /// None of its own; the signature fits [`Supervisor::add`](crate::Supervisor::add).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BoxError> {
        let mut every = tokio::time::interval(self.period);
        every.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut failures = Failures::default();
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                _ = every.tick() => {}
            }
            let pass = CatchPanic::new((self.pass)(shutdown.clone()));
            let outcome = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                outcome = pass => outcome,
            };
            let (cause, caught) = match outcome {
                Ok(Ok(())) => {
                    if let Some(failed_ticks) = failures.passed() {
                        self.log_recovery(failed_ticks);
                    }
                    continue;
                }
                // The pass saw the service's own shutdown: not a failed tick.
                Ok(Err(_)) if shutdown.is_cancelled() => return Ok(()),
                Ok(Err(error)) => {
                    let reported = crate::failure::report(error.as_ref());
                    let cause = match reported.sqlstate {
                        Some(code) => format!("{} (SQLSTATE {code})", reported.text),
                        None => reported.text,
                    };
                    (cause, None)
                }
                Err(caught) => (format!("tick panicked: {}", caught.value), Some(caught)),
            };
            let say = failures.failed(&cause, Instant::now());
            if let (Some(caught), Say::Failed | Say::StillFailing { .. }) = (&caught, say) {
                caught.log(&self.name);
            }
            self.log_failure(&cause, say);
        }
    }

    fn log_failure(&self, cause: &str, say: Say) {
        match say {
            Say::Failed => tracing::warn!(
                target: "plexsphere_leader",
                r#loop = %self.name,
                cause = %cause,
                "background loop tick failed: {cause}"
            ),
            Say::StillFailing {
                failed_ticks,
                not_logged,
            } => tracing::warn!(
                target: "plexsphere_leader",
                r#loop = %self.name,
                cause = %cause,
                failed_ticks,
                not_logged,
                "background loop tick still failing: {cause}"
            ),
            Say::Nothing => {}
        }
    }

    fn log_recovery(&self, failed_ticks: u64) {
        tracing::info!(
            target: "plexsphere_leader",
            r#loop = %self.name,
            failed_ticks,
            "background loop tick passed again after {failed_ticks} failed ticks"
        );
    }
}

impl fmt::Debug for EveryReplica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EveryReplica")
            .field("name", &self.name)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

/// What a failed tick writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Say {
    /// The first failure, or a cause other than the one before: WARN `tick failed`.
    Failed,
    /// The same cause, and the last line is a repeat interval old: WARN `still failing`.
    StillFailing { failed_ticks: u64, not_logged: u64 },
    /// The same cause within the repeat interval: held back.
    Nothing,
}

/// The rate limit of an every-replica loop's failure lines: pure, time is an argument.
#[derive(Debug, Default)]
struct Failures {
    streak: Option<Streak>,
}

/// Failed ticks in a row.
#[derive(Debug)]
struct Streak {
    cause: String,
    failed_ticks: u64,
    not_logged: u64,
    logged_at: Instant,
}

impl Failures {
    /// A tick failed with `cause` at `now`.
    fn failed(&mut self, cause: &str, now: Instant) -> Say {
        let Some(streak) = &mut self.streak else {
            self.streak = Some(Streak {
                cause: cause.to_owned(),
                failed_ticks: 1,
                not_logged: 0,
                logged_at: now,
            });
            return Say::Failed;
        };
        streak.failed_ticks += 1;
        if streak.cause != cause {
            cause.clone_into(&mut streak.cause);
            streak.not_logged = 0;
            streak.logged_at = now;
            return Say::Failed;
        }
        if now.saturating_duration_since(streak.logged_at) < REPEATED_FAILURE_LOG_INTERVAL {
            streak.not_logged += 1;
            return Say::Nothing;
        }
        let say = Say::StillFailing {
            failed_ticks: streak.failed_ticks,
            not_logged: streak.not_logged,
        };
        streak.not_logged = 0;
        streak.logged_at = now;
        say
    }

    /// A tick passed: the number of failed ticks before it, if any.
    fn passed(&mut self) -> Option<u64> {
        self.streak.take().map(|streak| streak.failed_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_cause_is_said_once_then_once_per_interval_and_another_at_once() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut failures = Failures::default();
        assert_eq!(failures.failed("refused", at(0)), Say::Failed);
        for second in 1..60 {
            assert_eq!(failures.failed("refused", at(second)), Say::Nothing);
        }
        assert_eq!(
            failures.failed("refused", at(60)),
            Say::StillFailing {
                failed_ticks: 61,
                not_logged: 59
            }
        );
        assert_eq!(failures.failed("refused", at(61)), Say::Nothing);
        assert_eq!(failures.failed("timed out", at(62)), Say::Failed);
        assert_eq!(failures.failed("timed out", at(63)), Say::Nothing);
        assert_eq!(failures.passed(), Some(64));
        assert_eq!(failures.passed(), None, "said once");
        assert_eq!(failures.failed("timed out", at(64)), Say::Failed);
    }
}
