//! The rules every lock of a space is held to, written once over a space of locks: the single
//! election is a space of one lock (lock 0, the leader's), a sharded run a space of `K` (lock
//! `s`, shard `s`). Detection, overlap and the orphan bound are judged here for both; the
//! checkers build the [`Space`] from their evidence and add what only their mechanism has.

use std::collections::BTreeMap;
use std::time::Duration;

use plexsphere_leader_pgsim::{
    EndReason, Event, LockKey, LockMode, LogEntry, QueryRecord, ReleaseReason,
};

use super::{Measurements, Owner, Property, Violation, max, ms};
use crate::record::{History, Span, TermRecord, Work};
use crate::setup::SERVERS;

/// One tenure of a lock on one server: a session's first grant to the release of its last
/// count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tenure {
    pub(crate) server: usize,
    pub(crate) pid: i32,
    pub(crate) owner: Option<Owner>,
    pub(crate) granted: Duration,
    pub(crate) released: Option<Duration>,
    /// Released by its own replica: an unlock, the unlock-all, or the client closing the
    /// session (Terminate, or the socket's FIN), not a server-side end.
    pub(crate) unlocked: bool,
    /// The release was `pg_terminate_backend` ending the holding session (a nemesis fault).
    pub(crate) terminated: bool,
    /// Granted in the instant the session's queued wait timed out: the statement failed with
    /// 55P03 though the session holds the lock (`Event::GrantedAtLockTimeout`).
    pub(crate) at_timeout: bool,
}

impl Tenure {
    /// A tenure granted to `pid` at `at`, still held.
    pub(crate) fn granted(
        server: usize,
        pid: i32,
        owners: &BTreeMap<i32, Owner>,
        at: Duration,
    ) -> Self {
        Self {
            server,
            pid,
            owner: owners.get(&pid).copied(),
            granted: at,
            released: None,
            unlocked: false,
            terminated: false,
            at_timeout: false,
        }
    }

    /// The tenure ends at `at`, for `reason`.
    pub(crate) fn release(&mut self, at: Duration, reason: ReleaseReason) {
        self.released = Some(at);
        self.unlocked = matches!(
            reason,
            ReleaseReason::Unlock
                | ReleaseReason::UnlockAll
                | ReleaseReason::SessionEnd(EndReason::ClientClosed | EndReason::ClientTerminate)
        );
        self.terminated = reason == ReleaseReason::SessionEnd(EndReason::Terminated);
    }

    pub(crate) fn held_at(&self, at: Duration) -> bool {
        self.granted <= at && self.released.is_none_or(|released| released > at)
    }
}

/// What the locks of a space are: the words a violation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Noun {
    /// One election's lock.
    Leader,
    /// Shard `s` is lock `s`.
    Shard,
}

/// What one rule measured over the space: the longest case, the count of cases, and the
/// violations.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) longest: Option<Duration>,
    pub(crate) cases: usize,
    pub(crate) violations: Vec<Violation>,
}

impl Found {
    fn case(&mut self, length: Duration) {
        self.longest = max(self.longest, Some(length));
        self.cases += 1;
    }

    fn violate(&mut self, at: Duration, property: Property, detail: String) {
        self.violations.push(Violation {
            at,
            property,
            detail,
        });
    }
}

/// A space of locks as the checker reads it: each lock's tenures, the terms on each (the
/// history's) and the work of each, in simulated time up to `end`.
pub(crate) struct Space<'a> {
    pub(crate) noun: Noun,
    pub(crate) history: &'a History,
    pub(crate) end: Duration,
    pub(crate) replicas: usize,
    /// Every tenure of each lock, by lock, in grant order.
    pub(crate) holds: BTreeMap<u32, Vec<Tenure>>,
    /// Every unit of work on a lock of the space.
    pub(crate) work: &'a [Work],
    /// Whether the locks live in the committed tables, which follow a failover to the
    /// synchronous standby (the lease): a deposed server then ends no tenure.
    pub(crate) replicated: bool,
}

impl Space<'_> {
    /// When `tenure` stopped counting: released, or its server deposed as the primary (or it
    /// never was the primary at the grant).
    pub(crate) fn loss(&self, tenure: &Tenure) -> Duration {
        let history = self.history;
        if history.primary_at(tenure.granted) != tenure.server {
            return tenure.granted;
        }
        let moved = history
            .primaries
            .iter()
            .find(|(since, server)| *since > tenure.granted && *server != tenure.server)
            .map(|(since, _)| *since)
            .filter(|_| !self.replicated);
        match (tenure.released, moved) {
            (Some(released), Some(moved)) => released.min(moved),
            (Some(at), None) | (None, Some(at)) => at,
            (None, None) => self.end + Duration::from_secs(3600),
        }
    }

    /// The tenure a term rests on: its incarnation's latest grant of the term's lock at or
    /// before the term began.
    pub(crate) fn hold_of(&self, term: &TermRecord) -> Option<Tenure> {
        let owner = (term.replica, term.incarnation);
        self.holds
            .get(&term.lock)?
            .iter()
            .filter(|t| t.owner == Some(owner) && t.granted <= term.span.start)
            .max_by_key(|t| t.granted)
            .copied()
    }

    /// `r0.1 term 3`, `r0.1 shard 2 term 3`.
    pub(crate) fn name(&self, term: &TermRecord) -> String {
        match self.noun {
            Noun::Leader => format!("r{}.{} term {}", term.replica, term.incarnation, term.id),
            Noun::Shard => format!(
                "r{}.{} shard {} term {}",
                term.replica, term.incarnation, term.lock, term.id
            ),
        }
    }

    /// A term ends within `bound` (2·I) of its lock's loss (release, or its server deposed);
    /// a term without a grant of its lock breaks it at once.
    pub(crate) fn detection(&self, bound: Duration) -> Found {
        let mut found = Found::default();
        let (grant, still, its) = match self.noun {
            Noun::Leader => ("a grant", "still led", "the lock"),
            Noun::Shard => ("a grant of the shard", "still owned the shard", "its lock"),
        };
        for term in &self.history.terms {
            let who = self.name(term);
            let Some(hold) = self.hold_of(term) else {
                let detail = format!("{who} began without {grant}");
                found.violate(term.span.start, Property::Detection, detail);
                continue;
            };
            let lost = self.loss(&hold);
            let ended = term.span.end_or(self.end);
            if lost >= ended {
                continue;
            }
            let since = lost.max(term.span.start);
            let delay = ended - since;
            found.case(delay);
            if delay > bound {
                let (delay, pid, server, bound) =
                    (ms(delay), hold.pid, SERVERS[hold.server], ms(bound));
                let detail = if self.replicated {
                    format!(
                        "{who} {still} {delay} after its lease (claimed by pid {pid} on {server}) ended on the server (bound {bound})"
                    )
                } else {
                    format!(
                        "{who} {still} {delay} after its session (pid {pid} on {server}) lost {its} (bound {bound})"
                    )
                };
                found.violate(since, Property::Detection, detail);
            }
        }
        found
    }

    /// The rules every space shares, measured into `measured`: detection (`detection_bound`,
    /// 2·I for a lock session) and overlap (`overlap_bound`, 2·I + T for a lock session);
    /// their violations.
    pub(crate) fn shared_rules(
        &self,
        detection_bound: Duration,
        overlap_bound: Duration,
        measured: &mut Measurements,
    ) -> Vec<Violation> {
        let detection = self.detection(detection_bound);
        measured.detection = max(measured.detection, detection.longest);
        measured.cases.detections += detection.cases;
        let overlap = self.overlap(overlap_bound);
        measured.overlap = max(measured.overlap, overlap.longest);
        measured.cases.overlaps += overlap.cases;
        let mut violations = detection.violations;
        violations.extend(overlap.violations);
        violations
    }

    /// After every replica stopped, no term on a lock of the space is left open.
    pub(crate) fn open_terms(&self) -> Found {
        let mut found = Found::default();
        for term in self.history.terms.iter().filter(|t| t.span.end.is_none()) {
            let detail = format!("{} is still open", self.name(term));
            found.violate(self.end, Property::CleanStop, detail);
        }
        found
    }

    /// Replica `replica`'s intervals of acting on `lock`: its terms and the units of work of
    /// the lock, merged. A unit of work that a pause of the replica's process met acts until
    /// the pause began: what runs on after the resume is work already in flight, which the
    /// reference leaves to fencing (the fence-holds property judges its writes), not a belief.
    pub(crate) fn acting(&self, replica: usize, lock: u32) -> Vec<(Duration, Duration)> {
        let terms = self
            .history
            .terms
            .iter()
            .filter(|t| t.replica == replica && t.lock == lock)
            .map(|t| t.span);
        let work = self
            .work
            .iter()
            .filter(|w| w.replica == replica && w.lock == lock)
            .map(|w| self.until_paused(replica, w.span));
        merge(
            terms
                .chain(work)
                .map(|span| (span.start, span.end_or(self.end))),
        )
    }

    /// `span` of replica `replica`, up to the first pause of its process that began inside it.
    fn until_paused(&self, replica: usize, span: Span) -> Span {
        let end = span.end_or(self.end);
        let paused = self
            .history
            .pauses
            .iter()
            .filter(|(r, pause)| *r == replica && pause.start > span.start && pause.start < end)
            .map(|(_, pause)| pause.start)
            .min();
        match paused {
            Some(at) => Span {
                start: span.start,
                end: Some(at),
            },
            None => span,
        }
    }

    /// At most one replica acts on each lock, except for at most `bound` (2·I + T: within the
    /// detection bound of a lost session, and the last unit of work).
    pub(crate) fn overlap(&self, bound: Duration) -> Found {
        let mut found = Found::default();
        for &lock in self.holds.keys() {
            let acting: Vec<_> = (0..self.replicas).map(|r| self.acting(r, lock)).collect();
            for a in 0..acting.len() {
                for b in a + 1..acting.len() {
                    for (start, end) in intersections(&acting[a], &acting[b]) {
                        let length = end - start;
                        found.case(length);
                        if length > bound {
                            let role = match self.noun {
                                Noun::Leader => "leader".to_owned(),
                                Noun::Shard => format!("owner of shard {lock}"),
                            };
                            let detail = format!(
                                "r{a} and r{b} both acted as {role} for {} (bound {})",
                                ms(length),
                                ms(bound)
                            );
                            found.violate(start, Property::Overlap, detail);
                        }
                    }
                }
            }
        }
        found
    }
}

/// The tenures of a server log's locks, in grant order, each numbered by `lock_of` from its
/// key and mode (`None`: not a lock of the space): a session's first grant opens one, the
/// release of its last count ends it, a grant at a `lock_timeout` (55P03) marks it.
pub(crate) fn tenures(
    server: usize,
    log: &[LogEntry],
    owners: &BTreeMap<i32, Owner>,
    lock_of: impl Fn(LockKey, LockMode) -> Option<u32>,
) -> Vec<(u32, Tenure)> {
    let mut tenures: Vec<(u32, Tenure)> = Vec::new();
    for entry in log {
        // `None`: granted; `Some(None)`: granted at the lock_timeout; `Some(reason)`: released.
        let (pid, lock, mode, ended) = match &entry.event {
            Event::LockGranted {
                pid,
                lock,
                count: 1,
                mode,
            } => (*pid, lock, *mode, None),
            Event::GrantedAtLockTimeout { pid, lock } => {
                (*pid, lock, LockMode::Exclusive, Some(None))
            }
            Event::LockReleased {
                pid,
                lock,
                remaining: 0,
                mode,
                reason,
            } => (*pid, lock, *mode, Some(Some(*reason))),
            _ => continue,
        };
        let Some(number) = lock_of(lock.key, mode) else {
            continue;
        };
        let Some(ended) = ended else {
            tenures.push((number, Tenure::granted(server, pid, owners, entry.at)));
            continue;
        };
        let open = tenures
            .iter_mut()
            .rev()
            .find(|(n, t)| *n == number && t.pid == pid && t.released.is_none());
        match (open, ended) {
            (Some((_, open)), Some(reason)) => open.release(entry.at, reason),
            (Some((_, open)), None) => open.at_timeout = true,
            (None, _) => {}
        }
    }
    tenures
}

/// The orphan bound: the session of each of `tenures` is never idle longer than `bound` (4·I)
/// from the answer of the statement that was granted the lock to its release; `what` names a
/// tenure's lock in the violation (`the lock`).
pub(crate) fn orphans<'t>(
    queries: impl Fn(usize) -> &'t [QueryRecord],
    tenures: &[Tenure],
    end: Duration,
    bound: Duration,
    what: &str,
) -> Found {
    let mut found = Found::default();
    for tenure in tenures {
        let until = tenure.released.unwrap_or(end);
        for (from, to) in idle_periods(queries(tenure.server), tenure, until) {
            let idle = to.saturating_sub(from);
            found.case(idle);
            if idle > bound {
                let detail = format!(
                    "pid {} on {} held {what} idle for {} (bound {})",
                    tenure.pid,
                    SERVERS[tenure.server],
                    ms(idle),
                    ms(bound)
                );
                found.violate(from, Property::OrphanBound, detail);
            }
        }
    }
    found
}

/// The idle periods of `tenure`'s session from the answer of the statement that was granted
/// the lock to `until`: answer → arrival of the next statement.
fn idle_periods(
    queries: &[QueryRecord],
    tenure: &Tenure,
    until: Duration,
) -> Vec<(Duration, Duration)> {
    let mut mine = queries.iter().filter(|q| q.pid == tenure.pid);
    let Some(mut idle_since) = mine
        .by_ref()
        .find(|q| q.answered.is_some_and(|a| a >= tenure.granted))
        .and_then(|q| q.answered)
    else {
        return Vec::new();
    };
    let mut periods = Vec::new();
    for query in mine {
        if query.received > until {
            break;
        }
        periods.push((idle_since, query.received));
        match query.answered {
            Some(answered) => idle_since = answered,
            None => return periods,
        }
    }
    if idle_since <= until {
        periods.push((idle_since, until));
    }
    periods
}

/// Sorted, merged intervals.
pub(crate) fn merge(
    spans: impl Iterator<Item = (Duration, Duration)>,
) -> Vec<(Duration, Duration)> {
    let mut spans: Vec<(Duration, Duration)> = spans.collect();
    spans.sort();
    let mut merged: Vec<(Duration, Duration)> = Vec::new();
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The intersections of two sorted lists of disjoint intervals.
pub(crate) fn intersections(
    a: &[(Duration, Duration)],
    b: &[(Duration, Duration)],
) -> Vec<(Duration, Duration)> {
    let (mut i, mut j) = (0, 0);
    let mut out: Vec<(Duration, Duration)> = Vec::new();
    while i < a.len() && j < b.len() {
        let start = a[i].0.max(b[j].0);
        let end = a[i].1.min(b[j].1);
        if start < end {
            match out.last_mut() {
                Some(last) if last.1 >= start => last.1 = last.1.max(end),
                _ => out.push((start, end)),
            }
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}
