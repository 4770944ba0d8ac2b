//! Rollout runs: the preferred leader (issue 41) through a rolling deploy.
//!
//! - `preference`: no worse-ranked replica leads while a better one has been a live
//!   candidate for longer than the window W plus the gap bound of a standby that surveys
//!   before it tries ([`Params::gap_bound_of`], one round trip more), counted from the later
//!   of the better incarnation's start and the worse term's start (the leader leads W before
//!   it yields). A fault that met either replica, the servers or the better one's
//!   eligibility in that time exempts the pair.
//! - `one-move`: between two upgrades of the rollout (from one upgrade to the next, the last
//!   to the end of the run), at most one term ends by a yield: one move of leadership per
//!   rank change. A window in which another fault happened is exempt.

use std::time::Duration;

use plexsphere_leader::rank::Version;
use plexsphere_leader_pgsim::Event;

use super::{Checker, Property, secs};
use crate::record::TermEnd;

impl Checker<'_> {
    /// The version incarnation `incarnation` of replica `replica` was ranked with.
    fn version_of(&self, replica: usize, incarnation: u32) -> Option<Version> {
        let history = self.e.history;
        let (_, _, text) = history
            .versions
            .iter()
            .find(|(r, i, _)| *r == replica && *i == incarnation)?;
        Version::parse(text).ok()
    }

    /// Whether a fault other than the rollout's upgrades met `[from, to]`: of a replica's
    /// links or sessions, latency, a stop, a resign or ineligible spell, a server's restart or
    /// a failover, or an incarnation started by something else than an upgrade.
    fn other_fault(&self, from: Duration, to: Duration) -> bool {
        let history = self.e.history;
        let within = |at: Duration| at >= from && at <= to;
        let replicas = (0..self.e.replicas).any(|r| self.disturbed(r, from, to));
        let stops = history
            .stop_requests
            .iter()
            .any(|stop| within(stop.1) && !history.upgrades.contains(stop));
        let resigns = history.resign_requests.iter().any(|(_, at)| within(*at))
            || history.held_out.iter().any(|h| h.span.meets(from, to));
        let servers = history.primaries.iter().skip(1).any(|(at, _)| within(*at))
            || self.e.servers.iter().any(|server| {
                server
                    .log
                    .iter()
                    .any(|entry| entry.event == Event::ServerStarted && within(entry.at))
            });
        // An incarnation after the first one of its replica started by an upgrade's restart:
        // the replica's previous start was before that upgrade's stop, and no start between.
        let restarts = history.incarnations.iter().any(|&(r, incarnation, at)| {
            incarnation > 1 && within(at) && {
                let previous = history
                    .incarnations
                    .iter()
                    .filter(|(p, i, _)| *p == r && *i + 1 == incarnation)
                    .map(|(_, _, started)| *started)
                    .next()
                    .unwrap_or_default();
                !history
                    .upgrades
                    .iter()
                    .any(|&(u, asked)| u == r && asked >= previous && asked <= at)
            }
        });
        let pauses = history.pauses.iter().any(|(_, span)| span.meets(from, to));
        replicas || stops || resigns || servers || restarts || pauses
    }

    /// The version of replica `replica`'s incarnation current at `at`.
    fn version_at(&self, replica: usize, at: Duration) -> Option<Version> {
        let history = self.e.history;
        let (_, incarnation, _) = history
            .incarnations
            .iter()
            .rev()
            .find(|(r, _, started)| *r == replica && *started <= at)?;
        self.version_of(replica, *incarnation)
    }

    /// Rollout runs: whether standby `r` may rightly defer over `[from, to]` (no healthy
    /// standby then, for the gap bound): a better-ranked replica that a fault met, or that
    /// went down or up, within the defer limit ([`Params::defer_limit`]) before `from` or in
    /// the window, so that `r` may defer to a candidacy that is still live but will not take
    /// over, for at most the defer limit, as issue 41 designs it.
    pub(super) fn may_defer(&self, r: usize, from: Duration, to: Duration) -> bool {
        if !self.e.rollout {
            return false;
        }
        let Some(mine) = self.version_at(r, from) else {
            return false;
        };
        let since = from.saturating_sub(self.p.defer_limit() + self.p.disturbance_tail());
        let history = self.e.history;
        (0..self.e.replicas).filter(|&o| o != r).any(|o| {
            let better = [since, from, to]
                .into_iter()
                .any(|at| self.version_at(o, at).is_some_and(|theirs| theirs > mine));
            let changed = history.up.iter().any(|up| {
                up.replica == o
                    && (up.span.start >= since && up.span.start <= to
                        || up.span.end.is_some_and(|end| end >= since && end <= to))
            });
            better && (changed || self.disturbed(o, since, to))
        })
    }

    /// No worse-ranked leader while a better candidate has been live for W plus the gap bound.
    pub(super) fn preference(&mut self) {
        if !self.e.rollout {
            return;
        }
        let history = self.e.history;
        let window = self.p.preempt_window();
        let bound = window + self.p.gap_bound_of(true);
        let stop = history.stop_all.unwrap_or(self.end);
        let mut found = Vec::new();
        for term in history.terms.iter().filter(|t| t.lock == 0) {
            let Some(mine) = self.version_of(term.replica, term.incarnation) else {
                continue;
            };
            let term_end = term.span.end_or(self.end);
            for &(other, incarnation, started) in &history.incarnations {
                if other == term.replica {
                    continue;
                }
                let Some(theirs) = self.version_of(other, incarnation) else {
                    continue;
                };
                if theirs <= mine {
                    continue;
                }
                let up_end = history
                    .up
                    .iter()
                    .rev()
                    .find(|up| up.replica == other && up.span.start <= started)
                    .map_or(started, |up| up.span.end_or(self.end));
                let from = started.max(term.span.start);
                let deadline = from + bound;
                let live = term_end > deadline && up_end > deadline && deadline < stop;
                if !live || self.other_fault(from.saturating_sub(self.p.interval), deadline) {
                    continue;
                }
                found.push((
                    deadline,
                    format!(
                        "r{} (version {mine}) still led term {} at {}, although r{other}.{incarnation} \
                         (version {theirs}) had been a live candidate since {} and r{} had led \
                         since {}: past W {} plus the gap bound {}",
                        term.replica,
                        term.id,
                        secs(deadline),
                        secs(started),
                        term.replica,
                        secs(term.span.start),
                        secs(window),
                        secs(bound - window),
                    ),
                ));
                break;
            }
        }
        for (at, detail) in found {
            self.violate(at, Property::Preference, detail);
        }
    }

    /// At most one yield per rank change: between two upgrades, one term ends yielding.
    pub(super) fn one_move(&mut self) {
        if !self.e.rollout {
            return;
        }
        let history = self.e.history;
        let mut found = Vec::new();
        for (index, &(replica, asked)) in history.upgrades.iter().enumerate() {
            let until = history
                .upgrades
                .get(index + 1)
                .map_or(self.end, |(_, next)| *next);
            let yields: Vec<_> = history
                .terms
                .iter()
                .filter(|t| t.end == TermEnd::Yielded)
                .filter(|t| t.span.end.is_some_and(|end| end >= asked && end < until))
                .collect();
            if yields.len() <= 1 || self.other_fault(asked, until) {
                continue;
            }
            let moves: Vec<String> = yields
                .iter()
                .map(|t| {
                    format!(
                        "r{} term {} at {}",
                        t.replica,
                        t.id,
                        secs(t.span.end_or(self.end))
                    )
                })
                .collect();
            found.push((
                yields[1].span.end_or(self.end),
                format!(
                    "{} leaders yielded after the upgrade of r{replica} at {}, before the next \
                     rank change at {}: {}",
                    yields.len(),
                    secs(asked),
                    secs(until),
                    moves.join(", ")
                ),
            ));
        }
        for (at, detail) in found {
            self.violate(at, Property::OneMove, detail);
        }
    }
}
