//! Fault injection with replicas as separate OS processes (`plx-replica`), each test on its own
//! database of the shared local server. Every replica's `lead` / `follow` events and the lock
//! observer's view of `pg_locks` are merged on one clock (`CLOCK_MONOTONIC`, see
//! `plexsphere_leader_tests::clock`), from which handovers, detection delays, leaderless gaps and
//! overlaps are computed.
//!
//! I = 200 ms unless a test says otherwise. Bounds come from the design (section 6) and are
//! asserted as `bound + MARGIN` (5 s, `support::MARGIN`): scheduling on a loaded 2-core
//! machine, process start, connection setup. Each test prints what it measured.
//!
//! | scenario | expected outcome (bound) |
//! |----------|--------------------------|
//! | graceful stop (SIGTERM) | term ends before the unlock; successor within I; overlap 0 |
//! | SIGKILL of the leader | the kernel closes the socket; successor within I |
//! | silent death: blackhole, then SIGKILL | the server ends the orphan by `idle_session_timeout`: successor within 4·I + I, not before 2·I |
//! | blackhole longer than the idle timeout, then heal | leader demotes within 2·I; successor within 5·I; after the heal the old leader stays a standby |
//! | partition shorter than one interval (held, not lost) | no demotion, same term, same server session |
//! | client→server drop | demotes within 2·I; the server frees the lock by the idle timeout (a FATAL session end) |
//! | server→client drop | demotes within 2·I; its close reaches the server, which frees the lock at once (no FATAL) |
//! | reply lost after the try | the client never leads; the grant's own `idle_session_timeout` frees the orphan within 4·I |
//! | `pg_terminate_backend` of a standby, then of the leader | standby: no effect on the leader, it reconnects; leader: demotes within 2·I, successor follows |
//! | SIGSTOP for 2·I (between I and 3·I), then SIGCONT | the server keeps the session: no successor; the resumed leader keeps its term and lock backend |
//! | SIGSTOP longer than the idle timeout, then SIGCONT | server frees within 4·I; successor within 5·I; the resumed leader demotes at its next check (2·I) |
//! | slow server (answers after 2·I) | nobody leads while slow; one WARN per interval; a leader within 2·I of recovery |
//! | pool exhausted by other work | each attempt ends within one interval with a WARN; leads once the pool has room |
//! | a pass that ignores cancellation | `run_if_leader` reports `Ok(false)` and INFO; work overlap ≤ 2·I + T |
//! | ten standbys race for a freed lock | exactly one wins, and stays the only leader |
//!
//! Every test ends with `Fleet::finish`: each replica stops gracefully with its pool intact
//! (every connection back, a fresh one served), and no replica session and no lock is left.

// The scenarios run on both backends are plain functions called by the generated tests, so
// clippy's allowance for `unwrap` in tests does not see them.
#![allow(clippy::unwrap_used)]

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{
    Fleet, I, MARGIN, STARTUP, assert_within, next_check, ready_at, sessions_fatal, sleep_until,
    wait_sessions_fatal,
};
use nix::sys::signal::Signal;
use plexsphere_leader_tests::replica_process::{FOLLOW, LEAD, REPLICA_APP_PREFIX};
use plexsphere_leader_tests::timeline::{Interval, max_overlap};
use plexsphere_leader_tests::{Backend, Direction, FaultProxy, LockObserver, Mode, TestDb};
use tokio::time::Instant;

const ACQUIRE_WARN: &str = "leader: acquire lock connection";
const LOST_WARN: &str = "leader: lost background leader lock";

/// A replica name's application_name.
fn app(name: &str) -> String {
    format!("{REPLICA_APP_PREFIX}{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_hands_over_within_one_interval_without_overlap() {
    let db = TestDb::create("fault_graceful").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    tokio::time::sleep(2 * I).await;
    assert_eq!(fleet.leaders(), vec![a], "b is a standby");

    let stop = Instant::now();
    let report = fleet.get_mut(a).stop().await.unwrap();
    fault_support::assert_pool_intact("a", &report);
    let (follow_a, cause) = fleet.wait_follow_since(a, stop, MARGIN).await;
    assert_eq!(cause, "Stopped");
    assert_eq!(
        fleet
            .get(a)
            .logs("INFO", "leader: released background leader lock")
            .len(),
        1
    );
    let lead_b = fleet.wait_lead_since(b, stop, I + MARGIN).await;
    assert_within("handover after SIGTERM", lead_b - stop, I + MARGIN);
    assert!(
        follow_a < lead_b,
        "the term ended before the successor's began"
    );
    assert_eq!(
        fleet.max_overlap(),
        Duration::ZERO,
        "no overlap on a graceful stop"
    );
    assert_eq!(observer.max_granted(), 1);

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    sigkill_of_the_leader_hands_over_within_one_interval
);
async fn sigkill_of_the_leader_hands_over_within_one_interval(backend: Backend) {
    let db = TestDb::create(&format!("fault_sigkill_{backend}"))
        .await
        .unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn_on(backend, "a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn_on(backend, "b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    let holder = observer.wait_for_holder(MARGIN).await.expect("a holds");
    assert_eq!(holder.application_name.as_deref(), Some(app("a").as_str()));

    let killed = Instant::now();
    fleet.get_mut(a).kill().await.unwrap();
    let lead_b = fleet.wait_lead_since(b, killed, I + MARGIN).await;
    assert_within("handover after SIGKILL", lead_b - killed, I + MARGIN);
    let new = observer
        .wait_for_new_holder(holder.pid, MARGIN)
        .await
        .expect("b holds on the server");
    assert_eq!(new.application_name.as_deref(), Some(app("b").as_str()));
    let gap = observer.leaderless_gaps(Instant::now());
    let longest = gap.iter().map(|g| g.duration()).max().unwrap_or_default();
    assert_within("server-side leaderless gap", longest, I + MARGIN);
    assert_eq!(fleet.max_overlap(), Duration::ZERO);

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    silent_death_is_bounded_by_the_idle_session_timeout
);
async fn silent_death_is_bounded_by_the_idle_session_timeout(backend: Backend) {
    let db = TestDb::create(&format!("fault_silent_death_{backend}"))
        .await
        .unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet
        .spawn_on(backend, "a", &proxy.pg_config(&db.config()), I)
        .await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn_on(backend, "b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    let orphan = observer.wait_for_holder(MARGIN).await.expect("a holds");
    tokio::time::sleep(I + I / 2).await;
    let fatal_before = sessions_fatal(db.admin()).await;

    // A power loss: nothing reaches the server any more, not even the FIN of the kill.
    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();
    fleet.get_mut(a).kill().await.unwrap();
    let lead_b = fleet.wait_lead_since(b, cut, 5 * I + MARGIN).await;
    assert_within(
        "successor after a silent death",
        lead_b - cut,
        5 * I + MARGIN,
    );
    assert!(
        lead_b - cut >= 2 * I,
        "the orphan cannot be freed before its idle timeout: {:?}",
        lead_b - cut
    );
    let successor = observer
        .wait_for_new_holder(orphan.pid, MARGIN)
        .await
        .expect("the orphan's lock went to b");
    assert_eq!(
        successor.application_name.as_deref(),
        Some(app("b").as_str())
    );
    assert_eq!(
        wait_sessions_fatal(db.admin(), fatal_before + 1, MARGIN).await,
        fatal_before + 1,
        "the orphan ended by idle_session_timeout (a FATAL session end)"
    );

    proxy.set_both(Mode::Forward);
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackhole_longer_than_the_idle_timeout_demotes_and_the_healed_replica_stays_standby() {
    let db = TestDb::create("fault_long_blackhole").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &proxy.pg_config(&db.config()), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    observer.wait_for_holder(MARGIN).await.expect("a holds");

    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();
    let (follow_a, cause) = fleet.wait_follow_since(a, cut, 2 * I + MARGIN).await;
    assert_eq!(cause, "Lost(CheckTimedOut)");
    assert_within("detection of a partition", follow_a - cut, 2 * I + MARGIN);
    let lost = fleet.get(a).logs("WARN", LOST_WARN);
    assert!(
        lost.iter().any(|r| r
            .str("message")
            .is_some_and(|m| m.contains("no answer within"))),
        "{lost:?}"
    );
    let lead_b = fleet.wait_lead_since(b, cut, 5 * I + MARGIN).await;
    assert_within("successor after a partition", lead_b - cut, 5 * I + MARGIN);
    assert_within("overlap (bound 2·I)", fleet.max_overlap(), 2 * I + MARGIN);

    // Blackholed for twice the idle timeout in all; the cut-off replica keeps trying.
    sleep_until(cut + 8 * I).await;
    assert!(!fleet.get(a).logs("WARN", ACQUIRE_WARN).is_empty());
    proxy.set_both(Mode::Forward);
    let healed = Instant::now();
    tokio::time::sleep(4 * I).await;
    assert_eq!(fleet.leaders(), vec![b], "after the heal, a is a standby");
    assert!(
        fleet
            .get(a)
            .wait_for_since(healed, Duration::ZERO, |r| r.event == LEAD)
            .await
            .is_none()
    );
    assert_eq!(observer.max_granted(), 1);

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

/// A real partition shorter than one interval loses packets that TCP retransmits afterwards; the
/// proxy models it as a hold (`Mode::Delay` longer than the partition, then `Forward`), not as
/// `Mode::Blackhole`, which throws bytes away for good (that is the long blackhole above). The
/// hold is placed around the leader's ping (pings run on the grid `ready + k·I`), and I = 1 s so
/// the held ping is answered 0.5 s before its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_shorter_than_one_interval_does_not_demote() {
    let interval = Duration::from_secs(1);
    let db = TestDb::create("fault_short_partition").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet
        .spawn("a", &proxy.pg_config(&db.config()), interval)
        .await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet
        .spawn("b", &proxy.pg_config(&db.config()), interval)
        .await;
    fleet.wait_checked(db.admin(), b).await;
    let holder = observer.wait_for_holder(MARGIN).await.expect("a holds");

    let ping = next_check(
        ready_at(fleet.get(a)),
        interval,
        Instant::now() + interval / 2,
    );
    sleep_until(ping - interval / 4).await;
    let hold_start: f64 = db
        .admin()
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    proxy.set_both(Mode::Delay(Duration::from_secs(3600)));
    sleep_until(ping + interval / 4).await;
    proxy.set_both(Mode::Forward);
    tokio::time::sleep(interval / 8).await;
    let last_query: f64 = db
        .admin()
        .query_one(
            "SELECT extract(epoch FROM query_start)::float8 FROM pg_stat_activity WHERE pid = $1",
            &[&holder.pid],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        last_query > hold_start,
        "the leader's ping was held by the partition and reached the server after it"
    );
    tokio::time::sleep(3 * interval).await;

    assert_eq!(fleet.leaders(), vec![a]);
    assert_eq!(fleet.get(a).terms().len(), 1, "same term");
    assert!(fleet.get(a).events(FOLLOW).is_empty(), "never demoted");
    assert!(fleet.get(a).logs("WARN", "").is_empty());
    assert!(
        fleet.get(b).logs("WARN", "").is_empty(),
        "the standby's checks answered in time"
    );
    let changes = observer.timeline();
    let first = changes
        .iter()
        .position(|c| c.holder.is_some())
        .expect("the lock was seen held");
    assert_eq!(
        changes.len(),
        first + 1,
        "the same session held the lock throughout: {changes:?}"
    );

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_to_server_drop_demotes_and_the_idle_timeout_frees_the_lock() {
    let db = TestDb::create("fault_drop_c2s").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &proxy.pg_config(&db.config()), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    observer.wait_for_holder(MARGIN).await.expect("a holds");
    tokio::time::sleep(I + I / 2).await;
    let fatal_before = sessions_fatal(db.admin()).await;

    proxy.set_mode(Direction::ClientToServer, Mode::Blackhole);
    let cut = Instant::now();
    let (follow_a, _) = fleet.wait_follow_since(a, cut, 2 * I + MARGIN).await;
    assert_within(
        "detection (pings never arrive)",
        follow_a - cut,
        2 * I + MARGIN,
    );
    // The close after the timed-out ping is dropped too: only the idle timeout frees the lock.
    let lead_b = fleet.wait_lead_since(b, cut, 5 * I + MARGIN).await;
    assert_within("successor", lead_b - cut, 5 * I + MARGIN);
    assert!(
        lead_b - cut >= 2 * I,
        "freed by the idle timeout, not before"
    );
    assert_eq!(
        wait_sessions_fatal(db.admin(), fatal_before + 1, MARGIN).await,
        fatal_before + 1,
        "the lock session ended by idle_session_timeout"
    );

    proxy.set_both(Mode::Forward);
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_to_client_drop_demotes_and_the_close_frees_the_lock_at_once() {
    let db = TestDb::create("fault_drop_s2c").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &proxy.pg_config(&db.config()), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    let orphan = observer.wait_for_holder(MARGIN).await.expect("a holds");
    tokio::time::sleep(I + I / 2).await;
    let fatal_before = sessions_fatal(db.admin()).await;

    proxy.set_mode(Direction::ServerToClient, Mode::Blackhole);
    let cut = Instant::now();
    let (follow_a, _) = fleet.wait_follow_since(a, cut, 2 * I + MARGIN).await;
    assert_within(
        "detection (answers never arrive)",
        follow_a - cut,
        2 * I + MARGIN,
    );
    // After its timed-out ping the leader closes the connection and never sends on it again:
    // the close travels client→server, so the server ends the session and frees the lock now.
    assert!(
        observer
            .wait_for_new_holder(orphan.pid, I + MARGIN)
            .await
            .is_some(),
        "the lock is freed by the close"
    );
    let lead_b = fleet.wait_lead_since(b, cut, 3 * I + MARGIN).await;
    assert_within(
        "successor after the demotion",
        lead_b.saturating_duration_since(follow_a),
        I + MARGIN,
    );
    tokio::time::sleep(I).await;
    assert_eq!(
        sessions_fatal(db.admin()).await,
        fatal_before,
        "the lock session ended by the client's close, not by the idle timeout"
    );

    proxy.set_both(Mode::Forward);
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

/// The grant reaches the server and the session takes the lock, but the answer is lost and the
/// client's close is held back too: the client never learns it and never leads, and the
/// `idle_session_timeout` set by the same statement frees the orphaned lock. The replica behind
/// the proxy runs with I = 1 s (idle timeout 4 s), so the test has a second to cut the
/// client→server direction once the grant shows in `pg_locks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_lost_after_the_try_is_freed_by_the_idle_timeout_set_in_the_same_statement() {
    let slow = Duration::from_secs(1);
    let db = TestDb::create("fault_reply_lost").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let blocker = db.connect("plx-harness-blocker").await.unwrap();
    blocker
        .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
        .await
        .unwrap();
    let blocker_pid = observer
        .wait_for_holder(MARGIN)
        .await
        .expect("the blocker holds")
        .pid;
    let mut fleet = Fleet::new();
    let r = fleet.spawn("r", &proxy.pg_config(&db.config()), slow).await;
    let fatal_before = sessions_fatal(db.admin()).await;

    // Just after a refused check: drop the answers, free the lock; r's next check is granted.
    let check = next_check(ready_at(fleet.get(r)), slow, Instant::now() + slow / 2);
    sleep_until(check + slow * 3 / 10).await;
    proxy.set_mode(Direction::ServerToClient, Mode::Blackhole);
    blocker
        .simple_query("SELECT pg_advisory_unlock(1886156915, 1)")
        .await
        .unwrap();
    let orphan = observer
        .wait_for_new_holder(blocker_pid, slow + MARGIN)
        .await
        .expect("r's session is granted the lock on the server");
    proxy.set_mode(Direction::ClientToServer, Mode::Blackhole);
    let granted = Instant::now();
    assert_eq!(orphan.application_name.as_deref(), Some(app("r").as_str()));

    let s = fleet.spawn("s", &db.config(), I).await;
    let lead_s = fleet
        .wait_lead_since(s, granted, 4 * slow + I + MARGIN)
        .await;
    assert_within(
        "orphaned grant freed and taken",
        lead_s - granted,
        4 * slow + I + MARGIN,
    );
    assert!(
        fleet.get(r).terms().is_empty(),
        "r never learned of the grant, never led"
    );
    let warned = fleet.get(r).logs("WARN", ACQUIRE_WARN);
    assert!(
        warned.iter().any(|w| w
            .str("message")
            .is_some_and(|m| m.contains("no answer within"))),
        "the grant's answer timed out: {warned:?}"
    );
    assert!(
        wait_sessions_fatal(db.admin(), fatal_before + 1, MARGIN).await > fatal_before,
        "the orphan ended by its idle_session_timeout"
    );
    assert_eq!(observer.max_granted(), 1);

    proxy.set_both(Mode::Forward);
    drop(blocker);
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_a_standby_session_changes_nothing_and_terminating_the_leaders_demotes_it() {
    let db = TestDb::create("fault_terminate").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    let holder = observer.wait_for_holder(MARGIN).await.expect("a holds");
    tokio::time::sleep(2 * I).await;

    // b's pooled session: its run's exclusion proof borrowed it (beside a short-lived session
    // of its own, closed at once), and its checks borrow it since.
    let standby = db.sessions_of(&app("b")).await.unwrap();
    assert_eq!(standby.len(), 1, "b's pooled sessions: {standby:?}");
    assert!(db.terminate(standby[0].pid).await.unwrap());
    tokio::time::sleep(4 * I).await;
    assert_eq!(fleet.leaders(), vec![a]);
    assert_eq!(fleet.get(a).terms().len(), 1);
    assert!(
        fleet.get(b).logs("WARN", ACQUIRE_WARN).len() <= 1,
        "at most one failed check"
    );
    let again = db.sessions_of(&app("b")).await.unwrap();
    assert!(
        again.len() == 1 && again.iter().all(|s| s.pid != standby[0].pid),
        "b went on without the terminated session: {again:?}"
    );

    let terminated = Instant::now();
    assert!(db.terminate(holder.pid).await.unwrap());
    let (follow_a, cause) = fleet.wait_follow_since(a, terminated, 2 * I + MARGIN).await;
    assert_eq!(cause, "Lost(SessionEnded)");
    assert_within(
        "detection of a terminated session",
        follow_a - terminated,
        2 * I + MARGIN,
    );
    fleet.sole_leader(2 * I + MARGIN).await;
    assert_within("overlap (bound 2·I)", fleet.max_overlap(), 2 * I + MARGIN);
    assert_eq!(observer.max_granted(), 1);

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_longer_than_the_idle_timeout_loses_the_lock_and_demotes_when_resumed() {
    let db = TestDb::create("fault_sigstop").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    observer.wait_for_holder(MARGIN).await.expect("a holds");
    tokio::time::sleep(I + I / 2).await;

    fleet.get(a).signal(Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let lead_b = fleet.wait_lead_since(b, stopped, 5 * I + MARGIN).await;
    assert_within(
        "successor of a frozen leader",
        lead_b - stopped,
        5 * I + MARGIN,
    );
    assert!(
        fleet.get(a).is_leader(),
        "frozen, a still believes it leads"
    );
    tokio::time::sleep(2 * I).await;

    let resumed = Instant::now();
    fleet.get(a).signal(Signal::SIGCONT).unwrap();
    let (follow_a, cause) = fleet.wait_follow_since(a, stopped, 2 * I + MARGIN).await;
    assert_eq!(cause, "Lost(SessionEnded)");
    assert_within(
        "detection after SIGCONT",
        follow_a.saturating_duration_since(resumed),
        2 * I + MARGIN,
    );
    // The overlap in wall-clock time includes the time a was frozen (it ran nothing then);
    // beyond that it is bounded by the check after the resume.
    let overlap = fleet.max_overlap();
    assert_within(
        "overlap beyond the frozen time",
        overlap.saturating_sub(resumed - lead_b),
        2 * I + MARGIN,
    );
    assert_eq!(fleet.leaders(), vec![b]);

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

/// A pause shorter than the idle timeout (2·I here: between I and 3·I) leaves the server
/// session alone, so the lock stays with the frozen leader's backend: the standby cannot take
/// it, and the resumed leader's overdue check finds the same backend holding it and keeps its
/// term. The freeze starts halfway between two checks, so no check is in flight when it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_between_one_and_three_intervals_keeps_the_term_and_the_lock_backend() {
    let db = TestDb::create("fault_short_sigstop").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    let holder = observer.wait_for_holder(MARGIN).await.expect("a holds");

    let ready = ready_at(fleet.get(a));
    sleep_until(next_check(ready, I, Instant::now() + I) + I / 2).await;
    fleet.get(a).signal(Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    tokio::time::sleep(2 * I).await;
    fleet.get(a).signal(Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    // Three checks after the resume.
    tokio::time::sleep(3 * I).await;

    assert_eq!(fleet.leaders(), vec![a], "a still leads");
    assert_eq!(fleet.get(a).terms().len(), 1, "the same term");
    assert!(
        fleet
            .get(b)
            .wait_for_since(stopped, Duration::ZERO, |r| r.event == LEAD)
            .await
            .is_none(),
        "b never led: the server kept the frozen leader's session"
    );
    let now = observer.current().expect("the lock is held");
    assert_eq!(now.pid, holder.pid, "the same lock backend");
    assert_eq!(observer.max_granted(), 1);
    println!(
        "paused {:?}; after the resume, a kept term 1 on backend {}",
        resumed - stopped,
        holder.pid
    );

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_slower_than_one_interval_leaves_no_leader_and_warns_once_per_interval() {
    let db = TestDb::create("fault_slow_server").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &proxy.pg_config(&db.config()), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &proxy.pg_config(&db.config()), I).await;
    fleet.wait_checked(db.admin(), b).await;
    tokio::time::sleep(2 * I).await;

    proxy.set_mode(Direction::ServerToClient, Mode::Delay(2 * I));
    let slow = Instant::now();
    let (follow_a, _) = fleet.wait_follow_since(a, slow, 2 * I + MARGIN).await;
    assert_within(
        "detection of a slow server",
        follow_a - slow,
        2 * I + MARGIN,
    );
    let window_start = slow + 2 * I + MARGIN;
    sleep_until(window_start + 10 * I).await;
    let window_end = Instant::now();
    for replica in &fleet.replicas {
        assert!(
            replica
                .records()
                .iter()
                .all(|r| r.event != LEAD || r.at < window_start),
            "{} never leads while every answer comes after its deadline",
            replica.name()
        );
        let warns: Vec<Instant> = replica
            .logs("WARN", ACQUIRE_WARN)
            .iter()
            .map(|r| r.at)
            .filter(|at| *at >= window_start && *at < window_end)
            .collect();
        let per_interval = (window_end - window_start).as_millis() / I.as_millis();
        assert!(
            !warns.is_empty() && warns.len() as u128 <= per_interval + 2,
            "{}: {} WARN lines in {per_interval} intervals",
            replica.name(),
            warns.len()
        );
    }
    // A lock the server granted to a check that timed out is released within one interval.
    for held in observer.holder_intervals(window_end) {
        if held.start >= slow {
            assert_within(
                "a grant nobody learned of",
                held.end - held.start,
                I + MARGIN,
            );
        }
    }

    proxy.set_mode(Direction::ServerToClient, Mode::Forward);
    let healed = Instant::now();
    let leader = fleet.sole_leader(2 * I + MARGIN).await;
    assert_within("a leader after recovery", healed.elapsed(), 2 * I + MARGIN);
    let _ = leader;
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_exhausted_by_other_work_bounds_each_attempt_by_one_interval() {
    let db = TestDb::create("fault_pool_exhausted").await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet
        .spawn_dsn(
            "b",
            plexsphere_leader_tests::replica_process::dsn(&db.config()),
            I,
            1,
        )
        .await;
    fleet.wait_checked(db.admin(), b).await;
    fleet.get_mut(b).command("hog 1").await.unwrap();
    fleet
        .get(b)
        .wait_for(MARGIN, |r| r.event == "hogged" && r.u64("n") == Some(1))
        .await
        .expect("b's only pooled connection is taken by other work");

    fleet.get_mut(a).stop().await.unwrap();
    let freed = Instant::now();
    sleep_until(freed + 12 * I).await;
    assert!(!fleet.get(b).is_leader(), "no connection, no lock");
    let warns: Vec<_> = fleet
        .get(b)
        .logs("WARN", ACQUIRE_WARN)
        .into_iter()
        .filter(|r| r.at >= freed)
        .collect();
    println!("{}", warns[0].str("message").unwrap_or_default());
    // Each attempt gives up when its interval is over; it then ends just after the next grid
    // time, so the next attempt starts one grid time later: one WARN every two intervals.
    assert!(
        warns.iter().all(|w| w
            .str("message")
            .is_some_and(|m| m.contains("no answer within 200ms"))),
        "each attempt is cut at one interval: {warns:?}"
    );
    assert!(
        (4..=13).contains(&warns.len()),
        "one failed attempt every one or two intervals: {}",
        warns.len()
    );
    let stamps: Vec<Instant> = warns.iter().map(|r| r.at).collect();
    let longest = stamps
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    assert_within("time between two failed attempts", longest, 2 * I + MARGIN);

    fleet.get_mut(b).command("unhog").await.unwrap();
    let unhogged = Instant::now();
    let lead_b = fleet.wait_lead_since(b, unhogged, I + MARGIN).await;
    assert_within(
        "leads once the pool has room",
        lead_b - unhogged,
        I + MARGIN,
    );

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_ignores_cancellation_is_reported_and_its_overlap_is_bounded() {
    let work = Duration::from_millis(2_500);
    let db = TestDb::create("fault_stubborn_pass").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn("a", &db.config(), I).await;
    fleet.wait_lead(a, STARTUP).await;
    let b = fleet.spawn("b", &db.config(), I).await;
    fleet.wait_checked(db.admin(), b).await;
    let holder = observer.wait_for_holder(MARGIN).await.expect("a holds");

    fleet
        .get_mut(a)
        .command(&format!("work {}", work.as_millis()))
        .await
        .unwrap();
    let started = fleet
        .get(a)
        .wait_for(MARGIN, |r| r.event == "work_start")
        .await
        .expect("the pass starts")
        .at;
    let terminated = Instant::now();
    assert!(db.terminate(holder.pid).await.unwrap());
    let (follow_a, _) = fleet.wait_follow_since(a, terminated, 2 * I + MARGIN).await;
    let lead_b = fleet.wait_lead_since(b, terminated, 2 * I + MARGIN).await;
    let ended = fleet
        .get(a)
        .wait_for(work + MARGIN, |r| r.event == "work_end")
        .await
        .expect("the pass runs to its end")
        .at;
    assert!(ended > follow_a, "the pass ignored the end of its term");
    let result = fleet
        .get(a)
        .wait_for(MARGIN, |r| r.event == "work_result")
        .await
        .expect("run_if_leader returned");
    assert_eq!(
        result.bool("ran"),
        Some(false),
        "a demotion is not a failure: Ok(false)"
    );
    assert_eq!(
        fleet
            .get(a)
            .logs("INFO", "leader: leadership ended while background work ran")
            .len(),
        1
    );
    let mut work_and_leads = vec![Interval {
        replica: "a-work".into(),
        start: started,
        end: ended,
    }];
    work_and_leads.extend(
        fleet
            .intervals()
            .into_iter()
            .filter(|i| i.replica == app("b")),
    );
    let overlap = max_overlap(&work_and_leads);
    assert!(overlap > Duration::ZERO && lead_b < ended);
    assert_within(
        "work overlap (bound 2·I + T)",
        overlap,
        2 * I + work + MARGIN,
    );

    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_standbys_racing_for_a_freed_lock_elect_exactly_one() {
    let db = TestDb::create("fault_ten_standbys").await.unwrap();
    let observer = LockObserver::start(&db.config()).await.unwrap();
    let blocker = db.connect("plx-harness-blocker").await.unwrap();
    blocker
        .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
        .await
        .unwrap();
    let mut fleet = Fleet::new();
    for name in ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"] {
        fleet.spawn(name, &db.config(), I).await;
    }
    // One pooled session each: every run proves its pool with one pooled connection and a
    // short-lived session of its own (closed at once), then its checks borrow the pooled one.
    let all_checked = support::wait_for_async(STARTUP, || async {
        db.session_count(REPLICA_APP_PREFIX).await.unwrap() == 10
    })
    .await;
    assert!(all_checked.is_some(), "every standby has tried the lock");
    tokio::time::sleep(I).await;
    assert!(fleet.leaders().is_empty());

    let freed = Instant::now();
    blocker
        .simple_query("SELECT pg_advisory_unlock(1886156915, 1)")
        .await
        .unwrap();
    let winner = fleet.sole_leader(I + MARGIN).await;
    assert_within(
        "a winner after the lock is freed",
        freed.elapsed(),
        I + MARGIN,
    );
    for _ in 0..10 {
        tokio::time::sleep(I / 2).await;
        assert_eq!(fleet.leaders(), vec![winner]);
    }
    assert_eq!(
        fleet.lead_count(),
        1,
        "exactly one term began among the ten"
    );
    assert_eq!(observer.max_granted(), 1);
    println!("winner: {}", fleet.get(winner).name());

    drop(blocker);
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}
