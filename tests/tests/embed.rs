//! The elector embedded from the outside, as a service would, in at most 25 lines including the
//! pool: once on tokio-postgres and deadpool (the default backend), once on sqlx. Each runs
//! against the real local PostgreSQL on its own database; the line counts are checked from this
//! file's own text.

use plexsphere_leader::TermEndCause;
use plexsphere_leader_tests::TestDb;

// --- embed: deadpool ---
async fn embed_deadpool(dsn: &str) -> Result<Option<TermEndCause>, Box<dyn std::error::Error>> {
    use deadpool_postgres::{Manager, ManagerConfig, Pool};
    use plexsphere_leader::{Config, Elector, session::ObservedConnect};
    use tokio_util::sync::CancellationToken;

    let connect = ObservedConnect::new(tokio_postgres::NoTls);
    let manager = Manager::from_connect(dsn.parse()?, connect, ManagerConfig::default());
    let elector = Elector::new(Config::new(Pool::builder(manager).max_size(4).build()?))?;
    let shutdown = CancellationToken::new();
    let election = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    let term = elector.next_term(&shutdown).await?; // leads: the only replica
    // ... the leader's work, until term.cancelled() ...
    drop(term); // the work is done: a graceful stop need not wait for it
    shutdown.cancel();
    election.await??; // the term ended, the lock is released, the session closed
    Ok(elector.leadership().last_end().map(|end| end.cause))
}
// --- end ---

// --- embed: sqlx ---
async fn embed_sqlx(url: &str) -> Result<Option<TermEndCause>, Box<dyn std::error::Error>> {
    use plexsphere_leader::Elector;
    use tokio_util::sync::CancellationToken;

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await?;
    let elector = Elector::new(plexsphere_leader_sqlx::config(pool))?;
    let shutdown = CancellationToken::new();
    let election = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    let term = elector.next_term(&shutdown).await?; // leads: the only replica
    // ... the leader's work, until term.cancelled() ...
    drop(term); // the work is done: a graceful stop need not wait for it
    shutdown.cancel();
    election.await??; // the term ended, the lock is released, the session closed
    Ok(elector.leadership().last_end().map(|end| end.cause))
}
// --- end ---

/// The lines between the marker `--- embed: <name> ---` and the next `--- end ---`.
fn embed_lines(name: &str) -> usize {
    let source = include_str!("embed.rs");
    let start = source
        .find(&format!("// --- embed: {name} ---"))
        .expect("start marker");
    let end = source[start..].find("// --- end ---").expect("end marker");
    source[start..start + end].lines().count() - 1
}

#[tokio::test]
async fn a_service_embeds_the_deadpool_elector_in_25_lines() {
    assert!(
        embed_lines("deadpool") <= 25,
        "{} lines",
        embed_lines("deadpool")
    );
    let db = TestDb::create("embed_deadpool").await.unwrap();
    let dsn = plexsphere_leader_tests::replica_process::dsn(&db.config());
    let why = embed_deadpool(&dsn).await.unwrap();
    assert_eq!(why, Some(TermEndCause::Stopped));
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_service_embeds_the_sqlx_elector_in_25_lines() {
    assert!(embed_lines("sqlx") <= 25, "{} lines", embed_lines("sqlx"));
    let db = TestDb::create("embed_sqlx").await.unwrap();
    let config = db.config();
    let url = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        config.get_user().unwrap_or("postgres"),
        config.get_ports().first().copied().unwrap_or(5432),
        config.get_dbname().unwrap_or("postgres"),
    );
    let why = embed_sqlx(&url).await.unwrap();
    assert_eq!(why, Some(TermEndCause::Stopped));
    db.cleanup().await.unwrap();
}
