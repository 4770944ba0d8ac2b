//! The demo's passes stay correct when two replicas run the same pass at once (the spec's
//! overlap window, and the ungated boot passes): each transition is applied exactly once.
//!
//! The pass code is the demo's own (`adapters/service/examples/demo/passes.rs`, included by path).
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the demo's module; this test uses a part of it"
)]
#[path = "../../adapters/service/examples/demo/passes.rs"]
mod passes;

use std::time::Duration;

use plexsphere_leader_tests::TestDb;
use tokio_postgres::Client;

const LOOP: &str = "invitations-expire";

/// The sweep without its compare-and-set guard: what the test must catch.
const UNGUARDED_SWEEP: &str = "WITH due AS ( \
         SELECT id FROM plexsphere_demo.items \
         WHERE loop_name = $1 AND state = 'pending' AND due_at <= now() ORDER BY due_at LIMIT 100 \
     ), moved AS ( \
         UPDATE plexsphere_demo.items i SET state = 'done', version = i.version + 1, \
             done_at = now(), done_by = $2 \
         FROM due WHERE i.id = due.id RETURNING i.id \
     ) \
     INSERT INTO plexsphere_demo.transitions (item_id, loop_name, actor) SELECT id, $1, $2 FROM moved";

async fn add_due_items(client: &Client, n: i32) {
    client
        .execute(
            "INSERT INTO plexsphere_demo.items (loop_name, due_at) \
             SELECT $1, now() - interval '1 second' FROM generate_series(1, $2)",
            &[&LOOP, &n],
        )
        .await
        .unwrap();
}

/// Items moved more than once, items due but still pending, and all transitions.
async fn damage(client: &Client) -> (i64, i64, i64) {
    let row = client
        .query_one(
            "SELECT \
               (SELECT count(*) FROM (SELECT item_id FROM plexsphere_demo.transitions \
                                      GROUP BY item_id HAVING count(*) > 1) d), \
               (SELECT count(*) FROM plexsphere_demo.items WHERE state = 'pending' AND due_at <= now()), \
               (SELECT count(*) FROM plexsphere_demo.transitions)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Replica A sweeps inside an open transaction; replica B runs `statement` meanwhile and blocks
/// on A's row locks; A commits; B finishes. Returns how many rows each moved.
async fn overlapping_sweeps(db: &TestDb, statement: Option<&'static str>) -> (u64, u64) {
    let mut a = db.connect("replica-a").await.unwrap();
    let mut b = db.connect("replica-b").await.unwrap();
    let tx_a = a.transaction().await.unwrap();
    let moved_a = passes::sweep(&tx_a, LOOP, "replica-a").await.unwrap();
    let b_task = tokio::spawn(async move {
        let tx_b = b.transaction().await.unwrap();
        let moved = match statement {
            None => passes::sweep(&tx_b, LOOP, "replica-b").await.unwrap(),
            Some(sql) => tx_b.execute(sql, &[&LOOP, &"replica-b"]).await.unwrap(),
        };
        tx_b.commit().await.unwrap();
        moved
    });
    // B is really waiting on A's row locks before A commits.
    let waiting = async {
        loop {
            let row = db
                .admin()
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = 'replica-b' \
                       AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap();
            if row.get::<_, i64>(0) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("replica B blocks on replica A's row locks");
    tx_a.commit().await.unwrap();
    (moved_a, b_task.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_running_the_same_sweep_at_once_apply_each_transition_once() {
    let db = TestDb::create("demo_cas_overlap").await.unwrap();
    let mut setup = db.connect("setup").await.unwrap();
    passes::create_schema(&mut setup).await.unwrap();
    add_due_items(&setup, 60).await;

    let (moved_a, moved_b) = overlapping_sweeps(&db, None).await;
    assert_eq!(
        (moved_a, moved_b),
        (60, 0),
        "B re-checks each row after A's commit and skips it"
    );
    assert_eq!(damage(&setup).await, (0, 0, 60));
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overlap_test_catches_a_sweep_without_its_compare_and_set() {
    let db = TestDb::create("demo_cas_control").await.unwrap();
    let mut setup = db.connect("setup").await.unwrap();
    passes::create_schema(&mut setup).await.unwrap();
    add_due_items(&setup, 60).await;

    let (moved_a, moved_b) = overlapping_sweeps(&db, Some(UNGUARDED_SWEEP)).await;
    assert_eq!(
        (moved_a, moved_b),
        (60, 60),
        "the blind update applies every row twice"
    );
    let (doubled, _, transitions) = damage(&setup).await;
    assert_eq!((doubled, transitions), (60, 120));
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_the_full_demo_pass_and_schema_creation_stay_correct() {
    let db = TestDb::create("demo_cas_race").await.unwrap();
    // Every replica creates the schema at boot, at the same time.
    let mut creators = Vec::new();
    for i in 0..3 {
        let mut client = db.connect(&format!("boot-{i}")).await.unwrap();
        creators.push(tokio::spawn(async move {
            passes::create_schema(&mut client).await
        }));
    }
    for creator in creators {
        creator.await.unwrap().unwrap();
    }
    let setup = db.connect("setup").await.unwrap();
    let mut racers = Vec::new();
    for i in 0..3 {
        let client = db.connect(&format!("racer-{i}")).await.unwrap();
        racers.push(tokio::spawn(async move {
            let actor = format!("replica-{i}");
            let mut moved = 0;
            for _ in 0..30 {
                moved += passes::ticked_pass(&client, LOOP, &actor, Duration::from_millis(5))
                    .await
                    .unwrap();
            }
            moved
        }));
    }
    let mut feeder_total = 0;
    for _ in 0..10 {
        add_due_items(&setup, 20).await;
        feeder_total += 20;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut moved = 0;
    for racer in racers {
        moved += racer.await.unwrap();
    }
    // Whatever the racers left pending is swept once more.
    tokio::time::sleep(Duration::from_millis(20)).await;
    moved += passes::sweep(&setup, LOOP, "final").await.unwrap();
    let (doubled, pending_due, transitions) = damage(&setup).await;
    assert_eq!(doubled, 0, "no item moved twice");
    assert_eq!(pending_due, 0);
    assert_eq!(u64::try_from(transitions).unwrap(), moved);
    assert!(
        moved >= feeder_total,
        "every fed item moved ({moved} < {feeder_total})"
    );
    db.cleanup().await.unwrap();
}
