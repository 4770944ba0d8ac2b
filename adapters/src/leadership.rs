//! Leadership as a published value: what [`Elector::subscribe`](crate::Elector::subscribe)
//! receivers see.

use std::time::Instant;

use plexsphere_leader_core::{TermEndCause, TermId};

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
                last_end: Some(TermEnd {
                    id: term.id,
                    cause,
                    began: term.since,
                    at,
                }),
            },
            None => self,
        }
    }
}

/// [`Elector::next_term`](crate::Elector::next_term) gave up: its parent token was cancelled
/// before this replica led.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the wait for a term of leadership was cancelled")]
pub struct TermWaitCancelled;

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
}
