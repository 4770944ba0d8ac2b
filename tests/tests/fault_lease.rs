//! The lease mechanism's faults with replicas as separate OS processes (`plx-replica
//! --mechanism lease`), connected directly and (`behind_pgbouncer_…`) through a real PgBouncer
//! in `pool_mode = transaction` with one server connection for the three of them, on both
//! backends (`<test>::deadpool`, `<test>::sqlx`), each test on its own database.
//!
//! | scenario | expected outcome (bound) |
//! |----------|--------------------------|
//! | three replicas for 60 s (directly and behind PgBouncer, at once) | one leader, one term, no transition |
//! | SIGKILL of the leader | nothing is released: a successor within TTL + I |
//! | the runtime stalled past the TTL (`stall`) | `is_leader()`, asked from another thread, says no once the trust window passed, during the stall and before the successor's term: overlap 0 |
//! | SIGSTOP longer than the TTL, then SIGCONT | a successor within TTL + I; the resumed leader's first `is_leader()` (sampled every ms, `believe`) says no, whether or not its driver ran yet: the two beliefs overlap by 0; it demotes (`LeaseExpired`) |
//! | the leader blackholed (fault proxy) | it demotes by 0.9·TTL after its last renewal, before the lease expires; a successor within TTL + I; no overlap |
//! | `pg_ctl restart -m fast` (throwaway cluster, direct) | a leader within the restart + TTL + I; no overlap |
//!
//! TTL is the default, three intervals. Bounds are asserted as `bound + MARGIN` (5 s,
//! `support::MARGIN`); the blackhole runs at I = 1 s, so that the leader's 10 % margin before
//! the server's expiry (0.3 s) is far above a loaded machine's scheduling delay.
#![allow(clippy::unwrap_used)]

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{Fleet, I, MARGIN, STARTUP, assert_within};
use nix::sys::signal::Signal;
use plexsphere_leader::LockKey;
use plexsphere_leader_tests::replica_process::{REPLICA_APP_PREFIX, dsn};
use plexsphere_leader_tests::{
    Backend, ChildArgs, Cluster, FaultProxy, Mechanism, Mode, StopMode, TestDb,
};
use support::lease_target;
use tokio::time::Instant;

/// The default lease TTL at interval `interval`: three intervals.
fn ttl(interval: Duration) -> Duration {
    interval * 3
}

/// How long the steady test watches.
const STEADY: Duration = Duration::from_secs(60);

/// The test database's name for `scenario` on `backend`, direct or pooled.
fn name(scenario: &str, backend: Backend, pooled: bool) -> String {
    let endpoint = if pooled { "pooled" } else { "direct" };
    format!("fault_lease_{scenario}_{endpoint}_{backend}")
}

/// Stops every replica still running, gracefully, and checks that each run ended well and that
/// no lease is held within a TTL of the last stop: the last leader released it, or a standby
/// stopped while its claim was in flight left one that expires (a claim given up may still
/// commit on the server). The pool checks of `Fleet::finish` do not apply here: behind
/// PgBouncer the server sessions are the pooler's, and sqlx gives a connection back to its
/// pool in a task of its own, after `run` returned.
async fn finish(mut fleet: Fleet, db: TestDb, interval: Duration) {
    for replica in &mut fleet.replicas {
        let killed = replica.records().iter().all(|r| r.event != "exit") && replica.exited();
        if killed {
            continue;
        }
        let report = replica.stop().await.unwrap();
        assert_eq!(report.run_error, None, "{}", replica.name());
    }
    let stopped = Instant::now();
    let statement = plexsphere_leader::sql::lease::who_holds(
        plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
        LockKey::DEFAULT,
    );
    loop {
        let rows = db.admin().query(&statement, &[]).await.unwrap();
        let held: Option<bool> = rows.first().map(|row| row.get(3));
        if held == Some(false) {
            break;
        }
        assert!(
            stopped.elapsed() <= ttl(interval) + MARGIN,
            "the lease is free within a TTL of the last stop: {held:?}"
        );
        tokio::time::sleep(interval / 4).await;
    }
    db.cleanup().await.unwrap();
}

/// Starts lease replica `name` on `config`.
async fn spawn(
    fleet: &mut Fleet,
    backend: Backend,
    name: &str,
    config: &tokio_postgres::Config,
    interval: Duration,
) -> usize {
    fleet
        .spawn_args(ChildArgs {
            backend,
            mechanism: Mechanism::Lease,
            ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn(config), interval)
        })
        .await
}

/// Three replica processes, directly or (`pooled`) behind PgBouncer: one leader and one term
/// for `STEADY`.
async fn steady(backend: Backend, pooled: bool) {
    let (db, target, _bouncer) =
        lease_target(&name("steady", backend, pooled), pooled, backend).await;
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        spawn(&mut fleet, backend, name, &target, I).await;
    }
    let leader = fleet.sole_leader(STARTUP).await;
    let started = Instant::now();
    while started.elapsed() < STEADY {
        assert_eq!(fleet.leaders(), vec![leader], "one steady leader");
        tokio::time::sleep(I).await;
    }
    assert_eq!(
        fleet.lead_count(),
        1,
        "one term, no transition in {STEADY:?}"
    );
    let endpoint = if pooled { "behind PgBouncer" } else { "direct" };
    println!("{backend}: one term for {:?} {endpoint}", started.elapsed());
    finish(fleet, db, I).await;
}

async fn killed_leader(backend: Backend, pooled: bool) {
    let (db, target, _bouncer) =
        lease_target(&name("kill", backend, pooled), pooled, backend).await;
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        spawn(&mut fleet, backend, name, &target, I).await;
    }
    let leader = fleet.sole_leader(STARTUP).await;
    tokio::time::sleep(2 * I).await;
    let killed = fleet.get_mut(leader).kill().await.unwrap();
    let bound = ttl(I) + I + MARGIN;
    let successor = fleet.sole_leader(bound).await;
    let led = fleet.wait_lead_since(successor, killed, bound).await;
    println!("{backend}: successor {:?} after the SIGKILL", led - killed);
    assert_within("successor after a SIGKILL", led - killed, bound);
    finish(fleet, db, I).await;
}

/// Replica `r`'s first sampler record `event` (`believes`, `resumed`) stamped at or after
/// `since` whose answer is `leader` (any answer: `None`), waited for up to `MARGIN`: the
/// sampler's records may arrive a little after the term records the test waited on.
async fn believed_since(
    fleet: &Fleet,
    r: usize,
    event: &str,
    leader: Option<bool>,
    since: Instant,
) -> Option<plexsphere_leader_tests::replica_process::Record> {
    fleet
        .get(r)
        .wait_for_since(since, MARGIN, |record| {
            record.event == event
                && leader.is_none_or(|leader| record.bool("leader") == Some(leader))
        })
        .await
}

/// When, after `since`, the old leader's `is_leader()` first said no and the successor's first
/// said yes.
async fn handover_of_belief(
    fleet: &Fleet,
    old: usize,
    new: usize,
    since: Instant,
) -> (Instant, Instant) {
    let old_ended = believed_since(fleet, old, "believes", Some(false), since)
        .await
        .expect("the old leader stopped believing")
        .at;
    let new_began = believed_since(fleet, new, "believes", Some(true), since)
        .await
        .expect("the successor believed")
        .at;
    (old_ended, new_began)
}

/// The one replica other than `leader` that leads, waited for at most `bound` from `since`.
async fn successor_of(fleet: &Fleet, leader: usize, since: Instant, bound: Duration) -> usize {
    loop {
        let others: Vec<usize> = fleet
            .leaders()
            .into_iter()
            .filter(|&r| r != leader)
            .collect();
        if let [successor] = others[..] {
            return successor;
        }
        assert!(since.elapsed() < bound, "a successor within {bound:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn stopped_leader(backend: Backend, pooled: bool) {
    let (db, target, _bouncer) =
        lease_target(&name("sigstop", backend, pooled), pooled, backend).await;
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        spawn(&mut fleet, backend, name, &target, I).await;
    }
    let leader = fleet.sole_leader(STARTUP).await;
    // What a service's loop would read: every replica's is_leader(), sampled each millisecond.
    for r in 0..3 {
        fleet.get_mut(r).command("believe").await.unwrap();
    }
    tokio::time::sleep(2 * I).await;
    let stopped = Instant::now();
    fleet.get(leader).signal(Signal::SIGSTOP).unwrap();
    let bound = ttl(I) + I + MARGIN;
    let successor = successor_of(&fleet, leader, stopped, bound).await;
    let led = fleet.wait_lead_since(successor, stopped, bound).await;
    println!("{backend}: successor {:?} after the SIGSTOP", led - stopped);
    assert_within("successor after a SIGSTOP", led - stopped, bound);
    tokio::time::sleep(ttl(I)).await;
    let resumed = Instant::now();
    fleet.get(leader).signal(Signal::SIGCONT).unwrap();
    let (_, cause) = fleet.wait_follow_since(leader, stopped, MARGIN).await;
    assert!(cause.contains("LeaseExpired"), "{cause}");
    // Its trust ran out during the pause: the first is_leader() after the resume said no,
    // whether or not the driver had run yet, so no belief of the two overlapped.
    let resumed_sample = believed_since(&fleet, leader, "resumed", None, resumed)
        .await
        .expect("the sampler saw the pause");
    assert_eq!(
        resumed_sample.bool("leader"),
        Some(false),
        "{backend}: is_leader() after the resume"
    );
    let (old_ended, new_began) = handover_of_belief(&fleet, leader, successor, stopped).await;
    // The old leader's last `true` was sampled before the SIGSTOP (its next sample, after the
    // resume, said no), the successor's first after it: the beliefs overlap by 0.
    assert!(
        old_ended >= resumed && new_began < resumed,
        "{backend}: old belief ended {:?} after the resume, successor began {:?} after the stop",
        old_ended - resumed,
        new_began - stopped
    );
    println!(
        "{backend}: successor believed {:?} after the SIGSTOP; old leader's first sample {:?} \
         after the SIGCONT said no",
        new_began - stopped,
        resumed_sample.at - resumed
    );
    tokio::time::sleep(4 * I).await;
    assert_eq!(
        fleet.leaders(),
        vec![successor],
        "the resumed leader stays a standby"
    );
    println!("{backend}: resumed at {:?}", resumed - stopped);
    finish(fleet, db, I).await;
}

/// A leader whose runtime is stalled past its lease (blocking work on the thread its election
/// runs on): its driver cannot run, yet `is_leader()`, asked from another thread, answers no
/// once its trust window (0.9·TTL after its last renewal was sent) has passed, before the
/// successor's term, while the stall still lasts. Before, it answered yes until the runtime
/// ran again.
async fn stalled_leader(backend: Backend) {
    let (db, target, _bouncer) = lease_target(&name("stall", backend, false), false, backend).await;
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        spawn(&mut fleet, backend, name, &target, I).await;
    }
    let leader = fleet.sole_leader(STARTUP).await;
    for r in 0..3 {
        fleet.get_mut(r).command("believe").await.unwrap();
    }
    tokio::time::sleep(2 * I).await;
    let stall = ttl(I) + 2 * I;
    let stalled = Instant::now();
    fleet
        .get_mut(leader)
        .command(&format!("stall {}", stall.as_millis()))
        .await
        .unwrap();
    let bound = ttl(I) + I + MARGIN;
    let successor = successor_of(&fleet, leader, stalled, bound).await;
    let (old_ended, new_began) = handover_of_belief(&fleet, leader, successor, stalled).await;
    println!(
        "{backend}: the stalled leader's is_leader() said no {:?} into the stall, the \
         successor's yes {:?} (stall {stall:?})",
        old_ended - stalled,
        new_began - stalled
    );
    assert!(
        old_ended < new_began,
        "{backend}: the beliefs overlap by {:?}",
        old_ended - new_began
    );
    assert!(
        old_ended - stalled < stall,
        "{backend}: it said no while the runtime was still stalled"
    );
    // Its driver runs once the stall ends: the term ends LeaseExpired, it stays a standby.
    let (_, cause) = fleet
        .wait_follow_since(leader, stalled, stall + MARGIN)
        .await;
    assert!(cause.contains("LeaseExpired"), "{cause}");
    finish(fleet, db, I).await;
}

/// Issue 49, item 11: the advisory lock's leader answers no, like a lease's, once the server
/// may have ended its session: the send of its last proving check plus its session's
/// `idle_session_timeout` (4·I) less a tenth (the lease's margin), at the moment of the call,
/// while its runtime is stalled past that timeout. Before, it said yes for 11–32 ms after resuming while its successor led.
async fn stalled_advisory_leader(backend: Backend) {
    let db = TestDb::create(&name("stall_advisory", backend, false))
        .await
        .unwrap();
    let target = db.config();
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        fleet
            .spawn_args(ChildArgs {
                backend,
                ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn(&target), I)
            })
            .await;
    }
    let leader = fleet.sole_leader(STARTUP).await;
    for r in 0..3 {
        fleet.get_mut(r).command("believe").await.unwrap();
    }
    tokio::time::sleep(2 * I).await;
    // Past the idle timeout, so that the server ends the session and a standby takes the lock.
    let stall = 4 * I + 3 * I;
    let stalled = Instant::now();
    fleet
        .get_mut(leader)
        .command(&format!("stall {}", stall.as_millis()))
        .await
        .unwrap();
    let bound = 4 * I + 2 * I + MARGIN;
    let successor = successor_of(&fleet, leader, stalled, bound).await;
    let (old_ended, new_began) = handover_of_belief(&fleet, leader, successor, stalled).await;
    println!(
        "{backend}: the stalled advisory leader's is_leader() said no {:?} into the stall, the \
         successor's yes {:?} (stall {stall:?})",
        old_ended - stalled,
        new_began - stalled
    );
    assert!(
        old_ended < new_began,
        "{backend}: the beliefs overlap by {:?}",
        old_ended - new_began
    );
    assert!(
        old_ended - stalled < stall,
        "{backend}: it said no only once the runtime ran again"
    );
    // Its driver runs once the stall ends: its session is gone, the term is lost.
    let (_, cause) = fleet
        .wait_follow_since(leader, stalled, stall + MARGIN)
        .await;
    assert!(cause.starts_with("Lost("), "{cause}");
    fleet.finish(db.admin()).await;
    db.cleanup().await.unwrap();
}

async fn an_advisory_leader_stalled_past_its_idle_timeout_answers_no_first(backend: Backend) {
    stalled_advisory_leader(backend).await;
}

async fn blackholed_leader(backend: Backend, pooled: bool) {
    let interval = Duration::from_secs(1);
    let (db, target, _bouncer) =
        lease_target(&name("blackhole", backend, pooled), pooled, backend).await;
    let proxy = FaultProxy::in_front_of(&target).await.unwrap();
    let mut fleet = Fleet::new();
    let a = spawn(
        &mut fleet,
        backend,
        "a",
        &proxy.pg_config(&target),
        interval,
    )
    .await;
    fleet.wait_lead(a, STARTUP).await;
    let b = spawn(&mut fleet, backend, "b", &target, interval).await;
    tokio::time::sleep(2 * interval).await;
    assert_eq!(fleet.leaders(), vec![a]);

    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();
    let (demoted, cause) = fleet
        .wait_follow_since(a, cut, ttl(interval) + MARGIN)
        .await;
    assert!(cause.contains("LeaseExpired"), "{cause}");
    let bound = ttl(interval) + interval + MARGIN;
    let led = fleet.wait_lead_since(b, cut, bound).await;
    println!(
        "{backend}: a demoted {:?}, b led {:?} after the cut",
        demoted - cut,
        led - cut
    );
    // The last renewal was sent at most one interval before the cut; the trust ends 0.9·TTL
    // after it.
    assert_within(
        "demotion after the cut",
        demoted - cut,
        ttl(interval) * 9 / 10 + MARGIN,
    );
    assert_within("successor after the cut", led - cut, bound);
    assert!(
        demoted < led,
        "a demoted ({demoted:?}) before b led ({led:?})"
    );
    assert_eq!(fleet.max_overlap(), Duration::ZERO, "never two leaders");
    proxy.set_both(Mode::Forward);
    finish(fleet, db, interval).await;
}

/// The server restarts (`pg_ctl restart -m fast` of a throwaway cluster) under three lease
/// replicas: the lease row survives; a leader is back within the restart plus TTL + I, and
/// never two at once.
async fn server_restart(backend: Backend) {
    let cluster = Cluster::start().await.unwrap();
    let config = cluster.config("postgres");
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(connection);
    plexsphere_leader::lease::setup(&client).await.unwrap();
    drop(client);
    let _ = driver.await;
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        spawn(&mut fleet, backend, name, &config, I).await;
    }
    fleet.sole_leader(STARTUP).await;
    tokio::time::sleep(2 * I).await;
    let began = Instant::now();
    cluster.restart(StopMode::Fast).await.unwrap();
    let restart = began.elapsed();
    let leader = fleet.sole_leader(ttl(I) + I + MARGIN).await;
    let back = began.elapsed();
    println!(
        "{backend}: restart {restart:?}; {} leads {back:?} after it began",
        leader
    );
    assert_within(
        "a leader after the restart",
        back,
        restart + ttl(I) + I + MARGIN,
    );
    tokio::time::sleep(4 * I).await;
    assert_eq!(
        fleet.leaders(),
        vec![leader],
        "one leader after the restart"
    );
    assert_eq!(fleet.max_overlap(), Duration::ZERO, "never two leaders");
    for replica in &mut fleet.replicas {
        let report = replica.stop().await.unwrap();
        assert_eq!(report.run_error, None, "{}", replica.name());
    }
}

async fn a_killed_leader_is_succeeded_within_ttl_plus_one_interval(backend: Backend) {
    killed_leader(backend, false).await;
}

async fn behind_pgbouncer_a_killed_leader_is_succeeded_within_ttl_plus_one_interval(
    backend: Backend,
) {
    killed_leader(backend, true).await;
}

async fn a_stopped_leader_is_succeeded_and_demotes_as_it_resumes(backend: Backend) {
    stopped_leader(backend, false).await;
}

async fn behind_pgbouncer_a_stopped_leader_is_succeeded_and_demotes_as_it_resumes(
    backend: Backend,
) {
    stopped_leader(backend, true).await;
}

async fn a_stalled_leader_answers_no_once_its_trust_ran_out(backend: Backend) {
    stalled_leader(backend).await;
}

/// Directly and behind PgBouncer at once (two fleets of three over the same minute), so that
/// both endpoints are watched for 60 s without a second minute of CI.
async fn three_replicas_keep_one_leader_and_one_term_for_a_minute(backend: Backend) {
    tokio::join!(steady(backend, false), steady(backend, true));
}

async fn a_blackholed_leader_demotes_before_its_lease_expires(backend: Backend) {
    blackholed_leader(backend, false).await;
}

async fn behind_pgbouncer_a_blackholed_leader_demotes_before_its_lease_expires(backend: Backend) {
    blackholed_leader(backend, true).await;
}

async fn a_server_restart_hands_over_within_the_restart_plus_ttl_plus_one_interval(
    backend: Backend,
) {
    server_restart(backend).await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    three_replicas_keep_one_leader_and_one_term_for_a_minute
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_killed_leader_is_succeeded_within_ttl_plus_one_interval
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    behind_pgbouncer_a_killed_leader_is_succeeded_within_ttl_plus_one_interval
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_stopped_leader_is_succeeded_and_demotes_as_it_resumes
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    behind_pgbouncer_a_stopped_leader_is_succeeded_and_demotes_as_it_resumes
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_stalled_leader_answers_no_once_its_trust_ran_out
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    an_advisory_leader_stalled_past_its_idle_timeout_answers_no_first
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_blackholed_leader_demotes_before_its_lease_expires
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    behind_pgbouncer_a_blackholed_leader_demotes_before_its_lease_expires
);
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_server_restart_hands_over_within_the_restart_plus_ttl_plus_one_interval
);
