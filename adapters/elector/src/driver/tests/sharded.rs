//! The driver running sharded leadership against the in-memory server, under paused time: the
//! same loop as the single election's, with the sharded mode's statements.

use std::time::Duration;

use plexsphere_leader_core::{LossReason, TermEndCause, UNLOCK_BUDGET};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::I;
use super::fake::{Fake, Fault, Kind};
use crate::RunError;
use crate::leadership::Resignation;
use crate::sharded::{ShardConfig, ShardedElector};

const SHARDS: u32 = 4;

struct Running {
    elector: ShardedElector,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), RunError>>,
}

fn run(fake: &Fake) -> Running {
    run_with(fake, |config| config)
}

fn run_with(fake: &Fake, configure: impl FnOnce(ShardConfig) -> ShardConfig) -> Running {
    let config = configure(ShardConfig::with_sessions(fake.clone(), SHARDS).check_interval(I));
    let elector = ShardedElector::new(config).unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    Running {
        elector,
        shutdown,
        task,
    }
}

impl Running {
    /// Waits (at most `within` of virtual time) until this replica owns `count` shards.
    async fn owning(&self, count: usize, within: Duration) {
        let mut ownership = self.elector.subscribe();
        timeout(within, ownership.wait_for(|o| o.count() == count))
            .await
            .unwrap_or_else(|_| panic!("not owning {count} shards within {within:?}"))
            .unwrap();
    }

    /// A unit of work on every owned shard that returns as its term ends, with the cause.
    fn work(&self) -> Vec<tokio::task::JoinHandle<TermEndCause>> {
        let parent = CancellationToken::new();
        (0..SHARDS)
            .filter_map(|shard| self.elector.term(shard, &parent))
            .map(|term| tokio::spawn(async move { term.ended().await }))
            .collect()
    }

    /// Stops the run and returns how long (virtual time) it took to return.
    async fn stop(self) -> Duration {
        let asked = Instant::now();
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        asked.elapsed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_replica_takes_every_shard_and_its_stop_releases_them_all() {
    let fake = Fake::default();
    let running = run(&fake);
    running.owning(SHARDS as usize, 3 * I).await;
    assert_eq!(fake.lock().shards.len(), SHARDS as usize);
    let work = running.work();
    let took = running.stop().await;
    assert!(
        took < I / 10,
        "a stop whose work returns at once took {took:?}"
    );
    for work in work {
        assert_eq!(work.await.unwrap(), TermEndCause::Stopped);
    }
    let server = fake.lock();
    assert!(server.shards.is_empty() && server.members.is_empty());
    assert_eq!(server.closed, 1, "the lock session is closed, never pooled");
}

#[tokio::test(start_paused = true)]
async fn a_survey_that_never_answers_ends_every_shard_term_within_two_intervals() {
    let fake = Fake::default();
    let running = run(&fake);
    running.owning(SHARDS as usize, 3 * I).await;
    let work = running.work();
    fake.fault(Kind::Survey, Fault::Hang);
    let hung = Instant::now();
    for work in work {
        let why = timeout(3 * I, work).await.unwrap().unwrap();
        assert_eq!(why, TermEndCause::Lost(LossReason::CheckTimedOut));
    }
    assert!(hung.elapsed() <= 2 * I, "{:?}", hung.elapsed());
    assert!(fake.lock().shards.is_empty(), "the session is closed");
    fake.heal(Kind::Survey);
    running.owning(SHARDS as usize, 3 * I).await;
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_end_of_the_lock_session_ends_every_shard_term_at_once() {
    let fake = Fake::default();
    let running = run(&fake);
    running.owning(SHARDS as usize, 3 * I).await;
    let work = running.work();
    let session = *fake.lock().members.first().unwrap();
    fake.terminate(session);
    let ended = Instant::now();
    for work in work {
        let why = timeout(I / 10, work).await.unwrap().unwrap();
        assert_eq!(why, TermEndCause::Lost(LossReason::SessionEnded));
    }
    assert!(ended.elapsed() < I / 10);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_resign_releases_every_shard_and_rejoins_after_the_hold_off() {
    let fake = Fake::default();
    let running = run(&fake);
    running.owning(SHARDS as usize, 3 * I).await;
    let work = running.work();
    let hold_off = 5 * I;
    assert_eq!(running.elector.resign_for(hold_off), Resignation::Requested);
    let asked = Instant::now();
    running.owning(0, I).await;
    for work in work {
        assert_eq!(work.await.unwrap(), TermEndCause::Resigned);
    }
    tokio::time::sleep(I / 10).await;
    {
        let server = fake.lock();
        assert!(server.shards.is_empty() && server.members.is_empty());
        assert_eq!(server.closed, 1);
    }
    running.owning(SHARDS as usize, hold_off + 3 * I).await;
    assert!(
        asked.elapsed() >= hold_off,
        "rejoined after {:?}",
        asked.elapsed()
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_ineligible_replica_takes_no_shard_until_made_eligible() {
    let fake = Fake::default();
    let config = ShardConfig::with_sessions(fake.clone(), SHARDS).check_interval(I);
    let elector = ShardedElector::new(config).unwrap();
    elector.set_eligible(false);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    let running = Running {
        elector,
        shutdown,
        task,
    };
    tokio::time::sleep(10 * I).await;
    {
        let server = fake.lock();
        assert_eq!(server.count(Kind::Take), 0, "{:?}", server.log);
        assert!(server.members.is_empty(), "no member lock either");
    }
    assert!(!running.elector.is_eligible());
    running.elector.set_eligible(true);
    running.owning(SHARDS as usize, 3 * I).await;
    assert!(running.elector.is_eligible());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stop_whose_unlock_never_answers_closes_after_the_unlock_budget() {
    let fake = Fake::default();
    let running = run(&fake);
    running.owning(SHARDS as usize, 3 * I).await;
    fake.fault(Kind::UnlockShards, Fault::Hang);
    fake.fault(Kind::UnlockAll, Fault::Hang);
    let took = running.stop().await;
    assert!(took >= UNLOCK_BUDGET, "closed before the budget: {took:?}");
    assert!(took <= UNLOCK_BUDGET + I, "{took:?}");
    let server = fake.lock();
    assert!(
        server.shards.is_empty(),
        "closing the session released them"
    );
    assert_eq!(server.closed, 1);
}

#[tokio::test(start_paused = true)]
async fn shard_work_past_its_deadline_after_a_loss_is_aborted_at_the_deadline() {
    let fake = Fake::default();
    let deadline = 3 * I;
    #[cfg(feature = "prometheus")]
    let registry = prometheus::Registry::new();
    let running = run_with(&fake, |c| {
        let c = c.work_deadline(deadline, crate::config::OnOverdue::Abort);
        #[cfg(feature = "prometheus")]
        let c = c.registry(&registry);
        c
    });
    running.owning(SHARDS as usize, 3 * I).await;
    let work = tokio::spawn({
        let elector = running.elector.clone();
        async move {
            let ran = elector
                .run_if_owner(0, &CancellationToken::new(), |_ignored| {
                    std::future::pending::<Result<(), RunError>>()
                })
                .await;
            (ran, Instant::now())
        }
    });
    tokio::task::yield_now().await;
    let session = *fake.lock().members.first().unwrap();
    let lost = Instant::now();
    fake.terminate(session);
    let (ran, returned) = timeout(10 * I, work).await.unwrap().unwrap();
    assert!(!ran.unwrap(), "aborted work is no failure");
    assert_eq!(returned - lost, deadline, "dropped exactly at the deadline");
    running.stop().await;
    #[cfg(feature = "prometheus")]
    {
        let overdue = |action: &str| {
            registry
                .gather()
                .iter()
                .filter(|family| family.name() == "plexsphere_shards_overdue_work_total")
                .flat_map(|family| family.get_metric().iter())
                .find(|metric| {
                    metric
                        .get_label()
                        .iter()
                        .any(|label| label.name() == "action" && label.value() == action)
                })
                .map(|metric| metric.get_counter().get_value())
        };
        assert_eq!(overdue("aborted"), Some(1.0), "the abort is counted");
        assert_eq!(
            overdue("reported"),
            Some(0.0),
            "the series exists from the start"
        );
    }
}
