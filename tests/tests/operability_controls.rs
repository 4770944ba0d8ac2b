//! Operator controls against a real PostgreSQL: resign with a hold-off, eligibility, and the
//! hard deadline for leader work after its term ended. Bounds use the documented margins of
//! `support` (I = 200 ms, MARGIN = 5 s); lower bounds that the election guarantees (no check
//! before a hold-off ends) are asserted exactly, since lateness cannot break them.

mod support;

use std::time::Duration;

use plexsphere_leader::metrics::{ELIGIBLE, OVERDUE_WORK, TRANSITIONS};
use plexsphere_leader::{
    Config, ConfigError, Elector, TermEndCause,
    config::{MAX_HOLD_OFF, OnOverdue},
    leadership::{Interruption, OVERDUE_WORK_MESSAGE, Resignation, named_work},
};
use plexsphere_leader_tests::TestDb;
use prometheus::Registry;
use support::{
    I, Logs, MARGIN, STARTUP, lock_holders, sample, spawn_elector, wait_for, wait_for_async,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn config(db: &TestDb) -> Config {
    Config::new(db.pool(2).expect("pool")).check_interval(I)
}

/// The value of metric `name` with `labels` (and the default key) on `registry`.
fn metric(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(registry, name, labels).expect("the series exists")
}

#[tokio::test]
async fn a_resigning_leader_hands_over_and_stays_out_for_its_hold_off() {
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create("resign_hand_over").await.unwrap();
    let hold_off = 5 * I;
    let registry = Registry::new();
    let (first, first_stop, first_task) =
        spawn_elector(config(&db).resign_hold_off(hold_off).registry(&registry));
    wait_for(STARTUP, || first.is_leader())
        .await
        .expect("first leads");
    let (second, second_stop, second_task) = spawn_elector(config(&db));
    tokio::time::sleep(I).await;
    assert!(!second.is_leader());
    let parent = CancellationToken::new();
    let term = first.term(&parent).expect("a term while leading");

    let asked = Instant::now();
    assert_eq!(first.resign(), Resignation::Requested);
    let handed_over = wait_for(I + MARGIN, || second.is_leader())
        .await
        .expect("the standby takes over after the resign");
    println!("the standby led {handed_over:?} after the resign request");
    assert!(!first.is_leader());
    assert_eq!(
        term.cause(),
        Some(Interruption::Term(TermEndCause::Resigned))
    );
    assert_eq!(lock_holders(&db).await.len(), 1);
    let resigned = [("to", "standby"), ("cause", "resigned")];
    assert_eq!(metric(&registry, TRANSITIONS, &resigned), 1.0);
    assert!(logs.contains("INFO", "leader: resigned background leadership"));
    // The standby may take the lock before the resigner has read the unlock's answer.
    wait_for(MARGIN, || {
        logs.contains(
            "INFO",
            "leader: released background leader lock after resigning",
        )
    })
    .await
    .expect("the release after resigning is logged");

    // The new leader stops at once: the lock is free, but the resigner waits out its hold-off.
    second_stop.cancel();
    second_task.await.unwrap();
    wait_for(hold_off + MARGIN, || first.is_leader())
        .await
        .expect("the resigner leads again after its hold-off");
    let again = asked.elapsed();
    println!("the resigner led again {again:?} after its request (hold-off {hold_off:?})");
    assert!(
        again >= hold_off,
        "no check before the hold-off ends: led again after {again:?}"
    );
    first_stop.cancel();
    first_task.await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_resign_while_not_running_changes_nothing_and_a_too_long_hold_off_is_refused() {
    let db = TestDb::create("resign_idle").await.unwrap();
    let elector = Elector::new(config(&db)).unwrap();
    assert_eq!(elector.resign(), Resignation::NotRunning);
    let error = Elector::new(config(&db).resign_hold_off(MAX_HOLD_OFF + Duration::from_secs(1)))
        .unwrap_err();
    assert!(matches!(error, ConfigError::HoldOff { .. }), "{error}");
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn an_ineligible_replica_never_takes_the_free_lock_until_made_eligible() {
    let db = TestDb::create("eligibility").await.unwrap();
    let registry = Registry::new();
    let (canary, stop, task) = spawn_elector(config(&db).eligible(false).registry(&registry));
    assert!(!canary.is_eligible());
    assert_eq!(metric(&registry, ELIGIBLE, &[]), 0.0);
    // Five checks' worth: the lock is free all along, and nobody takes it.
    tokio::time::sleep(5 * I).await;
    assert!(!canary.is_leader());
    assert!(lock_holders(&db).await.is_empty());

    canary.set_eligible(true);
    assert_eq!(metric(&registry, ELIGIBLE, &[]), 1.0);
    let took = wait_for(I + MARGIN, || canary.is_leader())
        .await
        .expect("leads once eligible");
    println!("led {took:?} after being made eligible");
    assert!(canary.is_eligible());

    // Made ineligible while leading: it resigns, releases, and stays out.
    let parent = CancellationToken::new();
    let term = canary.term(&parent).expect("a term");
    canary.set_eligible(false);
    wait_for_async(MARGIN, || async { lock_holders(&db).await.is_empty() })
        .await
        .expect("the lock is released");
    assert_eq!(
        term.cause(),
        Some(Interruption::Term(TermEndCause::Resigned))
    );
    tokio::time::sleep(5 * I).await;
    assert!(!canary.is_leader());
    assert!(lock_holders(&db).await.is_empty());
    stop.cancel();
    task.await.unwrap();

    // The setting outlives the run: a new run stays out too.
    let shutdown = CancellationToken::new();
    let rerun = tokio::spawn({
        let (canary, shutdown) = (canary.clone(), shutdown.clone());
        async move { canary.run(shutdown).await }
    });
    tokio::time::sleep(3 * I).await;
    assert!(!canary.is_leader());
    shutdown.cancel();
    rerun.await.unwrap().unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_canary_stands_by_while_an_eligible_replica_leads() {
    let db = TestDb::create("eligibility_canary").await.unwrap();
    let (canary, canary_stop, canary_task) = spawn_elector(config(&db).eligible(false));
    let (regular, regular_stop, regular_task) = spawn_elector(config(&db));
    wait_for(STARTUP, || regular.is_leader())
        .await
        .expect("the eligible replica leads");
    // The leader stops: the lock is free, and the canary still does not take it.
    regular_stop.cancel();
    regular_task.await.unwrap();
    tokio::time::sleep(5 * I).await;
    assert!(!canary.is_leader());
    assert!(lock_holders(&db).await.is_empty());
    canary_stop.cancel();
    canary_task.await.unwrap();
    db.cleanup().await.unwrap();
}

/// Leads with `on_overdue`, starts work that ignores its term's cancellation (it sleeps
/// `work_takes`), then ends the backend; returns what `run_if_leader` returned, how long after
/// the loss it returned, and the captured logs.
async fn overdue_work_after_a_loss(
    name: &str,
    deadline: Duration,
    on_overdue: OnOverdue,
    work_takes: Duration,
) -> (Result<bool, std::io::Error>, Duration, Logs, Registry) {
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create(name).await.expect("database");
    let registry = Registry::new();
    let (elector, shutdown, task) = spawn_elector(
        config(&db)
            .work_deadline(deadline, on_overdue)
            .registry(&registry),
    );
    wait_for(STARTUP, || elector.is_leader())
        .await
        .expect("leads");
    let parent = CancellationToken::new();
    let work = tokio::spawn({
        let elector = elector.clone();
        async move {
            named_work("stubborn-pass", async {
                elector
                    .run_if_leader(&parent, |_token| async move {
                        // Ignores the token on purpose.
                        tokio::time::sleep(work_takes).await;
                        Ok::<_, std::io::Error>(())
                    })
                    .await
            })
            .await
        }
    });
    tokio::time::sleep(I / 2).await;
    let pid = lock_holders(&db).await[0];
    let lost = Instant::now();
    db.admin()
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("pg_terminate_backend");
    wait_for(MARGIN, || !elector.is_leader())
        .await
        .expect("demoted");
    let result = work.await.expect("work task");
    let returned = lost.elapsed();
    shutdown.cancel();
    task.await.expect("run task");
    db.cleanup().await.expect("cleanup");
    (result, returned, logs, registry)
}

#[tokio::test]
async fn work_past_the_deadline_after_a_loss_is_reported_and_aborted() {
    let deadline = 2 * I;
    let (result, returned, logs, registry) = overdue_work_after_a_loss(
        "overdue_abort",
        deadline,
        OnOverdue::Abort,
        Duration::from_secs(60),
    )
    .await;
    println!("aborted work returned {returned:?} after the loss (deadline {deadline:?})");
    assert!(!result.unwrap(), "an aborted pass is not a failure");
    assert!(
        returned >= deadline && returned < deadline + MARGIN,
        "the pass is dropped at the deadline, not at its own end: {returned:?}"
    );
    let line = logs
        .lines()
        .into_iter()
        .find(|line| line.contains(OVERDUE_WORK_MESSAGE))
        .expect("the overdue work is reported");
    assert!(line.starts_with("WARN"), "{line}");
    assert!(line.contains("stubborn-pass"), "{line}");
    assert!(line.contains("aborted=true"), "{line}");
    assert_eq!(
        metric(&registry, OVERDUE_WORK, &[("action", "aborted")]),
        1.0
    );
    assert_eq!(
        metric(&registry, OVERDUE_WORK, &[("action", "reported")]),
        0.0
    );
}

#[tokio::test]
async fn work_past_the_deadline_is_only_reported_when_abort_is_off() {
    let deadline = 2 * I;
    let work_takes = 8 * I;
    let (result, returned, logs, registry) =
        overdue_work_after_a_loss("overdue_report", deadline, OnOverdue::Report, work_takes).await;
    assert!(!result.unwrap(), "the term ended under the pass");
    assert!(
        returned >= work_takes - I,
        "the pass ran to its own end: {returned:?}"
    );
    assert!(logs.contains("WARN", "stubborn-pass"));
    assert!(logs.contains("WARN", "aborted=false"));
    assert_eq!(
        metric(&registry, OVERDUE_WORK, &[("action", "reported")]),
        1.0
    );
    assert_eq!(
        metric(&registry, OVERDUE_WORK, &[("action", "aborted")]),
        0.0
    );
}

#[tokio::test]
async fn work_that_returns_within_the_deadline_is_not_reported() {
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create("overdue_none").await.unwrap();
    let (elector, shutdown, task) =
        spawn_elector(config(&db).work_deadline(2 * I, OnOverdue::Abort));
    wait_for(STARTUP, || elector.is_leader())
        .await
        .expect("leads");
    let parent = CancellationToken::new();
    let ran = elector.run_if_leader(&parent, |token| async move {
        token.cancelled().await;
        Ok::<_, std::io::Error>(())
    });
    let stop = async {
        tokio::time::sleep(I / 2).await;
        shutdown.cancel();
    };
    let (ran, ()) = tokio::join!(ran, stop);
    assert!(!ran.unwrap());
    task.await.unwrap();
    tokio::time::sleep(4 * I).await;
    assert!(!logs.contains("WARN", OVERDUE_WORK_MESSAGE));
    db.cleanup().await.unwrap();
}
