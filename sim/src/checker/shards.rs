//! The checker of a sharded run: each shard held to the single election's bounds, over the
//! servers' logs (ground truth) and the shard terms and work the replicas' electors published,
//! and the space held to its balance.
//!
//! | property | what |
//! |---|---|
//! | mutual exclusion | the servers' logs: no lock held by two sessions in conflicting modes |
//! | overlap | per shard and pair of replicas, acting as owner (term open, or a unit of its work running) at once for at most 2·I + T |
//! | graceful overlap | a shard term ended by a handover, a stop or a resign (or being made ineligible), whose lock its own session released (unlock, unlock-all): the term and every unit of its work ended before the release |
//! | operator controls | the base checker's: no shard term of an incarnation begins during its resign's hold-off or while it is ineligible (its shards are re-owned by the liveness rule) |
//! | detection | a shard term ends within 2·I of its lock's loss (release, or its server deposed) |
//! | orphan bound | a member session (and so its shards) is never idle longer than 4·I |
//! | stranded lock | a shard lock held by a healthy replica's session that believes neither the term nor a handover of it, for longer than I + margin; and when every replica is asked to stop, every lock of the space is held by a current incarnation on the primary, each shard by the one that owns it |
//! | liveness | a shard free on the primary is taken within I + margin by a replica that begins its term (see [`ShardChecker::liveness`] for the window) |
//! | balance | from every replica up + [`Params::balance_bound`](crate::setup::Params::balance_bound) to the stop, every replica owns ⌊K/R⌋ or ⌈K/R⌉ shards and every shard has one owner |
//! | clean stop | the base checker's, and no shard term left open |

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use plexsphere_leader_pgsim::{Event, LockKey, LockMode};

use super::space::{self, Noun, Space, Tenure, merge};
use super::{Checker, Evidence, Measurements, Property, Violation, max, ms};
use crate::record::{TermEnd, TermRecord};
use crate::setup::{SERVERS, Sharding};

/// The second half of the member lock.
const MEMBER: i32 = plexsphere_leader::shard_sql::MEMBER_OBJ_ID;

/// What only sharded runs measure, summed or maximised over runs (the rules every space shares
/// measure into [`Measurements`]: terms, overlap, detection, orphan idle, the leaderless gap and
/// their cases).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardMeasurements {
    /// Sharded runs.
    pub runs: usize,
    /// Largest time a checked shard stayed without owner, from the moment it became free to
    /// the moment its next owner's term began, whatever held it open.
    pub leaderless: Option<Duration>,
    /// Largest time from the moment it became free where a member that could not take (cut
    /// off, stopping, deposed) or that left or joined held the window open (bounded by that
    /// member's end, or its join, + I + margin).
    pub ghost_gap: Option<Duration>,
    /// Largest time from every replica up to a balanced space that stayed balanced.
    pub balance: Option<Duration>,
    /// Free shards checked against a bound a ghost or a leave extended.
    pub ghost_gaps: usize,
    /// Terms ended by a handover whose unlock was checked against the term's work.
    pub handovers: usize,
    /// Terms ended by a graceful stop whose unlock-all was checked against the term's work.
    pub stops: usize,
    /// Shard moves: a shard granted to another replica than its previous holder.
    pub moves: usize,
    /// Membership changes: a member lock granted or released (on the primary).
    pub membership_changes: usize,
    /// Moves after every replica was up (the rebalance), summed over runs.
    pub settle_moves: usize,
    /// The most moves one run made after every replica was up.
    pub max_settle_moves: usize,
}

impl ShardMeasurements {
    /// Sums the counts and keeps the larger of each maximum.
    pub fn merge(&mut self, other: &Self) {
        self.runs += other.runs;
        self.leaderless = max(self.leaderless, other.leaderless);
        self.ghost_gap = max(self.ghost_gap, other.ghost_gap);
        self.balance = max(self.balance, other.balance);
        self.ghost_gaps += other.ghost_gaps;
        self.handovers += other.handovers;
        self.stops += other.stops;
        self.moves += other.moves;
        self.membership_changes += other.membership_changes;
        self.settle_moves += other.settle_moves;
        self.max_settle_moves = self.max_settle_moves.max(other.max_settle_moves);
    }
}

/// Checks a sharded run of `sharding` in the space of `class`; returns what it measured and
/// every violation, in time order.
pub(crate) fn check(
    evidence: &Evidence<'_>,
    sharding: Sharding,
    class: i32,
) -> (Measurements, Vec<Violation>) {
    let mut base = Checker::new(evidence);
    base.harness();
    base.mutual_exclusion();
    base.operator_controls();
    base.clean_stop();
    let mut checker = ShardChecker::new(base, sharding, class);
    // The shard space's rules every space shares: detection and overlap, per shard, to the
    // bounds of the mechanism (none for leases).
    checker.base.shared_rules();
    checker.graceful();
    if evidence.mechanism.holds_session() {
        // A lease space holds no session: no orphan, and a row nobody believes in ends with
        // its member's lease.
        checker.orphans();
        checker.stranded();
    }
    checker.stranded_at_stop();
    // A lease space's takes bring every shard term its epoch, rising per shard.
    if evidence.fencing {
        checker.base.epochs_rise();
    }
    checker.liveness();
    checker.balance();
    checker.moves();
    checker.base.open_terms();
    let ShardChecker {
        base, mut measured, ..
    } = checker;
    let mut violations = base.violations;
    violations.sort_by_key(|v| (v.at, v.property));
    measured.runs = 1;
    let measurements = Measurements {
        terms: evidence.history.terms.len(),
        faults: evidence.history.faults,
        shards: measured,
        ..base.measured
    };
    (measurements, violations)
}

struct ShardChecker<'a> {
    base: Checker<'a>,
    shards: u32,
    /// Every tenure of the member lock, in grant order.
    members: Vec<Tenure>,
    measured: ShardMeasurements,
}

impl<'a> ShardChecker<'a> {
    fn new(mut base: Checker<'a>, sharding: Sharding, class: i32) -> Self {
        let e = base.e;
        let (holds, members) = if e.mechanism.holds_session() {
            Self::locks(&base, sharding, class)
        } else {
            let found = super::lease::shard_tenures(
                &e.servers,
                &base.owners,
                e.history,
                class,
                sharding.shards,
            );
            base.violations.extend(found.violations);
            (found.shards, found.members)
        };
        Self::over(base, sharding, holds, members)
    }

    /// The tenures of the space's advisory locks, by shard, and of the member lock.
    fn locks(
        base: &Checker<'a>,
        sharding: Sharding,
        class: i32,
    ) -> (BTreeMap<u32, Vec<Tenure>>, Vec<Tenure>) {
        let mut holds: BTreeMap<u32, Vec<Tenure>> = BTreeMap::new();
        let mut members = Vec::new();
        // The shard locks `(class, s)`, `0 <= s < K`, held exclusively; the member lock
        // `(class, -1)` held in shared mode, numbered `u32::MAX`.
        let lock_of = |key, mode| match (key, mode) {
            (LockKey::Pair(c, MEMBER), LockMode::Shared) if c == class => Some(u32::MAX),
            (LockKey::Pair(c, s), LockMode::Exclusive) if c == class => {
                u32::try_from(s).ok().filter(|&s| s < sharding.shards)
            }
            _ => None,
        };
        for (server, evidence) in base.e.servers.iter().enumerate() {
            let owners = &base.owners[server];
            for (lock, tenure) in space::tenures(server, &evidence.log, owners, lock_of) {
                match lock {
                    u32::MAX => members.push(tenure),
                    shard => holds.entry(shard).or_default().push(tenure),
                }
            }
        }
        for tenures in holds.values_mut() {
            tenures.sort_by_key(|t| (t.granted, t.server, t.pid));
        }
        members.sort_by_key(|t| (t.granted, t.server, t.pid));
        (holds, members)
    }

    /// The checker of the space `holds` (by shard) with its members' tenures.
    fn over(
        mut base: Checker<'a>,
        sharding: Sharding,
        mut holds: BTreeMap<u32, Vec<Tenure>>,
        members: Vec<Tenure>,
    ) -> Self {
        let e = base.e;
        base.space = Space {
            noun: Noun::Shard,
            history: e.history,
            end: base.end,
            replicas: e.replicas,
            holds: (0..sharding.shards)
                .map(|shard| (shard, holds.remove(&shard).unwrap_or_default()))
                .collect(),
            work: e.work,
            replicated: !e.mechanism.holds_session(),
        };
        Self {
            base,
            shards: sharding.shards,
            members,
            measured: ShardMeasurements::default(),
        }
    }

    fn terms(&self) -> &'a [TermRecord] {
        &self.base.e.history.terms
    }

    /// A graceful handover or stop: the term, and every unit of its work, ended before the
    /// replica released the lock (its unlock or unlock-all, or its closing the session; a
    /// crash ends the host's work with it).
    fn graceful(&mut self) {
        for term in self.terms() {
            if !matches!(
                term.end,
                TermEnd::HandedOver | TermEnd::Stopped | TermEnd::Resigned
            ) {
                continue;
            }
            let Some(hold) = self.base.hold_of(term) else {
                continue;
            };
            let (Some(released), true) = (hold.released, hold.unlocked) else {
                continue;
            };
            if term.end == TermEnd::HandedOver {
                self.measured.handovers += 1;
            } else {
                self.measured.stops += 1;
            }
            let ended = term.span.end_or(self.base.end);
            let work_end = self
                .base
                .e
                .work
                .iter()
                .filter(|w| {
                    w.replica == term.replica
                        && w.incarnation == term.incarnation
                        && w.lock == term.lock
                        && w.term == term.id
                })
                .map(|w| w.span.end_or(self.base.end))
                .max();
            let how = match term.end {
                TermEnd::HandedOver => "handed over",
                TermEnd::Resigned => "resigned",
                _ => "stopped",
            };
            if ended > released {
                self.base.violate(
                    released,
                    Property::GracefulOverlap,
                    format!(
                        "{} ({how}) ended {} after its session (pid {}) released the shard's lock",
                        self.base.space.name(term),
                        ms(ended - released),
                        hold.pid
                    ),
                );
            }
            if let Some(work_end) = work_end.filter(|&end| end > released) {
                // A successor whose term began while that work ran.
                let successor = self
                    .terms()
                    .iter()
                    .filter(|t| {
                        t.lock == term.lock
                            && t.replica != term.replica
                            && t.span.start >= released
                            && t.span.start < work_end
                    })
                    .min_by_key(|t| t.span.start)
                    .map_or_else(String::new, |t| {
                        format!(
                            "; r{}.{} began its term of the shard {} before that work ended",
                            t.replica,
                            t.incarnation,
                            ms(work_end - t.span.start)
                        )
                    });
                self.base.violate(
                    released,
                    Property::GracefulOverlap,
                    format!(
                        "{} ({how}): its session (pid {}) released the shard's lock while the term's work ran {} longer{successor}",
                        self.base.space.name(term),
                        hold.pid,
                        ms(work_end - released)
                    ),
                );
            }
        }
    }

    /// Every idle period of a member session (which holds its shards) is at most 4·I.
    fn orphans(&mut self) {
        let what = "the member lock (and its shards)";
        self.base.orphans_of(&self.members, what);
    }

    /// What replica `replica`'s incarnation `incarnation` believed about `shard`: its terms
    /// and its handovers, merged.
    fn believed(&self, replica: usize, incarnation: u32, shard: u32) -> Vec<(Duration, Duration)> {
        let end = self.base.end;
        let history = self.base.e.history;
        let terms = history
            .terms
            .iter()
            .filter(|t| t.replica == replica && t.incarnation == incarnation && t.lock == shard)
            .map(|t| t.span);
        let handing = history
            .handing
            .iter()
            .filter(|h| h.replica == replica && h.incarnation == incarnation && h.shard == shard)
            .map(|h| h.span);
        merge(
            terms
                .chain(handing)
                .map(|span| (span.start, span.end_or(end))),
        )
    }

    /// A shard lock held by a session whose healthy replica believes neither its term nor its
    /// handover, for longer than I + margin (a take whose answer it ignored, a lock kept
    /// after a term it ended, …).
    fn stranded(&mut self) {
        let bound = self.base.p.interval + self.base.p.margin();
        let tail = self.base.p.disturbance_tail();
        let mut found = Vec::new();
        for (&shard, tenures) in &self.base.space.holds {
            for tenure in tenures {
                let Some((replica, incarnation)) = tenure.owner else {
                    continue;
                };
                let until = tenure.released.unwrap_or(self.base.end);
                let believed = self.believed(replica, incarnation, shard);
                for (from, to) in gaps_in((tenure.granted, until), &believed) {
                    if to - from <= bound {
                        continue;
                    }
                    let current = self.base.e.history.is_current(replica, incarnation, from);
                    let up = self.base.e.history.up.iter().any(|u| {
                        u.replica == replica && u.span.start <= from && u.span.end_or(to) >= to
                    });
                    let disturbed = self.base.disturbed(replica, from.saturating_sub(tail), to)
                        || self
                            .base
                            .interrupted(tenure.server, from.saturating_sub(tail), to);
                    if current && up && !disturbed {
                        found.push((from, shard, replica, incarnation, *tenure, to - from));
                    }
                }
            }
        }
        for (from, shard, replica, incarnation, tenure, held) in found {
            self.base.violate(
                from,
                Property::StrandedLock,
                format!(
                    "r{replica}.{incarnation}'s session (pid {} on {}) held shard {shard} for {} while the replica believed neither a term nor a handover of it (bound {})",
                    tenure.pid,
                    SERVERS[tenure.server],
                    ms(held),
                    ms(bound)
                ),
            );
        }
    }

    /// When every replica is asked to stop: every lock of the space on either server is held
    /// by a session of a current incarnation on the primary, and every shard lock by the
    /// incarnation that owns the shard (a take answered within a round trip excepted).
    fn stranded_at_stop(&mut self) {
        let history = self.base.e.history;
        let Some(stop) = history.stop_all else {
            return;
        };
        let primary = history.primary_at(stop);
        let mut problems = Vec::new();
        for (server, locks) in history.locks_at_stop.iter().enumerate() {
            // The exclusion proof's key is no lock of the space (its session is judged as one).
            for lock in locks
                .iter()
                .filter(|lock| !super::is_proof_key(lock.id.key))
            {
                let owner = self.base.owners[server].get(&lock.pid).copied();
                let name = owner.map_or_else(
                    || format!("pid {}", lock.pid),
                    |(r, n)| format!("r{r}.{n} (pid {})", lock.pid),
                );
                let what = match lock.id.key {
                    LockKey::Pair(_, MEMBER) => "the member lock".to_owned(),
                    LockKey::Pair(_, shard) => format!("shard {shard}"),
                    key => format!("{key:?}"),
                };
                let current = owner
                    .is_some_and(|(r, n)| history.is_current(r, n, stop) && self.up_at(r, stop));
                if server != primary || !current {
                    problems.push(format!(
                        "{name} holds {what} on {} (not the primary's session of a running replica)",
                        SERVERS[server]
                    ));
                    continue;
                }
                let (LockKey::Pair(_, shard), LockMode::Exclusive) = (lock.id.key, lock.mode)
                else {
                    continue;
                };
                let Some((replica, incarnation)) = owner else {
                    continue;
                };
                let shard = shard.cast_unsigned();
                let believes = self.terms().iter().any(|t| {
                    t.replica == replica
                        && t.incarnation == incarnation
                        && t.lock == shard
                        && t.span.start <= stop
                        && t.span.end.is_none_or(|end| end >= stop)
                });
                let taking = self.base.space.holds.get(&shard).is_some_and(|tenures| {
                    tenures.iter().any(|t| {
                        t.pid == lock.pid
                            && t.held_at(stop)
                            && stop - t.granted <= self.base.p.round_trip()
                    })
                });
                if !believes && !taking {
                    problems.push(format!(
                        "{name} holds {what} on {}, which it does not own",
                        SERVERS[server]
                    ));
                }
            }
        }
        for problem in problems {
            self.base.violate(
                stop,
                Property::StrandedLock,
                format!("at the stop: {problem}"),
            );
        }
    }

    fn up_at(&self, replica: usize, at: Duration) -> bool {
        self.base.e.history.up.iter().any(|u| {
            u.replica == replica && u.span.start <= at && u.span.end.is_none_or(|end| end >= at)
        })
    }

    /// Whether member `tenure` can take a shard promptly over `[from, to]`: its session is
    /// its current incarnation's, running and not asked to stop, with no fault on its link to
    /// the server and no raised query latency from `disturbance_tail` before `from`.
    fn able(&self, tenure: &Tenure, from: Duration, to: Duration) -> bool {
        let history = self.base.e.history;
        let Some((replica, incarnation)) = tenure.owner else {
            return false;
        };
        let since = from.max(tenure.granted);
        let until = to.min(tenure.released.unwrap_or(to));
        let tail = self.base.p.disturbance_tail();
        // A lease member's row outlives its incarnation, and its replica's next registration,
        // until the lease expires: a ghost once a new incarnation runs or the replica joined
        // again as another member (a session member ends with its client, or is bounded by
        // the orphan rule).
        let superseded = self
            .members
            .iter()
            .any(|m| m.owner == tenure.owner && m.granted > tenure.granted && m.granted <= until);
        let current = history.is_current(replica, incarnation, since)
            && (!self.base.space.replicated
                || history.is_current(replica, incarnation, until) && !superseded);
        let up = history.up.iter().any(|u| {
            u.replica == replica
                && u.span.start <= since
                && u.span.end.is_none_or(|end| end >= until)
        });
        let link = history.link_faults.iter().any(|f| {
            f.replica == replica
                && self.on(f.server, tenure.server)
                && f.span.meets(from.saturating_sub(tail), to)
        });
        let slow = history.latency.iter().any(|(server, span)| {
            self.on(*server, tenure.server) && span.meets(from.saturating_sub(tail), to)
        });
        current && up && !link && !slow
    }

    /// Whether some shard of the space is held on `server` at `at`.
    fn any_held(&self, server: usize, at: Duration) -> bool {
        self.base
            .space
            .holds
            .values()
            .flatten()
            .any(|t| self.on(t.server, server) && t.held_at(at))
    }

    /// Whether a hold on server `held` counts on `server`: the same server, or any when the
    /// space lives in the committed tables, which follow a failover (a lease space's rows).
    fn on(&self, held: usize, server: usize) -> bool {
        self.base.space.replicated || held == server
    }

    /// The moments `shard` becomes free on the running primary: a release of its lock, the
    /// server's start, the primary's change.
    fn free_moments(&self, shard: u32) -> Vec<(usize, Duration)> {
        let history = self.base.e.history;
        let mut moments: Vec<(usize, Duration)> = self
            .base
            .space
            .holds
            .get(&shard)
            .into_iter()
            .flatten()
            .filter_map(|t| {
                let released = t.released?;
                // A lease row is freed wherever the primary of the moment is.
                let on = if self.base.space.replicated {
                    history.primary_at(released)
                } else {
                    t.server
                };
                Some((on, released))
            })
            .collect();
        // A lease space's rows outlive a crash and follow a failover: only a release, an
        // expiry or a reap frees a shard.
        let servers = if self.base.space.replicated {
            &[][..]
        } else {
            &self.base.e.servers[..]
        };
        for (server, evidence) in servers.iter().enumerate() {
            for entry in &evidence.log {
                if entry.event == Event::ServerStarted {
                    moments.push((server, entry.at));
                }
            }
        }
        if !self.base.space.replicated {
            moments.extend(
                history
                    .primaries
                    .iter()
                    .map(|&(since, server)| (server, since)),
            );
        }
        let held = |server: usize, at: Duration| {
            self.base.space.holds.get(&shard).is_some_and(|tenures| {
                tenures
                    .iter()
                    .any(|t| self.on(t.server, server) && t.held_at(at))
            })
        };
        moments.retain(|&(server, at)| {
            history.primary_at(at) == server && self.base.running(server, at) && !held(server, at)
        });
        moments.sort();
        moments.dedup();
        moments
    }

    /// A shard that becomes free on the primary is taken within I + margin, and its taker's
    /// term begins within the same bound; the window is measured from the moment a member
    /// able to take is on the server (a failover or a restart leaves none until the replicas
    /// reconnect), plus one I when nothing of the space is held then (a cold start waits the
    /// rebalance delay). A member that cannot take (cut off, stopping, its link or server
    /// disturbed), or that leaves, may be the one every plan gives the shard to: the window
    /// then runs until that member's session is gone (the orphan bound ends a cut-off one)
    /// plus I + margin. A member that joins in the window changes every plan (the caps'
    /// extra slots go to the members owning the most): the window runs until its join plus
    /// I + margin, by when every member surveyed the new membership. Another shard freed in
    /// the window, before the planned taker surveyed, may take the last of that taker's room and
    /// move this shard to another member's plan (each member plans from its own survey): the
    /// window then runs until that other free plus I + margin, once (two intervals at most for
    /// this cause). A case whose window reaches the stop, or in which the server crashes or
    /// is deposed, or with no able member, is not checked.
    fn liveness(&mut self) {
        let history = self.base.e.history;
        let stop = history.stop_all.unwrap_or(self.base.end);
        let step = self.base.p.interval + self.base.p.margin();
        let mut found = Vec::new();
        let frees: Vec<(u32, usize, Duration)> = (0..self.shards)
            .flat_map(|shard| {
                self.free_moments(shard)
                    .into_iter()
                    .map(move |(server, at)| (shard, server, at))
            })
            .collect();
        for shard in 0..self.shards {
            for (server, free) in self.free_moments(shard) {
                let first_able = self
                    .members
                    .iter()
                    .filter(|t| {
                        self.on(t.server, server)
                            && t.released.is_none_or(|r| r > free)
                            && t.granted <= stop
                    })
                    .filter(|t| self.able(t, free.max(t.granted), free.max(t.granted) + step))
                    .map(|t| t.granted.max(free))
                    .min();
                let Some(start) = first_able else {
                    continue;
                };
                let cold = !self.any_held(server, start);
                let plain = start
                    + step
                    + if cold {
                        self.base.p.interval
                    } else {
                        Duration::ZERO
                    };
                // Another shard freed after this one and before its planned taker's survey.
                let concurrent = frees
                    .iter()
                    .filter(|(other, s, at)| {
                        *other != shard && *s == server && *at > free && *at <= plain
                    })
                    .map(|(_, _, at)| *at + step)
                    .max();
                let mut deadline = plain.max(concurrent.unwrap_or(plain));
                for _ in 0..16 {
                    let extended = self
                        .members
                        .iter()
                        .filter(|t| {
                            self.on(t.server, server)
                                && t.granted <= deadline
                                && t.released.is_none_or(|r| r > free)
                        })
                        .filter_map(|t| {
                            let end = t.released.unwrap_or(self.base.end);
                            let leaves = end <= deadline;
                            let joins = t.granted > start;
                            if leaves || !self.able(t, free, deadline) {
                                Some(end + step)
                            } else if joins {
                                Some(t.granted + step)
                            } else {
                                None
                            }
                        })
                        .max()
                        .unwrap_or(deadline);
                    if extended <= deadline {
                        break;
                    }
                    deadline = extended;
                }
                if deadline > stop || self.base.interrupted(server, free, deadline) {
                    continue;
                }
                let ghost = deadline > plain;
                let next = self
                    .base
                    .space
                    .holds
                    .get(&shard)
                    .into_iter()
                    .flatten()
                    .filter(|t| self.on(t.server, server) && t.granted >= free)
                    .min_by_key(|t| t.granted)
                    .copied();
                // The next grant, if it came before the server crashed or was deposed.
                let grant = next.filter(|g| !self.base.interrupted(server, free, g.granted));
                let Some(grant) = grant else {
                    found.push((
                        free,
                        format!(
                            "shard {shard} stayed free on {} for more than {} (bound {}{})",
                            SERVERS[server],
                            ms(deadline - free),
                            ms(deadline - free),
                            if ghost {
                                ", a member that could not take, left or joined in the window"
                            } else {
                                ""
                            }
                        ),
                    ));
                    continue;
                };
                let Some((replica, incarnation)) = grant.owner else {
                    continue;
                };
                let began = self
                    .terms()
                    .iter()
                    .filter(|t| {
                        t.replica == replica
                            && t.incarnation == incarnation
                            && t.lock == shard
                            && t.span.start >= grant.granted
                    })
                    .map(|t| t.span.start)
                    .min();
                let taker_able = self.members.iter().any(|m| {
                    self.on(m.server, server)
                        && m.owner == grant.owner
                        && m.held_at(grant.granted)
                        && self.able(m, grant.granted, grant.granted + self.base.p.margin())
                });
                // A taker cut off, stopping or lost as it took makes no owner; the lock's
                // release is then a free moment of its own.
                if grant.granted <= deadline
                    && (!taker_able
                        || grant
                            .released
                            .is_some_and(|released| began.is_none_or(|b| b > released)))
                {
                    continue;
                }
                // A taker that lost the lock before its term began made no owner: its grant
                // is the measure (its release is a free moment of its own).
                let lost = grant
                    .released
                    .is_some_and(|released| began.is_none_or(|b| b > released));
                let began = match began {
                    Some(began) if !lost => began,
                    _ => grant.granted,
                };
                let gap = began - free;
                self.measured.leaderless = max(self.measured.leaderless, Some(gap));
                if ghost {
                    self.measured.ghost_gap = max(self.measured.ghost_gap, Some(gap));
                    self.measured.ghost_gaps += 1;
                } else {
                    // From the moment a member able to take was there.
                    let waited = began.saturating_sub(start);
                    let measured = &mut self.base.measured;
                    measured.gap = max(measured.gap, Some(waited));
                    measured.cases.gaps += 1;
                }
                if began > deadline {
                    found.push((free, format!(
                        "shard {shard} had no owner for {} after it became free on {} (r{replica}.{incarnation} was granted it {} after; bound {}{})",
                        ms(gap),
                        SERVERS[server],
                        ms(grant.granted - free),
                        ms(deadline - free),
                        if ghost { ", a member that could not take, left or joined in the window" } else { "" }
                    )));
                }
            }
        }
        for (at, detail) in found {
            self.base.violate(at, Property::Liveness, detail);
        }
    }

    /// From every replica up + the balance bound to the stop, the space stays balanced: each
    /// replica owns ⌊K/R⌋ or ⌈K/R⌉ shards and each shard has exactly one owner.
    fn balance(&mut self) {
        let history = self.base.e.history;
        let (Some(all_up), Some(stop)) = (history.all_up, history.stop_all) else {
            return;
        };
        let moves = Sharding {
            shards: self.shards,
        }
        .moves(self.base.p);
        let bound = self
            .base
            .p
            .balance_bound(self.shards, self.base.e.replicas, moves);
        let mut points: Vec<Duration> = vec![all_up];
        for term in self.terms() {
            for at in [Some(term.span.start), term.span.end].into_iter().flatten() {
                if at > all_up && at < stop {
                    points.push(at);
                }
            }
        }
        points.sort();
        points.dedup();
        let mut settled = Some(all_up);
        let mut last_bad = None;
        for &at in &points {
            match self.imbalance(at) {
                Some(what) => {
                    settled = None;
                    last_bad = Some((at, what));
                }
                None if settled.is_none() => settled = Some(at),
                None => {}
            }
        }
        if let Some(settled) = settled {
            self.measured.balance = max(self.measured.balance, Some(settled - all_up));
        }
        let late = settled.is_none_or(|settled| settled > all_up + bound);
        if late && all_up + bound < stop {
            let (at, what) = last_bad.unwrap_or((stop, String::new()));
            self.base.violate(
                at,
                Property::Balance,
                format!(
                    "{} after every replica was up the space was not balanced (bound {}): {what}",
                    ms(at - all_up),
                    ms(bound)
                ),
            );
        }
    }

    /// What is wrong with the ownership at `at` (after every change at that instant), if
    /// anything: a replica owning outside ⌊K/R⌋..=⌈K/R⌉, a shard without owner or with two.
    fn imbalance(&self, at: Duration) -> Option<String> {
        let open = |t: &&TermRecord| t.span.start <= at && t.span.end.is_none_or(|e| e > at);
        let mut owners: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        let mut counts = vec![0_u32; self.base.e.replicas];
        for term in self.terms().iter().filter(open) {
            owners.entry(term.lock).or_default().push(term.replica);
            counts[term.replica] += 1;
        }
        let replicas = u32::try_from(self.base.e.replicas)
            .unwrap_or(u32::MAX)
            .max(1);
        let (low, high) = (self.shards / replicas, self.shards.div_ceil(replicas));
        let mut what = String::new();
        for (replica, count) in counts.iter().enumerate() {
            if !(low..=high).contains(count) {
                let _ = write!(what, "r{replica} owns {count} (not {low}..={high}); ");
            }
        }
        for shard in 0..self.shards {
            match owners.get(&shard).map_or(0, Vec::len) {
                1 => {}
                0 => {
                    let _ = write!(what, "shard {shard} has no owner; ");
                }
                n => {
                    let _ = write!(what, "shard {shard} has {n} owners; ");
                }
            }
        }
        (!what.is_empty()).then(|| what.trim_end_matches("; ").to_owned())
    }

    /// Counts the moves (a shard granted on the primary to another replica than its previous
    /// holder on that server since the server last started) and the membership changes on
    /// the primary, and the moves after every replica was up.
    fn moves(&mut self) {
        let history = self.base.e.history;
        let all_up = history.all_up.unwrap_or(self.base.end);
        let starts: Vec<(usize, Duration)> = super::logged(&self.base.e.servers)
            .filter(|(_, entry)| entry.event == Event::ServerStarted)
            .map(|(server, entry)| (server, entry.at))
            .collect();
        let mut settle = 0;
        for tenures in self.base.space.holds.values() {
            let mut previous: BTreeMap<usize, (usize, Duration)> = BTreeMap::new();
            for tenure in tenures {
                let Some((replica, _)) = tenure.owner else {
                    continue;
                };
                let before = previous.insert(tenure.server, (replica, tenure.granted));
                let restarted = |since: Duration| {
                    starts
                        .iter()
                        .any(|&(s, at)| s == tenure.server && at > since && at <= tenure.granted)
                };
                let moved =
                    before.is_some_and(|(holder, since)| holder != replica && !restarted(since));
                if moved && history.primary_at(tenure.granted) == tenure.server {
                    self.measured.moves += 1;
                    if tenure.granted >= all_up {
                        settle += 1;
                    }
                }
            }
        }
        self.measured.settle_moves = settle;
        self.measured.max_settle_moves = settle;
        self.measured.membership_changes = self
            .members
            .iter()
            .filter(|t| history.primary_at(t.granted) == t.server)
            .map(|t| 1 + usize::from(t.released.is_some()))
            .sum();
    }
}

/// The parts of `(from, to)` that no interval of the sorted, merged `covered` covers.
fn gaps_in(
    (from, to): (Duration, Duration),
    covered: &[(Duration, Duration)],
) -> Vec<(Duration, Duration)> {
    let mut gaps = Vec::new();
    let mut at = from;
    for &(start, end) in covered {
        if end <= at {
            continue;
        }
        if start >= to {
            break;
        }
        if start > at {
            gaps.push((at, start));
        }
        at = at.max(end);
    }
    if at < to {
        gaps.push((at, to));
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn gaps_are_the_uncovered_parts() {
        let covered = [(d(10), d(20)), (d(30), d(40))];
        assert_eq!(
            gaps_in((d(0), d(50)), &covered),
            vec![(d(0), d(10)), (d(20), d(30)), (d(40), d(50))]
        );
        assert_eq!(gaps_in((d(12), d(18)), &covered), vec![]);
        assert_eq!(gaps_in((d(15), d(35)), &covered), vec![(d(20), d(30))]);
    }

    #[test]
    fn merge_joins_touching_and_overlapping_spans() {
        let spans = [(d(5), d(8)), (d(0), d(5)), (d(10), d(12)), (d(11), d(20))];
        assert_eq!(merge(spans.into_iter()), vec![(d(0), d(8)), (d(10), d(20))]);
    }
}

/// The sharded checker on handcrafted runs built with the checkers' shared [`Run`] builder.
#[cfg(test)]
mod properties {
    use plexsphere_leader_pgsim::{EndReason, HeldLock, LockId, LockKey, LockMode, ReleaseReason};

    use super::MEMBER;
    use crate::checker::Property;
    use crate::checker::tests::{CLASS, Run, assert_clean, assert_only, ms, span};
    use crate::record::{TermEnd, Work};

    fn shard(s: i32) -> LockKey {
        LockKey::Pair(CLASS, s)
    }

    /// `pid` takes shard `s` at `at`.
    fn take(run: &mut Run, pid: i32, s: i32, at: u64) {
        run.lock(pid, shard(s), LockMode::Exclusive, at);
    }

    /// `pid` gives shard `s` up at `at` for `reason`.
    fn give(run: &mut Run, pid: i32, s: i32, at: u64, reason: ReleaseReason) {
        run.unlock(pid, shard(s), LockMode::Exclusive, at, reason);
    }

    const CUT_OFF: ReleaseReason = ReleaseReason::SessionEnd(EndReason::ConnectionError);

    /// r0 owns shard 0 from 12 on a lock taken at 10; its session is cut off at 1000 and the
    /// term ends at `ended`.
    fn shard_lost_at_1000(ended: u64) -> Run {
        let mut run = Run::new(2);
        let pid = run.session(0, 0);
        take(&mut run, pid, 0, 10);
        give(&mut run, pid, 0, 1000, CUT_OFF);
        run.shard_term(0, 0, 12, Some(ended), TermEnd::Lost);
        run
    }

    #[test]
    fn an_owner_that_ends_its_shard_term_within_2i_of_losing_the_lock_keeps_detection() {
        assert_clean(&shard_lost_at_1000(1203).check_sharded(2));
    }

    #[test]
    fn an_owner_still_owning_a_tick_past_2i_after_losing_the_lock_breaks_detection() {
        let found = shard_lost_at_1000(1204).check_sharded(2);
        assert_only(&found, Property::Detection);
        assert!(found[0].detail.contains("still owned the shard 204ms"));
    }

    #[test]
    fn a_shard_term_without_a_grant_of_the_shard_breaks_detection() {
        let mut run = Run::new(2);
        run.shard_term(0, 1, 12, Some(100), TermEnd::Lost);
        let found = run.check_sharded(2);
        assert_only(&found, Property::Detection);
        assert!(found[0].detail.contains("without a grant of the shard"));
    }

    /// Shard 0's first owner r0 is cut off at 1000 and ends its term at 1200, its last unit
    /// of the shard's work at `work_end`; r1 takes the shard at 1001 and owns it from 1010.
    fn shard_successor_at_1010(work_end: u64) -> Run {
        let mut run = shard_lost_at_1000(1200);
        run.work.push(Work {
            replica: 0,
            incarnation: 1,
            lock: 0,
            term: 1,
            span: span(1150, work_end),
        });
        let pid = run.session(1, 0);
        take(&mut run, pid, 0, 1001);
        give(&mut run, pid, 0, 2000, ReleaseReason::UnlockAll);
        run.shard_term(1, 0, 1010, Some(2000), TermEnd::Stopped);
        run
    }

    #[test]
    fn two_owners_of_a_shard_for_2i_plus_t_keep_the_overlap_bound() {
        assert_clean(&shard_successor_at_1010(1010 + 228).check_sharded(2));
    }

    #[test]
    fn two_owners_of_a_shard_a_tick_past_2i_plus_t_break_the_overlap_bound() {
        let found = shard_successor_at_1010(1010 + 229).check_sharded(2);
        assert_only(&found, Property::Overlap);
        assert!(found[0].detail.contains("owner of shard 0 for 229ms"));
    }

    /// r0 hands shard 0 over: its term ends at `ended`, its unit of work of that term at
    /// `work_end`, and its session unlocks the shard at 1000.
    fn handed_over(ended: u64, work_end: u64) -> Run {
        let mut run = Run::new(2);
        let pid = run.session(0, 0);
        take(&mut run, pid, 0, 10);
        give(&mut run, pid, 0, 1000, ReleaseReason::Unlock);
        let term = run.shard_term(0, 0, 12, Some(ended), TermEnd::HandedOver);
        run.work.push(Work {
            replica: 0,
            incarnation: 1,
            lock: 0,
            term,
            span: span(900, work_end),
        });
        run
    }

    #[test]
    fn a_handover_ending_the_term_and_its_work_by_the_unlock_is_graceful() {
        assert_clean(&handed_over(1000, 1000).check_sharded(2));
    }

    #[test]
    fn a_handover_whose_term_outlives_the_unlock_breaks_graceful_overlap() {
        let found = handed_over(1001, 1000).check_sharded(2);
        assert_only(&found, Property::GracefulOverlap);
        assert!(found[0].detail.contains("ended 1ms after its session"));
    }

    #[test]
    fn a_handover_whose_work_outlives_the_unlock_breaks_graceful_overlap() {
        let found = handed_over(1000, 1001).check_sharded(2);
        assert_only(&found, Property::GracefulOverlap);
        assert!(
            found[0]
                .detail
                .contains("while the term's work ran 1ms longer")
        );
    }

    /// r0's member session joins by a statement answered at 10, is idle until its next
    /// statement arrives at `next`, and leaves at 500.
    fn member_idle_until(next: u64) -> Run {
        let mut run = Run::new(2);
        let pid = run.session(0, 0);
        let member = LockKey::Pair(CLASS, MEMBER);
        run.query(pid, 9, Some(10)).query(pid, next, Some(next + 1));
        run.lock(pid, member, LockMode::Shared, 10);
        run.unlock(pid, member, LockMode::Shared, 500, ReleaseReason::UnlockAll);
        run
    }

    #[test]
    fn a_member_session_idle_for_4i_keeps_the_orphan_bound() {
        assert_clean(&member_idle_until(10 + 403).check_sharded(2));
    }

    #[test]
    fn a_member_session_idle_a_tick_past_4i_breaks_the_orphan_bound() {
        let found = member_idle_until(10 + 404).check_sharded(2);
        assert_only(&found, Property::OrphanBound);
        assert!(found[0].detail.contains("idle for 404ms"));
    }

    /// A healthy r0's session takes shard 0 at 10 without the replica believing a term of
    /// it, and unlocks it at `released`.
    fn taken_unbelieved(released: u64) -> Run {
        let mut run = Run::new(2);
        let pid = run.session(0, 0);
        take(&mut run, pid, 0, 10);
        give(&mut run, pid, 0, released, ReleaseReason::Unlock);
        run.up(0, 0, None);
        run
    }

    #[test]
    fn a_shard_lock_held_unbelieved_for_i_and_the_margin_is_not_stranded() {
        assert_clean(&taken_unbelieved(10 + 152).check_sharded(2));
    }

    #[test]
    fn a_shard_lock_held_unbelieved_a_tick_past_i_and_the_margin_is_stranded() {
        let found = taken_unbelieved(10 + 153).check_sharded(2);
        assert_only(&found, Property::StrandedLock);
        assert!(found[0].detail.contains("held shard 0 for 153ms"));
    }

    /// The stop is asked at 1000 while r0 owns shard 0 (taken at 10) and its session holds
    /// the lock of shard `held`.
    fn at_the_stop_holding(held: i32) -> Run {
        let mut run = Run::new(2);
        let pid = run.session(0, 0);
        take(&mut run, pid, 0, 10);
        give(&mut run, pid, 0, 1100, ReleaseReason::UnlockAll);
        run.shard_term(0, 0, 12, Some(1100), TermEnd::Stopped);
        run.up(0, 0, Some(1000));
        run.history.stop_all = Some(ms(1000));
        run.history.locks_at_stop = vec![
            vec![HeldLock {
                id: LockId {
                    database: "plexsphere".to_owned(),
                    key: shard(held),
                },
                pid,
                count: 1,
                mode: LockMode::Exclusive,
            }],
            Vec::new(),
        ];
        run
    }

    #[test]
    fn at_the_stop_every_shard_lock_held_by_its_owner_is_not_stranded() {
        assert_clean(&at_the_stop_holding(0).check_sharded(2));
    }

    #[test]
    fn at_the_stop_a_shard_lock_held_by_a_replica_that_does_not_own_it_is_stranded() {
        let found = at_the_stop_holding(1).check_sharded(2);
        assert_only(&found, Property::StrandedLock);
        assert!(found[0].detail.contains("which it does not own"));
    }

    /// One replica, up and a member from 0, over one shard, free from the server's start
    /// (a cold start: nothing of the space held); r0 takes it at 200 and owns it from
    /// `began` to 1000 (the stop is asked at 1100).
    fn cold_start(began: u64) -> Run {
        let mut run = Run::new(1);
        let pid = run.session(0, 0);
        let member = LockKey::Pair(CLASS, MEMBER);
        run.lock(pid, member, LockMode::Shared, 0);
        take(&mut run, pid, 0, 200);
        give(&mut run, pid, 0, 1000, ReleaseReason::Unlock);
        run.unlock(
            pid,
            member,
            LockMode::Shared,
            1100,
            ReleaseReason::UnlockAll,
        );
        run.shard_term(0, 0, began, Some(1000), TermEnd::Stopped);
        run.up(0, 0, None);
        run.history.stop_all = Some(ms(1100));
        run
    }

    #[test]
    fn a_free_shard_owned_within_2i_and_the_margin_of_a_cold_start_keeps_liveness() {
        assert_clean(&cold_start(252).check_sharded(1));
    }

    #[test]
    fn a_free_shard_owned_a_tick_past_2i_and_the_margin_of_a_cold_start_breaks_liveness() {
        let found = cold_start(253).check_sharded(1);
        assert_only(&found, Property::Liveness);
        assert!(found[0].detail.contains("had no owner for 253ms"));
    }

    /// Two replicas over two shards, every replica up at 0 and the stop asked at 3000: r0
    /// owns shard 0 from 100, r1 shard 1 from `second`.
    fn balanced_from(second: u64) -> Run {
        let mut run = Run::new(2);
        let (a, b) = (run.session(0, 0), run.session(1, 0));
        take(&mut run, a, 0, 90);
        take(&mut run, b, 1, second - 5);
        give(&mut run, a, 0, 3000, ReleaseReason::UnlockAll);
        give(&mut run, b, 1, 3000, ReleaseReason::UnlockAll);
        run.shard_term(0, 0, 100, Some(3000), TermEnd::Stopped);
        run.shard_term(1, 1, second, Some(3000), TermEnd::Stopped);
        run.history.all_up = Some(ms(0));
        run.history.stop_all = Some(ms(3000));
        run
    }

    #[test]
    fn a_space_balanced_within_the_balance_bound_keeps_balance() {
        // (7 + 1 round) · I + T + margin = 800 + 25 + 52 ms for 2 shards over 2 replicas.
        assert_clean(&balanced_from(877).check_sharded(2));
    }

    #[test]
    fn a_space_balanced_a_tick_past_the_balance_bound_breaks_balance() {
        let found = balanced_from(878).check_sharded(2);
        assert_only(&found, Property::Balance);
        assert!(found[0].detail.contains("shard 1 has no owner"));
    }

    #[test]
    fn a_shard_term_left_open_at_the_end_breaks_the_clean_stop() {
        let mut run = Run::new(2);
        let pid = run.session(0, 0);
        take(&mut run, pid, 0, 10);
        run.shard_term(0, 0, 12, None, TermEnd::Open);
        let found = run.check_sharded(2);
        assert_only(&found, Property::CleanStop);
        assert!(found[0].detail.contains("shard 0 term 1 is still open"));
    }
}
