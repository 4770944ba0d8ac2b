//! The statements of a sharded election (`plexsphere_leader::shard_sql`) against the real local
//! PostgreSQL, sent over the simple query protocol exactly as a `LockSession` sends them, and
//! their rows read by the module's parsers. Each test has its own database: advisory locks are
//! per database, so tests running at the same time never see each other's locks.

use std::collections::BTreeSet;
use std::time::Duration;

use plexsphere_leader::session::Row;
use plexsphere_leader::shard_sql::{self, OwnerRow, Registered, SurveyRows};
use plexsphere_leader_core::shards::{MemberId, Shard};
use plexsphere_leader_tests::{TestDb, simple_rows};
use tokio_postgres::Client;

/// The shard space of these tests.
const CLASS: i32 = 4242;
/// Its number of shards.
const COUNT: u32 = 8;
/// The `idle_session_timeout` a registration sets, in milliseconds.
const IDLE_MS: u32 = 20_000;

/// Every row of `statement`, each column as text, as `LockSession::query` returns them.
async fn rows(client: &Client, statement: &str) -> Vec<Row> {
    simple_rows(client, statement).await.expect(statement)
}

/// The one text column of the one row of `statement`.
async fn scalar(client: &Client, statement: &str) -> Option<String> {
    let rows = rows(client, statement).await;
    assert_eq!(rows.len(), 1, "{statement}");
    rows[0][0].clone()
}

async fn pid(client: &Client) -> MemberId {
    let pid = scalar(client, "SELECT pg_backend_pid()").await;
    MemberId::new(pid.expect("a pid").parse().expect("an int4"))
}

fn shards(numbers: impl IntoIterator<Item = u32>) -> Vec<Shard> {
    numbers.into_iter().map(Shard::new).collect()
}

/// A new session on `db`, whose connection-time `application_name` is `app`.
async fn session(db: &TestDb, app: &str) -> Client {
    db.connect(app).await.expect("connect")
}

async fn register(client: &Client, class: i32, identity: &str) -> Registered {
    let statement = shard_sql::register(class, identity, IDLE_MS);
    shard_sql::parse_registered(&rows(client, &statement).await).expect("register rows")
}

async fn survey(client: &Client, class: i32, count: u32) -> SurveyRows {
    let statement = shard_sql::survey(class, count, plexsphere_leader::rank::FloorStep::Off);
    shard_sql::parse_survey(count, &rows(client, &statement).await, false).expect("survey rows")
}

async fn take(client: &Client, class: i32, asked: &[Shard]) -> Vec<Shard> {
    let statement = shard_sql::take(class, asked);
    shard_sql::parse_taken(&rows(client, &statement).await).expect("take rows")
}

async fn unlock(client: &Client, class: i32, asked: &[Shard]) -> Vec<Shard> {
    let statement = shard_sql::unlock(class, asked);
    shard_sql::parse_unlocked(&rows(client, &statement).await).expect("unlock rows")
}

async fn owners(client: &Client, class: i32, count: u32) -> Vec<OwnerRow> {
    let statement = shard_sql::owners(class, count);
    shard_sql::parse_owners(&rows(client, &statement).await).expect("owners rows")
}

#[tokio::test]
async fn register_grants_the_shared_member_lock_to_two_sessions_and_counts_members() {
    let db = TestDb::create("shard_register").await.expect("database");
    let (a, b) = (session(&db, "conn-a").await, session(&db, "conn-b").await);

    let first = register(&a, CLASS, "alpha@host").await;
    assert_eq!(first.backend, pid(&a).await);
    assert!(first.granted && !first.in_recovery, "{first:?}");
    assert_eq!(first.members, 1);
    let second = register(&b, CLASS, "beta@host").await;
    assert_eq!(second.backend, pid(&b).await);
    assert!(second.granted, "{second:?}");
    assert_eq!(second.members, 2);

    // Granted: bounded and named, session-level (they outlive the statement's transaction).
    let setting = "SELECT current_setting('idle_session_timeout')";
    assert_eq!(scalar(&a, setting).await.as_deref(), Some("20s"));
    let setting = "SELECT current_setting('idle_in_transaction_session_timeout')";
    assert_eq!(scalar(&b, setting).await.as_deref(), Some("20s"));
    let name = "SELECT current_setting('application_name')";
    assert_eq!(scalar(&a, name).await.as_deref(), Some("alpha@host"));
    assert_eq!(scalar(&b, name).await.as_deref(), Some("beta@host"));
    let mode = "SELECT string_agg(mode, ',') FROM pg_locks WHERE locktype = 'advisory' \
                AND pid = pg_backend_pid()";
    assert_eq!(scalar(&a, mode).await.as_deref(), Some("ShareLock"));

    // An observer counts both, and the count leaves itself out whatever it holds.
    let again = register(&a, CLASS, "alpha@host").await;
    assert_eq!((again.granted, again.members), (true, 2));
    let read = survey(&b, CLASS, COUNT).await;
    assert_eq!(read.survey.members().len(), 2);

    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn register_is_refused_without_side_effects_while_the_member_key_is_held_exclusively() {
    let db = TestDb::create("shard_register_refused")
        .await
        .expect("database");
    let (holder, joiner) = (session(&db, "holder").await, session(&db, "joiner").await);
    let lock = format!("SELECT pg_advisory_lock({CLASS}, -1)");
    rows(&holder, &lock).await;

    let refused = register(&joiner, CLASS, "late@host").await;
    assert_eq!(refused.backend, pid(&joiner).await);
    assert!(!refused.granted, "{refused:?}");
    // The exclusive holder is no member.
    assert_eq!(refused.members, 0);
    let setting = "SELECT current_setting('idle_session_timeout')";
    assert_eq!(scalar(&joiner, setting).await.as_deref(), Some("0"));
    let name = "SELECT current_setting('application_name')";
    assert_eq!(scalar(&joiner, name).await.as_deref(), Some("joiner"));
    let held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                AND pid = pg_backend_pid()";
    assert_eq!(scalar(&joiner, held).await.as_deref(), Some("0"));

    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn the_lock_capacity_is_the_product_of_the_servers_settings() {
    let db = TestDb::create("shard_capacity").await.expect("database");
    let a = session(&db, "a").await;
    let registered = register(&a, CLASS, "a").await;
    let product = |name: &str| format!("SELECT current_setting('{name}')::int8");
    let mut settings = Vec::new();
    for name in [
        "max_locks_per_transaction",
        "max_connections",
        "max_prepared_transactions",
    ] {
        let value = scalar(&a, &product(name)).await.expect("a setting");
        settings.push(value.parse::<u64>().expect("a number"));
    }
    assert_eq!(
        registered.lock_capacity,
        settings[0] * (settings[1] + settings[2]),
        "{settings:?}"
    );
    println!(
        "lock capacity {} from {settings:?}",
        registered.lock_capacity
    );
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn an_empty_space_surveys_as_one_row_without_holder() {
    let db = TestDb::create("shard_survey_empty")
        .await
        .expect("database");
    let a = session(&db, "a").await;
    // A lock of another class and one of the class outside the space are not the space's.
    rows(&a, &format!("SELECT pg_advisory_lock({}, 0)", CLASS + 1)).await;
    rows(&a, &format!("SELECT pg_advisory_lock({CLASS}, {COUNT})")).await;
    rows(&a, &format!("SELECT pg_advisory_lock({CLASS}, -2)")).await;

    let raw = rows(
        &a,
        &shard_sql::survey(CLASS, COUNT, plexsphere_leader::rank::FloorStep::Off),
    )
    .await;
    let me = pid(&a).await;
    assert_eq!(
        raw,
        vec![vec![None, None, None, None, Some(me.get().to_string())]]
    );
    let read = shard_sql::parse_survey(COUNT, &raw, false).expect("parses");
    assert_eq!(read.survey.backend(), me);
    assert!(read.survey.members().is_empty());
    assert_eq!(read.survey.held_count(), 0);
    assert!(owners(&a, CLASS, COUNT).await.is_empty());
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn the_survey_shows_members_their_shards_holders_without_membership_and_names() {
    let db = TestDb::create("shard_survey").await.expect("database");
    let (a, b, c) = (
        session(&db, "conn-a").await,
        session(&db, "conn-b").await,
        session(&db, "conn-c").await,
    );
    let (pa, pb, pc) = (pid(&a).await, pid(&b).await, pid(&c).await);
    register(&a, CLASS, "alpha@host").await;
    register(&b, CLASS, "beta@host").await;
    assert_eq!(take(&a, CLASS, &shards([0, 1, 2])).await, shards([0, 1, 2]));
    assert_eq!(take(&b, CLASS, &shards([3, 4])).await, shards([3, 4]));
    // A backend outside the protocol: a shard without the member lock.
    assert_eq!(take(&c, CLASS, &shards([6])).await, shards([6]));

    let read = survey(&a, CLASS, COUNT).await;
    let mut members = vec![pa, pb];
    members.sort_unstable();
    assert_eq!(read.survey.backend(), pa);
    assert_eq!(read.survey.members(), members.as_slice());
    assert_eq!(read.survey.held_by(pa), shards([0, 1, 2]));
    assert_eq!(read.survey.held_by(pb), shards([3, 4]));
    assert_eq!(read.survey.holder(Shard::new(6)), Some(pc));
    assert_eq!(read.survey.holder(Shard::new(5)), None);
    assert_eq!(read.names.get(&pa).map(String::as_str), Some("alpha@host"));
    assert_eq!(read.names.get(&pb).map(String::as_str), Some("beta@host"));
    assert_eq!(read.names.get(&pc).map(String::as_str), Some("conn-c"));
    // The other member sees the same space, answered by its own backend.
    let from_b = survey(&b, CLASS, COUNT).await;
    assert_eq!(from_b.survey.backend(), pb);
    assert_eq!(
        from_b.survey.holders().collect::<Vec<_>>(),
        read.survey.holders().collect::<Vec<_>>()
    );

    // Any session (here the harness's, no member) reads who owns what.
    let mut expected = vec![
        OwnerRow {
            pid: pa,
            name: Some("alpha@host".to_owned()),
            member: true,
            shards: shards([0, 1, 2]),
            rank: None,
        },
        OwnerRow {
            pid: pb,
            name: Some("beta@host".to_owned()),
            member: true,
            shards: shards([3, 4]),
            rank: None,
        },
        OwnerRow {
            pid: pc,
            name: Some("conn-c".to_owned()),
            member: false,
            shards: shards([6]),
            rank: None,
        },
    ];
    expected.sort_by_key(|row| row.pid);
    assert_eq!(owners(db.admin(), CLASS, COUNT).await, expected);
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn racing_takes_of_overlapping_sets_grant_disjoint_shards() {
    let db = TestDb::create("shard_take_race").await.expect("database");
    let (a, b) = (session(&db, "a").await, session(&db, "b").await);
    let (pa, pb) = (pid(&a).await, pid(&b).await);
    register(&a, CLASS, "a").await;
    register(&b, CLASS, "b").await;
    // Long lists, so the two statements run at the same time on the server.
    let count = 1536;
    let ask_a = shards(0..1024);
    let ask_b = shards(512..1536);
    for round in 0..10 {
        let (got_a, got_b) = tokio::join!(take(&a, CLASS, &ask_a), take(&b, CLASS, &ask_b));
        let set_a: BTreeSet<Shard> = got_a.iter().copied().collect();
        let set_b: BTreeSet<Shard> = got_b.iter().copied().collect();
        assert!(set_a.is_disjoint(&set_b), "round {round}");
        assert!(got_a.iter().all(|s| ask_a.contains(s)), "round {round}");
        assert!(got_b.iter().all(|s| ask_b.contains(s)), "round {round}");
        assert_eq!(
            set_a.len() + set_b.len(),
            count as usize,
            "round {round}: every shard went"
        );
        assert!(got_a.windows(2).all(|w| w[0] < w[1]), "ascending");
        let contested = |got: &[Shard]| {
            got.iter()
                .filter(|s| (512..1024).contains(&s.get()))
                .count()
        };
        println!(
            "round {round}: of the 512 contested shards a got {}, b got {}",
            contested(&got_a),
            contested(&got_b)
        );
        let read = survey(&a, CLASS, count).await;
        assert_eq!(read.survey.held_by(pa), got_a, "round {round}");
        assert_eq!(read.survey.held_by(pb), got_b, "round {round}");
        // A second take of the other's shards is refused outright.
        assert!(take(&a, CLASS, &got_b).await.is_empty(), "round {round}");
        assert!(unlock(&a, CLASS, &got_a).await.is_empty());
        assert!(unlock(&b, CLASS, &got_b).await.is_empty());
    }
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn unlock_returns_the_shards_that_were_not_held() {
    let db = TestDb::create("shard_unlock").await.expect("database");
    let (a, b) = (session(&db, "a").await, session(&db, "b").await);
    let (pa, pb) = (pid(&a).await, pid(&b).await);
    register(&a, CLASS, "a").await;
    register(&b, CLASS, "b").await;
    take(&a, CLASS, &shards([0, 1, 2])).await;
    take(&b, CLASS, &shards([5])).await;

    assert_eq!(
        unlock(&a, CLASS, &shards([1, 2, 3, 5])).await,
        shards([3, 5])
    );
    let read = survey(&b, CLASS, COUNT).await;
    assert_eq!(read.survey.held_by(pa), shards([0]));
    assert_eq!(
        read.survey.held_by(pb),
        shards([5]),
        "another's shard stays"
    );
    assert_eq!(read.survey.members().len(), 2, "the member lock stays");
    assert!(unlock(&a, CLASS, &[]).await.is_empty());
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn unlock_all_frees_every_lock_for_the_other_sessions_survey() {
    let db = TestDb::create("shard_unlock_all").await.expect("database");
    let (a, b) = (session(&db, "a").await, session(&db, "b").await);
    let (pa, pb) = (pid(&a).await, pid(&b).await);
    register(&a, CLASS, "a").await;
    // Registered twice: the shared lock is counted twice, and unlock_all frees both.
    register(&a, CLASS, "a").await;
    register(&b, CLASS, "b").await;
    take(&a, CLASS, &shards(0..4)).await;
    assert_eq!(survey(&b, CLASS, COUNT).await.survey.held_by(pa).len(), 4);

    let done = rows(&a, &shard_sql::unlock_all()).await;
    assert_eq!(done, vec![vec![Some(String::new())]]);
    let read = survey(&b, CLASS, COUNT).await;
    assert_eq!(read.survey.members(), &[pb]);
    assert_eq!(read.survey.held_count(), 0);
    assert!(!read.names.contains_key(&pa));
    // Free for the other member at once.
    assert_eq!(take(&b, CLASS, &shards(0..4)).await, shards(0..4));
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn a_closed_sessions_locks_vanish_from_the_survey() {
    let db = TestDb::create("shard_closed").await.expect("database");
    let (a, b) = (session(&db, "a").await, session(&db, "b").await);
    let (pa, pb) = (pid(&a).await, pid(&b).await);
    register(&a, CLASS, "a").await;
    register(&b, CLASS, "b").await;
    take(&a, CLASS, &shards(0..COUNT)).await;
    drop(a);

    // The backend exits after the client's Terminate arrives: poll for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = survey(&b, CLASS, COUNT).await;
        if !read.survey.members().contains(&pa) || tokio::time::Instant::now() > deadline {
            break read;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(read.survey.members(), &[pb]);
    assert_eq!(read.survey.held_count(), 0);
    assert_eq!(owners(db.admin(), CLASS, COUNT).await.len(), 1);
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn a_negative_class_shows_in_pg_locks_as_an_oid_and_works() {
    let db = TestDb::create("shard_negative_class")
        .await
        .expect("database");
    let (a, b) = (session(&db, "a").await, session(&db, "b").await);
    let (pa, pb) = (pid(&a).await, pid(&b).await);
    let class = -7;
    // Its positive twin is another space.
    register(&b, 7, "b").await;
    take(&b, 7, &shards([1])).await;

    let registered = register(&a, class, "neg").await;
    assert_eq!((registered.granted, registered.members), (true, 1));
    assert_eq!(take(&a, class, &shards([1, 2])).await, shards([1, 2]));
    let raw = rows(
        &a,
        "SELECT classid::text, objid::text, mode FROM pg_locks \
         WHERE locktype = 'advisory' AND pid = pg_backend_pid() ORDER BY objid",
    )
    .await;
    let text = |c: &str| Some(c.to_owned());
    assert_eq!(
        raw,
        vec![
            vec![text("4294967289"), text("1"), text("ExclusiveLock")],
            vec![text("4294967289"), text("2"), text("ExclusiveLock")],
            vec![text("4294967289"), text("4294967295"), text("ShareLock")],
        ]
    );
    let read = survey(&a, class, COUNT).await;
    assert_eq!(read.survey.members(), &[pa]);
    assert_eq!(read.survey.held_by(pa), shards([1, 2]));
    assert_eq!(read.survey.holder(Shard::new(1)), Some(pa));
    let twin = survey(&a, 7, COUNT).await;
    assert_eq!(twin.survey.members(), &[pb]);
    assert_eq!(twin.survey.held_by(pb), shards([1]));
    assert_eq!(unlock(&a, class, &shards([1, 2, 3])).await, shards([3]));
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn a_take_of_1024_shards_is_one_statement() {
    let db = TestDb::create("shard_take_1024").await.expect("database");
    let (a, b) = (session(&db, "a").await, session(&db, "b").await);
    let pa = pid(&a).await;
    register(&a, CLASS, "a").await;
    register(&b, CLASS, "b").await;
    let all = shards(0..1024);
    assert_eq!(take(&a, CLASS, &all).await, all);
    assert!(take(&b, CLASS, &all).await.is_empty());
    let read = survey(&b, CLASS, 1024).await;
    assert_eq!(read.survey.held_by(pa), all);
    let listed = owners(db.admin(), CLASS, 1024).await;
    assert_eq!(listed.iter().map(|o| o.shards.len()).sum::<usize>(), 1024);
    assert!(unlock(&a, CLASS, &all).await.is_empty());
    assert_eq!(unlock(&a, CLASS, &all).await, all, "none held any more");
    db.cleanup().await.expect("drop database");
}

#[tokio::test]
async fn each_statement_reads_pg_locks_once() {
    let db = TestDb::create("shard_plans").await.expect("database");
    let a = session(&db, "a").await;
    for (name, statement) in [
        ("register", shard_sql::register(CLASS, "a", IDLE_MS)),
        (
            "survey",
            shard_sql::survey(CLASS, 1024, plexsphere_leader::rank::FloorStep::Off),
        ),
        ("owners", shard_sql::owners(CLASS, 1024)),
    ] {
        let plan = rows(&a, &format!("EXPLAIN {statement}")).await;
        let plan: Vec<String> = plan.into_iter().filter_map(|r| r[0].clone()).collect();
        let scans = plan
            .iter()
            .filter(|line| line.contains("pg_lock_status"))
            .count();
        assert_eq!(scans, 1, "{name}:\n{}", plan.join("\n"));
    }
    db.cleanup().await.expect("drop database");
}
