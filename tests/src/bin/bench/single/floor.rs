//! `bench single`: The detection floor: how soon a bare tokio-postgres connection learns that
//! `pg_terminate_backend` ended its session.

use super::*;

/// How fast any client can learn that `pg_terminate_backend` ended its session: a bare
/// tokio-postgres connection holding the lock in this process, no elector, no pool. The stamp
/// is taken as in the `terminate-direct` fault (before the admin session sends the statement);
/// the end is the connection future resolving. What the elector's figure (b) adds to this is
/// its own path.
pub(super) async fn detection_floor(options: &Options) -> Result<(), BoxError> {
    let db = TestDb::create("bench_floor").await?;
    let key = plexsphere_leader::LockKey::DEFAULT;
    let mut ends = Vec::with_capacity(options.rounds);
    for _ in 0..options.rounds {
        let (client, connection) = db.config().connect(NoTls).await?;
        let ended = tokio::spawn(async move {
            let _closed = connection.await;
            Instant::now()
        });
        client
            .batch_execute(&format!(
                "SELECT pg_advisory_lock({}, {})",
                key.class_id, key.obj_id
            ))
            .await?;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let at = Instant::now();
        db.terminate(pid).await?;
        let end = tokio::time::timeout(ROUND_TIMEOUT, ended).await??;
        ends.push(end - at);
        drop(client);
    }
    db.cleanup().await?;
    println!(
        "\n## Detection floor ({} rounds)\n\n\
         | path | fault → session end known: median | p99 | max |\n|---|---|---|---|",
        options.rounds
    );
    println!(
        "| bare tokio-postgres connection, `pg_terminate_backend` | {} | {} | {} |",
        fine_ms(percentile(&ends, 50)),
        fine_ms(percentile(&ends, 99)),
        fine_ms(percentile(&ends, 100))
    );
    Ok(())
}
