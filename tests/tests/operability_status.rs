//! Operability against the real local PostgreSQL: the leader's identity in its lock session's
//! `application_name`, `status::who_leads`, the `plexsphere-leader status` command (in-process;
//! the binary itself is run by `adapters/cli/tests/cli_binary.rs`), several elections with their
//! own keys on one database, and the identity's validation. Each test has its own database and
//! a 200 ms check interval; time bounds carry the documented `MARGIN` (5 s).

mod support;

use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use plexsphere_leader::status::{self, Since};
use plexsphere_leader::{
    Config, ConfigError, Elector, LockKey,
    config::{IdentityError, MAX_IDENTITY_LEN},
    sql,
};
use plexsphere_leader_cli as cli;
use plexsphere_leader_tests::replica_process::dsn;
use plexsphere_leader_tests::{TestDb, base_config, pool_for};
use support::{I, MARGIN, Replica, STARTUP, wait_for, wait_for_async};

/// An elector of election `key` called `identity`, running in a task.
struct Member {
    elector: Elector,
    replica: Replica,
}

impl Member {
    fn spawn(pool: Pool, key: LockKey, identity: &str) -> Self {
        let replica = Replica::spawn_with(pool, I, |config| config.key(key).identity(identity));
        Self {
            elector: replica.elector.clone(),
            replica,
        }
    }

    async fn leads(&self) {
        wait_for(STARTUP, || self.elector.is_leader())
            .await
            .unwrap_or_else(|| panic!("{} leads", self.elector.identity()));
    }

    async fn stop(self) {
        self.replica.stop().await.expect("run ends well");
    }
}

/// The granted holders of `key`'s lock in the test's database.
async fn holders(db: &TestDb, key: LockKey) -> Vec<i32> {
    let rows = db
        .admin()
        .query(&sql::leader_query(key), &[])
        .await
        .expect("pg_locks");
    rows.iter()
        .filter(|row| row.get::<_, bool>(1))
        .map(|row| row.get(0))
        .collect()
}

/// `(pid, application_name)` of every session of the test's database but the harness's.
async fn sessions(db: &TestDb) -> Vec<(i32, String)> {
    let rows = db
        .admin()
        .query(
            "SELECT pid, application_name FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_activity");
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

#[tokio::test]
async fn the_identity_and_grant_time_name_the_lock_session_only() {
    let db = TestDb::create("op_identity").await.unwrap();
    let before = SystemTime::now();
    let leader = Member::spawn(
        db.pool_with_app_name("pool-a", 4).unwrap(),
        LockKey::DEFAULT,
        "svc-a@host-1",
    );
    leader.leads().await;
    let led = SystemTime::now();
    let standby = Member::spawn(
        db.pool_with_app_name("pool-b", 4).unwrap(),
        LockKey::DEFAULT,
        "svc-b@host-2",
    );
    // The standby's refused checks run on its pooled sessions.
    tokio::time::sleep(4 * I).await;
    assert!(!standby.elector.is_leader());

    let lock_pid = holders(&db, LockKey::DEFAULT).await;
    assert_eq!(lock_pid.len(), 1);
    let all = sessions(&db).await;
    let (_, name) = all
        .iter()
        .find(|(pid, _)| *pid == lock_pid[0])
        .expect("the lock session is in pg_stat_activity");
    let (identity, since) = status::parse_application_name(name).expect("<identity> since <t>");
    assert_eq!(identity, "svc-a@host-1");
    // Whole seconds of the server's clock, on this machine: within the test's own window,
    // widened by a second of truncation and the margin.
    assert!(since + Duration::from_secs(1) + MARGIN >= before, "{name}");
    assert!(since <= led + MARGIN, "{name}");
    for (pid, name) in &all {
        if *pid != lock_pid[0] {
            assert!(
                name == "pool-a" || name == "pool-b",
                "session {pid} keeps its pool's name, not {name:?}"
            );
        }
    }
    assert!(
        all.iter().any(|(_, name)| name == "pool-b"),
        "the standby's pooled sessions are there, named by their pool"
    );
    standby.stop().await;
    leader.stop().await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn who_leads_names_the_leader_its_backend_and_since_when() {
    let db = TestDb::create("op_who_leads").await.unwrap();
    assert_eq!(
        status::who_leads(db.admin(), LockKey::DEFAULT)
            .await
            .unwrap(),
        None,
        "no replica leads yet"
    );
    let before = SystemTime::now();
    let leader = Member::spawn(db.pool(2).unwrap(), LockKey::DEFAULT, "who-leads@test");
    leader.leads().await;
    let led = SystemTime::now();

    let status = status::who_leads(db.admin(), LockKey::DEFAULT)
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(status.identity.as_deref(), Some("who-leads@test"));
    assert_eq!(vec![status.pid], holders(&db, LockKey::DEFAULT).await);
    let Since::Granted(since) = status.since else {
        panic!("the grant time is in application_name: {status:?}");
    };
    assert!(since + Duration::from_secs(1) + MARGIN >= before);
    assert!(since <= led + MARGIN);
    assert!(status.leading_for().expect("known") < STARTUP + MARGIN);
    assert_eq!(
        status.client_addr.as_deref(),
        Some("127.0.0.1"),
        "a superuser sees the client address"
    );
    assert!(status.client_port.is_some_and(|port| port > 0));
    assert_eq!(status.user.as_deref(), Some("postgres"));
    assert!(status.waiting.is_empty());
    let through_elector = leader.elector.who_leads().await.unwrap().expect("a leader");
    assert_eq!(through_elector.pid, status.pid);
    assert_eq!(through_elector.since, status.since);

    leader.stop().await;
    assert_eq!(
        status::who_leads(db.admin(), LockKey::DEFAULT)
            .await
            .unwrap(),
        None,
        "a graceful stop unlocks"
    );
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_lock_taken_by_hand_falls_back_to_the_session_start() {
    let db = TestDb::create("op_by_hand").await.unwrap();
    let holder = db.connect("by-hand").await.unwrap();
    holder
        .batch_execute("SELECT pg_advisory_lock(1886156915, 1)")
        .await
        .unwrap();
    let status = status::who_leads(db.admin(), LockKey::DEFAULT)
        .await
        .unwrap()
        .expect("the lock is held");
    assert_eq!(status.identity, None, "`by-hand` is no leader's name");
    assert_eq!(status.application_name.as_deref(), Some("by-hand"));
    assert!(
        matches!(status.since, Since::SessionStart(_)),
        "backend_start, a lower bound: {status:?}"
    );
    drop(holder);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn the_status_command_prints_the_leader_and_exits_by_the_documented_codes() {
    let db = TestDb::create("op_cli").await.unwrap();
    let dsn = dsn(&db.config());
    let key = LockKey::new(-17, 4);
    let status_of = |format: &'static str| {
        let dsn = dsn.clone();
        async move {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let args = [
                "plexsphere-leader",
                "status",
                "--dsn",
                dsn.as_str(),
                "--key",
                "-17:4",
                "--format",
                format,
            ];
            let code = cli::run(args, &mut out, &mut err).await;
            (
                code,
                String::from_utf8(out).unwrap(),
                String::from_utf8(err).unwrap(),
            )
        }
    };

    let (code, out, _) = status_of("text").await;
    assert_eq!(code, cli::EXIT_NO_LEADER, "{out}");
    assert_eq!(
        out,
        format!(
            "election -17:4 on database {:?}: no replica leads\n",
            db.name()
        )
    );

    let leader = Member::spawn(db.pool(2).unwrap(), key, "cli@test");
    leader.leads().await;
    let (code, out, err) = status_of("text").await;
    assert_eq!(code, cli::EXIT_LEADER, "{out}{err}");
    let pid = holders(&db, key).await[0];
    assert!(out.contains("led by \"cli@test\""), "{out}");
    assert!(
        out.contains(&format!("backend: pid {pid}, user postgres")),
        "{out}"
    );
    assert!(out.contains("client:  127.0.0.1:"), "{out}");
    assert!(
        out.contains("grant time in application_name, server clock"),
        "{out}"
    );
    let (code, out, _) = status_of("json").await;
    assert_eq!(code, cli::EXIT_LEADER);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["key"], "-17:4");
    assert_eq!(json["leader"]["identity"], "cli@test");
    assert_eq!(json["leader"]["pid"], pid);
    assert_eq!(json["leader"]["since_source"], "granted");

    leader.stop().await;
    let (code, out, _) = status_of("json").await;
    assert_eq!(code, cli::EXIT_NO_LEADER);
    assert!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["leader"].is_null());

    // Nothing listens on port 1: the question cannot be answered.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let args = [
        "plexsphere-leader",
        "status",
        "--dsn",
        "host=127.0.0.1 port=1 user=x",
    ];
    assert_eq!(cli::run(args, &mut out, &mut err).await, cli::EXIT_ERROR);
    assert!(
        String::from_utf8(err)
            .unwrap()
            .starts_with("plexsphere-leader status: ")
    );
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn elections_with_their_own_keys_never_interfere() {
    let db = TestDb::create("op_keys").await.unwrap();
    let (one, two) = (LockKey::new(7, 1), LockKey::new(7, 2));
    let a1 = Member::spawn(db.pool(2).unwrap(), one, "a@one");
    let a2 = Member::spawn(db.pool(2).unwrap(), two, "a@two");
    let a0 = Member::spawn(db.pool(2).unwrap(), LockKey::DEFAULT, "a@default");
    for member in [&a1, &a2, &a0] {
        member.leads().await;
    }
    let b1 = Member::spawn(db.pool(2).unwrap(), one, "b@one");
    tokio::time::sleep(2 * I).await;
    assert!(!b1.elector.is_leader(), "key one has its leader");
    assert_eq!(a1.elector.key(), one);

    let rows = db
        .admin()
        .query(
            "SELECT classid::int8, objid::int8, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND granted AND objsubid = 2 \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             ORDER BY classid::int8, objid::int8",
            &[],
        )
        .await
        .unwrap();
    let keys: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        keys,
        [(7, 1), (7, 2), (1_886_156_915, 1)],
        "three elections"
    );
    let mut pids: Vec<i32> = rows.iter().map(|r| r.get(2)).collect();
    pids.dedup();
    assert_eq!(pids.len(), 3, "three different sessions");
    for (key, identity) in [
        (one, "a@one"),
        (two, "a@two"),
        (LockKey::DEFAULT, "a@default"),
    ] {
        let status = status::who_leads(db.admin(), key)
            .await
            .unwrap()
            .expect("led");
        assert_eq!(status.identity.as_deref(), Some(identity));
    }

    let (term2, term0) = (
        a2.elector.leadership().term().map(|t| t.id),
        a0.elector.leadership().term().map(|t| t.id),
    );
    let (pid2, pid0) = (
        holders(&db, two).await,
        holders(&db, LockKey::DEFAULT).await,
    );
    a1.stop().await;
    let took_over = wait_for(I + MARGIN, || b1.elector.is_leader()).await;
    assert!(
        took_over.is_some(),
        "key one's standby leads within I + margin"
    );
    let admin = db.admin();
    let ok = wait_for_async(MARGIN, || async move {
        status::who_leads(admin, one)
            .await
            .unwrap()
            .and_then(|s| s.identity)
            .as_deref()
            == Some("b@one")
    })
    .await;
    assert!(ok.is_some(), "the server names b@one for key one");
    assert!(a2.elector.is_leader() && a0.elector.is_leader());
    assert_eq!(
        a2.elector.leadership().term().map(|t| t.id),
        term2,
        "key two's term went on"
    );
    assert_eq!(
        a0.elector.leadership().term().map(|t| t.id),
        term0,
        "the default key's term went on"
    );
    assert_eq!(holders(&db, two).await, pid2);
    assert_eq!(holders(&db, LockKey::DEFAULT).await, pid0);

    for member in [b1, a2, a0] {
        member.stop().await;
    }
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn an_invalid_identity_is_a_typed_config_error() {
    let pool = pool_for(base_config().unwrap(), 1).unwrap();
    let build = |identity: &str| Elector::new(Config::new(pool.clone()).identity(identity));
    assert!(matches!(
        build(""),
        Err(ConfigError::Identity(IdentityError::Empty))
    ));
    assert!(matches!(
        build("tab\there"),
        Err(ConfigError::Identity(IdentityError::NotPrintableAscii {
            at: 3,
            ..
        }))
    ));
    assert!(matches!(
        build("naïve"),
        Err(ConfigError::Identity(IdentityError::NotPrintableAscii {
            at: 2,
            ..
        }))
    ));
    let long = "x".repeat(MAX_IDENTITY_LEN + 1);
    assert!(matches!(
        build(&long),
        Err(ConfigError::Identity(IdentityError::TooLong { len, .. })) if len == MAX_IDENTITY_LEN + 1
    ));
    let fits = build(&"x".repeat(MAX_IDENTITY_LEN)).expect("46 bytes fit");
    assert_eq!(fits.identity().len(), MAX_IDENTITY_LEN);
    let default = Elector::new(Config::new(pool.clone())).expect("the default identity is valid");
    assert!(
        default.identity().starts_with("operability_status"),
        "{}",
        default.identity()
    );
    assert_eq!(default.key(), LockKey::DEFAULT);
}
