//! The checkers' unit tests on handcrafted runs, and [`Run`], the builder of those runs that
//! the tests of `fence` and `shards` share: server logs and statement logs of both servers,
//! the harness's history, units of work. Every property gets a run that keeps it and one that
//! breaks it just past its bound, with exactly that violation reported.
//!
//! With [`Params::default`]: I = 100 ms, T = 25 ms, slack 3 ms, round trip 12 ms, margin
//! 52 ms, so detection ≤ 203 ms, overlap ≤ 228 ms, orphan idle ≤ 403 ms, a leaderless gap
//! ≤ 152 ms and the steady state within 652 ms.

use std::time::Duration;

use plexsphere_leader_pgsim::{
    EndReason, Event, HeldLock, LockId, LockKey, LockMode, LogEntry, QueryRecord, ReleaseReason,
    RowId,
};

use super::space::intersections;
use super::*;
use crate::record::{HeldOut, Span, UpSpan};
use crate::setup::Sharding;

/// `n` milliseconds.
pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The election's lock in the handcrafted single-election runs.
pub(super) const ELECTION: LockKey = LockKey::Pair(7, 1);

/// The class of the shard space in the handcrafted sharded runs.
pub(super) const CLASS: i32 = 9;

/// The database every session of a handcrafted run uses.
const DATABASE: &str = "plexsphere";

/// A handcrafted run: two servers started at 0 with pg1 the primary, `replicas` replicas
/// each in its first incarnation from 0, the run ending at 5 s. The methods add to the
/// servers' logs and the history; [`Run::check`] and [`Run::check_sharded`] hold it to the
/// checkers.
pub(super) struct Run {
    pub(super) replicas: usize,
    pub(super) fencing: bool,
    pub(super) mechanism: Mechanism,
    pub(super) history: History,
    pub(super) work: Vec<Work>,
    pub(super) fenced: Vec<FencedWrite>,
    /// Per server: its log, in the order written (stably sorted by time when checked).
    pub(super) logs: Vec<Vec<LogEntry>>,
    /// Per server: its statement log.
    pub(super) queries: Vec<Vec<QueryRecord>>,
    /// Per server: the locks still held when the run ended.
    pub(super) locks: Vec<Vec<HeldLock>>,
    next_pid: i32,
}

impl Run {
    pub(super) fn new(replicas: usize) -> Self {
        let started = LogEntry {
            at: Duration::ZERO,
            event: Event::ServerStarted,
        };
        let history = History {
            primaries: vec![(Duration::ZERO, 0)],
            incarnations: (0..replicas).map(|r| (r, 1, Duration::ZERO)).collect(),
            end: ms(5000),
            ..History::default()
        };
        Self {
            replicas,
            fencing: false,
            mechanism: Mechanism::Advisory,
            history,
            work: Vec::new(),
            fenced: Vec::new(),
            logs: vec![vec![started.clone()], vec![started]],
            queries: vec![Vec::new(), Vec::new()],
            locks: vec![Vec::new(), Vec::new()],
            next_pid: 100,
        }
    }

    /// Appends `event` at `at` ms to server `server`'s log.
    pub(super) fn log(&mut self, server: usize, at: u64, event: Event) -> &mut Self {
        self.logs[server].push(LogEntry { at: ms(at), event });
        self
    }

    /// Replica `replica`'s first incarnation opens a session on pg1 at `at`; its pid.
    pub(super) fn session(&mut self, replica: usize, at: u64) -> i32 {
        self.session_on(0, replica, 1, at)
    }

    /// Incarnation `incarnation` of `replica` opens a session on server `server` at `at`.
    pub(super) fn session_on(
        &mut self,
        server: usize,
        replica: usize,
        incarnation: u32,
        at: u64,
    ) -> i32 {
        self.next_pid += 1;
        let pid = self.next_pid;
        self.log(
            server,
            at,
            Event::SessionStarted {
                pid,
                database: DATABASE.to_owned(),
                user: "app".to_owned(),
                application_name: format!("r{replica}.{incarnation}"),
            },
        );
        pid
    }

    fn lock_id(key: LockKey) -> LockId {
        LockId {
            database: DATABASE.to_owned(),
            key,
        }
    }

    /// `pid` on pg1 is granted `key` (first count) at `at`.
    pub(super) fn lock(&mut self, pid: i32, key: LockKey, mode: LockMode, at: u64) -> &mut Self {
        let lock = Self::lock_id(key);
        self.log(
            0,
            at,
            Event::LockGranted {
                pid,
                lock,
                count: 1,
                mode,
            },
        )
    }

    /// `pid` on pg1 releases its last count of `key` at `at`, for `reason`.
    pub(super) fn unlock(
        &mut self,
        pid: i32,
        key: LockKey,
        mode: LockMode,
        at: u64,
        reason: ReleaseReason,
    ) -> &mut Self {
        let lock = Self::lock_id(key);
        self.log(
            0,
            at,
            Event::LockReleased {
                pid,
                lock,
                remaining: 0,
                reason,
                mode,
            },
        )
    }

    /// `pid` on pg1 is granted the election's lock at `at`.
    pub(super) fn grant(&mut self, pid: i32, at: u64) -> &mut Self {
        self.lock(pid, ELECTION, LockMode::Exclusive, at)
    }

    /// `pid` on pg1 unlocks the election's lock at `at`.
    pub(super) fn release(&mut self, pid: i32, at: u64) -> &mut Self {
        self.unlock(
            pid,
            ELECTION,
            LockMode::Exclusive,
            at,
            ReleaseReason::Unlock,
        )
    }

    /// `pid`'s session on pg1 is cut off (a connection error) at `at`: the lock goes with it.
    pub(super) fn lose(&mut self, pid: i32, at: u64) -> &mut Self {
        let reason = ReleaseReason::SessionEnd(EndReason::ConnectionError);
        self.unlock(pid, ELECTION, LockMode::Exclusive, at, reason)
    }

    /// The lease row of the default key.
    fn lease_row() -> RowId {
        RowId {
            database: DATABASE.to_owned(),
            table: "plexsphere_leader_lease".to_owned(),
            key: (1_886_156_915, 1),
        }
    }

    /// `pid` on pg1 claims the lease at `at` for `holder`, until `expires`.
    pub(super) fn claim(&mut self, pid: i32, holder: &str, at: u64, expires: u64) -> &mut Self {
        let (row, holder, expires) = (Self::lease_row(), holder.to_owned(), ms(expires));
        let claimed = Event::LeaseClaimed {
            pid,
            row,
            holder,
            expires,
        };
        self.log(0, at, claimed)
    }

    /// `pid` on pg1 renews `holder`'s lease at `at`, until `expires`.
    pub(super) fn renew(&mut self, pid: i32, holder: &str, at: u64, expires: u64) -> &mut Self {
        let (row, holder, expires) = (Self::lease_row(), holder.to_owned(), ms(expires));
        let renewed = Event::LeaseRenewed {
            pid,
            row,
            holder,
            expires,
        };
        self.log(0, at, renewed)
    }

    /// `pid` on pg1 releases `holder`'s lease at `at`.
    pub(super) fn release_lease(&mut self, pid: i32, holder: &str, at: u64) -> &mut Self {
        let (row, holder) = (Self::lease_row(), holder.to_owned());
        self.log(0, at, Event::LeaseReleased { pid, row, holder })
    }

    /// A statement of `pid` on pg1 arrives at `received` and is answered at `answered`.
    pub(super) fn query(&mut self, pid: i32, received: u64, answered: Option<u64>) -> &mut Self {
        self.queries[0].push(QueryRecord {
            pid,
            received: ms(received),
            answered: answered.map(ms),
        });
        self
    }

    /// A term of replica `replica`'s first incarnation from `start` to `end`, ended `how`.
    pub(super) fn term(&mut self, replica: usize, start: u64, end: u64, how: TermEnd) -> &mut Self {
        let id = self.history.terms.len() as u64 + 1;
        self.history.terms.push(TermRecord {
            replica,
            incarnation: 1,
            lock: 0,
            id,
            epoch: None,
            span: Span {
                start: ms(start),
                end: Some(ms(end)),
            },
            end: how,
        });
        self
    }

    /// A term of shard `shard` of replica `replica`'s first incarnation; its id.
    pub(super) fn shard_term(
        &mut self,
        replica: usize,
        shard: u32,
        start: u64,
        end: Option<u64>,
        how: TermEnd,
    ) -> u64 {
        let id = self.history.terms.len() as u64 + 1;
        self.history.terms.push(TermRecord {
            replica,
            incarnation: 1,
            lock: shard,
            id,
            epoch: None,
            span: Span {
                start: ms(start),
                end: end.map(ms),
            },
            end: how,
        });
        id
    }

    /// A unit of leader work of `replica` from `start` to `end`, in its latest term.
    pub(super) fn work(&mut self, replica: usize, start: u64, end: u64) -> &mut Self {
        let term = self
            .history
            .terms
            .iter()
            .rev()
            .find(|t| t.replica == replica);
        self.work.push(Work {
            replica,
            incarnation: 1,
            lock: 0,
            term: term.map_or(0, |t| t.id),
            span: span(start, end),
        });
        self
    }

    /// Replica `replica`'s first incarnation is up from `from` (to `to`, or to the end).
    pub(super) fn up(&mut self, replica: usize, from: u64, to: Option<u64>) -> &mut Self {
        self.history.up.push(UpSpan {
            replica,
            span: Span {
                start: ms(from),
                end: to.map(ms),
            },
        });
        self
    }

    fn evidence(&self) -> Evidence<'_> {
        let servers = (0..2)
            .map(|s| {
                let mut log = self.logs[s].clone();
                log.sort_by_key(|entry| entry.at);
                ServerEvidence {
                    log,
                    queries: self.queries[s].clone(),
                    sessions: Vec::new(),
                    locks: self.locks[s].clone(),
                }
            })
            .collect();
        Evidence {
            params: Params::default(),
            replicas: self.replicas,
            fencing: self.fencing,
            mechanism: self.mechanism,
            history: &self.history,
            unfit: None,
            // A rollout run when the history ranks its incarnations.
            rollout: !self.history.versions.is_empty(),
            work: &self.work,
            fenced: &self.fenced,
            servers,
        }
    }

    /// The single-election checker's verdict: every violation, in time order.
    pub(super) fn check(&self) -> Vec<Violation> {
        check(&self.evidence()).1
    }

    /// The sharded checker's verdict over `shards` shards of [`CLASS`].
    pub(super) fn check_sharded(&self, shards: u32) -> Vec<Violation> {
        shards::check(&self.evidence(), Sharding { shards }, CLASS).1
    }

    /// Runs `passes` (some of the checker's passes) alone; what they measured and found.
    pub(super) fn check_only(
        &self,
        passes: impl FnOnce(&mut Checker<'_>),
    ) -> (Measurements, Vec<Violation>) {
        let evidence = self.evidence();
        let mut checker = Checker::new(&evidence);
        passes(&mut checker);
        (checker.measured, checker.violations)
    }
}

/// `[start, end)` in ms.
pub(super) fn span(start: u64, end: u64) -> Span {
    Span {
        start: ms(start),
        end: Some(ms(end)),
    }
}

/// The properties of `violations`, in order.
pub(super) fn properties(violations: &[Violation]) -> Vec<Property> {
    violations.iter().map(|v| v.property).collect()
}

/// Asserts that `violations` is exactly one violation of `property`.
#[track_caller]
pub(super) fn assert_only(violations: &[Violation], property: Property) {
    assert_eq!(properties(violations), [property], "{violations:#?}");
}

/// Asserts that `violations` is empty.
#[track_caller]
pub(super) fn assert_clean(violations: &[Violation]) {
    assert!(violations.is_empty(), "{violations:#?}");
}

fn d(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[test]
fn intersections_of_interval_lists() {
    let a = [(d(0), d(10)), (d(20), d(30))];
    let b = [(d(5), d(25))];
    assert_eq!(intersections(&a, &b), vec![(d(5), d(10)), (d(20), d(25))]);
    assert!(intersections(&a, &[(d(10), d(20))]).is_empty());
}

#[test]
fn owners_are_parsed_from_application_names() {
    assert_eq!(parse_owner("r2.13"), Some((2, 13)));
    assert_eq!(parse_owner("psql"), None);
}

// ---- The single-election checker, one property at a time. ----

/// r0 leads from 12 on a lock granted at 10; its session is cut off at 1000 and its term
/// ends at `ended`.
fn lost_at_1000(ended: u64) -> Run {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, 10).lose(pid, 1000);
    run.term(0, 12, ended, TermEnd::Lost);
    run
}

#[test]
fn a_leader_that_ends_its_term_within_2i_of_losing_its_session_keeps_detection() {
    assert_clean(&lost_at_1000(1203).check());
}

#[test]
fn a_leader_still_leading_2i_and_a_tick_after_losing_its_session_breaks_detection() {
    let found = lost_at_1000(1204).check();
    assert_only(&found, Property::Detection);
    assert!(found[0].detail.contains("still led 204ms"), "{found:?}");
}

#[test]
fn a_term_without_a_grant_breaks_detection() {
    let mut run = Run::new(3);
    run.term(0, 12, 100, TermEnd::Lost);
    let found = run.check();
    assert_only(&found, Property::Detection);
    assert!(
        found[0].detail.contains("began without a grant"),
        "{found:?}"
    );
}

/// r0's session is cut off at 1000, its term ends at 1200 and its last unit of work at
/// `work_end`; r1 is granted the lock at 1001 and leads from 1010.
fn successor_at_1010(work_end: u64) -> Run {
    let mut run = lost_at_1000(1200);
    run.work(0, 1150, work_end);
    let pid = run.session(1, 0);
    run.grant(pid, 1001).release(pid, 2000);
    run.term(1, 1010, 2000, TermEnd::Stopped);
    run
}

#[test]
fn two_replicas_acting_as_leader_for_2i_plus_t_keep_the_overlap_bound() {
    assert_clean(&successor_at_1010(1010 + 228).check());
}

#[test]
fn two_replicas_acting_as_leader_a_tick_past_2i_plus_t_break_the_overlap_bound() {
    let found = successor_at_1010(1010 + 229).check();
    assert_only(&found, Property::Overlap);
    assert!(
        found[0]
            .detail
            .contains("r0 and r1 both acted as leader for 229ms")
    );
}

/// r0 is asked to stop at 900 and ends its term at 1000 (its unlock at 990); r1 is granted
/// the lock at 995 and begins its term at `successor`.
fn graceful_stop(successor: u64) -> Run {
    let mut run = Run::new(3);
    let (a, b) = (run.session(0, 0), run.session(1, 0));
    run.grant(a, 10)
        .release(a, 990)
        .grant(b, 995)
        .release(b, 2000);
    run.term(0, 12, 1000, TermEnd::Stopped);
    run.term(1, successor, 2000, TermEnd::Stopped);
    run.history.stop_requests.push((0, ms(900)));
    run
}

#[test]
fn a_successor_beginning_as_the_stopped_leader_ends_its_term_is_a_graceful_handover() {
    assert_clean(&graceful_stop(1000).check());
}

#[test]
fn a_successor_beginning_before_the_stopped_leader_ended_its_term_breaks_graceful_overlap() {
    let found = graceful_stop(999).check();
    assert_only(&found, Property::GracefulOverlap);
}

/// r0 is held out (a resign's hold-off) from 500 to 800; it is granted the lock at 790 and
/// begins a term at `began`.
fn held_out_until_800(began: u64) -> Run {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, 790).release(pid, 1500);
    run.term(0, began, 1500, TermEnd::Stopped);
    run.history.held_out.push(HeldOut {
        replica: 0,
        incarnation: 1,
        span: span(500, 800),
    });
    run
}

#[test]
fn a_term_beginning_as_the_hold_off_ends_honours_the_operator() {
    assert_clean(&held_out_until_800(800).check());
}

#[test]
fn a_term_beginning_within_the_hold_off_breaks_operator_controls() {
    let found = held_out_until_800(799).check();
    assert_only(&found, Property::OperatorControls);
    assert!(
        found[0].detail.contains("after it was held out"),
        "{found:?}"
    );
}

/// r0 resigns at 990, its term ends at 1000 and its session unlocks at `released`.
fn resigned_at_1000(released: u64) -> Run {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, 10).release(pid, released);
    run.term(0, 12, 1000, TermEnd::Resigned);
    run.history.resign_requests.push((0, ms(990)));
    run
}

#[test]
fn a_resigned_leader_unlocking_within_i_and_the_margin_honours_the_operator() {
    // I + margin + slack = 100 + 52 + 3 ms.
    assert_clean(&resigned_at_1000(1155).check());
}

#[test]
fn a_resigned_leader_unlocking_a_tick_late_breaks_operator_controls() {
    let found = resigned_at_1000(1156).check();
    assert_only(&found, Property::OperatorControls);
    assert!(
        found[0].detail.contains("released 156ms later"),
        "{found:?}"
    );
}

/// r0's session is granted the lock by a statement answered at 10, is idle until its next
/// statement arrives at `next`, and unlocks at 500.
fn idle_until(next: u64) -> Run {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.query(pid, 9, Some(10)).query(pid, next, Some(next + 1));
    run.grant(pid, 10).release(pid, 500);
    run.term(0, 11, 500, TermEnd::Stopped);
    run
}

#[test]
fn a_lock_session_idle_for_4i_keeps_the_orphan_bound() {
    assert_clean(&idle_until(10 + 403).check());
}

#[test]
fn a_lock_session_idle_a_tick_past_4i_breaks_the_orphan_bound() {
    let found = idle_until(10 + 404).check();
    assert_only(&found, Property::OrphanBound);
    assert!(found[0].detail.contains("idle for 404ms"), "{found:?}");
}

/// r0's queued wait is granted the lock at 10 in the instant it failed with 55P03; its next
/// statement is answered at 21 and the lock is released at `released`.
fn granted_at_timeout(released: u64) -> Run {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, 10).log(
        0,
        10,
        Event::GrantedAtLockTimeout {
            pid,
            lock: Run::lock_id(ELECTION),
        },
    );
    run.query(pid, 20, Some(21)).release(pid, released);
    run
}

#[test]
fn a_lock_granted_at_the_timeout_and_released_by_the_next_statement_is_not_stranded() {
    assert_clean(&granted_at_timeout(21).check());
}

#[test]
fn a_lock_granted_at_the_timeout_left_held_by_the_next_statement_is_stranded() {
    let found = granted_at_timeout(22).check();
    assert_only(&found, Property::StrandedLock);
    assert!(found[0].detail.contains("next statement"), "{found:?}");
}

/// A healthy r0's queued wait is granted the lock at 10 as it failed with 55P03; no
/// statement follows and the lock is released at `released` (the stop is asked at 100).
fn healthy_granted_at_timeout(released: u64) -> Run {
    let mut run = Run::new(1);
    let pid = run.session(0, 0);
    run.grant(pid, 10).log(
        0,
        10,
        Event::GrantedAtLockTimeout {
            pid,
            lock: Run::lock_id(ELECTION),
        },
    );
    run.release(pid, released).up(0, 0, None);
    run.history.stop_all = Some(ms(100));
    run
}

#[test]
fn a_healthy_replica_releasing_a_lock_granted_at_the_timeout_within_the_margin_is_not_stranded() {
    assert_clean(&healthy_granted_at_timeout(10 + 52).check());
}

#[test]
fn a_healthy_replica_keeping_a_lock_granted_at_the_timeout_past_the_margin_strands_it() {
    let found = healthy_granted_at_timeout(10 + 53).check();
    assert_only(&found, Property::StrandedLock);
    assert!(
        found[0].detail.contains("kept the lock for 53ms"),
        "{found:?}"
    );
}

/// Two healthy standbys from 0, the lock free from the server's start; r0 is granted it at
/// `granted` and begins its term at `began`, ended at 1000 (the stop is asked at 1100).
fn free_from_the_start(granted: u64, began: u64) -> Run {
    let mut run = Run::new(2);
    let pid = run.session(0, 0);
    run.grant(pid, granted).release(pid, 1000);
    run.term(0, began, 1000, TermEnd::Stopped);
    run.up(0, 0, None).up(1, 0, None);
    run.history.stop_all = Some(ms(1100));
    run
}

/// Two healthy standbys; r0's session is granted the free lock at 100 and loses it in the same
/// instant, with no term (seed 222 of the advisory runs); r1 is granted it at `granted` and
/// leads at `granted` + 5 until 1000.
fn granted_and_released_at_once(granted: u64) -> Run {
    let mut run = Run::new(2);
    let r0 = run.session(0, 0);
    run.grant(r0, 100).release(r0, 100);
    let r1 = run.session(1, 0);
    run.grant(r1, granted).release(r1, 1000);
    run.term(1, granted + 5, 1000, TermEnd::Stopped);
    run.up(0, 0, None).up(1, 0, None);
    run.history.stop_all = Some(ms(1100));
    run
}

#[test]
fn a_grant_released_in_its_own_tick_is_a_free_moment_checked_from_its_release() {
    // r1 leads 10 ms after the release: live, though r0 never led.
    assert_clean(&granted_and_released_at_once(105).check());
    // r1 leads only 300 ms after it: a liveness violation, not excused.
    let found = granted_and_released_at_once(400).check();
    assert!(
        found.iter().any(|v| v.property == Property::Liveness),
        "{found:?}"
    );
}

#[test]
fn a_leader_within_i_and_the_margin_of_a_free_lock_keeps_liveness() {
    assert_clean(&free_from_the_start(100, 152).check());
}

#[test]
fn a_leader_a_tick_past_i_and_the_margin_of_a_free_lock_breaks_liveness() {
    let found = free_from_the_start(100, 153).check();
    assert_only(&found, Property::Liveness);
    assert!(found[0].detail.contains("no leader for 153ms"), "{found:?}");
}

#[test]
fn a_lock_left_free_past_i_and_the_margin_with_a_healthy_standby_breaks_liveness() {
    let found = free_from_the_start(153, 160).check();
    assert_only(&found, Property::Liveness);
    assert!(found[0].detail.contains("stayed free"), "{found:?}");
}

/// One replica, up from 0 (its pool never connected), met by raised query latency from 10 to
/// 100 ms; the server restarts at `restart` and the lock stays free until the stop at 4500.
fn free_after_a_cold_start(restart: u64) -> Run {
    let mut run = Run::new(1);
    run.up(0, 0, None);
    run.history.latency.push((
        0,
        Span {
            start: ms(10),
            end: Some(ms(100)),
        },
    ));
    run.log(0, restart, Event::ServerStarted);
    run.history.stop_all = Some(ms(4500));
    run
}

#[test]
fn a_replica_whose_first_setup_a_fault_met_is_no_standby_until_the_setup_bound() {
    // Within the first setup's bound (2 s) and the tail (300 ms) of its start: the replica may
    // still be resuming its hung first setup.
    assert_clean(&free_after_a_cold_start(2299).check());
    // Past them it must lead within the gap bound.
    let found = free_after_a_cold_start(2300).check();
    assert_only(&found, Property::Liveness);
    assert!(found[0].detail.contains("stayed free"), "{found:?}");
}

/// The faults stop and every replica is up at 0, the stop is asked at 2000; r0 alone leads
/// from `began`.
fn steady_from(began: u64) -> Run {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, began - 10).release(pid, 2000);
    run.term(0, began, 2000, TermEnd::Stopped);
    run.history.faults_stopped = Some(Duration::ZERO);
    run.history.all_up = Some(Duration::ZERO);
    run.history.stop_all = Some(ms(2000));
    run
}

#[test]
fn one_leader_within_6i_and_the_margin_of_the_faults_ending_is_a_steady_state() {
    assert_clean(&steady_from(652).check());
}

#[test]
fn no_leader_6i_and_the_margin_after_the_faults_ended_breaks_the_steady_state() {
    let found = steady_from(653).check();
    assert_only(&found, Property::SteadyState);
    assert!(found[0].detail.contains("no leader 652ms"), "{found:?}");
}

#[test]
fn two_grants_of_the_lock_without_a_release_between_break_mutual_exclusion() {
    let mut run = Run::new(3);
    let (a, b) = (run.session(0, 0), run.session(1, 0));
    run.grant(a, 10).release(a, 20).grant(b, 20).release(b, 30);
    assert_clean(&run.check());
    let mut run = Run::new(3);
    let (a, b) = (run.session(0, 0), run.session(1, 0));
    run.grant(a, 10).grant(b, 20).release(a, 25).release(b, 30);
    assert_only(&run.check(), Property::MutualExclusion);
}

#[test]
fn a_term_left_open_or_a_lock_left_held_at_the_end_breaks_the_clean_stop() {
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, 10);
    run.history.terms.push(TermRecord {
        replica: 0,
        incarnation: 1,
        lock: 0,
        id: 1,
        epoch: None,
        span: Span::open(ms(12)),
        end: TermEnd::Open,
    });
    assert_only(&run.check(), Property::CleanStop);
    let mut run = Run::new(3);
    let pid = run.session(0, 0);
    run.grant(pid, 10);
    run.locks[0].push(HeldLock {
        id: Run::lock_id(ELECTION),
        pid,
        count: 1,
        mode: LockMode::Exclusive,
    });
    let found = run.check();
    assert_only(&found, Property::CleanStop);
    assert!(found[0].detail.contains("still holds"), "{found:?}");
}

#[test]
fn an_adapter_error_or_a_failed_host_breaks_the_harness_property() {
    let mut run = Run::new(3);
    run.history.errors.push((ms(5), "ERROR event".to_owned()));
    assert_only(&run.check(), Property::Harness);
    let mut run = Run::new(3);
    run.history.host_failure = Some((ms(5), "r0 panicked".to_owned()));
    assert_only(&run.check(), Property::Harness);
}

/// A lease run of three replicas, all up until the stop at 690 ms, with `fill` writing its log
/// and terms.
fn lease_run(fill: impl FnOnce(&mut Run)) -> Run {
    let mut run = Run::new(3);
    run.mechanism = Mechanism::Lease;
    run.history.stop_all = Some(ms(690));
    for replica in 0..3 {
        run.up(replica, 0, None);
    }
    fill(&mut run);
    run
}

#[test]
fn a_term_that_outlives_its_lease_is_a_late_detection_and_an_overlap_with_the_next_claimer() {
    let run = lease_run(|run| {
        let (a, b) = (run.session(0, 5), run.session(1, 5));
        run.claim(a, "r0.1 n", 10, 310).renew(a, "r0.1 n", 110, 410);
        run.term(0, 12, 500, TermEnd::Lost);
        run.claim(b, "r1.1 n", 420, 720);
        run.term(1, 422, 700, TermEnd::Stopped);
        run.release_lease(b, "r1.1 n", 701);
    });
    let violations = run.check();
    assert_eq!(
        properties(&violations),
        [Property::Detection, Property::Overlap],
        "{violations:#?}"
    );
    assert!(
        violations[0]
            .detail
            .contains("still led 90ms after its lease (claimed by pid 101 on pg1) ended"),
        "{violations:#?}"
    );
    assert!(violations[1].detail.contains("for 78ms (bound 0ms)"));
}

#[test]
fn terms_within_their_leases_and_a_handover_after_a_release_keep_every_bound() {
    let run = lease_run(|run| {
        let (a, b) = (run.session(0, 5), run.session(1, 5));
        run.claim(a, "r0.1 n", 10, 310).renew(a, "r0.1 n", 110, 410);
        run.term(0, 12, 300, TermEnd::Stopped);
        run.release_lease(a, "r0.1 n", 301);
        run.claim(b, "r1.1 n", 350, 650);
        run.term(1, 352, 600, TermEnd::Stopped);
        run.release_lease(b, "r1.1 n", 601);
    });
    let (measured, violations) = run.check_only(|checker| {
        checker.shared_rules();
        checker.liveness();
    });
    assert_eq!(violations, []);
    assert_eq!(measured.gap, Some(ms(51)), "from the release to r1's term");
    assert_eq!(measured.cases.detections, 0, "no term outlived its lease");
    assert_eq!(run.check(), []);
}

#[test]
fn a_lease_that_expired_with_a_healthy_standby_must_be_claimed_within_the_gap_bound() {
    let run = lease_run(|run| {
        let (a, b) = (run.session(0, 5), run.session(1, 5));
        run.claim(a, "r0.1 n", 10, 310);
        run.term(0, 12, 280, TermEnd::Lost);
        run.claim(b, "r1.1 n", 470, 770);
        run.term(1, 472, 700, TermEnd::Stopped);
        run.release_lease(b, "r1.1 n", 701);
    });
    let violations = run.check();
    assert_only(&violations, Property::Liveness);
    assert_eq!(violations[0].at, ms(310), "from the lease's expiry");
}

#[test]
fn a_claim_of_another_holders_unexpired_lease_breaks_mutual_exclusion() {
    let run = lease_run(|run| {
        let (a, b) = (run.session(0, 5), run.session(1, 5));
        run.claim(a, "r0.1 n", 10, 310);
        run.claim(b, "r1.1 n", 200, 500);
        run.release_lease(b, "r1.1 n", 201);
    });
    let (_, violations) = run.check_only(|_| {});
    assert_only(&violations, Property::MutualExclusion);
    assert!(
        violations[0]
            .detail
            .contains("claimed by pid 102 for r1.1 while r0.1's ran until 0.310s"),
        "{violations:#?}"
    );
}

#[test]
fn of_two_claims_a_connection_answered_in_one_instant_the_term_rests_on_the_later_epoch() {
    let run = lease_run(|run| {
        run.fencing = true;
        let a = run.session(0, 5);
        let fence = |epoch| Event::EpochAdvanced {
            pid: a,
            row: RowId {
                table: "plexsphere_leader_fence".to_owned(),
                ..Run::lease_row()
            },
            epoch,
            waited: Duration::ZERO,
        };
        // The first claim's client gave up on it; the second one queued behind it on the link.
        run.claim(a, "r0.1 n", 10, 310).log(0, 10, fence(7));
        run.claim(a, "r0.1 n", 10, 310).log(0, 10, fence(8));
        run.term(0, 12, 300, TermEnd::Stopped);
        run.history.terms[0].epoch = Some(8);
        run.release_lease(a, "r0.1 n", 301);
    });
    let (_, violations) = run.check_only(|checker| checker.epochs_rise());
    assert_clean(&violations);
    let mut stale = run;
    stale.history.terms[0].epoch = Some(7);
    let (_, violations) = stale.check_only(|checker| checker.epochs_rise());
    assert_only(&violations, Property::EpochsRise);
}

#[test]
fn a_lease_a_stopped_leader_led_on_and_left_held_breaks_the_clean_stop() {
    let run = lease_run(|run| {
        let a = run.session(0, 5);
        run.claim(a, "r0.1 n", 10, 6000);
        run.term(0, 12, 300, TermEnd::Stopped);
    });
    let (_, violations) = run.check_only(|checker| checker.clean_stop());
    assert_only(&violations, Property::CleanStop);
    assert!(
        violations[0]
            .detail
            .contains("the lease r0.1 led on, claimed at 0.010s (pid 101 on pg1), is still held"),
        "{violations:#?}"
    );
    // A claim whose answer was lost leaves a lease no term rested on: its TTL ends it.
    let unanswered = lease_run(|run| {
        let b = run.session(1, 5);
        run.claim(b, "r1.1 n", 400, 6000);
    });
    let (_, violations) = unanswered.check_only(|checker| checker.clean_stop());
    assert_clean(&violations);
}
