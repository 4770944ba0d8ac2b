//! Leadership as a published value and what a term is: what
//! [`Elector::subscribe`](crate::Elector::subscribe) receivers see, the term events, why a term
//! ended or a check fails, the last release, resignation and the stuck-leader verdict.

use std::time::Instant;

use plexsphere_leader_core::TermEndCause;

use crate::error::RunError;

pub use crate::overdue::OVERDUE_WORK_MESSAGE;
pub use crate::term::named_work;
pub use plexsphere_leader_core::failures::FailureClass;
pub use plexsphere_leader_core::work::Interruption;
pub use plexsphere_leader_core::{
    Release, ReleaseOutcome, STUCK_AFTER_INTERVALS, StuckLeader, TermId,
};

/// What became of a resign request ([`Elector::resign`](crate::Elector::resign),
/// [`ShardedElector::resign`](crate::sharded::ShardedElector::resign)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resignation {
    /// The running election took the request: a leader ends its term and releases the lock
    /// (after the stop grace; a sharded member gives up every shard), and no check begins
    /// before the hold-off has passed.
    Requested,
    /// The election is not running: nothing changed.
    NotRunning,
}

/// This replica's place in the election, published by the elector every time a term begins or
/// ends (a `tokio::sync::watch` value: [`Elector::subscribe`](crate::Elector::subscribe)).
///
/// A watch holds the latest value only: a term lost and a new one begun between two reads show
/// as a new [`TermInfo::id`] (and the lost term as [`last_end`](Self::last_end) of the newer
/// value once that one ends), never as a change that was missed and left the reader behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leadership {
    current: Option<TermInfo>,
    last_end: Option<TermEnd>,
    last_release: Option<Release>,
    failing: Option<CheckFailing>,
    run_failed: Option<RunError>,
}

/// This replica's checks are failing: since when, and whether retrying alone can fix it. The
/// watch publishes it when a run of failures begins, changes class, or ends (not at every
/// failed check); [`Elector::check_failure`](crate::Elector::check_failure) has the error text,
/// the advice and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckFailing {
    /// [`FailureClass::Permanent`] for a configuration error (a database that does not exist,
    /// a role that may not connect, a wrong password), [`FailureClass::Transient`] otherwise.
    pub class: FailureClass,
    /// When the first failed check of the run failed.
    pub since: Instant,
}

/// The last failed check of a run that has not ended, in full: what
/// [`Elector::check_failure`](crate::Elector::check_failure) returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckFailure {
    /// Whether retrying alone can fix it.
    pub class: FailureClass,
    /// When the first failed check of the run failed.
    pub since: Instant,
    /// How many checks in a row failed.
    pub failures: u64,
    /// The latest failure's text (the error chain, with the server's message).
    pub error: String,
    /// For a permanent failure: the server's hint, if any, and what to do.
    pub advice: Option<String>,
}

/// A term of leadership of this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TermInfo {
    /// The term's id: strictly increasing over the life of the elector.
    pub id: TermId,
    /// Its fencing epoch, when fencing is on.
    pub epoch: Option<u64>,
    /// When it began (the monotonic clock, `tokio::time::Instant` in std form).
    pub since: Instant,
}

/// How a term of this replica ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TermEnd {
    /// The term that ended.
    pub id: TermId,
    /// Its fencing epoch, when fencing is on.
    pub epoch: Option<u64>,
    /// Why it ended.
    pub cause: TermEndCause,
    /// When it began.
    pub began: Instant,
    /// When it ended.
    pub at: Instant,
}

impl Leadership {
    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.current.is_some()
    }

    /// The open term while this replica leads; `None` on a standby.
    pub fn term(&self) -> Option<TermInfo> {
        self.current
    }

    /// How the last term of this replica ended; `None` before the first term ended.
    pub fn last_end(&self) -> Option<TermEnd> {
        self.last_end
    }

    /// How the last term that gave up its lock did so: published after its end, once the
    /// graceful stop's unlock answered, failed or went unanswered (or a panic, drop or the
    /// session's end closed it). A term lost to a failed check has none. `None` before the
    /// first such release. A reader that printed [`TermEvent::Ended`] for a stopped term waits
    /// for this to say whether the lock is already free.
    pub fn last_release(&self) -> Option<Release> {
        self.last_release
    }

    /// Whether this replica's checks are failing (the latest check failed), and since when;
    /// `None` once a check succeeds (the lock granted or refused, or the leader's check proved
    /// it).
    pub fn check_failing(&self) -> Option<CheckFailing> {
        self.failing
    }

    /// The error the last run of the election ended with ([`Elector::run`](crate::Elector::run)
    /// returned it); `None` while a run is in progress, before the first run, and after a run
    /// that returned `Ok`. A run that failed takes no further part in the election until
    /// `run` is called again, so [`Elector::next_term`](crate::Elector::next_term) answers
    /// with it instead of waiting.
    pub fn run_failed(&self) -> Option<RunError> {
        self.run_failed
    }

    /// The value once a run began (`None`) or ended with `error`.
    pub(crate) fn run_ended(self, error: Option<RunError>) -> Self {
        Self {
            run_failed: error,
            ..self
        }
    }

    /// The value with `failing` as the state of the checks.
    pub(crate) fn failing(self, failing: Option<CheckFailing>) -> Self {
        Self { failing, ..self }
    }

    /// The value once `release` was decided.
    pub(crate) fn released(self, release: Release) -> Self {
        Self {
            last_release: Some(release),
            ..self
        }
    }

    /// The value once term `id` began at `since`.
    pub(crate) fn began(self, id: TermId, epoch: Option<u64>, since: Instant) -> Self {
        Self {
            current: Some(TermInfo { id, epoch, since }),
            ..self
        }
    }

    /// The value once the open term ended for `cause` at `at` (nothing changes when no term
    /// is open).
    pub(crate) fn ended(self, cause: TermEndCause, at: Instant) -> Self {
        match self.current {
            Some(term) => Self {
                current: None,
                last_release: self.last_release,
                failing: self.failing,
                run_failed: self.run_failed,
                last_end: Some(TermEnd {
                    id: term.id,
                    epoch: term.epoch,
                    cause,
                    began: term.since,
                    at,
                }),
            },
            None => self,
        }
    }
}

/// A term of this replica began or ended: what [`TermEvents`] reads out of successive
/// [`Leadership`] values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TermEvent {
    /// A term began.
    Began(TermInfo),
    /// A term ended.
    Ended(TermEnd),
    /// A term that was seen open ended between two reads, and a newer term's end replaced its
    /// record before it was read: its cause is lost (the reader was not woken for a whole
    /// term; a watch keeps the latest value only).
    EndMissed(TermId),
}

/// Turns the values a [`Leadership`] receiver reads into the term begins and ends they imply,
/// oldest first, each once: for a `subscribe()` loop that reports every change.
///
/// Between two reads a term may end and another begin (the new value shows both), or a term
/// may begin and end (its begin is read out of the end). When more changed between two reads,
/// a term seen open whose end record was replaced comes out as [`TermEvent::EndMissed`], and
/// terms that began *and* ended in between, before the last one, are not seen at all: a watch
/// keeps the latest value.
#[derive(Debug, Clone, Copy, Default)]
pub struct TermEvents {
    began: Option<TermId>,
    ended: Option<TermId>,
}

impl TermEvents {
    /// A reader that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The events `leadership` implies that were not returned yet, oldest first: the last
    /// term's begin (if it was never seen open) and its end, then the open term's begin.
    pub fn read(&mut self, leadership: &Leadership) -> Vec<TermEvent> {
        let mut events = Vec::new();
        // A term seen open, whose end this value no longer shows.
        if let Some(open) = self
            .began
            .filter(|began| self.ended.is_none_or(|e| *began > e))
        {
            let newest_end = leadership.last_end().map(|end| end.id);
            let newest = leadership.term().map(|term| term.id).max(newest_end);
            if newest_end != Some(open) && newest.is_some_and(|newest| newest > open) {
                events.push(TermEvent::EndMissed(open));
                self.ended = Some(open);
            }
        }
        if let Some(end) = leadership.last_end()
            && self.ended.is_none_or(|ended| end.id > ended)
        {
            self.begin(
                TermInfo {
                    id: end.id,
                    epoch: end.epoch,
                    since: end.began,
                },
                &mut events,
            );
            events.push(TermEvent::Ended(end));
            self.ended = Some(end.id);
        }
        if let Some(term) = leadership.term() {
            self.begin(term, &mut events);
        }
        events
    }

    fn begin(&mut self, term: TermInfo, events: &mut Vec<TermEvent>) {
        if self.began.is_none_or(|began| term.id > began) {
            events.push(TermEvent::Began(term));
            self.began = Some(term.id);
        }
    }
}

/// Why [`Elector::next_term`](crate::Elector::next_term) returned without a term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TermWaitError {
    /// The parent token was cancelled before this replica led: the usual end of a service's
    /// `while let Ok(term) = elector.next_term(&shutdown).await` loop.
    #[error("the wait for a term of leadership was cancelled")]
    Cancelled,
    /// The election's run ended with this error (for example
    /// [`RunError::SessionsMultiplexed`] behind a transaction-mode pooler): no term can come
    /// until `run` is called again. Print it and stop, or restart the run.
    #[error("the election stopped: {0}")]
    RunFailed(RunError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_leader_core::LossReason;

    #[test]
    fn a_term_begins_then_ends_with_its_cause_kept_as_the_last_end() {
        let t0 = Instant::now();
        let standby = Leadership::default();
        assert!(!standby.is_leader());
        let leading = standby.began(TermId::new(3), Some(9), t0);
        let term = leading.term().expect("a term");
        assert_eq!(
            (term.id, term.epoch, term.since),
            (TermId::new(3), Some(9), t0)
        );
        let lost = TermEndCause::Lost(LossReason::SessionEnded);
        let ended = leading.ended(lost, t0);
        assert!(!ended.is_leader());
        assert_eq!(
            ended.last_end().map(|end| (end.id, end.cause)),
            Some((TermId::new(3), lost))
        );
        // A second end without a term changes nothing.
        assert_eq!(ended.ended(TermEndCause::Stopped, t0), ended);
        // The next term keeps the last end until it ends itself.
        let again = ended.began(TermId::new(4), None, t0);
        assert_eq!(again.last_end(), ended.last_end());
    }

    #[test]
    fn term_events_come_out_once_each_oldest_first() {
        let t0 = Instant::now();
        let lost = TermEndCause::Lost(LossReason::CheckTimedOut);
        let mut events = TermEvents::new();
        let standby = Leadership::default();
        assert_eq!(events.read(&standby), vec![]);
        let one = standby.began(TermId::new(1), Some(7), t0);
        let began = |id, epoch| {
            TermEvent::Began(TermInfo {
                id,
                epoch,
                since: t0,
            })
        };
        assert_eq!(events.read(&one), vec![began(TermId::new(1), Some(7))]);
        assert_eq!(events.read(&one), vec![], "each once");
        // Term 1 ended and term 2 began between two reads: the end, then the begin.
        let two = one.ended(lost, t0).began(TermId::new(2), None, t0);
        let read = events.read(&two);
        assert!(matches!(read[0], TermEvent::Ended(TermEnd { id, .. }) if id == TermId::new(1)));
        assert_eq!(read[1], began(TermId::new(2), None));
        assert_eq!(read.len(), 2);
        // Term 2 ended, term 3 began and ended, all unseen: term 2's end is missed, term 3's
        // begin is read out of its end.
        let three = two
            .ended(TermEndCause::Stopped, t0)
            .began(TermId::new(3), Some(9), t0)
            .ended(TermEndCause::Resigned, t0);
        let read = events.read(&three);
        assert_eq!(read[0], TermEvent::EndMissed(TermId::new(2)));
        assert_eq!(read[1], began(TermId::new(3), Some(9)));
        assert!(matches!(
            read[2],
            TermEvent::Ended(TermEnd {
                cause: TermEndCause::Resigned,
                ..
            })
        ));
        assert_eq!(read.len(), 3);
        assert_eq!(events.read(&three), vec![]);
    }
}
