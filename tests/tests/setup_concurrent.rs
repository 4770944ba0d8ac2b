//! Every setup is safe to run from every replica at the same start, as the rustdoc invites
//! (issue 49, item 13). Before, `fencing::setup` and `floor::setup` each failed 20 of 30 calls
//! made at once on a fresh database (`duplicate key value violates unique constraint
//! "pg_type_typname_nsp_index"`: two concurrent `CREATE TABLE IF NOT EXISTS` of one table),
//! and the error said "fence check"; only `lease::setup` took a transaction lock first. Now
//! every setup of both backends takes the same transaction-level advisory lock before its
//! `CREATE … IF NOT EXISTS`, and a failed setup names itself.
//!
//! Each scenario opens [`CONNECTIONS`] connections first, then releases all the setups at once
//! (a barrier), on a fresh database: the race needs no timing to show, only that the calls
//! overlap, which 30 connections opened beforehand make all but certain on any machine.

use std::rc::Rc;

use plexsphere_leader::fencing::FenceError;
use plexsphere_leader_tests::{Backend, BackendPool, TestDb};
use sqlx::PgConnection;
use tokio::sync::Barrier;

/// How many connections run a setup at once.
const CONNECTIONS: usize = 30;

/// The schema of the lease setups (the default one).
const SCHEMA: &str = plexsphere_leader::lease::DEFAULT_SCHEMA;

/// One setup function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// `fencing::setup`.
    Fence,
    /// `floor::setup`.
    Floor,
    /// `lease::setup`.
    Lease,
    /// `lease::setup_shards`.
    LeaseShards,
}

impl Setup {
    const ALL: [Self; 4] = [Self::Fence, Self::Floor, Self::Lease, Self::LeaseShards];

    /// The setup's path, as its error names it.
    const fn path(self) -> &'static str {
        match self {
            Self::Fence => "fencing::setup",
            Self::Floor => "floor::setup",
            Self::Lease => "lease::setup",
            Self::LeaseShards => "lease::setup_shards",
        }
    }

    /// A table the setup makes (qualified).
    const fn table(self) -> &'static str {
        match self {
            Self::Fence => "public.plexsphere_leader_fence",
            Self::Floor => "public.plexsphere_leader_floor",
            Self::Lease => "public.plexsphere_leader_lease",
            Self::LeaseShards => "public.plexsphere_shard_owner",
        }
    }

    /// Runs the setup with plexsphere-leader's own function on a tokio-postgres client or
    /// transaction.
    async fn on_postgres(
        self,
        client: &impl plexsphere_leader::fencing::FenceClient,
    ) -> Result<(), FenceError> {
        match self {
            Self::Fence => plexsphere_leader::fencing::setup(client).await,
            Self::Floor => plexsphere_leader::floor::setup(client).await,
            Self::Lease => plexsphere_leader::lease::setup(client).await,
            Self::LeaseShards => plexsphere_leader::lease::setup_shards(client, SCHEMA).await,
        }
    }

    /// Runs the setup with plexsphere-leader-sqlx's function on an sqlx connection.
    async fn on_sqlx(self, connection: &mut PgConnection) -> Result<(), FenceError> {
        match self {
            Self::Fence => plexsphere_leader_sqlx::fencing::setup(connection).await,
            Self::Floor => plexsphere_leader_sqlx::floor::setup(connection).await,
            Self::Lease => plexsphere_leader_sqlx::lease::setup(connection).await,
            Self::LeaseShards => {
                plexsphere_leader_sqlx::lease::setup_shards(connection, SCHEMA).await
            }
        }
    }
}

/// Runs `setups[i % len]` on connection `i` of [`CONNECTIONS`] of `backend`, all released at
/// once, on a fresh database; asserts that every one succeeded and that every table exists.
/// The setups run as local tasks (sqlx's generic setup futures are not provably `Send` for
/// every lifetime of a borrowed connection); what races is the server's 30 backends.
async fn all_at_once(backend: Backend, setups: &[Setup], name: &str) {
    let db = TestDb::create(name).await.expect("database");
    let pool = db
        .backend_pool(backend, "plx-setup", CONNECTIONS)
        .expect("pool");
    let failures = tokio::task::LocalSet::new()
        .run_until(run_all(&db, pool, setups))
        .await;
    assert!(
        failures.is_empty(),
        "{} of {CONNECTIONS} setups failed on {backend}: {failures:#?}",
        failures.len()
    );
    for setup in setups {
        let exists: bool = db
            .admin()
            .query_one(
                &format!("SELECT to_regclass('{}') IS NOT NULL", setup.table()),
                &[],
            )
            .await
            .expect("to_regclass")
            .get(0);
        assert!(exists, "{} made no {}", setup.path(), setup.table());
    }
    db.cleanup().await.expect("cleanup");
}

/// Opens the connections, then runs the setups on them at once (inside a `LocalSet`); the
/// failures, each named by its setup.
async fn run_all(db: &TestDb, pool: BackendPool, setups: &[Setup]) -> Vec<String> {
    let barrier = Rc::new(Barrier::new(CONNECTIONS));
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..CONNECTIONS {
        let (setup, barrier) = (setups[i % setups.len()], Rc::clone(&barrier));
        match &pool {
            BackendPool::Deadpool(_) => {
                let client = db
                    .connect(&format!("plx-setup-{i}"))
                    .await
                    .expect("connect");
                runs.spawn_local(async move {
                    barrier.wait().await;
                    (setup, setup.on_postgres(&client).await)
                });
            }
            BackendPool::Sqlx(pool) => {
                let mut connection = pool.acquire().await.expect("connect");
                runs.spawn_local(async move {
                    barrier.wait().await;
                    (setup, setup.on_sqlx(&mut connection).await)
                });
            }
        }
    }
    let mut failures = Vec::new();
    while let Some(run) = runs.join_next().await {
        if let (setup, Err(error)) = run.expect("the setup task") {
            failures.push(format!("{}: {error}", setup.path()));
        }
    }
    failures
}

/// One test per setup and backend, and one of all four setups interleaved (they share the
/// fence and floor tables, so they must share the lock too).
macro_rules! at_once {
    ($name:ident, $backend:expr, $setups:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            all_at_once($backend, &$setups, stringify!($name)).await;
        }
    };
}

at_once!(fencing_setup_on_postgres, Backend::Deadpool, [Setup::Fence]);
at_once!(floor_setup_on_postgres, Backend::Deadpool, [Setup::Floor]);
at_once!(lease_setup_on_postgres, Backend::Deadpool, [Setup::Lease]);
at_once!(
    lease_shards_setup_on_postgres,
    Backend::Deadpool,
    [Setup::LeaseShards]
);
at_once!(
    every_setup_together_on_postgres,
    Backend::Deadpool,
    Setup::ALL
);
at_once!(fencing_setup_on_sqlx, Backend::Sqlx, [Setup::Fence]);
at_once!(floor_setup_on_sqlx, Backend::Sqlx, [Setup::Floor]);
at_once!(lease_setup_on_sqlx, Backend::Sqlx, [Setup::Lease]);
at_once!(
    lease_shards_setup_on_sqlx,
    Backend::Sqlx,
    [Setup::LeaseShards]
);
at_once!(every_setup_together_on_sqlx, Backend::Sqlx, Setup::ALL);

/// Asserts that `result` is the failure of `setup`, named so, and not a fence check's.
fn assert_names_the_setup(setup: Setup, result: Result<(), FenceError>) {
    let Err(error) = result else {
        panic!("{} succeeded in a read-only transaction", setup.path());
    };
    let text = error.to_string();
    assert!(
        matches!(&error, FenceError::Setup { setup: path, .. } if *path == setup.path()),
        "{error:?}"
    );
    assert!(
        text.starts_with(&format!("{} failed: ", setup.path())),
        "{text}"
    );
    assert!(text.contains("read-only transaction"), "{text}");
    assert!(!text.contains("fence check"), "{text}");
}

/// A setup that fails (here: in a read-only transaction, SQLSTATE 25006) says which setup
/// failed and why, on the tokio-postgres side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_setup_names_the_setup_on_postgres() {
    let db = TestDb::create("setup_error_postgres")
        .await
        .expect("database");
    let mut client = db.connect("plx-setup-ro").await.expect("connect");
    for setup in Setup::ALL {
        let transaction = client
            .build_transaction()
            .read_only(true)
            .start()
            .await
            .expect("begin");
        assert_names_the_setup(setup, setup.on_postgres(&transaction).await);
        transaction.rollback().await.expect("rollback");
    }
    drop(client);
    db.cleanup().await.expect("cleanup");
}

/// The same on the sqlx side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_setup_names_the_setup_on_sqlx() {
    let db = TestDb::create("setup_error_sqlx").await.expect("database");
    let BackendPool::Sqlx(pool) = db
        .backend_pool(Backend::Sqlx, "plx-setup-ro", 1)
        .expect("pool")
    else {
        unreachable!("an sqlx pool");
    };
    for setup in Setup::ALL {
        let mut transaction = pool.begin().await.expect("begin");
        sqlx::raw_sql("SET TRANSACTION READ ONLY")
            .execute(&mut *transaction)
            .await
            .expect("read only");
        assert_names_the_setup(setup, setup.on_sqlx(&mut transaction).await);
        transaction.rollback().await.expect("rollback");
    }
    pool.close().await;
    db.cleanup().await.expect("cleanup");
}
