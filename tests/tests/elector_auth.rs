//! A wrong password: on a throwaway cluster whose `pg_hba.conf` asks one role for a
//! scram-sha-256 password, the elector keeps retrying, says so once at ERROR with what to do (a
//! permanent failure, issue 23), never leads and never logs the password.

mod support;

use std::time::Duration;

use plexsphere_leader_tests::{Cluster, pool_for};
use support::{Logs, Replica};

#[tokio::test]
async fn a_wrong_password_is_retried_with_one_error_that_never_shows_the_password() {
    let (logs, _guard) = Logs::capture();
    let cluster = Cluster::start().await.expect("throwaway cluster");
    let admin = cluster.connect("postgres").await.unwrap();
    admin
        .batch_execute(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE plx_pw LOGIN PASSWORD 'the-right-one'",
        )
        .await
        .unwrap();
    let hba: String = admin.query_one("SHOW hba_file", &[]).await.unwrap().get(0);
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all plx_pw 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();

    let mut config = cluster.config("postgres");
    config.user("plx_pw").password("wr0ng-s3cr3t");
    // Scram's key derivation runs in the client too (slow in a debug build): a generous interval.
    let replica = Replica::spawn(pool_for(config, 2).unwrap(), Duration::from_secs(1));
    let refused = |logs: &Logs| {
        logs.lines().iter().any(|l| {
            l.starts_with("ERROR")
                && l.contains("leader: acquire lock connection: ")
                && l.contains("password authentication failed")
                && l.contains("advice: check the password")
        })
    };
    support::wait_for(Duration::from_secs(20), || refused(&logs))
        .await
        .expect("the authentication failure is logged at ERROR with advice");
    let failure = replica.elector.check_failure().expect("a failed check");
    assert_eq!(
        failure.class,
        plexsphere_leader::leadership::FailureClass::Permanent,
        "{failure:?}"
    );
    assert!(!replica.elector.is_leader());
    assert!(!replica.task.is_finished(), "run keeps retrying");
    replica.stop().await.expect("a standby stops cleanly");
    let lines = logs.lines();
    assert!(
        lines.iter().all(|l| !l.contains("wr0ng-s3cr3t")),
        "the password never shows: {lines:?}"
    );
}
