//! Issue 49, item 8: behind PgBouncer in transaction mode with `default_pool_size = 1`, beside
//! pgbench running slow transactions through the same pooler, the advisory lock never leads,
//! on any replica, with a pool of one connection or of two. Before, a busy pooler answered the
//! pool proof's second connection late, the proof counted as passed, and a lone replica led
//! for 36 s (2 of 2 runs). Now a late second session proves nothing (no attempt) and one
//! backend for both refutes the pool.
//!
//! The load: four pgbench clients, each running `SELECT pg_sleep(0.07)` as its transaction,
//! so the pooler's one server session is busy nearly all the time. Each replica's leadership
//! is sampled every 5 ms for the whole run.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader::RunError;
use plexsphere_leader_tests::{Backend, PgBouncer, PoolMode, TestDb};
use support::{I, Replica};
use tokio::time::Instant;

/// How long the replicas run beside the load.
const WATCHED: Duration = Duration::from_secs(10);

/// Starts pgbench through `port` on `dbname`: four clients, slow transactions, for `seconds`.
fn pgbench(port: u16, dbname: &str, seconds: u64) -> std::process::Child {
    let dir = std::env::temp_dir().join(format!("plx-pgbench-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("slow.sql");
    std::fs::write(&script, "SELECT pg_sleep(0.07);\n").unwrap();
    std::process::Command::new("pgbench")
        .args([
            "-n",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-c",
            "4",
            "-j",
            "1",
        ])
        .args(["-p", &port.to_string(), "-T", &seconds.to_string()])
        .arg("-f")
        .arg(&script)
        .arg(dbname)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("pgbench (PostgreSQL's client tools) runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_slow_transactions_through_a_transaction_pooler_no_replica_ever_leads() {
    let db = TestDb::create("pooler_load").await.unwrap();
    let bouncer = PgBouncer::start(&db.config(), PoolMode::Transaction, 1)
        .await
        .expect("PgBouncer");
    let pooled = bouncer.pg_config(&db.config());
    let mut load = pgbench(bouncer.port(), db.name(), WATCHED.as_secs() + 5);
    // The load first, so that the pooler is busy when the replicas prove their pools.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let replicas: Vec<Replica> = [1, 2]
        .into_iter()
        .map(|size| Replica::spawn(Backend::Deadpool.pool(&pooled, size).unwrap(), I))
        .collect();
    let watched = Instant::now();
    while watched.elapsed() < WATCHED {
        for (n, replica) in replicas.iter().enumerate() {
            assert!(
                !replica.elector.is_leader(),
                "replica {n} led behind a busy transaction pooler"
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = load.kill();
    let _ = load.wait();
    for (n, replica) in replicas.into_iter().enumerate() {
        assert_eq!(
            replica.elector.leadership().last_end(),
            None,
            "{n}: no term"
        );
        // Refuted (one backend for both sessions) or still proving nothing: never a pass.
        match replica.stop().await {
            Ok(()) | Err(RunError::SessionsMultiplexed(_)) => {}
            Err(other) => panic!("replica {n}: {other:?}"),
        }
    }
    drop(bouncer);
    db.cleanup().await.unwrap();
}
