//! Fault injection on the server itself, each test on its own throwaway cluster (`Cluster`):
//! restarts, a failover to a promoted standby, `max_connections` exhausted, and a crash right
//! after the writes a leader trusts. Replicas are OS processes (`plx-replica`), I = 200 ms,
//! bounds asserted as `bound + MARGIN` (5 s).
//!
//! | scenario | expected outcome (bound) |
//! |----------|--------------------------|
//! | restart `-m fast` | every session ends with 57P01: the leader demotes at its next check (within 2·I); one leader within I of the server being back; overlap ≤ 2·I |
//! | restart `-m immediate` | the same after a crash and crash recovery |
//! | failover to a promoted standby, the old primary cut off silently | the leader's `SELECT 1` goes unanswered: it demotes within 2·I; one leader on the new primary within I of the promotion; the old primary frees its orphan within 4·I |
//! | `max_connections` exhausted (53300) | the standby's connect is refused, retried and logged once per interval; it leads once a slot is free |
//! | `-m immediate` right after a fencing epoch's advance and a lease's renewal, `synchronous_commit = off` | every epoch and the renewal are still there after crash recovery |
//!
//! Every test ends with `Fleet::finish`: pools intact, no replica session and no lock left.

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{Fleet, I, MARGIN, STARTUP, assert_within, sleep_until};
use plexsphere_leader_tests::{
    Backend, Cluster, FaultProxy, HarnessError, LockObserver, Mode, StopMode,
};
use support::row;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

const ACQUIRE_WARN: &str = "leader: acquire lock connection";

async fn restart_hands_over(mode: StopMode, backend: Backend) {
    let cluster = Cluster::start().await.expect("a throwaway cluster");
    let config = cluster.config("postgres");
    let observer = LockObserver::start(&config).await.expect("observer");
    let mut fleet = Fleet::new();
    let a = fleet.spawn_on(backend, "a", &config, I).await;
    fleet.wait_lead(a, STARTUP).await;
    let _b = fleet.spawn_on(backend, "b", &config, I).await;
    tokio::time::sleep(2 * I).await;

    let cut = Instant::now();
    cluster.restart(mode).await.expect("restart");
    let back = Instant::now();
    println!("{mode:?} restart took {:?}", back - cut);
    let (follow_a, cause) = fleet
        .wait_follow_since(a, cut, (back - cut) + 2 * I + MARGIN)
        .await;
    assert_eq!(cause, "Lost(SessionEnded)");
    assert_within(
        "detection of the restart",
        follow_a - cut,
        (back - cut) + 2 * I + MARGIN,
    );
    let leader = fleet.sole_leader(I + MARGIN).await;
    let lead = fleet.get(leader).terms().last().expect("a term").at;
    assert!(lead >= cut);
    assert_within(
        "a leader after the server is back",
        lead.saturating_duration_since(back),
        I + MARGIN,
    );
    assert_within("overlap (bound 2·I)", fleet.max_overlap(), 2 * I + MARGIN);
    for _ in 0..6 {
        tokio::time::sleep(I / 2).await;
        assert_eq!(fleet.leaders(), vec![leader]);
    }
    assert_eq!(observer.max_granted(), 1);
    assert!(observer.reconnects() >= 1, "the observer saw the restart");

    let admin = cluster.connect("postgres").await.expect("admin");
    fleet.finish(&admin).await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_fast_restart_demotes_the_leader_and_one_replica_leads_when_the_server_is_back
);
async fn a_fast_restart_demotes_the_leader_and_one_replica_leads_when_the_server_is_back(
    backend: Backend,
) {
    restart_hands_over(StopMode::Fast, backend).await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    an_immediate_restart_demotes_the_leader_and_one_replica_leads_after_recovery
);
async fn an_immediate_restart_demotes_the_leader_and_one_replica_leads_after_recovery(
    backend: Backend,
) {
    restart_hands_over(StopMode::Immediate, backend).await;
}

/// Deadpool only: the replicas follow the primary through a DSN listing both servers with
/// `target_session_attrs=read-write`, which sqlx's connect options do not take.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_promoted_standby_moves_leadership_to_the_new_primary() {
    let primary = Cluster::start().await.unwrap();
    let standby = Cluster::start_standby_of(&primary).await.unwrap();
    let proxy = FaultProxy::in_front_of(&primary.config("postgres"))
        .await
        .unwrap();
    // Both servers, first the one that accepts writes: the replicas follow the primary.
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write connect_timeout=2",
        proxy.addr().port(),
        standby.port()
    );
    let old_observer = LockObserver::start(&primary.config("postgres"))
        .await
        .unwrap();
    let new_observer = LockObserver::start(&standby.config("postgres"))
        .await
        .unwrap();
    let mut fleet = Fleet::new();
    let a = fleet.spawn_dsn("a", dsn.clone(), I, 2).await;
    fleet.wait_lead(a, STARTUP).await;
    let _b = fleet.spawn_dsn("b", dsn, I, 2).await;
    let orphan = old_observer
        .wait_for_holder(MARGIN)
        .await
        .expect("a holds on the primary");
    tokio::time::sleep(2 * I).await;
    assert!(new_observer.current().is_none());

    // The primary is cut off without a word (existing connections silent, new ones refused),
    // and the standby is promoted.
    proxy.set_refuse_new(true);
    proxy.set_both(Mode::Blackhole);
    let cut = Instant::now();
    standby.promote().await.unwrap();
    let promoted = Instant::now();
    println!("promotion took {:?}", promoted - cut);

    let (follow_a, cause) = fleet.wait_follow_since(a, cut, 2 * I + MARGIN).await;
    assert_eq!(cause, "Lost(CheckTimedOut)");
    assert_within("detection of the failover", follow_a - cut, 2 * I + MARGIN);
    assert!(
        fleet
            .get(a)
            .logs("WARN", "leader: lost background leader lock")
            .iter()
            .any(|r| r
                .str("message")
                .is_some_and(|m| m.contains("no answer within"))),
        "the unanswered SELECT 1 timed out"
    );
    let leader = fleet.sole_leader(I + MARGIN + (promoted - cut)).await;
    let lead = fleet.get(leader).terms().last().expect("a term").at;
    assert!(lead >= cut);
    assert_within(
        "a leader on the new primary after the promotion",
        lead.saturating_duration_since(promoted),
        I + MARGIN,
    );
    let holder = new_observer
        .wait_for_holder(MARGIN)
        .await
        .expect("the lock is held on the new primary");
    assert_eq!(
        holder.application_name.as_deref(),
        Some(fleet.get(leader).name())
    );
    assert_within("overlap (bound 2·I)", fleet.max_overlap(), 2 * I + MARGIN);
    // The old primary, still up behind the partition, ends the orphan by its idle timeout:
    // within 4·I of the orphan's last query, which came before the cut.
    let left = (cut + 4 * I + MARGIN).saturating_duration_since(Instant::now());
    assert!(
        old_observer.wait_for_no_holder(left).await,
        "the orphan on the old primary is freed within 4·I"
    );
    assert_ne!(old_observer.current().map(|h| h.pid), Some(orphan.pid));
    println!(
        "orphan on the old primary freed {:?} after the cut",
        cut.elapsed()
    );

    // Fence the old primary before anything could reach it again.
    primary.stop(StopMode::Immediate).await.unwrap();
    let admin = standby.connect("postgres").await.unwrap();
    fleet.finish(&admin).await;
    drop(proxy);
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    max_connections_exhausted_is_retried_and_warned_once_per_interval
);
async fn max_connections_exhausted_is_retried_and_warned_once_per_interval(backend: Backend) {
    let cluster = Cluster::start().await.expect("a throwaway cluster");
    let config = cluster.config("postgres");
    let admin = cluster.connect("postgres").await.expect("admin");
    let _observer = LockObserver::start(&config).await.expect("observer");
    let mut fleet = Fleet::new();
    let a = fleet.spawn_on(backend, "a", &config, I).await;
    fleet.wait_lead(a, STARTUP).await;

    let mut fillers = Vec::new();
    let mut filler_config = config.clone();
    filler_config.application_name("plx-harness-filler");
    loop {
        match plexsphere_leader_tests::connect(&filler_config).await {
            Ok(client) => fillers.push(client),
            Err(HarnessError::Postgres(e)) if e.code() == Some(&SqlState::TOO_MANY_CONNECTIONS) => {
                break;
            }
            Err(e) => panic!("filler connection: {e}"),
        }
        assert!(fillers.len() < 200, "max_connections never reached");
    }
    println!("{} filler sessions took every free slot", fillers.len());

    let b = fleet.spawn_on(backend, "b", &config, I).await;
    let spawned = Instant::now();
    sleep_until(spawned + 8 * I).await;
    let warns: Vec<_> = fleet.get(b).logs("WARN", ACQUIRE_WARN);
    assert!(
        warns.iter().all(|w| w
            .str("message")
            .is_some_and(|m| m.contains("too many clients"))),
        "{warns:?}"
    );
    let stamps: Vec<Instant> = warns.iter().map(|w| w.at).collect();
    assert!(
        (4..=10).contains(&stamps.len()),
        "one WARN per interval over 8 intervals: {}",
        stamps.len()
    );
    let shortest = stamps
        .windows(2)
        .map(|w| w[1] - w[0])
        .min()
        .unwrap_or(Duration::MAX);
    assert!(shortest >= I / 2, "no burst of retries: {shortest:?}");
    assert!(!fleet.get(b).is_leader());
    assert_eq!(
        fleet.leaders(),
        vec![a],
        "the leader's own session is unaffected"
    );

    // Two slots free up: b connects at its next check (a standby), then leads after a stops.
    fillers.truncate(fillers.len() - 2);
    let freed = Instant::now();
    tokio::time::sleep(I + I / 2).await;
    let warned_after = fleet
        .get(b)
        .logs("WARN", ACQUIRE_WARN)
        .iter()
        .filter(|w| w.at > freed + I)
        .count();
    assert_eq!(warned_after, 0, "b connected once a slot was free");
    fleet.get_mut(a).stop().await.expect("a stops");
    let stopped = Instant::now();
    let lead_b = fleet.wait_lead_since(b, stopped, I + MARGIN).await;
    assert_within("b leads after the handover", lead_b - stopped, I + MARGIN);

    drop(fillers);
    fleet.finish(&admin).await;
}

/// The statements whose commit a leader trusts, a fencing epoch's advance (single and sharded)
/// and a lease's claim and renewal, survive a crash of a server that runs
/// `synchronous_commit = off` (the test clusters do, and so does many a tuned production
/// server): each begins with `SET LOCAL synchronous_commit = on` (`sql::DURABLE_COMMIT`), so
/// its commit waits for the WAL write. Without it the commit record stays in the WAL buffers
/// until the WAL writer's next round, which this test puts 10 s away, and the crash right after
/// the answer takes it: the next leader would get the same epoch again, or a lease that the
/// leader still trusts would be claimable. Each write meets a crash of its own: a durable
/// commit flushes the WAL before it too, so a later one would hide an earlier one's loss.
#[tokio::test]
async fn the_writes_a_leader_trusts_survive_a_crash_of_a_server_with_synchronous_commit_off() {
    use plexsphere_leader::shard_sql;
    use plexsphere_leader::sharded::Shard;
    use plexsphere_leader::sql::{self, lease};

    const KEY: plexsphere_leader::LockKey = plexsphere_leader::LockKey::DEFAULT;
    const CLASS: i32 = 42;
    const LEASE: plexsphere_leader::LockKey = plexsphere_leader::LockKey::new(7, 7);
    let epoch_of = |class: i32, obj: i32| {
        format!(
            "SELECT epoch FROM plexsphere_leader_fence WHERE classid = {class} AND objid = {obj}"
        )
    };
    let renewed = "SELECT (expires_at > now() + interval '300 s')::text \
                   FROM plexsphere_leader_lease WHERE classid = 7 AND objid = 7 AND holder = 'a 1'";
    let cluster = Cluster::start().await.expect("a throwaway cluster");
    let client = cluster.connect("postgres").await.unwrap();
    client
        .batch_execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        .await
        .unwrap();
    client
        .batch_execute("ALTER SYSTEM SET synchronous_commit = off")
        .await
        .unwrap();
    client
        .batch_execute(&lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA))
        .await
        .unwrap();
    // The tables on disk; the restart applies the settings.
    client.batch_execute("CHECKPOINT").await.unwrap();
    let mut client = crash(&cluster, client).await;

    let advanced = row(&client, &sql::advance_epoch_within(KEY, 1000)).await;
    assert_eq!(advanced[0].as_deref(), Some("1"));
    client = crash(&cluster, client).await;
    assert_eq!(
        row(&client, &epoch_of(KEY.class_id, KEY.obj_id)).await[0].as_deref(),
        Some("1"),
        "the single election's epoch is still there after the crash"
    );

    let shards = [0, 1, 2].map(Shard::new);
    client
        .simple_query(&shard_sql::advance_epochs(CLASS, &shards, 1000))
        .await
        .unwrap();
    client = crash(&cluster, client).await;
    for shard in 0..3 {
        assert_eq!(
            row(&client, &epoch_of(CLASS, shard)).await[0].as_deref(),
            Some("1"),
            "shard {shard}'s epoch is still there after the crash"
        );
    }

    let claimed = row(
        &client,
        &lease::claim(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            LEASE,
            "a 1",
            60_000,
            1000,
        ),
    )
    .await;
    assert_eq!(claimed[0].as_deref(), Some("1"));
    client = crash(&cluster, client).await;
    assert_eq!(
        row(&client, &epoch_of(7, 7)).await[0].as_deref(),
        Some("1"),
        "the claim's epoch is still there after the crash"
    );
    assert_eq!(
        row(
            &client,
            &lease::who_holds(plexsphere_leader::sql::lease::DEFAULT_SCHEMA, LEASE)
        )
        .await[0]
            .as_deref(),
        Some("a 1"),
        "the claim is still there after the crash"
    );

    let renewal = client
        .simple_query(&lease::renew(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            LEASE,
            "a 1",
            600_000,
        ))
        .await
        .unwrap();
    assert!(
        renewal
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))),
        "renewed"
    );
    assert_eq!(row(&client, renewed).await[0].as_deref(), Some("true"));
    client = crash(&cluster, client).await;
    assert_eq!(
        row(&client, renewed).await[0].as_deref(),
        Some("true"),
        "the renewal is still in the lease row after the crash"
    );
}

/// Stops `cluster` with `-m immediate` (a crash: no checkpoint, the WAL buffers lost) and
/// starts it again; a new client of its database `postgres` once it is back.
async fn crash(cluster: &Cluster, client: tokio_postgres::Client) -> tokio_postgres::Client {
    drop(client);
    cluster
        .stop(StopMode::Immediate)
        .await
        .expect("pg_ctl stop -m immediate");
    cluster.start_again().await.expect("crash recovery");
    cluster
        .connect("postgres")
        .await
        .expect("a client after the crash")
}
