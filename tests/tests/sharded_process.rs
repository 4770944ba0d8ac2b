//! Sharded leadership with replicas as separate OS processes (`bench replica --shards K`, see
//! `plexsphere_leader_tests::replica_child`), each test on its own database of the shared local
//! server. Every replica prints each shard term's begin and end with a `CLOCK_MONOTONIC` stamp;
//! the merged records say who believed it owned which shard when.
//!
//! I = 200 ms, K = 32 shards over 4 replicas. Bounds come from the sharded election's design
//! (a dead member's shards are taken at the survivors' next survey; a cut-off member's session
//! ends by its `idle_session_timeout` of 4·I, and the member itself gives up its shards when a
//! survey goes unanswered for an interval) and are asserted as `bound + MARGIN` (5 s,
//! `support::MARGIN`). Lower bounds are asserted only where nothing but the server's timeout can
//! free a lock. Balance after a change is waited for with the start-up allowance (`STARTUP`),
//! not asserted as a bound. Each test prints what it measured.
//!
//! | scenario | expected outcome (bound) |
//! |----------|--------------------------|
//! | SIGKILL of a replica process | the kernel closes its socket; every one of its shards has a new owner within I; never two believed owners of a shard |
//! | graceful stop (SIGTERM) | its terms end `Stopped` before the unlock; every shard re-owned within I; never two believed owners |
//! | cut off without FIN/RST (blackhole), kept alive | it stops believing it owns its shards within 2·I; the server ends its session by the idle timeout (a FATAL session end, not before 2·I); the others own its shards within 4·I + I; two believed owners of a shard at most within the detection bound; after the heal it rejoins and the space rebalances |
//! | cut off, then SIGKILL (silent death) | the idle timeout ends the orphan session; the others own its shards within 4·I + I, not before 2·I; never two believed owners |
//!
//! Every test ends with each replica stopping gracefully (`run` returns `Ok`) and no lock of
//! the space left on the server.

mod fault_support;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use fault_support::{CLEAN_TIMEOUT, I, MARGIN, STARTUP, assert_within};
use plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
use plexsphere_leader_tests::replica_process::dsn;
use plexsphere_leader_tests::replica_process::shards as fleet;
use plexsphere_leader_tests::{
    ChildArgs, FaultProxy, Launcher, Mechanism, Mode, ReplicaProcess, TestDb,
};
use tokio::time::Instant;
use tokio_postgres::Config;

/// Shards of the space.
const K: u32 = 32;
/// Replica processes of each test.
const R: usize = 4;

fn launcher() -> Launcher {
    Launcher::with_prefix(env!("CARGO_BIN_EXE_bench"), &["replica"])
}

/// The replica processes of one test.
struct Space {
    processes: Vec<ReplicaProcess>,
}

impl Space {
    /// Starts replica `plx-shard-<test>-<i>` on each config, in order.
    async fn start(test: &str, configs: &[Config]) -> Self {
        let launcher = launcher();
        let mut processes = Vec::new();
        for (i, config) in configs.iter().enumerate() {
            let args = ChildArgs::sharded(format!("plx-shard-{test}-{i}"), dsn(config), I, K);
            processes.push(launcher.spawn(args).await.expect("replica process starts"));
        }
        Self { processes }
    }

    fn live(&self) -> Vec<String> {
        self.processes
            .iter()
            .filter(|p| !p.exited())
            .map(|p| p.name().to_owned())
            .collect()
    }

    fn events(&self) -> Vec<fleet::ShardEvent> {
        let refs: Vec<&ReplicaProcess> = self.processes.iter().collect();
        fleet::shard_events(&refs)
    }

    fn is_balanced(&self) -> bool {
        let owned = fleet::owned_at(&self.events(), Instant::now());
        fleet::balanced(&owned, &self.live(), K)
    }

    /// Waits (up to `timeout`) until the live replicas' ownership is balanced.
    async fn wait_balanced(&self, timeout: Duration) {
        let balanced = support::wait_for(timeout, || self.is_balanced()).await;
        assert!(
            balanced.is_some(),
            "not balanced within {timeout:?}: {:?}",
            fleet::owned_at(&self.events(), Instant::now())
                .iter()
                .map(|(name, shards)| (name.clone(), shards.len()))
                .collect::<Vec<_>>()
        );
    }

    /// Waits until every shard of `lost` began a term on a live replica at or after `since`;
    /// returns the last of those first begins.
    async fn wait_reowned(
        &self,
        lost: &BTreeSet<u32>,
        since: Instant,
        timeout: Duration,
    ) -> Instant {
        let mut last = None;
        let found = support::wait_for(timeout, || {
            let live = self.live();
            let mut first = std::collections::BTreeMap::new();
            for e in self.events() {
                if e.began && e.at >= since && lost.contains(&e.shard) && live.contains(&e.replica)
                {
                    first.entry(e.shard).or_insert(e.at);
                }
            }
            last = first.values().max().copied();
            first.len() == lost.len()
        })
        .await;
        assert!(
            found.is_some(),
            "not every shard of {lost:?} re-owned within {timeout:?}: {:?}",
            fleet::owned_at(&self.events(), Instant::now())
        );
        last.unwrap_or(since)
    }

    /// The longest span two replicas believed they owned one shard, over the whole test.
    fn max_overlap(&self) -> Option<(Duration, u32)> {
        fleet::max_shard_overlap(&self.events(), Instant::now())
    }

    /// Stops every live replica gracefully (each `run` returns `Ok`), then waits until no lock
    /// of the space is left on the server.
    async fn finish(mut self, db: &TestDb) {
        for p in &mut self.processes {
            if p.exited() {
                continue;
            }
            let run = p.stop().await.expect("replica stops").run_error;
            assert_eq!(run, None, "{}: run returned an error", p.name());
        }
        let clean = support::wait_for_async(CLEAN_TIMEOUT, || async {
            fleet::owners(db.admin(), Mechanism::Advisory, DEFAULT_SHARD_CLASS, K)
                .await
                .expect("owners query")
                .is_empty()
        })
        .await;
        assert!(clean.is_some(), "locks of the space left on the server");
    }
}

/// The shards the server shows held by members of the space, and how many members it shows.
async fn server_view(db: &TestDb) -> (BTreeSet<u32>, usize) {
    let rows = fleet::owners(db.admin(), Mechanism::Advisory, DEFAULT_SHARD_CLASS, K)
        .await
        .expect("owners query");
    let held = rows
        .iter()
        .filter(|row| row.member)
        .flat_map(|row| row.shards.iter().map(|s| s.get()))
        .collect();
    (held, rows.iter().filter(|row| row.member).count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_sharded_replica_process_hands_every_shard_over_within_one_interval() {
    let db = TestDb::create("shardp_sigkill").await.unwrap();
    let mut space = Space::start("k", &vec![db.config(); R]).await;
    space.wait_balanced(STARTUP).await;

    let lost = space.processes[0].owned();
    let killed = space.processes[0].kill().await.unwrap();
    let last = space.wait_reowned(&lost, killed, I + MARGIN).await;
    assert_within(
        &format!("all {} shards of the killed replica re-owned", lost.len()),
        last - killed,
        I + MARGIN,
    );
    space.wait_balanced(STARTUP).await;
    assert_eq!(space.max_overlap(), None, "two believed owners of a shard");
    let (held, members) = server_view(&db).await;
    assert_eq!(members, R - 1, "the dead member's session is gone");
    assert_eq!(held.len(), K as usize, "every shard held by a live member");

    space.finish(&db).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_of_a_sharded_replica_process_hands_over_without_two_owners() {
    let db = TestDb::create("shardp_sigterm").await.unwrap();
    let mut space = Space::start("t", &vec![db.config(); R]).await;
    space.wait_balanced(STARTUP).await;

    let lost = space.processes[0].owned();
    let stop = Instant::now();
    let run = space.processes[0].stop().await.unwrap().run_error;
    assert_eq!(run, None);
    let ends = space.processes[0].events(fleet::END);
    assert!(
        ends.iter().all(|e| e.str("cause") == Some("Stopped")),
        "every term ended Stopped: {ends:?}"
    );
    let last = space.wait_reowned(&lost, stop, I + MARGIN).await;
    assert_within(
        &format!("all {} shards of the stopped replica re-owned", lost.len()),
        last - stop,
        I + MARGIN,
    );
    space.wait_balanced(STARTUP).await;
    assert_eq!(space.max_overlap(), None, "two believed owners of a shard");

    space.finish(&db).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_replica_stops_believing_and_the_idle_timeout_frees_its_shards_for_the_others() {
    let db = TestDb::create("shardp_partition").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let mut configs = vec![proxy.pg_config(&db.config())];
    configs.extend(vec![db.config(); R - 1]);
    let space = Space::start("p", &configs).await;
    space.wait_balanced(STARTUP).await;
    // The victim surveyed through the proxy at least once more.
    tokio::time::sleep(I + I / 2).await;
    let fatal_before = fault_support::sessions_fatal(db.admin()).await;

    let lost = space.processes[0].owned();
    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();
    // The victim lives on: its unanswered survey ends every one of its terms.
    let demoted = support::wait_for(2 * I + MARGIN, || space.processes[0].owned().is_empty())
        .await
        .is_some();
    assert!(demoted, "the cut-off replica still believes it owns shards");
    let ends: Vec<_> = space.processes[0]
        .events(fleet::END)
        .into_iter()
        .filter(|e| e.at >= cut)
        .collect();
    let believed_until = ends.iter().map(|e| e.at).max().unwrap_or(cut);
    assert_within(
        "the cut-off replica stops believing it owns its shards",
        believed_until - cut,
        2 * I + MARGIN,
    );
    assert!(
        ends.iter()
            .all(|e| e.str("cause").is_some_and(|c| c.starts_with("Lost"))),
        "every term ended as lost: {ends:?}"
    );

    let others: Vec<String> = space.live()[1..].to_vec();
    let last = wait_owned_by(&space, &lost, &others, cut, 5 * I + MARGIN).await;
    assert_within(
        &format!(
            "all {} shards of the cut-off replica owned by the others",
            lost.len()
        ),
        last - cut,
        5 * I + MARGIN,
    );
    assert!(
        last - cut >= 2 * I,
        "the orphan session cannot end before its idle timeout: {:?}",
        last - cut
    );
    assert_eq!(
        fault_support::wait_sessions_fatal(db.admin(), fatal_before + 1, MARGIN).await,
        fatal_before + 1,
        "the orphan session ended by idle_session_timeout (a FATAL session end)"
    );
    let overlap = space.max_overlap();
    println!("two believed owners of one shard, longest: {overlap:?}");
    assert!(
        overlap.is_none_or(|(d, _)| d <= 2 * I + MARGIN),
        "an overlap beyond the detection bound: {overlap:?}"
    );

    // Healed, the replica joins again and the space rebalances over all four.
    proxy.set_both(Mode::Forward);
    space.wait_balanced(STARTUP).await;
    space.finish(&db).await;
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_death_of_a_sharded_replica_process_is_bounded_by_the_idle_timeout() {
    let db = TestDb::create("shardp_silent").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let mut configs = vec![proxy.pg_config(&db.config())];
    configs.extend(vec![db.config(); R - 1]);
    let mut space = Space::start("s", &configs).await;
    space.wait_balanced(STARTUP).await;
    tokio::time::sleep(I + I / 2).await;
    let fatal_before = fault_support::sessions_fatal(db.admin()).await;

    let lost = space.processes[0].owned();
    // A power loss: nothing reaches the server any more, not even the FIN of the kill.
    proxy.set_both(Mode::Blackhole);
    let cut = space.processes[0].kill().await.unwrap();
    let last = space.wait_reowned(&lost, cut, 5 * I + MARGIN).await;
    assert_within(
        &format!("all {} shards of the dead replica re-owned", lost.len()),
        last - cut,
        5 * I + MARGIN,
    );
    assert!(
        last - cut >= 2 * I,
        "the orphan session cannot end before its idle timeout: {:?}",
        last - cut
    );
    assert_eq!(
        fault_support::wait_sessions_fatal(db.admin(), fatal_before + 1, MARGIN).await,
        fatal_before + 1,
        "the orphan session ended by idle_session_timeout (a FATAL session end)"
    );
    space.wait_balanced(STARTUP).await;
    assert_eq!(space.max_overlap(), None, "two believed owners of a shard");

    proxy.set_both(Mode::Forward);
    space.finish(&db).await;
    db.cleanup().await.unwrap();
}

/// Waits until every shard of `lost` is owned by one of `owners`, by their records; returns the
/// last begin among them at or after `since`.
async fn wait_owned_by(
    space: &Space,
    lost: &BTreeSet<u32>,
    owners: &[String],
    since: Instant,
    timeout: Duration,
) -> Instant {
    let done = support::wait_for(timeout, || {
        let owned = fleet::owned_at(&space.events(), Instant::now());
        lost.iter().all(|s| {
            owners
                .iter()
                .any(|o| owned.get(o).is_some_and(|shards| shards.contains(s)))
        })
    })
    .await;
    assert!(
        done.is_some(),
        "the others do not own every shard of {lost:?} within {timeout:?}"
    );
    space
        .events()
        .iter()
        .filter(|e| {
            e.began && e.at >= since && lost.contains(&e.shard) && owners.contains(&e.replica)
        })
        .map(|e| e.at)
        .max()
        .unwrap_or(since)
}
