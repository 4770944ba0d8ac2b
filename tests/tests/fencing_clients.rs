//! `fencing::check` takes what a service holds, as it holds it: a deadpool-postgres client or
//! transaction, a tokio-postgres client or transaction, and (in `plexsphere_leader_sqlx`) an
//! sqlx transaction or connection. Before issue 23 the deadpool transaction did not compile
//! (`deadpool_postgres::Transaction<'_>: tokio_postgres::GenericClient` is not satisfied) and
//! sqlx had no helper. Each case runs on the real server against a fence row set by hand: the
//! current epoch passes, an older one is `Stale`, and a database without the table says to run
//! `fencing::setup`.

use plexsphere_leader::LockKey;
use plexsphere_leader::fencing::{self, FenceError};
use plexsphere_leader_tests::{Backend, BackendPool, TestDb};

const KEY: LockKey = LockKey::new(1_886_156_915, 41);

/// Creates the fence table with `fencing::setup` and sets `KEY`'s epoch to 3.
async fn fenced_db(name: &str) -> TestDb {
    let db = TestDb::create(name).await.expect("database");
    fencing::setup(db.admin()).await.expect("setup");
    fencing::setup(db.admin())
        .await
        .expect("setup is idempotent");
    db.admin()
        .batch_execute("INSERT INTO plexsphere_leader_fence VALUES (1886156915, 41, 3)")
        .await
        .expect("fence row");
    db
}

fn assert_stale(result: Result<(), FenceError>) {
    assert!(
        matches!(
            result,
            Err(FenceError::Stale {
                epoch: 2,
                current: 3
            })
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn deadpool_and_tokio_postgres_clients_and_transactions_are_checked_as_held() {
    let db = fenced_db("fence_clients_deadpool").await;
    let pool = db.pool(2).expect("pool");

    let mut object = pool.get().await.expect("client");
    fencing::check(&object, KEY, 3)
        .await
        .expect("deadpool client");
    let transaction = object.transaction().await.expect("transaction");
    fencing::check(&transaction, KEY, 3)
        .await
        .expect("deadpool transaction");
    assert_stale(fencing::check(&transaction, KEY, 2).await);
    transaction.rollback().await.expect("rollback");

    let mut client = db.connect("plx-harness-fence").await.expect("client");
    fencing::check(&client, KEY, 3)
        .await
        .expect("tokio-postgres client");
    let transaction = client.transaction().await.expect("transaction");
    fencing::check(&transaction, KEY, 3)
        .await
        .expect("tokio-postgres transaction");
    assert_stale(fencing::check(&transaction, KEY, 2).await);
    drop(transaction);
    drop((object, pool, client));
    db.cleanup().await.expect("cleanup");
}

#[tokio::test]
async fn sqlx_transactions_and_connections_are_checked_as_held() {
    let db = fenced_db("fence_clients_sqlx").await;
    let BackendPool::Sqlx(pool) = db
        .backend_pool(Backend::Sqlx, "plx-fence-sqlx", 2)
        .expect("pool")
    else {
        unreachable!("an sqlx pool")
    };
    use plexsphere_leader_sqlx::fencing as sqlx_fencing;
    sqlx_fencing::setup(&pool)
        .await
        .expect("setup is idempotent");

    let mut transaction = pool.begin().await.expect("transaction");
    sqlx_fencing::check(&mut transaction, KEY, 3)
        .await
        .expect("sqlx transaction");
    assert_stale(sqlx_fencing::check(&mut transaction, KEY, 2).await);
    transaction.rollback().await.expect("rollback");

    let mut connection = pool.acquire().await.expect("connection");
    sqlx_fencing::check(&mut *connection, KEY, 3)
        .await
        .expect("sqlx connection");
    assert!(matches!(
        sqlx_fencing::check(&mut *connection, LockKey::new(1_886_156_915, 42), 1).await,
        Err(FenceError::NoEpoch)
    ));
    drop(connection);
    pool.close().await;
    db.cleanup().await.expect("cleanup");
}

#[tokio::test]
async fn a_database_without_the_fence_table_says_to_run_setup() {
    let db = TestDb::create("fence_missing_table")
        .await
        .expect("database");
    let pool = db.pool(1).expect("pool");
    let mut object = pool.get().await.expect("client");
    let transaction = object.transaction().await.expect("transaction");
    let missing = fencing::check(&transaction, KEY, 1).await;
    assert!(
        matches!(missing, Err(FenceError::MissingTable)),
        "{missing:?}"
    );
    let text = missing.unwrap_err().to_string();
    assert!(text.contains("run fencing::setup"), "{text}");
    drop(transaction);
    drop((object, pool));

    let BackendPool::Sqlx(pool) = db
        .backend_pool(Backend::Sqlx, "plx-fence-sqlx", 1)
        .expect("pool")
    else {
        unreachable!("an sqlx pool")
    };
    let mut transaction = pool.begin().await.expect("transaction");
    let missing = plexsphere_leader_sqlx::fencing::check(&mut transaction, KEY, 1).await;
    assert!(
        matches!(missing, Err(FenceError::MissingTable)),
        "{missing:?}"
    );
    drop(transaction);
    pool.close().await;
    db.cleanup().await.expect("cleanup");
}
