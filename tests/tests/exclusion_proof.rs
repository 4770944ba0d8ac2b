//! The exclusion proof against the real local PostgreSQL (issue 49, items 1, 3 and 8): a server
//! whose advisory lock grants every session elects nobody and every run fails with
//! `RunError::LockNotExclusive`; a direct pool of one connection is still proven and leads; a
//! second session that the server refuses proves nothing and costs the pool nothing.
//!
//! The vacuous server is PostgreSQL itself, with `pg_catalog`'s two-`int4` advisory-lock
//! functions of one throwaway database replaced by SQL functions that answer `true` (what
//! CockroachDB's stubs and YugabyteDB's two-`int4` bug do): schema-qualified calls reach them
//! too. Each test has its own database; bounds carry the documented `MARGIN` or `STARTUP`.

#![allow(clippy::unwrap_used)]

mod support;

use plexsphere_leader::RunError;
use plexsphere_leader_core::LockFinding;
use plexsphere_leader_tests::{Backend, TestDb};
use support::{I, Logs, MARGIN, Replica, STARTUP, wait_for, wait_for_async};

on_both_backends!(
    #[tokio::test]
    on_a_lock_that_grants_everyone_no_replica_leads_and_every_run_fails
);
async fn on_a_lock_that_grants_everyone_no_replica_leads_and_every_run_fails(backend: Backend) {
    let db = TestDb::create(&format!("vacuous_{backend}")).await.unwrap();
    db.make_advisory_locks_vacuous().await.unwrap();
    let (logs, _guard) = Logs::capture();
    let replicas: Vec<Replica> = (0..3)
        .map(|n| Replica::spawn(db.backend_pool(backend, &format!("vac-{n}"), 2).unwrap(), I))
        .collect();
    // Every run returns its error within the startup bound; none ever began a term.
    for replica in &replicas {
        let finished = wait_for(STARTUP, || replica.task.is_finished()).await;
        assert!(finished.is_some(), "the run ends by itself");
    }
    for replica in replicas {
        assert!(!replica.elector.is_leader());
        assert_eq!(
            replica.elector.leadership().last_end(),
            None,
            "no term at all"
        );
        assert_eq!(replica.gauge(), 0);
        let error = replica.task.await.unwrap().unwrap_err();
        assert!(
            matches!(
                error,
                RunError::LockNotExclusive(LockFinding::LockNotExclusive { .. })
            ),
            "{error:?}"
        );
        assert!(error.is_permanent());
        assert!(error.to_string().contains("Config::lease"), "{error}");
    }
    assert!(
        logs.contains("ERROR", "advisory locks do not exclude"),
        "{:?}",
        logs.lines()
    );
    assert!(!logs.contains("INFO", "acquired background leader lock"));
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_direct_pool_of_one_connection_is_proven_and_leads
);
async fn a_direct_pool_of_one_connection_is_proven_and_leads(backend: Backend) {
    let db = TestDb::create(&format!("pool_of_one_{backend}"))
        .await
        .unwrap();
    let replica = Replica::spawn(db.backend_pool(backend, "one", 1).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("a pool of one connection leads");
    // The proof's own session was closed: only the lock session remains.
    let gone = wait_for_async(MARGIN, || async { db.backend_count().await.unwrap() == 1 }).await;
    assert!(gone.is_some(), "{}", db.backend_count().await.unwrap());
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_second_session_the_server_refuses_proves_nothing_and_keeps_the_first_pooled
);
async fn a_second_session_the_server_refuses_proves_nothing_and_keeps_the_first_pooled(
    backend: Backend,
) {
    let db = TestDb::create(&format!("conn_limit_{backend}"))
        .await
        .unwrap();
    let role = format!("{}_one", db.name());
    db.admin()
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN CONNECTION LIMIT 1; \
             GRANT ALL ON DATABASE \"{}\" TO \"{role}\"",
            db.name()
        ))
        .await
        .unwrap();
    let mut config = db.config_with_app_name("limited");
    config.user(&role);
    let (logs, _guard) = Logs::capture();
    let replica = Replica::spawn(backend.pool(&config, 2).unwrap(), I);
    // Several checks: each proves again and fails to open its second session.
    tokio::time::sleep(6 * I).await;
    let first = db.sessions_of("limited").await.unwrap();
    tokio::time::sleep(5 * I).await;
    let later = db.sessions_of("limited").await.unwrap();
    assert!(!replica.elector.is_leader(), "no attempt without a proof");
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        first.iter().map(|s| s.pid).collect::<Vec<_>>(),
        later.iter().map(|s| s.pid).collect::<Vec<_>>(),
        "the one pooled session went back to the pool at every check, never closed"
    );
    assert!(
        logs.contains("WARN", "the exclusion proof proved nothing"),
        "{:?}",
        logs.lines()
    );
    // The limit lifted: the next proof passes and the replica leads.
    db.admin()
        .batch_execute(&format!("ALTER ROLE \"{role}\" CONNECTION LIMIT -1"))
        .await
        .unwrap();
    wait_for(MARGIN, || replica.elector.is_leader())
        .await
        .expect("leads once a second session can be had");
    replica.stop().await.unwrap();
    // The role outlives the database: drop it (its privileges first).
    db.admin()
        .batch_execute(&format!(
            "REVOKE ALL ON DATABASE \"{}\" FROM \"{role}\"; DROP ROLE \"{role}\"",
            db.name()
        ))
        .await
        .unwrap();
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    on_a_lock_that_grants_everyone_no_replica_joins_a_shard_space
);
async fn on_a_lock_that_grants_everyone_no_replica_joins_a_shard_space(backend: Backend) {
    use plexsphere_leader::sharded::ShardedElector;
    let db = TestDb::create(&format!("vacuous_shards_{backend}"))
        .await
        .unwrap();
    db.make_advisory_locks_vacuous().await.unwrap();
    let mut runs = Vec::new();
    let mut electors = Vec::new();
    for n in 0..2 {
        let pool = db.backend_pool(backend, &format!("vs-{n}"), 2).unwrap();
        let elector = ShardedElector::new(pool.shard_config(8).check_interval(I)).unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        runs.push(tokio::spawn({
            let elector = elector.clone();
            async move { elector.run(shutdown).await }
        }));
        electors.push(elector);
    }
    for (run, elector) in runs.into_iter().zip(&electors) {
        let error = tokio::time::timeout(STARTUP, run)
            .await
            .expect("the run ends by itself")
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(
                error,
                RunError::LockNotExclusive(LockFinding::LockNotExclusive { .. })
            ),
            "{error:?}"
        );
        assert_eq!(elector.ownership().count(), 0);
        assert!(elector.transitions().is_empty(), "no shard was ever owned");
    }
    db.cleanup().await.unwrap();
}
