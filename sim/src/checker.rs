//! The checker: the bounds of design.md section 6, over the server logs (ground truth) and the
//! replicas' terms and work, in simulated time; and, in fencing runs, the fencing properties
//! (`fence`).

mod fence;
mod lease;
mod preference;
pub(crate) mod shards;
mod space;

pub use shards::ShardMeasurements;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use plexsphere_leader_pgsim::{
    Event, HeldLock, LogEntry, QueryRecord, SessionInfo, check_mutual_exclusion,
};

use crate::record::{FencedWrite, History, TermEnd, TermRecord, Work};
use crate::setup::{Mechanism, Params, SERVERS, parse_application_name};

use self::space::{Found, Noun, Space, Tenure};

/// A property of design.md section 6 (or of the simulation itself) that a run can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Property {
    /// The server granted the lock to a session while another held it.
    MutualExclusion,
    /// Two replicas acted as leader at once for longer than 2·I + T.
    Overlap,
    /// A successor began before a gracefully stopped (or resigning) leader had ended its term.
    GracefulOverlap,
    /// An operator's controls were not honoured: a replica began a term during a resign's
    /// hold-off or while ineligible, or a resigning leader's lock was not released within the
    /// stop grace plus round trips while nothing disturbed it.
    OperatorControls,
    /// A leader noticed the loss of its session later than 2·I after it (or led without a
    /// grant).
    Detection,
    /// A session holding the lock stayed idle for longer than 4·I.
    OrphanBound,
    /// A lock granted in the instant a queued wait failed with 55P03 (the grant-at-timeout
    /// race) was not given back: the session's next statement did not release it (it went
    /// back to the pool holding the lock), or a healthy replica held it longer than the gap
    /// margin.
    StrandedLock,
    /// The lock stayed free, or no leader appeared, longer than I + round trips while a
    /// healthy standby existed.
    Liveness,
    /// After the faults stopped, no single leader appeared in time or it did not stay alone.
    SteadyState,
    /// Sharded runs: after the faults stopped the space was not balanced in time (every
    /// replica owning ⌊K/R⌋ or ⌈K/R⌉ shards, every shard one owner) or did not stay so.
    Balance,
    /// After every replica stopped, a lock, a session or a term was left, or a replica did not
    /// stop in time.
    CleanStop,
    /// Fitness runs (`--unfit`): the replica whose fitness probe the server refuses began a
    /// term, or never said that its probe was refused.
    Fitness,
    /// Rollout runs: a worse-ranked replica led while a better one had been a live candidate
    /// for longer than the window W plus the gap bound (of a standby that surveys before it
    /// tries), nothing else disturbing them.
    Preference,
    /// Rollout runs: more than one leader yielded between two rank changes (upgrades) of the
    /// rollout, nothing else disturbing the election.
    OneMove,
    /// Fencing: a term without an epoch (or with one though fencing is off), an epoch other
    /// than the one its lock session advanced to, or, ordered by the time the terms began,
    /// epochs that do not strictly increase.
    EpochsRise,
    /// Fencing: a fenced transaction committed on the primary although an epoch advance
    /// committed between its check and its commit (or the epoch at its commit was not the one
    /// it checked), or a write the service saw accepted is missing from the server's log.
    FenceHolds,
    /// The two runs of a seed produced different traces.
    Determinism,
    /// A host's software failed, or the adapter emitted an ERROR event or an inconsistent
    /// state.
    Harness,
}

impl Property {
    /// The name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::MutualExclusion => "mutual-exclusion",
            Self::Overlap => "overlap",
            Self::GracefulOverlap => "graceful-overlap",
            Self::OperatorControls => "operator-controls",
            Self::Detection => "detection",
            Self::OrphanBound => "orphan-bound",
            Self::StrandedLock => "stranded-lock",
            Self::Liveness => "liveness",
            Self::SteadyState => "steady-state",
            Self::Balance => "balance",
            Self::CleanStop => "clean-stop",
            Self::Fitness => "fitness",
            Self::Preference => "preference",
            Self::OneMove => "one-move",
            Self::EpochsRise => "epochs-rise",
            Self::FenceHolds => "fence-holds",
            Self::Determinism => "determinism",
            Self::Harness => "harness",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// When (simulated time since the start of the run).
    pub at: Duration,
    /// Which property.
    pub property: Property,
    /// What happened.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: {}", self.property, secs(self.at), self.detail)
    }
}

/// The largest values a run showed, each with how many cases were measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measurements {
    /// Largest overlap of two replicas acting as leader (terms and work).
    pub overlap: Option<Duration>,
    /// Largest leaderless gap while the lock was free and a healthy standby existed.
    pub gap: Option<Duration>,
    /// Largest delay between losing the lock's session and ending the term.
    pub detection: Option<Duration>,
    /// Largest idle period of a session that held the lock.
    pub orphan_idle: Option<Duration>,
    /// Fencing: longest an epoch advance waited for other sessions' fenced transactions.
    pub advance_wait: Option<Duration>,
    /// Lease runs: the least time by which a term ended before its lease ended on the server
    /// without its holder's release (it expired, or was claimed once expired), over every such
    /// term: how close the leader's own clock came to the server's expiry. A term past it is a
    /// detection violation instead.
    pub lease_headroom: Option<Duration>,
    /// Terms of leadership observed.
    pub terms: usize,
    /// Faults injected.
    pub faults: usize,
    /// How many overlaps, leaderless gaps, detection delays and idle periods of lock-holding
    /// sessions were measured (each measured case was also checked against its bound).
    pub cases: Cases,
    /// Fencing: what the fenced units of work and the fenced commits came to.
    pub fence: FenceCounts,
    /// Sharded runs: what they measured.
    pub shards: ShardMeasurements,
}

/// What fencing runs came to, summed over runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceCounts {
    /// Runs with fencing on.
    pub runs: usize,
    /// Terms whose epoch was checked (every term of a fencing run).
    pub epochs: usize,
    /// Terms that began after their lock session had already lost the lock (the server
    /// crashed, or the lock moved on, while the answer to the advance was on its way): exempt
    /// from the rising order, which binds the terms that began holding the lock.
    pub late_terms: usize,
    /// Fenced units of work the service saw committed.
    pub accepted: usize,
    /// Fenced units of work whose check found a newer epoch (rolled back).
    pub stale: usize,
    /// Fenced units of work that failed (no connection, an error, the budget exhausted).
    pub failed: usize,
    /// Fenced transactions the primary committed (each checked against the epoch advances).
    pub commits: usize,
    /// Fenced transactions committed on a server that was no longer the primary (not checked:
    /// see docs/simulation.md).
    pub deposed_commits: usize,
}

impl FenceCounts {
    fn merge(&mut self, other: &Self) {
        self.runs += other.runs;
        self.epochs += other.epochs;
        self.late_terms += other.late_terms;
        self.accepted += other.accepted;
        self.stale += other.stale;
        self.failed += other.failed;
        self.commits += other.commits;
        self.deposed_commits += other.deposed_commits;
    }
}

/// How many cases of each bound a run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cases {
    /// Overlaps of two replicas acting as leader.
    pub overlaps: usize,
    /// Free-lock intervals with a healthy standby (the gap bound).
    pub gaps: usize,
    /// Terms that outlived their session (the detection bound).
    pub detections: usize,
    /// Idle periods of lock-holding sessions (the orphan bound).
    pub idle_periods: usize,
    /// Grants in the instant a queued wait's `lock_timeout` fired, answered with 55P03 all
    /// the same (PostgreSQL's grant-at-timeout race): each must be released at once.
    pub timeout_grants: usize,
}

impl Measurements {
    /// Records what the orphan rule found: the longest idle period of a lock-holding session,
    /// and how many it measured.
    fn idled(&mut self, found: &Found) {
        self.orphan_idle = max(self.orphan_idle, found.longest);
        self.cases.idle_periods += found.cases;
    }

    /// The larger of each value.
    pub fn merge(&mut self, other: &Self) {
        self.overlap = max(self.overlap, other.overlap);
        self.gap = max(self.gap, other.gap);
        self.detection = max(self.detection, other.detection);
        self.orphan_idle = max(self.orphan_idle, other.orphan_idle);
        self.advance_wait = max(self.advance_wait, other.advance_wait);
        self.lease_headroom = match (self.lease_headroom, other.lease_headroom) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.terms += other.terms;
        self.faults += other.faults;
        self.cases.overlaps += other.cases.overlaps;
        self.cases.gaps += other.cases.gaps;
        self.cases.detections += other.cases.detections;
        self.cases.idle_periods += other.cases.idle_periods;
        self.cases.timeout_grants += other.cases.timeout_grants;
        self.fence.merge(&other.fence);
        self.shards.merge(&other.shards);
    }
}

fn max(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// `1.234s`.
pub(crate) fn secs(at: Duration) -> String {
    format!("{}.{:03}s", at.as_secs(), at.subsec_millis())
}

/// What one server recorded and holds at the end.
pub(crate) struct ServerEvidence {
    pub(crate) log: Vec<LogEntry>,
    pub(crate) queries: Vec<QueryRecord>,
    pub(crate) sessions: Vec<SessionInfo>,
    pub(crate) locks: Vec<HeldLock>,
}

/// Every entry of every server's log, with the server's index, server by server in log
/// order.
pub(crate) fn logged(servers: &[ServerEvidence]) -> impl Iterator<Item = (usize, &LogEntry)> {
    servers
        .iter()
        .enumerate()
        .flat_map(|(server, evidence)| evidence.log.iter().map(move |entry| (server, entry)))
}

/// Everything the checker looks at.
pub(crate) struct Evidence<'a> {
    pub(crate) params: Params,
    pub(crate) replicas: usize,
    /// Whether the run's terms have epochs (fencing, or a lease).
    pub(crate) fencing: bool,
    /// How the run's replicas hold leadership.
    pub(crate) mechanism: Mechanism,
    pub(crate) history: &'a History,
    /// A fitness run's unfit replica ([`RunOptions::unfit_replica`](crate::RunOptions::unfit_replica)).
    pub(crate) unfit: Option<usize>,
    /// A rollout run: the replicas are ranked, and the rollout upgrades them.
    pub(crate) rollout: bool,
    /// Every unit of work on a lock of the space.
    pub(crate) work: &'a [Work],
    /// The fenced units of work, as the service saw them.
    pub(crate) fenced: &'a [FencedWrite],
    pub(crate) servers: Vec<ServerEvidence>,
}

/// A session's owner: (replica, incarnation).
type Owner = (usize, u32);

/// Checks a run; returns what it measured and every violation, in time order.
pub(crate) fn check(evidence: &Evidence<'_>) -> (Measurements, Vec<Violation>) {
    let mut checker = Checker::new(evidence);
    checker.harness();
    checker.mutual_exclusion();
    checker.shared_rules();
    checker.lease_headroom();
    checker.graceful();
    checker.operator_controls();
    checker.fitness();
    checker.preference();
    checker.one_move();
    checker.orphans();
    checker.stranded();
    checker.liveness();
    checker.steady_state();
    checker.clean_stop();
    checker.open_terms();
    checker.epochs_rise();
    checker.fence_holds();
    checker.violations.sort_by_key(|v| (v.at, v.property));
    checker.measured.terms = evidence.history.terms.len();
    checker.measured.faults = evidence.history.faults;
    (checker.measured, checker.violations)
}

struct Checker<'a> {
    e: &'a Evidence<'a>,
    p: Params,
    end: Duration,
    owners: Vec<BTreeMap<i32, Owner>>,
    holds: Vec<Tenure>,
    /// The election as a space of one lock.
    space: Space<'a>,
    measured: Measurements,
    violations: Vec<Violation>,
}

/// Whether `key` is the exclusion proof's (`plexsphere_leader_core::proof`): a key of its own
/// class, held within the proof by a pooled session, never an election's lock.
pub(crate) fn is_proof_key(key: plexsphere_leader_pgsim::LockKey) -> bool {
    matches!(
        key,
        plexsphere_leader_pgsim::LockKey::Pair(class, _)
            if class == plexsphere_leader_core::proof::PROOF_CLASS_ID
    )
}

impl<'a> Checker<'a> {
    fn new(e: &'a Evidence<'a>) -> Self {
        let owners: Vec<BTreeMap<i32, Owner>> = e.servers.iter().map(|s| owners(&s.log)).collect();
        let (holds, violations) = match e.mechanism {
            Mechanism::Advisory => {
                let holds = e
                    .servers
                    .iter()
                    .enumerate()
                    .flat_map(|(index, server)| {
                        // Every advisory lock but the exclusion proof's short-lived key.
                        space::tenures(index, &server.log, &owners[index], |key, _| {
                            (!is_proof_key(key)).then_some(0)
                        })
                    })
                    .map(|(_, tenure)| tenure)
                    .collect::<Vec<Tenure>>();
                (holds, Vec::new())
            }
            Mechanism::Lease => lease::tenures(&e.servers, &owners, e.history),
        };
        let space = Space {
            noun: Noun::Leader,
            history: e.history,
            end: e.history.end,
            replicas: e.replicas,
            holds: BTreeMap::from([(0, holds.clone())]),
            work: e.work,
            replicated: !e.mechanism.holds_session(),
        };
        let mut measured = Measurements::default();
        measured.cases.timeout_grants = holds.iter().filter(|h| h.at_timeout).count();
        Self {
            e,
            p: e.params,
            end: e.history.end,
            owners,
            holds,
            space,
            measured,
            violations,
        }
    }

    fn violate(&mut self, at: Duration, property: Property, detail: impl Into<String>) {
        self.violations.push(Violation {
            at,
            property,
            detail: detail.into(),
        });
    }

    fn harness(&mut self) {
        if let Some((at, what)) = &self.e.history.host_failure {
            self.violate(*at, Property::Harness, what.clone());
        }
        for (at, what) in &self.e.history.errors {
            self.violate(*at, Property::Harness, what.clone());
        }
    }

    fn mutual_exclusion(&mut self) {
        for (index, server) in self.e.servers.iter().enumerate() {
            if let Err(violation) = check_mutual_exclusion(&server.log) {
                let at = match &violation {
                    plexsphere_leader_pgsim::LogViolation::DoubleGrant { at, .. }
                    | plexsphere_leader_pgsim::LogViolation::BadRelease { at, .. }
                    | plexsphere_leader_pgsim::LogViolation::TimeWentBackwards { at, .. } => *at,
                };
                self.violate(
                    at,
                    Property::MutualExclusion,
                    format!("{}: {violation}", SERVERS[index]),
                );
            }
        }
    }

    /// The hold a term leads on: the owner's latest grant at or before the term began.
    fn hold_of(&self, term: &TermRecord) -> Option<Tenure> {
        self.space.hold_of(term)
    }

    /// Adds the violations `found` and returns its measure.
    fn record(&mut self, found: Found) -> (Option<Duration>, usize) {
        self.violations.extend(found.violations);
        (found.longest, found.cases)
    }

    /// The rules every space shares, over the election's one lock: detection and overlap, to
    /// the bounds of the run's mechanism (none for a lease).
    fn shared_rules(&mut self) {
        let mechanism = self.e.mechanism;
        let violations = self.space.shared_rules(
            mechanism.detection_bound(&self.p),
            mechanism.overlap_bound(&self.p),
            &mut self.measured,
        );
        self.violations.extend(violations);
    }

    /// Lease runs: the least headroom between a term's end and the server-side end of its
    /// lease, over the terms whose lease expired on them ([`Measurements::lease_headroom`]).
    fn lease_headroom(&mut self) {
        if self.e.mechanism.holds_session() {
            return;
        }
        self.measured.lease_headroom = self
            .e
            .history
            .terms
            .iter()
            .filter_map(|term| {
                let hold = self.hold_of(term)?;
                let expired = hold.released.filter(|_| !hold.unlocked)?;
                let ended = term.span.end?;
                expired.checked_sub(ended)
            })
            .min();
    }

    fn graceful(&mut self) {
        let history = self.e.history;
        let requests = history
            .stop_requests
            .iter()
            .map(|&(replica, asked)| (replica, asked, TermEnd::Stopped))
            .chain(
                history
                    .resign_requests
                    .iter()
                    .map(|&(replica, asked)| (replica, asked, TermEnd::Resigned)),
            );
        for (replica, asked, end) in requests {
            let Some(stopped) = history.terms.iter().find(|t| {
                t.replica == replica
                    && t.end == end
                    && t.span.start <= asked
                    && t.span.end.is_some_and(|end| end >= asked)
            }) else {
                continue;
            };
            let ended = stopped.span.end_or(self.end);
            for other in history.terms.iter().filter(|t| t.replica != replica) {
                if other.span.start >= asked && other.span.start < ended {
                    self.violate(
                        other.span.start,
                        Property::GracefulOverlap,
                        format!(
                            "r{} began term {} before the gracefully stopped r{} ended its term",
                            other.replica, other.id, replica
                        ),
                    );
                }
            }
        }
    }

    /// Resign and eligibility: no term begins while its incarnation is held out, and a
    /// resigning leader unlocks within the stop grace (one interval) plus round trips, unless a
    /// fault disturbed it or its server.
    /// The unfit replica never leads, and its refused probe is what kept it out: it said so
    /// (no term, yet no refusal, would be a replica that simply never got the lock).
    fn fitness(&mut self) {
        let Some(unfit) = self.e.unfit else {
            return;
        };
        if let Some(term) = self.e.history.terms.iter().find(|t| t.replica == unfit) {
            let at = term.span.start;
            let detail = format!(
                "r{unfit}, whose fitness probe the server refuses, began term {} at {}",
                term.id,
                secs(at)
            );
            self.violate(at, Property::Fitness, detail);
        }
        if self.e.history.unfit_refusals == 0 {
            let detail = format!("r{unfit} never said that its fitness probe was refused");
            self.violate(self.end, Property::Fitness, detail);
        }
    }

    fn operator_controls(&mut self) {
        let history = self.e.history;
        for held in &history.held_out {
            let until = held.span.end_or(self.end);
            let began = history.terms.iter().find(|t| {
                t.replica == held.replica
                    && t.incarnation == held.incarnation
                    && t.span.start > held.span.start
                    && t.span.start < until
            });
            if let Some(term) = began {
                self.violate(
                    term.span.start,
                    Property::OperatorControls,
                    format!(
                        "r{}.{} began term {} {} after it was held out (until {})",
                        term.replica,
                        term.incarnation,
                        term.id,
                        ms(term.span.start - held.span.start),
                        secs(until)
                    ),
                );
            }
        }
        let bound = self.p.interval + self.p.margin() + self.p.slack();
        for term in history.terms.iter().filter(|t| t.end == TermEnd::Resigned) {
            let (Some(ended), Some(hold)) = (term.span.end, self.hold_of(term)) else {
                continue;
            };
            let deadline = ended + bound;
            let released = hold.released.unwrap_or(self.end);
            // A dropped segment wedges the lock session's connection for good, however long
            // ago: its unlock never arrives, and idle_session_timeout ends it.
            let wedged = history.link_faults.iter().any(|f| {
                f.drops
                    && f.replica == term.replica
                    && f.server == hold.server
                    && f.span.meets(hold.granted, deadline)
            });
            let tail = self.p.disturbance_tail();
            if released <= deadline
                || deadline > self.end
                || wedged
                || self.disturbed(term.replica, ended.saturating_sub(tail), deadline)
                || self.interrupted(hold.server, ended, deadline)
            {
                continue;
            }
            self.violate(
                ended,
                Property::OperatorControls,
                format!(
                    "r{}.{} resigned term {} but its lock (pid {} on {}) was released {} later (bound {})",
                    term.replica,
                    term.incarnation,
                    term.id,
                    hold.pid,
                    SERVERS[hold.server],
                    ms(released - ended),
                    ms(bound)
                ),
            );
        }
    }

    /// The orphan bound of lock sessions; a lease has none (its server-side end is its TTL).
    fn orphans(&mut self) {
        if self.e.mechanism.holds_session() {
            self.orphans_of(&self.holds.clone(), "the lock");
        }
    }

    /// The orphan bound over the sessions of `tenures`, which hold `what`.
    fn orphans_of(&mut self, tenures: &[Tenure], what: &str) {
        let servers = &self.e.servers;
        let bound = self.p.orphan_bound();
        let found = space::orphans(|s| &servers[s].queries, tenures, self.end, bound, what);
        self.measured.idled(&found);
        self.record(found);
    }

    /// Whether replica `r` is a healthy standby candidate over `[from, to]`: up (not stopping)
    /// throughout, not leading at `from`, and no fault that disturbs its checks (a fault on one
    /// of its links, raised query latency, the termination of one of its sessions) met the
    /// window or ended less than `disturbance_tail` before it.
    fn healthy(&self, r: usize, from: Duration, to: Duration) -> bool {
        let history = self.e.history;
        let tail = self.p.disturbance_tail();
        let up = history.up.iter().any(|u| {
            u.replica == r && u.span.start <= from && u.span.end.is_none_or(|end| end >= to)
        });
        // A replica that still leads (on a session it has not found lost yet) is no standby.
        let leads = history.terms.iter().any(|t| {
            t.replica == r && t.span.start <= from && t.span.end.is_none_or(|end| end > from)
        });
        // An operator keeps it off the lock (a resign's hold-off, an ineligible spell).
        let held_out = history
            .held_out
            .iter()
            .any(|held| held.replica == r && held.span.meets(from, to));
        // A fitness run's unfit replica never takes the lock: no standby to wait for.
        let unfit = self.e.unfit == Some(r);
        up && !leads
            && !held_out
            && !unfit
            && !self.disturbed(r, from.saturating_sub(tail), to)
            && !self.cold_after_fault(r, from)
            && !self.may_defer(r, from, to)
    }

    /// Whether replica `r`'s incarnation running at `from` may still wait on its first
    /// connection setup: a fault met it within [`Params::first_setup_bound`] of its start,
    /// and that bound and the disturbance tail have not passed by `from`. (Seed 130409 of
    /// `--rollout`: a replica started during raised latency kept its unanswered first setup
    /// for 1.4 s, fourteen intervals.)
    fn cold_after_fault(&self, r: usize, from: Duration) -> bool {
        let bound = self.p.first_setup_bound();
        let tail = self.p.disturbance_tail();
        self.e.history.up.iter().any(|u| {
            let start = u.span.start;
            u.replica == r
                && start <= from
                && from < start + bound + tail
                && self.disturbed(r, start, start + bound)
        })
    }

    /// Whether a fault that disturbs replica `r`'s statements (a fault on one of its links,
    /// raised query latency, the termination of one of its sessions) met `[from, to]`.
    fn disturbed(&self, r: usize, from: Duration, to: Duration) -> bool {
        let history = self.e.history;
        history
            .link_faults
            .iter()
            .filter(|f| f.replica == r)
            .map(|f| f.span)
            .chain(history.latency.iter().map(|(_, span)| *span))
            .chain(
                history
                    .disturbances
                    .iter()
                    .filter(|(replica, _)| *replica == r)
                    .map(|(_, span)| *span),
            )
            .any(|span| span.meets(from, to))
    }

    /// The starts of the intervals in which the primary runs and its lock is free.
    fn free_starts(&self) -> Vec<(usize, Duration)> {
        let history = self.e.history;
        let mut starts = Vec::new();
        for (server, evidence) in self.e.servers.iter().enumerate() {
            for entry in &evidence.log {
                let frees = matches!(
                    &entry.event,
                    Event::ServerStarted | Event::LockReleased { remaining: 0, .. }
                );
                if frees {
                    starts.push((server, entry.at));
                }
            }
        }
        for &(since, server) in &history.primaries {
            starts.push((server, since));
        }
        // A lease becomes free when it ends (released or expired) on the server of the moment.
        if !self.e.mechanism.holds_session() {
            for released in self.holds.iter().filter_map(|h| h.released) {
                starts.push((history.primary_at(released), released));
            }
        }
        starts.retain(|&(server, at)| {
            history.primary_at(at) == server && self.running(server, at) && !self.held(server, at)
        });
        starts.sort();
        starts.dedup();
        starts
    }

    /// Whether server `s` runs at `at`, from its log.
    fn running(&self, s: usize, at: Duration) -> bool {
        self.e.servers[s]
            .log
            .iter()
            .take_while(|entry| entry.at <= at)
            .filter_map(|entry| match entry.event {
                Event::ServerStarted => Some(true),
                Event::ServerCrashed => Some(false),
                _ => None,
            })
            .last()
            .unwrap_or(false)
    }

    /// Whether some session holds the lock on server `s` at `at` (a lease, on whichever server
    /// it was claimed: it follows a failover).
    fn held(&self, s: usize, at: Duration) -> bool {
        let lease = !self.e.mechanism.holds_session();
        self.holds.iter().any(|h| {
            (lease || h.server == s) && h.granted <= at && h.released.is_none_or(|r| r > at)
        })
    }

    /// Whether the interval that began at `from` on server `s` was cut short (crash or
    /// failover) before `to`.
    fn interrupted(&self, s: usize, from: Duration, to: Duration) -> bool {
        let crashed = self.e.servers[s]
            .log
            .iter()
            .any(|e| e.at > from && e.at <= to && e.event == Event::ServerCrashed);
        let moved = self
            .e
            .history
            .primaries
            .iter()
            .any(|(since, _)| *since > from && *since <= to);
        crashed || moved
    }

    /// The grants in the instant a queued wait failed with 55P03: the session's next
    /// statement must release the lock (the elector's release-if-held), and a healthy
    /// replica must have released it within the gap margin.
    fn stranded(&mut self) {
        let margin = self.p.margin();
        for hold in self.holds.clone() {
            if !hold.at_timeout {
                continue;
            }
            let who = match hold.owner {
                Some((replica, incarnation)) => format!("r{replica}.{incarnation}"),
                None => "an unknown client".to_owned(),
            };
            let where_ = format!("pid {} on {}", hold.pid, SERVERS[hold.server]);
            let next = self.e.servers[hold.server]
                .queries
                .iter()
                .find(|q| q.pid == hold.pid && q.received > hold.granted);
            let still_held = |at: Duration| hold.released.is_none_or(|released| released > at);
            if let Some(answered) = next.and_then(|q| q.answered).filter(|&a| still_held(a)) {
                self.violate(
                    hold.granted,
                    Property::StrandedLock,
                    format!(
                        "{who} ({where_}) was granted the lock as its queued wait failed with 55P03, and the session's next statement (answered {}) left it held: the session went on, as back in the pool, holding the lock",
                        secs(answered)
                    ),
                );
                continue;
            }
            let held = hold.released.unwrap_or(self.end) - hold.granted;
            let healthy = hold.owner.is_some_and(|(replica, incarnation)| {
                self.e
                    .history
                    .is_current(replica, incarnation, hold.granted)
                    && self.healthy(
                        replica,
                        hold.granted.saturating_sub(self.p.tick),
                        hold.granted + margin,
                    )
            });
            if healthy && held > margin {
                self.violate(
                    hold.granted,
                    Property::StrandedLock,
                    format!(
                        "{who} ({where_}) kept the lock for {} after its queued wait failed with 55P03 though granted (bound {})",
                        ms(held),
                        ms(margin)
                    ),
                );
            }
        }
    }

    fn liveness(&mut self) {
        // A fitness run's standby probes before it tries, a rollout run's surveys.
        let bound = self
            .p
            .gap_bound_of(self.e.unfit.is_some() || self.e.rollout);
        let margin = self.p.margin();
        let stop = self.e.history.stop_all.unwrap_or(self.end);
        for (server, free) in self.free_starts() {
            let deadline = free + bound;
            if deadline > stop || self.interrupted(server, free, deadline) {
                continue;
            }
            let Some(standby) = (0..self.e.replicas).find(|&r| self.healthy(r, free, deadline))
            else {
                continue;
            };
            let grant = self
                .holds
                .iter()
                .filter(|h| h.server == server && h.granted >= free)
                .min_by_key(|h| h.granted)
                .copied();
            let Some(grant) = grant.filter(|g| g.granted <= deadline) else {
                self.violate(
                    free,
                    Property::Liveness,
                    format!(
                        "{} on {} stayed free for more than {} while r{standby} was a healthy standby",
                        self.e.mechanism.held_thing(),
                        SERVERS[server],
                        ms(bound)
                    ),
                );
                continue;
            };
            let Some((replica, incarnation)) = grant.owner else {
                continue;
            };
            // A grant to a session of an incarnation that no longer runs (a queued wait whose
            // client crashed: the waiting backend does not watch its socket) is no grant to a
            // standby; that session releases the lock as soon as it finds its client gone, and
            // that release is checked as a moment the lock becomes free.
            if !self
                .e
                .history
                .is_current(replica, incarnation, grant.granted)
            {
                continue;
            }
            // From a tick before the grant: an incarnation restarted at the grant is another one.
            let before = grant.granted.saturating_sub(self.p.tick);
            if !self.healthy(replica, before, grant.granted + margin) {
                continue;
            }
            // A grant whose queued wait failed with 55P03 in the same instant (the
            // grant-at-timeout race) makes no leader: the replica releases it at once (checked
            // by `stranded`), and that release is checked as a moment the lock becomes free.
            if grant.at_timeout {
                continue;
            }
            let began = self
                .e
                .history
                .terms
                .iter()
                .filter(|t| {
                    t.replica == replica
                        && t.incarnation == incarnation
                        && t.span.start >= grant.granted
                })
                .map(|t| t.span.start)
                .min();
            // The granted session was terminated before its term could begin (during the epoch
            // advance): the fault, not the replica, left the lock without a leader, and that
            // release is checked as a moment the lock becomes free.
            if grant.terminated
                && grant
                    .released
                    .is_some_and(|released| began.is_none_or(|began| began > released))
            {
                continue;
            }
            // A grant released again in the tick it was made, before any term of its replica
            // (the queued wait's own end in that instant, which its client never saw as a
            // grant: seed 222 of the advisory runs), made no leader: the lock passed on, and
            // the bound holds for the first term of any replica after the lock became free.
            let lost_at_once = grant.released.is_some_and(|released| {
                released <= grant.granted + self.p.tick
                    && began.is_none_or(|began| began > released)
            });
            let (began, waited) = if lost_at_once {
                let next = self
                    .e
                    .history
                    .terms
                    .iter()
                    .map(|t| t.span.start)
                    .filter(|start| *start >= free)
                    .min();
                (next, Duration::ZERO)
            } else {
                // Fencing: the advance's wait for an old leader's fenced transactions is
                // excused.
                (began, self.advance_wait(&grant))
            };
            let gap = (began.map_or(self.end, |began| began) - free).saturating_sub(waited);
            self.measured.gap = max(self.measured.gap, Some(gap));
            self.measured.cases.gaps += 1;
            if gap > bound {
                self.violate(
                    free,
                    Property::Liveness,
                    format!(
                        "no leader for {} after {} on {} became free, though r{replica} was granted it{} (bound {}{})",
                        ms(gap),
                        self.e.mechanism.held_thing(),
                        SERVERS[server],
                        if lost_at_once {
                            " and lost it in the same tick"
                        } else {
                            ""
                        },
                        ms(bound),
                        if waited.is_zero() {
                            String::new()
                        } else {
                            format!(
                                "; {} its epoch advance waited for fenced transactions not counted",
                                ms(waited)
                            )
                        }
                    ),
                );
            }
        }
    }

    fn steady_state(&mut self) {
        let history = self.e.history;
        let (Some(_), Some(all_up), Some(stop)) =
            (history.faults_stopped, history.all_up, history.stop_all)
        else {
            return;
        };
        let deadline = all_up + self.p.liveness_bound();
        if deadline >= stop {
            return;
        }
        let mut points: Vec<Duration> = vec![deadline];
        for term in &history.terms {
            for at in [Some(term.span.start), term.span.end].into_iter().flatten() {
                if at > deadline && at < stop {
                    points.push(at);
                }
            }
        }
        points.sort();
        points.dedup();
        for at in points {
            let leaders: Vec<String> = history
                .terms
                .iter()
                .filter(|t| t.span.start <= at && t.span.end.is_none_or(|end| end > at))
                .map(|t| format!("r{}", t.replica))
                .collect();
            if leaders.len() != 1 {
                let detail = if leaders.is_empty() {
                    format!(
                        "no leader {} after the faults stopped and every replica was up (bound {})",
                        ms(at - all_up),
                        ms(self.p.liveness_bound())
                    )
                } else {
                    format!("{} lead at once with no fault", leaders.join(" and "))
                };
                self.violate(at, Property::SteadyState, detail);
                return;
            }
        }
    }

    /// After every replica stopped, no term is left open.
    fn open_terms(&mut self) {
        let found = self.space.open_terms();
        self.record(found);
    }

    /// After every replica stopped: each stopped within its budget, no lock is held and no
    /// session is open (but one whose FIN a fault may have lost).
    fn clean_stop(&mut self) {
        let history = self.e.history;
        for &replica in &history.unstopped {
            self.violate(
                self.end,
                Property::CleanStop,
                format!("r{replica} did not stop within the stop budget"),
            );
        }
        // A stopped leader releases its lease: one a term rested on and still held when the run
        // ended was not released, unless a fault dropped messages on the leader's link while it
        // held the lease (its release may be stuck on a wedged connection; the TTL ends it).
        // A claim whose answer was lost leaves a lease no term rested on: the TTL ends it too.
        if !self.e.mechanism.holds_session() {
            let history = self.e.history;
            let held: Vec<Tenure> = self
                .holds
                .iter()
                .filter(|h| h.released.is_none())
                .copied()
                .collect();
            for hold in held {
                let led = history.terms.iter().any(|term| {
                    self.hold_of(term)
                        .is_some_and(|h| h.granted == hold.granted && h.pid == hold.pid)
                });
                let wedged = history.link_faults.iter().any(|f| {
                    f.drops
                        && hold.owner.is_some_and(|(replica, _)| replica == f.replica)
                        && f.span.meets(hold.granted, self.end)
                });
                if !led || wedged {
                    continue;
                }
                let owner = hold.owner.map_or_else(
                    || "an unknown client".to_owned(),
                    |(replica, incarnation)| format!("r{replica}.{incarnation}"),
                );
                let detail = format!(
                    "the lease {owner} led on, claimed at {} (pid {} on {}), is still held",
                    secs(hold.granted),
                    hold.pid,
                    SERVERS[hold.server]
                );
                self.violate(self.end, Property::CleanStop, detail);
            }
        }
        for (server, evidence) in self.e.servers.iter().enumerate() {
            // The exclusion proof's key lives and dies with its pooled session, which the
            // sessions' own check below judges.
            for lock in evidence
                .locks
                .iter()
                .filter(|lock| !is_proof_key(lock.id.key))
            {
                let detail = format!(
                    "pid {} still holds {:?} on {}",
                    lock.pid, lock.id.key, SERVERS[server]
                );
                self.violate(self.end, Property::CleanStop, detail);
            }
            for session in &evidence.sessions {
                if self.wedged(server, session) {
                    continue;
                }
                let detail = format!(
                    "session pid {} of {} is still open on {}",
                    session.pid, session.application_name, SERVERS[server]
                );
                self.violate(self.end, Property::CleanStop, detail);
            }
        }
    }

    /// Whether the client of `session` may have lost its FIN: a fault dropped messages on its
    /// link while it lived. Without TCP keepalives PostgreSQL keeps such a session open.
    fn wedged(&self, server: usize, session: &SessionInfo) -> bool {
        let Some(&(replica, _)) = self.owners[server].get(&session.pid) else {
            return false;
        };
        self.e.history.link_faults.iter().any(|f| {
            f.drops
                && f.replica == replica
                && f.server == server
                && f.span.meets(session.started_at, self.end)
        })
    }
}

/// The owner of every session of a server log, from its application name `r<i>.<n>`.
fn owners(log: &[LogEntry]) -> BTreeMap<i32, Owner> {
    log.iter()
        .filter_map(|entry| match &entry.event {
            Event::SessionStarted {
                pid,
                application_name,
                ..
            } => parse_owner(application_name).map(|owner| (*pid, owner)),
            _ => None,
        })
        .collect()
}

fn parse_owner(name: &str) -> Option<Owner> {
    parse_application_name(name)
}

/// `123ms`.
pub(crate) fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

#[cfg(test)]
mod tests;
