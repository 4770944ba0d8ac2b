//! The `plexsphere-leader` binary itself, against the real local PostgreSQL
//! (`PLEXSPHERE_TEST_DSN`, default `host=127.0.0.1 port=5432 user=postgres dbname=postgres`):
//! a session of a database made for the test takes a lock with the elector's own grant
//! statement, and `plexsphere-leader status` reports it with exit 0, then exit 1 once it is
//! released, and exit 2 when the server cannot be reached. The in-process tests of the same
//! command are in `tests/tests/operability_status.rs`.
#![allow(clippy::unwrap_used)] // tests: an unexpected failure is the assertion
#![allow(missing_docs)] // test functions

use std::process::Command;
use std::str::FromStr;

use plexsphere_leader::{LockKey, sql};
use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage};

fn base_dsn() -> String {
    std::env::var("PLEXSPHERE_TEST_DSN")
        .ok()
        .filter(|dsn| !dsn.trim().is_empty())
        .unwrap_or_else(|| "host=127.0.0.1 port=5432 user=postgres dbname=postgres".to_owned())
}

async fn connect(dsn: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(dsn, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// `plexsphere-leader status --dsn <dsn> --key <key>`: exit code, stdout, stderr.
fn status(dsn: &str, key: LockKey, format: &str) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_plexsphere-leader"))
        .args(["status", "--dsn", dsn, "--key", &key.to_string()])
        .args(["--format", format])
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn the_binary_reports_the_leader_then_none_then_an_error() {
    let base = base_dsn();
    let admin = connect(&base).await;
    let database = format!("plx_cli_binary_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let mut config = Config::from_str(&base).unwrap();
    config.dbname(&database);
    let dsn = format!("{base} dbname={database}");
    let (holder, connection) = config.connect(NoTls).await.unwrap();
    let connection = tokio::spawn(connection);
    let key = LockKey::new(42, -42);

    let (code, out, err) = status(&dsn, key, "text");
    assert_eq!(
        (code, out.as_str()),
        (
            1,
            format!("election 42:-42 on database \"{database}\": no replica leads\n").as_str()
        ),
        "{err}"
    );

    let granted = holder
        .simple_query(&sql::try_lock(key, "binary@test", 60_000))
        .await
        .unwrap();
    let outcome = granted.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    assert_eq!(outcome.as_deref(), Some("granted"));
    let (code, out, err) = status(&dsn, key, "text");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("led by \"binary@test\""), "{out}");
    assert!(
        out.contains("grant time in application_name, server clock"),
        "{out}"
    );
    let (code, out, _) = status(&dsn, key, "json");
    assert_eq!(code, 0);
    assert!(out.contains("\"identity\":\"binary@test\""), "{out}");

    // The DSN from the environment alone, so that a password need not show in `ps`.
    let output = Command::new(env!("CARGO_BIN_EXE_plexsphere-leader"))
        .args(["status", "--key", &key.to_string()])
        .env("PLEXSPHERE_DSN", &dsn)
        .output()
        .unwrap();
    let out = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("led by \"binary@test\""), "{out}");
    assert!(!out.contains(&dsn), "the DSN is never printed");

    holder.simple_query(&sql::unlock(key)).await.unwrap();
    let (code, _, _) = status(&dsn, key, "text");
    assert_eq!(code, 1);

    let (code, out, err) = status("host=127.0.0.1 port=1 user=x", key, "text");
    assert_eq!(code, 2, "{out}");
    assert!(err.starts_with("plexsphere-leader status: "), "{err}");
    assert!(
        err.contains("Connection refused"),
        "the cause is printed: {err}"
    );

    drop(holder);
    let _ = connection.await;
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await
        .unwrap();
}

/// A server that accepts TCP and never answers must not hang `status`: `--timeout` bounds the
/// connection and the query together.
#[tokio::test]
async fn a_server_that_never_answers_fails_after_the_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts (the kernel completes the handshake from the backlog) and never reads or writes.
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_plexsphere-leader"))
        .args(["status", "--timeout", "300ms", "--dsn"])
        .arg(format!("host=127.0.0.1 port={port} user=x"))
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("status: no answer within 300ms"),
        "the timeout is the cause: {err}"
    );
    // Generous: the bound is 300 ms; a loaded 2-core machine may start the process slowly.
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    drop(silent);
}

/// `plexsphere-leader shards` with `extra` arguments: exit code and stdout.
fn shards_with(dsn: &str, class: i32, count: u32, format: &str, extra: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_plexsphere-leader"))
        .args(["shards", "--dsn", dsn, "--class", &class.to_string()])
        .args(["--shards", &count.to_string(), "--format", format])
        .args(extra)
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
    )
}

/// `plexsphere-leader shards` of a space held by advisory locks.
fn shards(dsn: &str, class: i32, count: u32, format: &str) -> (i32, String) {
    shards_with(dsn, class, count, format, &[])
}

/// A database of its own for a test, dropped by the returned closure's caller.
async fn database(admin: &Client, name: &str) -> String {
    let database = format!("{name}_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    database
}

#[tokio::test]
async fn the_binary_reports_who_owns_which_shards_of_a_lease_space() {
    use plexsphere_leader::shard_sql::lease;
    use plexsphere_leader::sharded::Shard;

    let base = base_dsn();
    let admin = connect(&base).await;
    let database = database(&admin, "plx_cli_lease_shards").await;
    let dsn = format!("{base} dbname={database}");
    let client = connect(&dsn).await;
    client.batch_execute(&lease::setup("public")).await.unwrap();
    let class = 42;
    let rows = |messages: Vec<SimpleQueryMessage>| -> Vec<Vec<Option<String>>> {
        messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    };
    let registered = client
        .simple_query(&lease::register(
            "public",
            class,
            "cli-member 0f",
            60_000,
            plexsphere_leader::rank::FloorStep::Off,
        ))
        .await
        .unwrap();
    let member = lease::parse_registered(&rows(registered)).unwrap().member;
    let asked: Vec<Shard> = (0..6).map(Shard::new).collect();
    client
        .simple_query(&lease::take("public", class, member, &asked, 1_000))
        .await
        .unwrap();
    let (code, text) = shards_with(&dsn, class, 8, "text", &["--mechanism", "lease"]);
    assert_eq!(code, 1, "two shards are unowned: {text}");
    assert!(text.contains("1 members, 2 unowned"), "{text}");
    assert!(text.contains("cli-member 0f"), "{text}");
    assert!(text.ends_with("unowned: 6-7\n"), "{text}");
    // The advisory view of the same space sees no lock at all.
    let (code, text) = shards(&dsn, class, 8, "text");
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("0 members, 8 unowned"), "{text}");
    drop(client);
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_binary_reports_who_owns_which_shards() {
    use plexsphere_leader::shard_sql;
    use plexsphere_leader::sharded::Shard;

    let base = base_dsn();
    let admin = connect(&base).await;
    let database = format!("plx_cli_shards_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let dsn = format!("{base} dbname={database}");
    let member = connect(&dsn).await;
    let class = -42;
    member
        .simple_query(&shard_sql::register(class, "cli-member", 60_000))
        .await
        .unwrap();
    let shards_taken: Vec<Shard> = (0..6).map(Shard::new).collect();
    member
        .simple_query(&shard_sql::take(class, &shards_taken))
        .await
        .unwrap();
    let (code, text) = shards(&dsn, class, 8, "text");
    assert_eq!(code, 1, "two shards are unowned: {text}");
    assert!(text.contains("1 members, 2 unowned"), "{text}");
    assert!(text.contains("cli-member"), "{text}");
    assert!(text.contains("6 shards  0-5"), "{text}");
    assert!(text.ends_with("unowned: 6-7\n"), "{text}");
    member
        .simple_query(&shard_sql::take(class, &[Shard::new(6), Shard::new(7)]))
        .await
        .unwrap();
    let (code, json) = shards(&dsn, class, 8, "json");
    assert_eq!(code, 0, "{json}");
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["holders"][0]["count"], 8);
    assert_eq!(value["unowned"], serde_json::json!([]));
    drop(member);
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await
        .unwrap();
}

/// A DSN's `connect_timeout` bounds connecting even when `--timeout` is larger: against a
/// server that accepts TCP and never answers the startup, `connect_timeout=1` ends the command
/// after about 1 s, not after `--timeout 30s`.
#[tokio::test]
async fn the_dsns_connect_timeout_shortens_a_larger_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_plexsphere-leader"))
        .args(["status", "--timeout", "30s", "--dsn"])
        .arg(format!(
            "host=127.0.0.1 port={port} user=x connect_timeout=1"
        ))
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("status: no connection within 1s (the DSN's connect_timeout)"),
        "the DSN's bound is the cause: {err}"
    );
    // Generous: the bound is 1 s, --timeout is 30 s; only the DSN's bound ends it this early.
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
    drop(silent);
}

/// `plexsphere-leader verify` with the DSN from `PLEXSPHERE_DSN` only, as a service's
/// environment gives it: a direct server is go for the advisory lock (exit 0), no-go for a
/// lease whose tables are missing in a schema that does not exist (exit 1), and the DSN is
/// never printed.
#[test]
fn the_binary_verifies_the_endpoint_of_plexsphere_dsn() {
    let dsn = base_dsn();
    let verify = |extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_plexsphere-leader"))
            .arg("verify")
            .args(extra)
            .env("PLEXSPHERE_DSN", &dsn)
            .output()
            .unwrap();
        let out = String::from_utf8(output.stdout).unwrap();
        let err = String::from_utf8(output.stderr).unwrap();
        assert!(!out.contains(&dsn) && !err.contains(&dsn));
        (output.status.code().unwrap(), out, err)
    };
    let (code, out, err) = verify(&[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("for the advisory mechanism: GO"), "{out}");
    let schema = "plx_no_such_schema";
    let (code, out, err) = verify(&["--mechanism", "lease", "--schema", schema, "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        json["lease"]["reason"],
        format!("schema {schema} does not exist")
    );
}
