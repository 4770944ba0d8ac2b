//! Leadership as events against the real server: a service awaits its term
//! (`Elector::next_term`), learns why it ended (`Term::ended`, typed), and follows every change
//! through `Elector::subscribe` — for a terminated backend, an unanswered check, a resign, and a
//! stop after the caller's own token was cancelled.

mod support;

use std::time::Duration;

use plexsphere_leader::{
    Elector, Leadership, LossReason, TermEndCause,
    leadership::{Interruption, TermWaitError},
};
use plexsphere_leader_tests::{FaultProxy, Mode, TestDb, pool_for};
use support::{I, Logs, MARGIN, Replica, STARTUP, lock_holders};
use tokio::sync::watch;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// Waits until the published leadership satisfies `done`, at most `within`.
async fn published(
    leadership: &mut watch::Receiver<Leadership>,
    within: Duration,
    done: impl FnMut(&Leadership) -> bool,
) -> Leadership {
    *timeout(within, leadership.wait_for(done))
        .await
        .expect("the change is published in time")
        .expect("the elector lives")
}

async fn first_term(elector: &Elector) -> plexsphere_leader::Term {
    timeout(STARTUP, elector.next_term(&CancellationToken::new()))
        .await
        .expect("a term begins")
        .expect("the wait is not cancelled")
}

#[tokio::test]
async fn a_terminated_backend_ends_the_awaited_term_as_session_ended() {
    let db = TestDb::create("events_terminate").await.unwrap();
    let replica = Replica::spawn(db.pool(2).unwrap(), I);
    let mut leadership = replica.elector.subscribe();
    let term = first_term(&replica.elector).await;
    assert_eq!(
        replica.elector.leadership().term().map(|t| t.id),
        Some(term.id())
    );

    assert!(db.terminate(lock_holders(&db).await[0]).await.unwrap());
    let why = timeout(2 * I + MARGIN, term.ended())
        .await
        .expect("the term ends within two intervals");
    assert_eq!(why, TermEndCause::Lost(LossReason::SessionEnded));
    let now = published(&mut leadership, MARGIN, |l| l.last_end().is_some()).await;
    let end = now.last_end().unwrap();
    assert_eq!((end.id, end.cause), (term.id(), why));
    assert_eq!(
        term.cause(),
        Some(Interruption::Term(TermEndCause::Lost(
            LossReason::SessionEnded
        )))
    );
    drop(term);

    // It leads again in a newer term, which the same receiver sees.
    let again = published(&mut leadership, STARTUP, Leadership::is_leader).await;
    assert!(again.term().unwrap().id > end.id);
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

/// A pool built with deadpool's own connector (not `ObservedConnect`): the elector cannot await
/// the connection's end and falls back to watching the client's closed flag; the cause is the
/// same.
#[tokio::test]
async fn with_deadpools_default_connector_a_terminated_backend_still_ends_the_term() {
    let db = TestDb::create("events_terminate_plain").await.unwrap();
    let manager = deadpool_postgres::Manager::from_config(
        db.config(),
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig::default(),
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .unwrap();
    let replica = Replica::spawn(pool, I);
    let term = first_term(&replica.elector).await;
    assert!(db.terminate(lock_holders(&db).await[0]).await.unwrap());
    let why = timeout(2 * I + MARGIN, term.ended()).await.unwrap();
    assert_eq!(why, TermEndCause::Lost(LossReason::SessionEnded));
    drop(term);
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn an_unanswered_check_ends_the_awaited_term_as_check_timed_out() {
    let db = TestDb::create("events_blackhole").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let pool = pool_for(proxy.pg_config(&db.config()), 2).unwrap();
    let replica = Replica::spawn(pool, I);
    let term = first_term(&replica.elector).await;

    proxy.set_both(Mode::Blackhole);
    let why = timeout(2 * I + MARGIN, term.ended())
        .await
        .expect("the check goes unanswered for one interval");
    assert_eq!(why, TermEndCause::Lost(LossReason::CheckTimedOut));
    assert_eq!(
        replica.elector.leadership().last_end().map(|end| end.cause),
        Some(why)
    );
    proxy.set_both(Mode::Forward);
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_resign_ends_the_awaited_term_as_resigned_and_the_standby_awaits_its_own() {
    let db = TestDb::create("events_resign").await.unwrap();
    let leader = Replica::spawn(db.pool(2).unwrap(), I);
    let term = first_term(&leader.elector).await;
    let standby = Replica::spawn(db.pool(2).unwrap(), I);
    let mut standby_leadership = standby.elector.subscribe();
    assert!(!standby_leadership.borrow().is_leader());

    leader.elector.resign();
    let why = timeout(MARGIN, term.ended())
        .await
        .expect("the resign ends the term");
    assert_eq!(why, TermEndCause::Resigned);
    drop(term);
    let taken = timeout(
        I + MARGIN,
        standby.elector.next_term(&CancellationToken::new()),
    )
    .await
    .expect("the standby leads within an interval of the release")
    .unwrap();
    let seen = published(&mut standby_leadership, MARGIN, Leadership::is_leader).await;
    assert_eq!(seen.term().map(|t| t.id), Some(taken.id()));
    assert!(seen.last_end().is_none(), "the standby never led before");
    drop(taken);
    standby.stop().await.unwrap();
    leader.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_parent_cancelled_before_the_stop_stays_the_cause_and_nothing_is_logged() {
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create("events_first_cause").await.unwrap();
    let replica = Replica::spawn(db.pool(2).unwrap(), I);
    let parent = CancellationToken::new();
    let term = timeout(STARTUP, replica.elector.next_term(&parent))
        .await
        .unwrap()
        .unwrap();

    // Work that sees its parent cancelled, then the election stop under it.
    let elector = replica.elector.clone();
    let work_parent = parent.clone();
    let stop = replica.shutdown.clone();
    let outcome = replica
        .elector
        .run_if_leader(&parent, |token| async move {
            work_parent.cancel();
            token.cancelled().await;
            stop.cancel();
            let mut leadership = elector.subscribe();
            let _ = leadership.wait_for(|l| l.last_end().is_some()).await;
            Err::<(), _>("stopped under the work")
        })
        .await;
    assert_eq!(outcome, Ok(false), "the term ended while the work ran");
    assert_eq!(term.cause(), Some(Interruption::ParentCancelled));
    assert_eq!(term.ended().await, TermEndCause::Stopped);
    assert!(
        !logs.contains("INFO", "leader: leadership ended while background work ran"),
        "{:?}",
        logs.lines()
    );
    drop(term);
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn waiting_for_a_term_ends_when_the_parent_is_cancelled() {
    let db = TestDb::create("events_wait_cancelled").await.unwrap();
    let leader = Replica::spawn(db.pool(2).unwrap(), I);
    let held = first_term(&leader.elector).await;
    let standby = Replica::spawn(db.pool(2).unwrap(), I);
    let parent = CancellationToken::new();
    let waiting = tokio::spawn({
        let (elector, parent) = (standby.elector.clone(), parent.clone());
        async move { elector.next_term(&parent).await.map(|term| term.id()) }
    });
    tokio::time::sleep(3 * I).await;
    assert!(
        !waiting.is_finished(),
        "no term while the other replica leads"
    );
    parent.cancel();
    assert_eq!(
        timeout(MARGIN, waiting).await.unwrap().unwrap(),
        Err(TermWaitError::Cancelled)
    );
    drop(held);
    standby.stop().await.unwrap();
    leader.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

/// Captures the `fmt` output of the election's log lines, span context included.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn two_elections_in_one_process_log_under_their_own_key_identity_and_database() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer({
            let captured = captured.clone();
            move || captured.clone()
        })
        .finish();
    let _guard = support::scoped_subscriber(subscriber);
    let db = TestDb::create("events_two_spans").await.unwrap();
    let shards = [1, 2].map(|shard| {
        let key = plexsphere_leader::LockKey::new(7, shard);
        let identity = format!("shard-{shard}@test");
        Replica::spawn_with(db.pool(2).unwrap(), I, |config| {
            config.key(key).identity(identity)
        })
    });
    for shard in &shards {
        first_term(&shard.elector).await;
    }
    for shard in shards {
        shard.stop().await.unwrap();
    }
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    for (key, identity) in [("7:1", "shard-1@test"), ("7:2", "shard-2@test")] {
        let span = format!(
            "election{{key={key} identity={identity} pid={}}}",
            std::process::id()
        );
        // The database comes from the server (the grant's current_database()), so replicas
        // pointed at different databases show it at once.
        let database = format!("database={}", db.name());
        for message in [
            "acquired background leader lock",
            "released background leader lock",
        ] {
            assert!(
                text.lines().any(|line| line.contains(&span)
                    && line.contains(message)
                    && line.contains(&database)),
                "no {message:?} line under {span} naming {database}:\n{text}"
            );
        }
    }
    db.cleanup().await.unwrap();
}
