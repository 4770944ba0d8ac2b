//! A merged event timeline and pure functions over "who believed it led when".
//!
//! Replicas, lock observers and test code record [`Event`]s into one [`Timeline`] (it is a
//! cheap clone around a shared vector). Afterwards a test turns the events into [`Interval`]s
//! during which each replica believed it led ([`intervals_from_events`]) and checks:
//!
//! - [`overlaps`] / [`max_overlap`]: spans during which two or more replicas believed they led
//!   (design section 6: at most 2·I + T; zero on a graceful shutdown);
//! - [`leaderless_gaps`] / [`max_gap`]: spans inside a window during which nobody led.
//!
//! Intervals are half-open, `[start, end)`: a replica that stops at `t` and another that starts
//! at `t` neither overlap nor leave a gap. Intervals of the same replica are merged first, so a
//! replica never overlaps with itself.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// One thing that happened, recorded with the monotonic tokio clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When it happened.
    pub at: Instant,
    /// Who it happened to (replica name, `observer`, `test`, …).
    pub replica: String,
    /// What happened (`lead`, `follow`, `stop`, …).
    pub event: String,
}

/// A span of time `[start, end)` during which one replica believed it led.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// The replica.
    pub replica: String,
    /// First instant of the interval.
    pub start: Instant,
    /// First instant after the interval.
    pub end: Instant,
}

/// A span of time `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First instant of the span.
    pub start: Instant,
    /// First instant after the span.
    pub end: Instant,
}

impl Span {
    /// The span's length (zero when `end` is not after `start`).
    pub fn duration(&self) -> Duration {
        self.end.saturating_duration_since(self.start)
    }
}

/// Records events from many sources into one list. Clones share the list.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `event` for `replica` at `tokio::time::Instant::now()`.
    pub fn record(&self, replica: impl Into<String>, event: impl Into<String>) {
        self.record_at(Instant::now(), replica, event);
    }

    /// Records `event` for `replica` at `at`.
    pub fn record_at(&self, at: Instant, replica: impl Into<String>, event: impl Into<String>) {
        self.lock().push(Event {
            at,
            replica: replica.into(),
            event: event.into(),
        });
    }

    /// All events, ordered by time; events recorded at the same instant keep their recording
    /// order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.lock().clone();
        events.sort_by_key(|e| e.at);
        events
    }

    /// The events of one replica, ordered by time.
    pub fn events_of(&self, replica: &str) -> Vec<Event> {
        let mut events = self.events();
        events.retain(|e| e.replica == replica);
        events
    }

    /// [`intervals_from_events`] over this timeline's events.
    pub fn intervals(&self, begin: &str, end: &str, until: Instant) -> Vec<Interval> {
        intervals_from_events(&self.events(), begin, end, until)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        // A panic while holding the lock cannot leave the vector half-pushed: recover it.
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Pairs each replica's `begin` event with its next `end` event into an [`Interval`].
///
/// A `begin` while the replica's interval is already open, and an `end` while none is open,
/// are ignored. An interval still open after the last event ends at `until`. The result is
/// ordered by start. `events` need not be sorted.
pub fn intervals_from_events(
    events: &[Event],
    begin: &str,
    end: &str,
    until: Instant,
) -> Vec<Interval> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| e.at);
    let mut open: Vec<(String, Instant)> = Vec::new();
    let mut out = Vec::new();
    for e in sorted {
        let position = open.iter().position(|(r, _)| *r == e.replica);
        if e.event == begin && position.is_none() {
            open.push((e.replica.clone(), e.at));
        } else if e.event == end
            && let Some(i) = position
        {
            let (replica, start) = open.swap_remove(i);
            out.push(Interval {
                replica,
                start,
                end: e.at,
            });
        }
    }
    out.extend(open.into_iter().map(|(replica, start)| Interval {
        replica,
        start,
        end: until.max(start),
    }));
    out.sort_by(|a, b| (a.start, &a.replica).cmp(&(b.start, &b.replica)));
    out
}

/// The maximal spans during which at least two different replicas believed they led.
pub fn overlaps(intervals: &[Interval]) -> Vec<Span> {
    merge_adjacent(
        coverage(intervals, None)
            .into_iter()
            .filter(|(_, n)| *n >= 2)
            .map(|(span, _)| span),
    )
}

/// The longest single span of [`overlaps`], zero when there is none.
pub fn max_overlap(intervals: &[Interval]) -> Duration {
    longest(&overlaps(intervals))
}

/// The total time covered by [`overlaps`].
pub fn total_overlap(intervals: &[Interval]) -> Duration {
    overlaps(intervals).iter().map(Span::duration).sum()
}

/// The maximal spans inside `window` during which no replica believed it led.
pub fn leaderless_gaps(intervals: &[Interval], window: Span) -> Vec<Span> {
    if window.duration().is_zero() {
        return Vec::new();
    }
    merge_adjacent(
        coverage(intervals, Some(window))
            .into_iter()
            .filter(|(_, n)| *n == 0)
            .map(|(span, _)| span),
    )
}

/// The longest single span of [`leaderless_gaps`], zero when there is none.
pub fn max_gap(intervals: &[Interval], window: Span) -> Duration {
    longest(&leaderless_gaps(intervals, window))
}

fn longest(spans: &[Span]) -> Duration {
    spans.iter().map(Span::duration).max().unwrap_or_default()
}

/// Merges each replica's overlapping or touching intervals and drops empty ones.
fn merge_per_replica(intervals: &[Interval]) -> Vec<Interval> {
    let mut sorted: Vec<&Interval> = intervals.iter().filter(|i| i.end > i.start).collect();
    sorted.sort_by(|a, b| (&a.replica, a.start).cmp(&(&b.replica, b.start)));
    let mut out: Vec<Interval> = Vec::new();
    for i in sorted {
        match out.last_mut() {
            Some(last) if last.replica == i.replica && i.start <= last.end => {
                last.end = last.end.max(i.end);
            }
            _ => out.push(i.clone()),
        }
    }
    out
}

/// Cuts time at every interval boundary (and the window's) and counts the replicas leading in
/// each piece. Pieces are ordered and non-empty; with a window, they tile exactly the window.
fn coverage(intervals: &[Interval], window: Option<Span>) -> Vec<(Span, usize)> {
    let merged = merge_per_replica(intervals);
    let mut cuts: Vec<Instant> = merged.iter().flat_map(|i| [i.start, i.end]).collect();
    if let Some(w) = window {
        cuts.retain(|t| *t > w.start && *t < w.end);
        cuts.extend([w.start, w.end]);
    }
    cuts.sort();
    cuts.dedup();
    cuts.windows(2)
        .map(|pair| {
            let span = Span {
                start: pair[0],
                end: pair[1],
            };
            let n = merged
                .iter()
                .filter(|i| i.start <= span.start && i.end >= span.end)
                .count();
            (span, n)
        })
        .collect()
}

/// Joins spans that touch (`a.end == b.start`); input is ordered and non-overlapping.
fn merge_adjacent(spans: impl IntoIterator<Item = Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for s in spans {
        match out.last_mut() {
            Some(last) if last.end == s.start => last.end = s.end,
            _ => out.push(s),
        }
    }
    out
}
