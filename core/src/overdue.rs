//! The work deadlines of ended terms ([`Options::work_deadline`](crate::Options::work_deadline),
//! [`ShardOptions::work_deadline`](crate::shards::ShardOptions::work_deadline)), kept once for
//! both machines: each ended term's deadline in the order the terms ended, reported when it
//! passes, forgotten when the term's work drained, and every one still pending reported when
//! the run finishes (nothing drives the machine after it).

use std::collections::VecDeque;
use std::time::Instant;

use crate::TermId;
use crate::options::{OnOverdue, WorkDeadline};

/// The pending work deadlines of ended terms.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct OverdueBook {
    due: VecDeque<(TermId, Instant)>,
}

/// A work deadline that came due: the machine reports it as `ReportOverdueWork`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overdue {
    pub(crate) term: TermId,
    /// Whether the work still running is aborted ([`OnOverdue::Abort`]).
    pub(crate) abort: bool,
}

impl OverdueBook {
    /// `term` ended at `now`: its work deadline, if `deadline` is set, starts now.
    pub(crate) fn watch(&mut self, deadline: Option<WorkDeadline>, now: Instant, term: TermId) {
        if let Some(deadline) = deadline {
            self.due.push_back((term, now + deadline.after));
        }
    }

    /// The work of `term` returned: its deadline is moot.
    pub(crate) fn forget(&mut self, term: TermId) {
        self.due.retain(|(ended, _)| *ended != term);
    }

    /// When the first pending deadline passes.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.due.front().map(|(_, at)| *at)
    }

    /// How many deadlines are pending.
    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }

    /// Takes the first pending deadline (it passed).
    pub(crate) fn pop(&mut self, deadline: Option<WorkDeadline>) -> Option<Overdue> {
        let (term, _) = self.due.pop_front()?;
        Some(Overdue::of(term, deadline))
    }

    /// Takes every pending deadline, in order (the run finishes).
    pub(crate) fn take_all(&mut self, deadline: Option<WorkDeadline>) -> Vec<Overdue> {
        self.due
            .drain(..)
            .map(|(term, _)| Overdue::of(term, deadline))
            .collect()
    }
}

impl Overdue {
    fn of(term: TermId, deadline: Option<WorkDeadline>) -> Self {
        let abort = deadline.is_some_and(|d| d.on_overdue == OnOverdue::Abort);
        Self { term, abort }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const DEADLINE: WorkDeadline = WorkDeadline {
        after: Duration::from_secs(1),
        on_overdue: OnOverdue::Abort,
    };

    #[test]
    fn deadlines_come_due_in_the_order_the_terms_ended_unless_forgotten() {
        let t0 = Instant::now();
        let mut book = OverdueBook::default();
        book.watch(None, t0, TermId::new(9));
        assert_eq!((book.len(), book.next()), (0, None), "no deadline set");
        for (term, at) in [(1, 0), (2, 10), (3, 20)] {
            book.watch(
                Some(DEADLINE),
                t0 + Duration::from_millis(at),
                TermId::new(term),
            );
        }
        assert_eq!(book.next(), Some(t0 + Duration::from_secs(1)));
        book.forget(TermId::new(1));
        assert_eq!(book.len(), 2);
        let first = book.pop(Some(DEADLINE));
        assert_eq!(
            first,
            Some(Overdue {
                term: TermId::new(2),
                abort: true
            })
        );
        let warn = WorkDeadline {
            on_overdue: OnOverdue::Report,
            ..DEADLINE
        };
        assert_eq!(
            book.pop(Some(warn)).map(|o| (o.term, o.abort)),
            Some((TermId::new(3), false))
        );
        assert_eq!(book.pop(Some(DEADLINE)), None);
        for term in [4, 5] {
            book.watch(Some(DEADLINE), t0, TermId::new(term));
        }
        let all: Vec<u64> = book
            .take_all(Some(DEADLINE))
            .iter()
            .map(|o| o.term.get())
            .collect();
        assert_eq!((all, book.len()), (vec![4, 5], 0));
    }
}
