//! The elector against the real local PostgreSQL: every statement of the spec's Lock key, Config,
//! Elector API, Metric, Demotion, Session connection and idle-timeout sections. Each test has its
//! own database and a 200 ms check interval; time bounds carry the documented `MARGIN`.

// The scenarios run on both backends are plain functions called by the generated tests, so
// clippy's allowance for `unwrap` in tests does not see them.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use plexsphere_leader::{
    Config, ConfigError, Elector, LockKey, LossReason, RunError, TermEndCause,
    leadership::Interruption,
};
use plexsphere_leader_tests::{Backend, TestDb};
use support::{
    I, Logs, MARGIN, Replica, STARTUP, lock_holders, sole_leader, wait_for, wait_for_async,
};
use tokio_util::sync::CancellationToken;

on_both_backends!(
    #[tokio::test]
    the_held_lock_shows_in_pg_locks_as_the_spec_says
);
async fn the_held_lock_shows_in_pg_locks_as_the_spec_says(backend: Backend) {
    let db = TestDb::create(&format!("pg_locks_row_{backend}"))
        .await
        .unwrap();
    let replica = Replica::spawn(db.backend_pool(backend, "replica-a", 2).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads");

    let holders = lock_holders(&db).await;
    assert_eq!(holders.len(), 1, "one granted row is the leader's backend");
    let row = db
        .admin()
        .query_one(
            "SELECT l.locktype, l.classid::int8, l.objid::int8, l.objsubid::int4, a.application_name \
             FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.pid = $1 AND l.locktype = 'advisory'",
            &[&holders[0]],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "advisory");
    assert_eq!(row.get::<_, i64>(1), 1_886_156_915);
    assert_eq!(row.get::<_, i64>(2), 1);
    assert_eq!(row.get::<_, i32>(3), 2, "two-int4 keys show objsubid = 2");
    let (identity, _since) =
        plexsphere_leader::status::parse_application_name(row.get::<_, &str>(4))
            .expect("the lock session is named `<identity> since <grant time>`");
    assert_eq!(identity, replica.elector.identity());
    assert_eq!(
        (LockKey::DEFAULT.class_id, LockKey::DEFAULT.obj_id),
        (1_886_156_915, 1)
    );

    replica.stop().await.unwrap();
    assert!(
        lock_holders(&db).await.is_empty(),
        "no row means no replica leads"
    );
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_bigint_xact_lock_with_the_same_halves_never_collides() {
    let db = TestDb::create("bigint_xact").await.unwrap();
    let replica = Replica::spawn(db.pool(2).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads");

    let mut other = db.connect("repository").await.unwrap();
    let tx = other.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL lock_timeout = '1s'")
        .await
        .unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock((1886156915::bigint << 32) | 1)",
        &[],
    )
    .await
    .expect("the bigint key does not wait for the two-int4 leader lock");
    let objsubid: i16 = tx
        .query_one(
            "SELECT objsubid::int2 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(objsubid, 1, "a bigint key shows objsubid = 1");
    tx.commit().await.unwrap();
    assert!(replica.elector.is_leader());
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn of_two_then_five_electors_exactly_one_leads_and_the_gauges_sum_to_one() {
    let db = TestDb::create("one_of_many").await.unwrap();
    for count in [2usize, 5] {
        let replicas: Vec<_> = (0..count)
            .map(|_| Replica::spawn(db.pool(2).unwrap(), I))
            .collect();
        sole_leader(&replicas, STARTUP).await;
        for _ in 0..20 {
            let leaders = replicas.iter().filter(|r| r.elector.is_leader()).count();
            let gauges: i64 = replicas.iter().map(Replica::gauge).sum();
            assert_eq!((leaders, gauges), (1, 1));
            assert_eq!(lock_holders(&db).await.len(), 1);
            tokio::time::sleep(I / 4).await;
        }
        for replica in replicas {
            replica.stop().await.unwrap();
        }
        assert!(lock_holders(&db).await.is_empty());
    }
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_cancelled_leader_releases_and_a_standby_leads_within_about_one_interval
);
async fn a_cancelled_leader_releases_and_a_standby_leads_within_about_one_interval(
    backend: Backend,
) {
    let db = TestDb::create(&format!("graceful_{backend}"))
        .await
        .unwrap();
    let replicas = vec![
        Replica::spawn(db.backend_pool(backend, "graceful-a", 2).unwrap(), I),
        Replica::spawn(db.backend_pool(backend, "graceful-b", 2).unwrap(), I),
    ];
    let leader = sole_leader(&replicas, STARTUP).await;
    let mut replicas = replicas;
    let old = replicas.remove(leader);
    let term = old
        .elector
        .term(&CancellationToken::new())
        .expect("leader has a term");

    old.shutdown.cancel();
    let returned = old.task.await.unwrap();
    assert_eq!(returned, Ok(()));
    assert_eq!(
        term.cause(),
        Some(Interruption::Term(TermEndCause::Stopped))
    );
    assert!(!old.elector.is_leader());
    assert_eq!(support::gauge(&old.registry), 0);
    let handover = wait_for(I + MARGIN, || replicas[0].elector.is_leader())
        .await
        .expect("the standby takes the lock at its next check");
    assert!(handover <= I + MARGIN, "handover took {handover:?}");
    assert_eq!(lock_holders(&db).await.len(), 1);
    replicas.pop().unwrap().stop().await.unwrap();
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_terminated_lock_session_demotes_the_leader_within_two_intervals
);
async fn a_terminated_lock_session_demotes_the_leader_within_two_intervals(backend: Backend) {
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create(&format!("terminate_{backend}"))
        .await
        .unwrap();
    let replicas = vec![
        Replica::spawn(db.backend_pool(backend, "terminate-a", 2).unwrap(), I),
        Replica::spawn(db.backend_pool(backend, "terminate-b", 2).unwrap(), I),
    ];
    let leader = sole_leader(&replicas, STARTUP).await;
    let term = replicas[leader]
        .elector
        .term(&CancellationToken::new())
        .unwrap();

    let pid = lock_holders(&db).await[0];
    assert!(db.terminate(pid).await.unwrap());
    let demoted = wait_for(2 * I + MARGIN, || !replicas[leader].elector.is_leader())
        .await
        .expect("the leader notices at its next check");
    assert!(demoted <= 2 * I + MARGIN);
    assert!(term.token().is_cancelled());
    let session_ended = TermEndCause::Lost(LossReason::SessionEnded);
    assert_eq!(term.cause(), Some(Interruption::Term(session_ended)));
    assert_eq!(term.ended().await, session_ended);
    assert_eq!(
        replicas[leader]
            .elector
            .leadership()
            .last_end()
            .map(|end| end.cause),
        Some(session_ended)
    );
    assert_eq!(replicas[leader].gauge(), 0);
    assert!(
        logs.contains("WARN", "leader: lost background leader lock:"),
        "{:?}",
        logs.lines()
    );

    let other = 1 - leader;
    wait_for(2 * I + MARGIN, || {
        replicas.iter().any(|r| r.elector.is_leader())
    })
    .await
    .expect("a standby takes over");
    let _ = other;
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_standby_refused_a_hundred_times_opens_and_closes_no_backend
);
async fn a_standby_refused_a_hundred_times_opens_and_closes_no_backend(backend: Backend) {
    // Short, so that a hundred checks take 20 s; long enough that a loaded 2-core machine (other
    // test binaries, builds) answers each check within it, since a check that times out closes
    // its session and the next one opens a new backend (at 50 ms, the minimum, one check in a
    // hundred missed its deadline under three parallel builds; at 100 ms one missed beside
    // `stress-ng --cpu 2`: issue 49, item 6).
    let interval = Duration::from_millis(200);
    let db = TestDb::create(&format!("refused_free_{backend}"))
        .await
        .unwrap();
    // The leader checks seldom: `pg_stat_database.sessions` counts every backend of the
    // database, and a leader's check missing its deadline on a loaded machine would open a new
    // lock session (and let the standby lead) without any cost of the standby's.
    let leader_interval = Duration::from_secs(5);
    let leader = Replica::spawn(
        db.backend_pool(backend, "leader", 2).unwrap(),
        leader_interval,
    );
    wait_for(STARTUP, || leader.elector.is_leader())
        .await
        .expect("leads");
    let standby = Replica::spawn(db.backend_pool(backend, "standby", 4).unwrap(), interval);
    // The standby's run first proves its pool (one pooled connection and one short-lived
    // session of its own, closed at once), then its checks borrow the pooled one; the pool
    // settles within a few checks (sqlx gives a connection back to its pool in a task of its
    // own, so a check right after the proof may open one more).
    wait_for_async(STARTUP, || async {
        db.session_count("standby").await.unwrap() >= 1
    })
    .await
    .expect("the standby's pooled sessions");
    tokio::time::sleep(5 * interval).await;
    let pids = |sessions: Vec<plexsphere_leader_tests::Session>| -> Vec<i32> {
        sessions.iter().map(|session| session.pid).collect()
    };
    let before = pids(db.sessions_of("standby").await.unwrap());
    let size = standby.pool.size();
    assert!(
        (1..=2).contains(&size),
        "the proof's pooled connection: {size}"
    );
    let sessions_before = sessions_started(&db).await;

    tokio::time::sleep(interval * 101).await;

    assert!(!standby.elector.is_leader());
    assert_eq!(
        pids(db.sessions_of("standby").await.unwrap()),
        before,
        "the same backends"
    );
    assert_eq!(standby.pool.size(), size, "the pool kept its connections");
    // Between checks the connection is back in the pool (a check may be borrowing it right now).
    wait_for(MARGIN, || standby.pool.idle() == size)
        .await
        .expect("the connection returns to the pool after each refused check");
    assert_eq!(
        sessions_started(&db).await,
        sessions_before,
        "pg_stat_database.sessions"
    );
    standby.stop().await.unwrap();
    leader.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

/// `pg_stat_database.sessions` of the test database, after the statistics were flushed.
async fn sessions_started(db: &TestDb) -> i64 {
    // Backends report their statistics at most once a second; wait for a flush.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    db.admin()
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .expect("clear the statistics snapshot");
    db.admin()
        .query_one(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_database row")
        .get(0)
}

#[tokio::test]
async fn term_and_run_if_leader_follow_the_spec_tables() {
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create("term_do").await.unwrap();
    let parent = CancellationToken::new();

    // A standby: no term, work not called.
    let leader = Replica::spawn(db.pool(2).unwrap(), I);
    wait_for(STARTUP, || leader.elector.is_leader())
        .await
        .unwrap();
    let standby = Replica::spawn(db.pool(2).unwrap(), I);
    tokio::time::sleep(I).await;
    assert!(standby.elector.term(&parent).is_none());
    let mut called = false;
    let outcome = standby
        .elector
        .run_if_leader(&parent, |_| {
            called = true;
            async { Ok::<_, &str>(()) }
        })
        .await;
    assert_eq!((outcome, called), (Ok(false), false));

    // A leader that keeps its term: (true, work's result).
    let ok = leader
        .elector
        .run_if_leader(&parent, |_| async { Ok::<_, &str>(()) })
        .await;
    assert_eq!(ok, Ok(true));
    let failed = leader
        .elector
        .run_if_leader(&parent, |_| async { Err::<(), _>("boom") })
        .await;
    assert_eq!(failed, Err("boom"));

    // Leadership lost while work runs: (false, no error), logged at INFO.
    let pid = lock_holders(&db).await[0];
    let db_ref = &db;
    let outcome = leader
        .elector
        .run_if_leader(&parent, |term| async move {
            db_ref.terminate(pid).await.unwrap();
            term.cancelled().await;
            Err::<(), _>("cancelled by the end of the term")
        })
        .await;
    assert_eq!(outcome, Ok(false));
    assert!(logs.contains("INFO", "leader: leadership ended while background work ran"));

    // A parent cancelled while work runs does not hide the work's own result while the term
    // holds: its error, or its success, comes back.
    wait_for(2 * I + MARGIN, || {
        standby.elector.is_leader() || leader.elector.is_leader()
    })
    .await
    .unwrap();
    let new_leader = if standby.elector.is_leader() {
        &standby
    } else {
        &leader
    };
    for (result, expected) in [(Err("deadline"), Err("deadline")), (Ok(()), Ok(true))] {
        let child = CancellationToken::new();
        let outcome = new_leader
            .elector
            .run_if_leader(&child, |term| {
                let child = child.clone();
                async move {
                    child.cancel();
                    term.cancelled().await;
                    result
                }
            })
            .await;
        assert_eq!(outcome, expected);
        let term = new_leader
            .elector
            .term(&child)
            .expect("the term still holds");
        assert_eq!(term.cause(), Some(Interruption::ParentCancelled));
    }
    assert!(new_leader.elector.is_leader());

    standby.stop().await.unwrap();
    leader.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn an_aborted_run_closes_the_lock_session_and_can_run_again() {
    let db = TestDb::create("abort").await.unwrap();
    let replica = Replica::spawn(db.pool(2).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .unwrap();
    let term = replica.elector.term(&CancellationToken::new()).unwrap();

    replica.task.abort();
    assert!(replica.task.await.unwrap_err().is_cancelled());
    assert!(!replica.elector.is_leader());
    assert_eq!(support::gauge(&replica.registry), 0);
    assert_eq!(
        term.cause(),
        Some(Interruption::Term(TermEndCause::Lost(LossReason::Dropped)))
    );
    wait_for_async(MARGIN, || async { lock_holders(&db).await.is_empty() })
        .await
        .expect("the server releases the lock when the session closes");

    let shutdown = CancellationToken::new();
    let again = tokio::spawn({
        let (elector, shutdown) = (replica.elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads again");
    assert!(
        replica
            .elector
            .term(&CancellationToken::new())
            .unwrap()
            .id()
            > term.id()
    );
    shutdown.cancel();
    assert_eq!(again.await.unwrap(), Ok(()));
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_panic_in_run_ends_the_term_and_closes_the_session_without_unlocking
);
async fn a_panic_in_run_ends_the_term_and_closes_the_session_without_unlocking(backend: Backend) {
    // A panic unwinding through `run`: here a tracing subscriber that panics on the first
    // "acquired" line, as a broken subscriber would, inside the run's own call stack.
    let logs = Logs::default();
    let panicking = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::layer::SubscriberExt::with(
            tracing_subscriber::registry(),
            logs.clone(),
        ),
        PanicOnce::default(),
    );
    let db = TestDb::create(&format!("panic_{backend}")).await.unwrap();
    let replica = {
        let _panic_guard = support::scoped_subscriber(panicking);
        let replica = Replica::spawn(db.backend_pool(backend, "panic", 2).unwrap(), I);
        let joined = tokio::time::timeout(STARTUP, replica.task)
            .await
            .expect("run panicked");
        assert!(joined.unwrap_err().is_panic());
        (replica.elector, replica.registry)
    };
    let (elector, registry) = replica;
    assert!(!elector.is_leader());
    assert_eq!(support::gauge(&registry), 0);
    wait_for_async(MARGIN, || async { lock_holders(&db).await.is_empty() })
        .await
        .expect("the server releases the lock when the session closes");
    assert!(
        logs.contains("WARN", "background leader lock abandoned after a panic"),
        "{:?}",
        logs.lines()
    );

    let shutdown = CancellationToken::new();
    let again = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    wait_for(STARTUP, || elector.is_leader())
        .await
        .expect("run works after a panic");
    shutdown.cancel();
    assert_eq!(again.await.unwrap(), Ok(()));
    db.cleanup().await.unwrap();
}

/// A layer that panics on the first "acquired background leader lock" event and records the
/// abandonment line.
#[derive(Default)]
struct PanicOnce {
    fired: std::sync::atomic::AtomicBool,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicOnce {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut message = String::new();
        event.record(
            &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                if field.name() == "message" {
                    message = format!("{value:?}");
                }
            },
        );
        if message.contains("acquired background leader lock")
            && !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("subscriber failure");
        }
    }
}

on_both_backends!(
    #[tokio::test]
    closing_or_draining_the_pool_never_ends_the_hijacked_session
);
async fn closing_or_draining_the_pool_never_ends_the_hijacked_session(backend: Backend) {
    let db = TestDb::create(&format!("pool_close_{backend}"))
        .await
        .unwrap();
    let replica = Replica::spawn(db.backend_pool(backend, "pool-close", 2).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .unwrap();
    let pid = lock_holders(&db).await;

    tokio::time::timeout(MARGIN, replica.pool.close())
        .await
        .expect("closing the pool waits for no borrowed connection");
    tokio::time::sleep(3 * I).await;

    assert!(
        replica.elector.is_leader(),
        "the leader's checks run on its own connection"
    );
    assert_eq!(
        lock_holders(&db).await,
        pid,
        "the same backend still holds the lock"
    );
    replica.stop().await.unwrap();
    assert!(lock_holders(&db).await.is_empty());
    db.cleanup().await.unwrap();
}

/// Issue 23, item 3: a permanent mistake (a role or database that does not exist) once looked
/// like a transient one (a WARN at every check, nothing typed). Now a transient failure keeps the
/// spec's WARN at every check, a permanent one is one ERROR with advice and then quiet (at most
/// one WARN a minute), and both are typed on the elector and its published value.
#[tokio::test]
async fn an_unreachable_server_warns_at_every_check_a_missing_role_or_database_is_one_error() {
    use plexsphere_leader::leadership::FailureClass;
    let (logs, _guard) = Logs::capture();
    let db = TestDb::create("unreachable").await.unwrap();
    let free_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut unreachable = tokio_postgres::Config::new();
    unreachable
        .host("127.0.0.1")
        .port(free_port)
        .user("postgres")
        .dbname(db.name())
        .password("s3cr3t-pw");
    let mut no_role = db.config();
    no_role.user("no_such_role_plx").password("s3cr3t-pw");
    let mut no_db = db.config();
    no_db.dbname("no_such_database_plx");

    let cases = [
        (unreachable, FailureClass::Transient, "Connection refused"),
        (no_role, FailureClass::Permanent, "no_such_role_plx"),
        (no_db, FailureClass::Permanent, "no_such_database_plx"),
    ];
    for (config, class, needle) in cases {
        let pool = plexsphere_leader_tests::pool_for(config, 2).unwrap();
        // Long enough that a loaded machine sets up (or is refused) a connection within one
        // check: a check that gives up on its setup is a transient failure between the
        // permanent ones, after which the permanent ERROR is said again (at 50 ms, beside
        // `stress-ng --cpu 2`: issue 49, item 6).
        let replica = Replica::spawn(pool, Duration::from_millis(250));
        wait_for(STARTUP, || {
            replica
                .elector
                .check_failure()
                .is_some_and(|failure| failure.failures >= 4)
        })
        .await
        .expect("at least four failed checks");
        assert!(!replica.elector.is_leader());
        assert!(!replica.task.is_finished(), "run keeps retrying");
        let failure = replica.elector.check_failure().expect("failing");
        assert_eq!(failure.class, class, "{needle}: {failure:?}");
        assert!(failure.error.contains(needle), "{failure:?}");
        assert_eq!(failure.advice.is_some(), class == FailureClass::Permanent);
        let published = replica
            .elector
            .leadership()
            .check_failing()
            .expect("published");
        assert_eq!((published.class, published.since), (class, failure.since));
        replica.stop().await.expect("a standby stops cleanly");
    }
    let lines = logs.lines();
    let of = |level: &str, needle: &str| {
        lines
            .iter()
            .filter(|line| {
                line.starts_with(level)
                    && line.contains("leader: acquire lock connection: ")
                    && line.contains(needle)
            })
            .count()
    };
    assert!(of("WARN", "Connection refused") >= 4, "{lines:#?}");
    assert_eq!(of("ERROR", "Connection refused"), 0, "{lines:#?}");
    for needle in ["no_such_role_plx", "no_such_database_plx"] {
        assert_eq!(of("ERROR", needle), 1, "one ERROR for {needle}: {lines:#?}");
        assert_eq!(of("WARN", needle), 0, "repeats are quiet: {lines:#?}");
    }
    assert!(
        lines.iter().any(|line| line.starts_with("ERROR")
            && line.contains("no_such_database_plx")
            && line.contains("advice: create the database")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().all(|line| !line.contains("s3cr3t-pw")),
        "no password in logs"
    );
    db.cleanup().await.unwrap();
}

/// A permanent failure still retries: the database created later is joined, and the published
/// failure ends with the first check that works.
#[tokio::test]
async fn a_database_created_later_is_joined_and_the_failure_cleared() {
    let db = TestDb::create("created_later").await.unwrap();
    let name = format!("{}_later", db.name());
    let mut later = db.config();
    later.dbname(&name);
    let pool = plexsphere_leader_tests::pool_for(later, 2).unwrap();
    let replica = Replica::spawn(pool, Duration::from_millis(50));
    wait_for(STARTUP, || replica.elector.check_failure().is_some())
        .await
        .expect("failing");
    let mut leadership = replica.elector.subscribe();
    db.admin()
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .expect("leads once the database exists");
    assert_eq!(replica.elector.check_failure(), None);
    assert!(leadership.borrow_and_update().check_failing().is_none());
    replica.stop().await.unwrap();
    db.admin()
        .batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .await
        .unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn invalid_config_is_a_typed_error_naming_the_field() {
    let db = TestDb::create("bad_config").await.unwrap();
    let pool = db.pool(1).unwrap();
    // 1 ms validated once, and no replica ever led at it (issue 23): the minimum is 50 ms.
    for given in [
        Duration::from_micros(500),
        Duration::from_millis(1),
        Duration::from_millis(49),
    ] {
        let too_short = Elector::new(Config::new(pool.clone()).check_interval(given));
        let Err(ConfigError::CheckInterval(error)) = too_short else {
            panic!("{given:?} rejected")
        };
        assert!(error.to_string().contains("check_interval"), "{error}");
        assert!(error.to_string().contains("minimum of 50ms"), "{error}");
    }
    assert!(
        Elector::new(Config::new(pool.clone()).check_interval(Duration::from_millis(50))).is_ok()
    );
    let too_long =
        Elector::new(Config::new(pool.clone()).check_interval(Duration::from_secs(600_000)));
    assert!(matches!(too_long, Err(ConfigError::CheckInterval(_))));
    let default = Elector::new(Config::new(pool)).unwrap();
    assert_eq!(default.check_interval(), Duration::from_secs(5));
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_second_concurrent_run_is_refused() {
    let db = TestDb::create("second_run").await.unwrap();
    let replica = Replica::spawn(db.pool(2).unwrap(), I);
    wait_for(STARTUP, || replica.elector.is_leader())
        .await
        .unwrap();
    let second = replica.elector.run(CancellationToken::new()).await;
    assert_eq!(second, Err(RunError::AlreadyRunning));
    assert!(
        replica.elector.is_leader(),
        "the refused run changed nothing"
    );
    replica.stop().await.unwrap();
    db.cleanup().await.unwrap();
}

/// Issue 23, item 4: through sqlx a refused TCP connection was reported as `no answer within
/// 1s` (sqlx's pool retries a refused connect silently); the check now reports the refusal.
#[tokio::test]
async fn sqlx_reports_a_refused_connection_as_refused() {
    let free_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let options = sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(free_port)
        .username("postgres");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(options);
    let elector = Elector::new(
        plexsphere_leader_sqlx::config(pool).check_interval(Duration::from_millis(500)),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    wait_for(STARTUP, || elector.check_failure().is_some())
        .await
        .expect("a failed check");
    let failure = elector.check_failure().expect("failing");
    assert!(
        failure.error.contains("Connection refused")
            && failure.error.contains(&format!("127.0.0.1:{free_port}")),
        "{failure:?}"
    );
    assert!(!failure.error.contains("no answer"), "{failure:?}");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}
