//! How a run of failed checks is reported: a permanent mistake (a database that does not exist,
//! a role without `CONNECT`, a wrong password) must not look like a transient one.
//!
//! The driver classifies each failure ([`FailureClass`], from the server's SQLSTATE) and
//! fingerprints it (the same error text, the same fingerprint); [`FailureReports`] says at which
//! level to log it, and remembers the current run of failures for the published leadership
//! value. Transient failures keep the spec's WARN at every check. The first failure of a run of
//! permanent ones is an ERROR; its repeats are logged at WARN at most once per
//! [`PERMANENT_REPEAT_EVERY`], with the count of the ones kept quiet in between. The election
//! keeps retrying either way: a database may be created later.

use std::time::{Duration, Instant};

use crate::action::Level;

/// How often a permanent failure that keeps repeating is logged again (at WARN).
pub const PERMANENT_REPEAT_EVERY: Duration = Duration::from_secs(60);

/// What kind of mistake a failed check is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// A configuration error that retrying alone will not fix: the database does not exist, the
    /// role does not exist or may not connect, the password is wrong, a privilege is missing.
    Permanent,
    /// Anything else: the server is unreachable, restarting, overloaded, or did not answer.
    Transient,
}

impl FailureClass {
    /// `permanent` or `transient`: the label value of metrics and the text of logs.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Permanent => "permanent",
            Self::Transient => "transient",
        }
    }
}

/// The current run of failed checks, for the published leadership value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureRun {
    /// The class of the latest failure.
    pub class: FailureClass,
    /// Consecutive failed checks, the latest included.
    pub failures: u64,
    /// When the first of them failed.
    pub since: Instant,
}

/// The reporting decision for one failed check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureReport {
    /// The level to log it at; `None` keeps it quiet (a permanent failure repeated within
    /// [`PERMANENT_REPEAT_EVERY`] of its last report).
    pub level: Option<Level>,
    /// How many identical failures were kept quiet since the last one logged.
    pub quiet: u64,
    /// The run it belongs to.
    pub run: FailureRun,
}

/// The reporting state of one election's failed checks. Pure; time is passed in.
#[derive(Debug, Clone, Default)]
pub struct FailureReports {
    run: Option<Run>,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    public: FailureRun,
    fingerprint: u64,
    last_logged: Instant,
    quiet: u64,
}

impl FailureReports {
    /// A check failed at `now` with a failure of `class` whose text hashes to `fingerprint`.
    pub fn failed(&mut self, now: Instant, class: FailureClass, fingerprint: u64) -> FailureReport {
        let repeat = self
            .run
            .filter(|run| run.fingerprint == fingerprint && run.public.class == class);
        let Some(mut run) = repeat else {
            let since = self.run.map_or(now, |run| run.public.since);
            let failures = self.run.map_or(0, |run| run.public.failures) + 1;
            let public = FailureRun {
                class,
                failures,
                since,
            };
            self.run = Some(Run {
                public,
                fingerprint,
                last_logged: now,
                quiet: 0,
            });
            let level = match class {
                FailureClass::Permanent => Level::Error,
                FailureClass::Transient => Level::Warn,
            };
            return FailureReport {
                level: Some(level),
                quiet: 0,
                run: public,
            };
        };
        run.public.failures += 1;
        let due = class == FailureClass::Transient
            || now.saturating_duration_since(run.last_logged) >= PERMANENT_REPEAT_EVERY;
        let report = if due {
            let quiet = run.quiet;
            run.quiet = 0;
            run.last_logged = now;
            FailureReport {
                level: Some(Level::Warn),
                quiet,
                run: run.public,
            }
        } else {
            run.quiet += 1;
            FailureReport {
                level: None,
                quiet: run.quiet,
                run: run.public,
            }
        };
        self.run = Some(run);
        report
    }

    /// A check succeeded (the lock was granted or refused, or the leader's check proved it):
    /// the run of failures, if any, is over. Returns it.
    pub fn succeeded(&mut self) -> Option<FailureRun> {
        self.run.take().map(|run| run.public)
    }

    /// The current run of failures, if the last check failed.
    pub fn current(&self) -> Option<FailureRun> {
        self.run.map(|run| run.public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_transient_failure_warns_at_every_check_as_the_spec_says() {
        let mut reports = FailureReports::default();
        let t0 = Instant::now();
        for n in 0..5u32 {
            let report = reports.failed(t0 + n * S, FailureClass::Transient, 7);
            assert_eq!(report.level, Some(Level::Warn));
            assert_eq!(report.quiet, 0);
            assert_eq!(report.run.failures, u64::from(n) + 1);
            assert_eq!(report.run.since, t0);
        }
    }

    #[test]
    fn a_permanent_failure_is_an_error_once_then_a_warning_a_minute() {
        let mut reports = FailureReports::default();
        let t0 = Instant::now();
        let first = reports.failed(t0, FailureClass::Permanent, 1);
        assert_eq!(first.level, Some(Level::Error));
        assert_eq!(first.run.class, FailureClass::Permanent);
        for n in 1..60u32 {
            let quiet = reports.failed(t0 + n * S, FailureClass::Permanent, 1);
            assert_eq!(quiet.level, None, "{n}");
            assert_eq!(quiet.quiet, u64::from(n));
        }
        let again = reports.failed(t0 + PERMANENT_REPEAT_EVERY, FailureClass::Permanent, 1);
        assert_eq!(again.level, Some(Level::Warn));
        assert_eq!(again.quiet, 59);
        assert_eq!(again.run.failures, 61);
        let after = reports.failed(t0 + PERMANENT_REPEAT_EVERY + S, FailureClass::Permanent, 1);
        assert_eq!((after.level, after.quiet), (None, 1));
    }

    #[test]
    fn another_failure_is_reported_at_once_and_keeps_the_run() {
        let mut reports = FailureReports::default();
        let t0 = Instant::now();
        reports.failed(t0, FailureClass::Permanent, 1);
        let other = reports.failed(t0 + S, FailureClass::Permanent, 2);
        assert_eq!(other.level, Some(Level::Error));
        assert_eq!((other.run.failures, other.run.since), (2, t0));
        let transient = reports.failed(t0 + 2 * S, FailureClass::Transient, 2);
        assert_eq!(transient.level, Some(Level::Warn));
        assert_eq!(transient.run.class, FailureClass::Transient);
        let permanent = reports.failed(t0 + 3 * S, FailureClass::Permanent, 2);
        assert_eq!(permanent.level, Some(Level::Error));
        assert_eq!(permanent.run.failures, 4);
    }

    #[test]
    fn a_successful_check_ends_the_run() {
        let mut reports = FailureReports::default();
        let t0 = Instant::now();
        assert_eq!(reports.succeeded(), None);
        assert_eq!(reports.current(), None);
        reports.failed(t0, FailureClass::Permanent, 1);
        reports.failed(t0 + S, FailureClass::Permanent, 1);
        let run = FailureRun {
            class: FailureClass::Permanent,
            failures: 2,
            since: t0,
        };
        assert_eq!(reports.current(), Some(run));
        assert_eq!(reports.succeeded(), Some(run));
        assert_eq!(reports.current(), None);
        let fresh = reports.failed(t0 + 2 * S, FailureClass::Permanent, 1);
        assert_eq!(fresh.level, Some(Level::Error));
        assert_eq!((fresh.run.failures, fresh.run.since), (1, t0 + 2 * S));
    }

    #[test]
    fn labels_are_stable() {
        assert_eq!(FailureClass::Permanent.label(), "permanent");
        assert_eq!(FailureClass::Transient.label(), "transient");
    }
}
