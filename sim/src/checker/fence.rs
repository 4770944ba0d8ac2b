//! The fencing properties, over the terms the harness observed, the fenced units of work the
//! service recorded, and the servers' ground truth (epoch advances, fence checks, fenced
//! commits).
//!
//! - **epochs rise**: with fencing on every term has an epoch, the one its lock session
//!   advanced to (the server's log), and ordered by the time the terms began (across replicas,
//!   incarnations and servers) the epochs strictly increase. A term that began after its
//!   session had already lost the lock (its server crashed, or the lock moved on, while the
//!   answer to its advance was on its way) is exempt from the order: its epoch is stale, so
//!   fenced writes reject it, and the detection check bounds how long it lasts. With fencing
//!   off no term has an epoch.
//! - **fence holds**: for every fenced transaction the primary of the moment committed, no
//!   epoch advance of its row committed between its check and its commit, and the row's epoch
//!   at the commit is the one it checked. A commit on a server that was no longer the primary
//!   is counted, not checked: fencing protects writes to one database, and the real
//!   deposed primary's commit would wait for its synchronous standby's acknowledgement that
//!   never comes (the model commits it). And every write the service saw accepted is one
//!   the servers logged as a fenced commit of that replica incarnation and epoch.

use std::collections::BTreeMap;
use std::time::Duration;

use plexsphere_leader_pgsim::{Event, RowId};

use super::space::Noun;
use super::{Checker, Evidence, Property, Tenure, secs};
use crate::record::{FenceOutcome, TermRecord};
use crate::setup::{Mechanism, SERVERS};

/// One committed epoch advance: when, on which server (and where in its log), by which
/// session, of which row.
struct Advance<'a> {
    at: Duration,
    server: usize,
    index: usize,
    pid: i32,
    row: &'a RowId,
    epoch: i64,
    /// How long it waited for other sessions' fenced transactions.
    waited: Duration,
}

/// Every epoch advance of every server, in the order of its log.
fn advances<'e>(evidence: &'e Evidence<'_>) -> Vec<Advance<'e>> {
    let mut advances = Vec::new();
    for (server, server_evidence) in evidence.servers.iter().enumerate() {
        for (index, entry) in server_evidence.log.iter().enumerate() {
            if let Event::EpochAdvanced {
                pid,
                row,
                epoch,
                waited,
            } = &entry.event
            {
                advances.push(Advance {
                    at: entry.at,
                    server,
                    index,
                    pid: *pid,
                    row,
                    epoch: *epoch,
                    waited: *waited,
                });
            }
        }
    }
    advances
}

impl Checker<'_> {
    /// How long the epoch advance of `grant`'s session waited for fenced transactions (zero
    /// without fencing).
    pub(super) fn advance_wait(&self, grant: &Tenure) -> Duration {
        self.e.servers[grant.server]
            .log
            .iter()
            .filter(|entry| entry.at >= grant.granted)
            .find_map(|entry| match &entry.event {
                Event::EpochAdvanced { pid, waited, .. } if *pid == grant.pid => Some(*waited),
                _ => None,
            })
            .unwrap_or_default()
    }

    pub(super) fn epochs_rise(&mut self) {
        let e = self.e;
        let terms = &e.history.terms;
        if !e.fencing {
            for term in terms.iter().filter(|t| t.epoch.is_some()) {
                let detail = format!(
                    "{} has an epoch though fencing is off",
                    self.space.name(term)
                );
                self.violate(term.span.start, Property::EpochsRise, detail);
            }
            return;
        }
        self.measured.fence.runs = 1;
        let advances = advances(e);
        self.measured.advance_wait = advances.iter().map(|a| a.waited).max();
        let mut live: Vec<(&TermRecord, u64)> = Vec::new();
        for term in terms {
            let Some(epoch) = term.epoch else {
                let detail = format!("{} began without an epoch", self.space.name(term));
                self.violate(term.span.start, Property::EpochsRise, detail);
                continue;
            };
            self.measured.fence.epochs += 1;
            let Some(hold) = self.hold_of(term) else {
                continue; // the detection check reports a term without a grant
            };
            // A shard's fence row is `(class, shard)`; the election's, its one key.
            let its_row = |a: &&Advance<'_>| {
                self.space.noun == Noun::Leader
                    || u32::try_from(a.row.key.1).is_ok_and(|shard| shard == term.lock)
            };
            let advanced = match self.e.mechanism {
                Mechanism::Advisory => advances
                    .iter()
                    .filter(its_row)
                    .find(|a| a.server == hold.server && a.pid == hold.pid && a.at >= hold.granted),
                // A claim (a take) advances the epoch in its own statement, logged in its
                // instant; of two claims a connection answered in one instant (the first one's
                // client gave up on it), the term rests on the later tenure and its advance.
                Mechanism::Lease => advances.iter().filter(its_row).rfind(|a| {
                    a.server == hold.server && a.pid == hold.pid && a.at == hold.granted
                }),
            };
            match advanced {
                Some(advance) if u64::try_from(advance.epoch) == Ok(epoch) => {}
                Some(advance) => {
                    let detail = format!(
                        "{} has epoch {epoch}, but its session (pid {} on {}) advanced to {}",
                        self.space.name(term),
                        hold.pid,
                        SERVERS[hold.server],
                        advance.epoch
                    );
                    self.violate(term.span.start, Property::EpochsRise, detail);
                }
                None => {
                    let detail = format!(
                        "{} has epoch {epoch}, but its session (pid {} on {}) advanced none",
                        self.space.name(term),
                        hold.pid,
                        SERVERS[hold.server]
                    );
                    self.violate(term.span.start, Property::EpochsRise, detail);
                }
            }
            if self.space.loss(&hold) < term.span.start {
                self.measured.fence.late_terms += 1;
            } else {
                live.push((term, epoch));
            }
        }
        // Rising per lock: over the election's terms, or each shard's.
        live.sort_by_key(|(term, epoch)| (term.lock, term.span.start, *epoch));
        for pair in live
            .windows(2)
            .filter(|pair| pair[0].0.lock == pair[1].0.lock)
        {
            let [(before, earlier), (term, epoch)] = pair else {
                continue;
            };
            if epoch <= earlier {
                let detail = format!(
                    "{} began at {} with epoch {epoch}, not above the epoch {earlier} of {}, which began at {}",
                    self.space.name(term),
                    secs(term.span.start),
                    self.space.name(before),
                    secs(before.span.start)
                );
                self.violate(term.span.start, Property::EpochsRise, detail);
            }
        }
    }

    pub(super) fn fence_holds(&mut self) {
        if !self.e.fencing {
            return;
        }
        self.count_fenced_writes();
        let e = self.e;
        let advances = advances(e);
        let mut committed: BTreeMap<((usize, u32), u64), usize> = BTreeMap::new();
        let mut found = Vec::new();
        for (server, evidence) in e.servers.iter().enumerate() {
            // The log index of each session's latest fence check.
            let mut checks: BTreeMap<i32, usize> = BTreeMap::new();
            for (index, entry) in evidence.log.iter().enumerate() {
                if let Event::FenceChecked { pid, .. } = &entry.event {
                    checks.insert(*pid, index);
                }
                let Event::FencedCommit {
                    pid,
                    row,
                    epoch,
                    checked_at,
                    current,
                } = &entry.event
                else {
                    continue;
                };
                let owner = self.owners[server].get(pid).copied();
                if let (Some(owner), Ok(epoch)) = (owner, u64::try_from(*epoch)) {
                    *committed.entry((owner, epoch)).or_default() += 1;
                }
                if e.history.primary_at(entry.at) != server {
                    self.measured.fence.deposed_commits += 1;
                    continue;
                }
                self.measured.fence.commits += 1;
                // On the same server the log orders events of one instant; across servers
                // only time does (the epoch at the commit covers a tie).
                let checked = checks.get(pid).copied().unwrap_or(0);
                let between = advances.iter().find(|a| {
                    // A deposed primary's advance is on a timeline of its own.
                    if e.history.primary_at(a.at) != a.server {
                        return false;
                    }
                    let inside = if a.server == server {
                        checked < a.index && a.index < index
                    } else {
                        *checked_at < a.at && a.at < entry.at
                    };
                    a.row == row && a.epoch > *epoch && inside
                });
                let what = format!(
                    "the fenced transaction of pid {pid} on {} ({}) checked epoch {epoch} at {} and committed at {}",
                    SERVERS[server],
                    owner.map_or_else(|| "?".to_owned(), |(r, i)| format!("r{r}.{i}")),
                    secs(*checked_at),
                    secs(entry.at)
                );
                if let Some(advance) = between {
                    let detail = format!(
                        "{what}, but pid {} on {} advanced the epoch to {} at {} in between",
                        advance.pid,
                        SERVERS[advance.server],
                        advance.epoch,
                        secs(advance.at)
                    );
                    found.push((*checked_at, detail));
                } else if *current != Some(*epoch) {
                    let current = current.map_or_else(|| "none".to_owned(), |c| c.to_string());
                    let detail = format!("{what}, when the epoch was {current}");
                    found.push((*checked_at, detail));
                }
            }
        }
        for (at, detail) in found {
            self.violate(at, Property::FenceHolds, detail);
        }
        self.accepted_writes_were_committed(&committed);
    }

    /// Counts the service's fenced units of work by outcome.
    fn count_fenced_writes(&mut self) {
        for write in self.e.fenced {
            match write.outcome {
                FenceOutcome::Accepted => self.measured.fence.accepted += 1,
                FenceOutcome::Stale { .. } => self.measured.fence.stale += 1,
                FenceOutcome::Failed(_) => self.measured.fence.failed += 1,
                FenceOutcome::Unfinished => {}
            }
        }
    }

    /// Every write the service saw accepted is a fenced commit of the servers' logs, of the
    /// same replica incarnation and epoch.
    fn accepted_writes_were_committed(&mut self, committed: &BTreeMap<((usize, u32), u64), usize>) {
        let mut accepted: BTreeMap<((usize, u32), u64), (usize, Duration)> = BTreeMap::new();
        for write in self.e.fenced {
            if let (FenceOutcome::Accepted, Some(epoch)) = (&write.outcome, write.epoch) {
                let entry = accepted
                    .entry(((write.replica, write.incarnation), epoch))
                    .or_insert((0, write.started));
                entry.0 += 1;
            }
        }
        for (((replica, incarnation), epoch), (count, first)) in accepted {
            let logged = committed
                .get(&((replica, incarnation), epoch))
                .copied()
                .unwrap_or(0);
            if logged < count {
                let detail = format!(
                    "r{replica}.{incarnation} saw {count} fenced write(s) of epoch {epoch} accepted, the servers logged {logged} such commit(s)"
                );
                self.violate(first, Property::FenceHolds, detail);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use plexsphere_leader_pgsim::{Event, RowId};

    use crate::checker::tests::{Run, ms};
    use crate::record::TermEnd;

    fn row() -> RowId {
        RowId {
            database: "plexsphere".to_owned(),
            table: "plexsphere_leader_fence".to_owned(),
            key: (1_886_156_915, 1),
        }
    }

    fn advanced(pid: i32, epoch: i64) -> Event {
        let waited = std::time::Duration::ZERO;
        let row = row();
        Event::EpochAdvanced {
            pid,
            row,
            epoch,
            waited,
        }
    }

    fn checked(pid: i32, epoch: i64) -> Event {
        Event::FenceChecked {
            pid,
            row: row(),
            epoch,
        }
    }

    fn commit(pid: i32, epoch: i64, checked_at: u64, current: i64) -> Event {
        Event::FencedCommit {
            pid,
            row: row(),
            epoch,
            checked_at: ms(checked_at),
            current: Some(current),
        }
    }

    /// A fencing run of three replicas, with `fill` writing its logs.
    fn fencing(fill: impl FnOnce(&mut Run)) -> Run {
        let mut run = Run::new(3);
        run.fencing = true;
        fill(&mut run);
        run
    }

    /// The fence-holds pass over `run`: each violation's text.
    fn fence_holds(run: &Run) -> Vec<String> {
        let (_, found) = run.check_only(|c| c.fence_holds());
        found.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn an_advance_logged_after_a_commit_of_the_same_instant_is_not_in_between() {
        let run = fencing(|run| {
            let pid = run.session(0, 0);
            run.log(0, 10, checked(pid, 1))
                .log(0, 20, commit(pid, 1, 10, 1))
                .log(0, 20, advanced(2, 2));
        });
        assert_eq!(fence_holds(&run), Vec::<String>::new());
        let run = fencing(|run| {
            let pid = run.session(0, 0);
            run.log(0, 10, checked(pid, 1))
                .log(0, 20, advanced(2, 2))
                .log(0, 20, commit(pid, 1, 10, 2));
        });
        let found = fence_holds(&run);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("advanced the epoch to 2 at 0.020s in between"),
            "{found:?}"
        );
    }

    #[test]
    fn a_commit_on_a_deposed_primary_is_counted_not_checked() {
        let run = fencing(|run| {
            run.history.primaries.push((ms(15), 1));
            let pid = run.session(0, 0);
            run.log(0, 10, checked(pid, 1))
                .log(0, 20, commit(pid, 1, 10, 2))
                .log(1, 18, advanced(100_001, 2));
        });
        let (measured, found) = run.check_only(|c| c.fence_holds());
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(measured.fence.deposed_commits, 1);
        assert_eq!(measured.fence.commits, 0);
    }

    /// Three replicas granted the lock at 1, 100 and 200, advancing the epoch to 1, 3 and
    /// 2; their pids.
    fn three_advances(run: &mut Run) -> [i32; 3] {
        let pids = [run.session(0, 0), run.session(1, 0), run.session(2, 0)];
        for (&pid, (at, epoch)) in pids.iter().zip([(1, 1), (100, 3), (200, 2)]) {
            run.grant(pid, at).log(0, at + 1, advanced(pid, epoch));
        }
        pids
    }

    /// The epochs-rise pass over terms of `replicas` beginning at `begins` with `epochs`.
    fn epochs_rise(terms: &[(usize, u64, Option<u64>)]) -> (Vec<String>, [i32; 3]) {
        let mut pids = [0; 3];
        let run = fencing(|run| {
            pids = three_advances(run);
            for &(replica, begins, epoch) in terms {
                run.term(replica, begins, begins + 50, TermEnd::Lost);
                run.history.terms.last_mut().unwrap().epoch = epoch;
            }
        });
        let (_, found) = run.check_only(|c| c.epochs_rise());
        (found.iter().map(ToString::to_string).collect(), pids)
    }

    #[test]
    fn epochs_must_be_present_match_the_session_and_rise_with_the_terms() {
        let (found, _) = epochs_rise(&[(0, 3, Some(1)), (1, 102, Some(3)), (2, 202, Some(2))]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("r2.1 term 3 began at 0.202s with epoch 2, not above the epoch 3"),
            "{found:?}"
        );
        let (found, pids) = epochs_rise(&[(0, 3, None), (1, 102, Some(4))]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("r0.1 term 1 began without an epoch"));
        let advanced_to_3 = format!(
            "has epoch 4, but its session (pid {} on pg1) advanced to 3",
            pids[1]
        );
        assert!(found[1].contains(&advanced_to_3), "{found:?}");
    }

    #[test]
    fn epochs_that_rise_with_the_terms_keep_epochs_rise() {
        let (found, _) = epochs_rise(&[(0, 3, Some(1)), (1, 102, Some(3))]);
        assert_eq!(found, Vec::<String>::new());
    }
}
