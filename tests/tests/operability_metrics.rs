//! The operability signals beyond the spec against a real PostgreSQL: the per-key metrics
//! (transitions by cause, lock attempts by outcome, check latency, the last successful check,
//! the current term, is-leader) and the stuck-leader liveness probe served on `/livez`.
//!
//! Timings use the documented margins of `support` (`I` = 200 ms, `MARGIN` = 5 s, `STARTUP` =
//! 30 s): values are read once they settle, never at exact instants.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;
mod support;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use plexsphere_leader::metrics::{
    CHECK_DURATION, IS_LEADER, LAST_CHECK_SUCCESS, LEADER_GAUGE_NAME, LOCK_ATTEMPTS, TERM_EPOCH,
    TERM_START, TRANSITIONS,
};
use plexsphere_leader::{Config, Elector, LockKey, TermEndCause, metrics::key_label};
use plexsphere_leader_service::loops::ELECTION_WORKER;
use plexsphere_leader_service::{Liveness, Readiness};
use plexsphere_leader_tests::TestDb;
use prometheus::Registry;
use support::{I, MARGIN, Replica, STARTUP, lock_holders, sample, wait_for};
use tokio_util::sync::CancellationToken;

/// The `key` label of the leader lock.
fn key() -> String {
    key_label(LockKey::DEFAULT)
}

fn transitions(registry: &Registry, to: &str, cause: &str) -> f64 {
    sample(registry, TRANSITIONS, &[("to", to), ("cause", cause)]).expect("transition series")
}

fn attempts(registry: &Registry, outcome: &str) -> f64 {
    sample(registry, LOCK_ATTEMPTS, &[("outcome", outcome)]).expect("attempt series")
}

fn gauge(registry: &Registry, name: &str) -> f64 {
    sample(registry, name, &[]).expect("gauge series")
}

fn checks(registry: &Registry, role: &str) -> f64 {
    sample(registry, CHECK_DURATION, &[("role", role)]).expect("histogram series")
}

/// Every transition to standby, summed over its causes.
fn demotions(registry: &Registry) -> f64 {
    TermEndCause::ALL
        .iter()
        .map(|cause| transitions(registry, "standby", cause.label()))
        .sum()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_and_a_refused_standby_show_their_terms_attempts_and_checks() {
    let db = TestDb::create("metrics_leader_standby").await.unwrap();
    let before = unix_now();
    let leader = Replica::spawn(db.pool(2).unwrap(), I);
    wait_for(STARTUP, || leader.elector.is_leader())
        .await
        .expect("the first replica leads");
    let after = unix_now();
    // A clone shares the registry's collectors and outlives `leader.stop()`.
    let reg = &leader.registry.clone();
    assert_eq!(transitions(reg, "leader", "acquired"), 1.0);
    assert_eq!(demotions(reg), 0.0);
    assert_eq!(attempts(reg, "granted"), 1.0);
    assert_eq!(gauge(reg, IS_LEADER), 1.0);
    assert_eq!(gauge(reg, TERM_EPOCH), 0.0, "no fencing: epoch 0");
    let start = gauge(reg, TERM_START);
    assert!(
        (before..=after).contains(&start),
        "term start {start} in [{before}, {after}]"
    );
    assert!(
        gauge(reg, LAST_CHECK_SUCCESS) >= start - 1.0,
        "the grant counts as a check"
    );
    assert!(
        checks(reg, "standby") >= 1.0,
        "the granted statement's latency"
    );

    // The leader's own checks: observed, and each success moves the last-check time on.
    let granted_at = gauge(reg, LAST_CHECK_SUCCESS);
    wait_for(I * 3 + MARGIN, || checks(reg, "leader") >= 2.0)
        .await
        .expect("the leader's checks are observed");
    assert!(gauge(reg, LAST_CHECK_SUCCESS) > granted_at);
    assert!(
        leader.elector.liveness().is_ok(),
        "a leader whose checks pass is live"
    );

    // A second replica is refused at each of its checks.
    let standby = Replica::spawn(db.pool(2).unwrap(), I);
    let sreg = &standby.registry;
    wait_for(STARTUP, || attempts(sreg, "refused") >= 3.0)
        .await
        .expect("the standby's refused attempts are counted");
    assert!(!standby.elector.is_leader());
    assert!(standby.elector.liveness().is_ok(), "a standby is live");
    assert_eq!(attempts(sreg, "granted"), 0.0);
    assert_eq!(transitions(sreg, "leader", "acquired"), 0.0);
    assert_eq!(gauge(sreg, IS_LEADER), 0.0);
    assert_eq!(gauge(sreg, TERM_START), 0.0);
    assert!(
        checks(sreg, "standby") >= 3.0,
        "each refused statement is observed"
    );
    assert!(
        gauge(sreg, LAST_CHECK_SUCCESS) > 0.0,
        "a refusal is an answered check"
    );
    for outcome in [
        "in_recovery",
        "shared_session",
        "timed_out",
        "error",
        "no_connection",
    ] {
        assert_eq!(attempts(sreg, outcome), 0.0, "{outcome}");
    }

    // A graceful stop: the leader's term ends as `stopped`; the standby takes over.
    leader.stop().await.unwrap();
    assert_eq!(transitions(reg, "standby", "stopped"), 1.0);
    assert_eq!(demotions(reg), 1.0);
    assert_eq!(gauge(reg, IS_LEADER), 0.0);
    assert_eq!(gauge(reg, TERM_START), 0.0);
    wait_for(I + MARGIN, || standby.elector.is_leader())
        .await
        .expect("the standby leads after the graceful stop");
    assert_eq!(transitions(sreg, "leader", "acquired"), 1.0);
    assert_eq!(attempts(sreg, "granted"), 1.0);
    standby.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_lock_session_counts_a_transition_to_standby_because_the_session_ended() {
    let db = TestDb::create("metrics_session_ended").await.unwrap();
    let replica = Replica::spawn(db.pool(2).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads");
    let pid = lock_holders(&db).await[0];
    assert!(db.terminate(pid).await.unwrap());
    wait_for(MARGIN, || !replica.elector.is_leader())
        .await
        .expect("demoted after pg_terminate_backend");
    let reg = &replica.registry;
    assert_eq!(transitions(reg, "standby", "session_ended"), 1.0);
    assert_eq!(demotions(reg), 1.0, "no other cause counted");
    assert_eq!(gauge(reg, IS_LEADER), 0.0);
    assert_eq!(gauge(reg, TERM_START), 0.0);
    // It takes the free lock again at a later check: a second term.
    wait_for(I * 2 + MARGIN, || replica.elector.is_leader())
        .await
        .expect("leads again");
    assert_eq!(transitions(reg, "leader", "acquired"), 2.0);
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_of_one_key_on_one_registry_write_the_same_series() {
    let db = TestDb::create("metrics_shared_registry").await.unwrap();
    let registry = Registry::new();
    let shutdown = CancellationToken::new();
    let electors: Vec<Elector> = (0..2)
        .map(|_| {
            let config = Config::new(db.pool(2).unwrap())
                .check_interval(I)
                .registry(&registry);
            Elector::new(config).expect("a second elector finds the collectors")
        })
        .collect();
    let tasks: Vec<_> = electors
        .iter()
        .map(|elector| {
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            tokio::spawn(async move { elector.run(shutdown).await })
        })
        .collect();
    wait_for(STARTUP, || {
        electors.iter().filter(|e| e.is_leader()).count() == 1
    })
    .await
    .expect("one leads");
    wait_for(STARTUP, || attempts(&registry, "refused") >= 2.0)
        .await
        .expect("the standby's refusals land in the shared series");
    assert_eq!(attempts(&registry, "granted"), 1.0);
    assert_eq!(transitions(&registry, "leader", "acquired"), 1.0);
    assert_eq!(gauge(&registry, IS_LEADER), 1.0);
    // One family per metric and one series per label set: shared, not duplicated.
    let families = registry.gather();
    for name in [
        IS_LEADER,
        TERM_START,
        LAST_CHECK_SUCCESS,
        TRANSITIONS,
        LOCK_ATTEMPTS,
    ] {
        assert_eq!(
            families.iter().filter(|f| f.name() == name).count(),
            1,
            "{name}"
        );
    }
    let is_leader = families.iter().find(|f| f.name() == IS_LEADER).unwrap();
    assert_eq!(is_leader.get_metric().len(), 1, "one series of the one key");
    shutdown.cancel();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(gauge(&registry, IS_LEADER), 0.0);
    assert_eq!(transitions(&registry, "standby", "stopped"), 1.0);
    db.cleanup().await.unwrap();
}

/// A leader's liveness fails while the thread that drives its election is blocked, and passes
/// again once it runs: the elector runs on its own current-thread runtime in a std thread, and a
/// task of that runtime blocks the thread with `std::thread::sleep` for 4 intervals. Its last
/// check is then at least 4 intervals old at the end of the block, so the probe fails for at
/// least the last 2 intervals of it (400 ms), a window the test thread sees by polling `/livez`
/// every 20 ms. After the block the leader checks again (live) or, if `idle_session_timeout`
/// (4 intervals) ended its session meanwhile, is demoted (live too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_runtime_is_blocked_fails_liveness_until_it_runs_again() {
    let db = TestDb::create("liveness_blocked").await.unwrap();
    let elector = Elector::new(Config::new(db.pool(2).unwrap()).check_interval(I)).unwrap();
    let liveness = Liveness::new();
    liveness
        .register(
            ELECTION_WORKER,
            Arc::new(plexsphere_leader_service::ElectorLiveness::new(
                elector.clone(),
            )),
        )
        .unwrap();
    let stop = CancellationToken::new();
    let addr = loops_support::serve(
        plexsphere_leader_service::http::router(Readiness::new(), liveness, Registry::new()),
        stop.clone(),
    )
    .await;

    let block = I * 4;
    let shutdown = CancellationToken::new();
    let (block_tx, thread) = support::on_a_blockable_runtime({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });

    wait_for(STARTUP, || elector.is_leader())
        .await
        .expect("leads");
    assert!(elector.liveness().is_ok());
    assert_eq!(
        loops_support::get(addr, "/livez").await.unwrap(),
        (
            200,
            format!("[+]{ELECTION_WORKER} ok\nlivez check passed\n")
        )
    );

    let blocked_at = tokio::time::Instant::now();
    block_tx.send(block).unwrap();
    let body = loops_support::eventually(block + MARGIN, "/livez fails while blocked", || async {
        let (code, body) = loops_support::get(addr, "/livez").await.unwrap();
        (code == 503).then_some(body)
    })
    .await;
    println!("/livez failed {:?} into the block", blocked_at.elapsed());
    assert!(
        body.starts_with(&format!(
            "[-]{ELECTION_WORKER} failed: the replica leads, but its last successful check was"
        )),
        "{body}"
    );
    assert!(body.ends_with("livez check failed\n"), "{body}");
    assert!(
        elector.is_leader(),
        "a blocked driver cannot even notice a loss"
    );
    let stuck = elector.liveness().unwrap_err();
    assert_eq!(stuck.bound, I * 2);

    loops_support::eventually(block + MARGIN, "/livez passes after the block", || async {
        let (code, _) = loops_support::get(addr, "/livez").await.unwrap();
        (code == 200).then_some(())
    })
    .await;
    println!(
        "/livez passed again {:?} after the block began; leading: {}",
        blocked_at.elapsed(),
        elector.is_leader()
    );
    assert!(
        blocked_at.elapsed() >= block,
        "not before the thread ran again"
    );

    shutdown.cancel();
    let run = tokio::task::spawn_blocking(move || thread.join())
        .await
        .unwrap()
        .expect("the elector thread did not panic");
    run.unwrap();
    stop.cancel();
    assert!(lock_holders(&db).await.is_empty());
    db.cleanup().await.unwrap();
}

#[test]
fn the_key_label_names_both_halves_of_the_lock_key() {
    assert_eq!(key(), "1886156915:1");
}

/// A snapshot of the debugging recorder: it hands counters and gauges over (resets them), so a
/// test takes one per phase and reads every value from it.
type FacadeSnapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    metrics_util::debugging::DebugValue,
)>;

/// The value of the facade series `name` whose labels include every pair of `labels`.
fn facade_value(snapshot: &FacadeSnapshot, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use metrics_util::debugging::DebugValue;
    snapshot.iter().find_map(|(key, _, _, value)| {
        let key = key.key();
        let matches = key.name() == name
            && labels
                .iter()
                .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v));
        matches.then(|| match value {
            DebugValue::Counter(count) => *count as f64,
            DebugValue::Gauge(gauge) => gauge.into_inner(),
            DebugValue::Histogram(samples) => samples.len() as f64,
        })
    })
}

/// A service on the `metrics` facade (no Prometheus registry) sees the same series: the spec's
/// gauge, is-leader and the transitions with their causes, from a real election.
#[tokio::test]
async fn the_metrics_facade_records_a_real_term() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let db = TestDb::create("metrics_facade").await.unwrap();
    let config = Config::new(db.pool(2).unwrap())
        .check_interval(I)
        .metrics_facade(true);
    // The handles are taken from the recorder installed when the elector is built.
    let elector = metrics::with_local_recorder(&recorder, || Elector::new(config)).unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    wait_for(STARTUP, || elector.is_leader())
        .await
        .expect("leads");
    let key = ("key", "1886156915:1");
    let leading = snapshotter.snapshot().into_vec();
    assert_eq!(facade_value(&leading, LEADER_GAUGE_NAME, &[]), Some(1.0));
    assert_eq!(facade_value(&leading, IS_LEADER, &[key]), Some(1.0));
    assert_eq!(
        facade_value(&leading, TRANSITIONS, &[key, ("cause", "acquired")]),
        Some(1.0)
    );
    assert!(facade_value(&leading, LOCK_ATTEMPTS, &[key, ("outcome", "granted")]) >= Some(1.0));

    shutdown.cancel();
    run.await.unwrap().unwrap();
    let stopped = snapshotter.snapshot().into_vec();
    assert_eq!(facade_value(&stopped, LEADER_GAUGE_NAME, &[]), Some(0.0));
    assert_eq!(facade_value(&stopped, IS_LEADER, &[key]), Some(0.0));
    assert_eq!(
        facade_value(&stopped, TRANSITIONS, &[key, ("cause", "stopped")]),
        Some(1.0)
    );
    db.cleanup().await.unwrap();
}

/// A sharded elector on the `metrics` facade records the same series as on a registry: the
/// shards owned, the members and unowned shards of the last survey, and the shard terms begun
/// and ended by cause, from a real space.
#[tokio::test]
async fn the_metrics_facade_records_a_real_sharded_space() {
    use plexsphere_leader::sharded::{DEFAULT_SHARD_CLASS, ShardConfig, ShardedElector};

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let db = TestDb::create("metrics_facade_sharded").await.unwrap();
    let config = ShardConfig::new(db.pool(2).unwrap(), 4)
        .check_interval(I)
        .metrics_facade(true);
    let elector = metrics::with_local_recorder(&recorder, || ShardedElector::new(config)).unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    wait_for(STARTUP, || elector.ownership().shards.len() == 4)
        .await
        .expect("owns every shard");
    let class = DEFAULT_SHARD_CLASS.to_string();
    let class = ("class", class.as_str());
    // A snapshot of the debugging recorder drains what it read: take one, after two more
    // surveys have seen the space owned.
    tokio::time::sleep(2 * I + MARGIN).await;
    let owning = snapshotter.snapshot().into_vec();
    assert_eq!(
        facade_value(&owning, "plexsphere_shards_owned", &[class]),
        Some(4.0)
    );
    assert_eq!(
        facade_value(&owning, "plexsphere_shards_unowned", &[class]),
        Some(0.0)
    );
    assert_eq!(
        facade_value(&owning, "plexsphere_shards_members", &[class]),
        Some(1.0)
    );
    assert_eq!(
        facade_value(&owning, "plexsphere_shards_eligible", &[class]),
        Some(1.0)
    );
    assert!(
        facade_value(&owning, "plexsphere_shards_survey_seconds", &[class]) >= Some(2.0),
        "a sample per survey"
    );
    assert_eq!(
        facade_value(
            &owning,
            "plexsphere_shard_terms_total",
            &[class, ("event", "began"), ("cause", "")]
        ),
        Some(4.0)
    );
    for action in ["reported", "aborted"] {
        assert_eq!(
            facade_value(
                &owning,
                "plexsphere_shards_overdue_work_total",
                &[class, ("action", action)]
            ),
            Some(0.0),
            "every series exists at zero from the start"
        );
    }

    shutdown.cancel();
    run.await.unwrap().unwrap();
    let stopped = snapshotter.snapshot().into_vec();
    assert_eq!(
        facade_value(&stopped, "plexsphere_shards_owned", &[class]),
        Some(0.0)
    );
    assert_eq!(
        facade_value(
            &stopped,
            "plexsphere_shard_terms_total",
            &[class, ("event", "ended"), ("cause", "stopped")]
        ),
        Some(4.0)
    );
    // Kept out by the operator (between runs too): the gauge says so.
    elector.set_eligible(false);
    let kept_out = snapshotter.snapshot().into_vec();
    assert_eq!(
        facade_value(&kept_out, "plexsphere_shards_eligible", &[class]),
        Some(0.0)
    );
    db.cleanup().await.unwrap();
}
