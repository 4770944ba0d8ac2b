//! `demo --shards K` against the real server, checked in a headless browser: three replicas
//! split the shards evenly, each replica's `/` shows who owns which shards and its last
//! transitions, and after a replica is killed the open page refreshes on its own (server-sent
//! events) to the two survivors owning every shard, with the taken shards among its
//! transitions. The ticked loops' items are swept by their shard's owner.

mod browser_support;
mod loops_support;

use std::time::Duration;

use browser_support::Browser;
use loops_support::{DEMO_BOOT, Demo, eventually};
use plexsphere_leader_tests::TestDb;
use plexsphere_leader_tests::replica_process::dsn;
use serde_json::Value;

const SHARDS: u64 = 48;

/// What the page shows: the update count, and each owner row's pid and shard count.
const READ_PAGE: &str = "return { \
    updates: Number(document.body.dataset.updates || 0), \
    rows: Array.from(document.querySelectorAll('#owners tbody tr')) \
        .map(r => [Number(r.dataset.pid), Number(r.dataset.count)]), \
    began: document.querySelectorAll('#transitions tbody tr').length, \
    title: document.querySelector('h1').textContent };";

fn counts(page: &Value) -> Vec<u64> {
    page["rows"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r[1].as_u64()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_shard_page_shows_who_owns_what_and_refreshes_live_after_a_kill() {
    let db = TestDb::create("demo_shards").await.unwrap();
    // 500 ms: a survey or a check over one interval loses a session, and this test must not
    // see one on a loaded machine.
    let demo = Demo::start_replicas(
        &dsn(&db.config()),
        3,
        "500ms",
        &["--shards", &SHARDS.to_string()],
        &[],
    )
    .await;
    demo.line(DEMO_BOOT, "shards=48").await;
    // Every replica prints its shards as it takes them.
    for replica in 0..3 {
        demo.line(DEMO_BOOT, &format!("replica={replica} pid="))
            .await;
    }
    eventually(DEMO_BOOT, "three replicas own 16 shards each", || async {
        let (_, body) = demo.get("/shards").await;
        let snapshot: Value = serde_json::from_str(&body).ok()?;
        let members = snapshot["members"].as_array()?;
        (members.len() == 3 && members.iter().all(|m| m["count"] == 16)).then_some(())
    })
    .await;

    let browser = Browser::start().await;
    browser.open(&format!("http://{}/", demo.addr)).await;
    let before = eventually(Duration::from_secs(20), "the page shows 3 x 16", || async {
        let page = browser.eval(READ_PAGE).await;
        (counts(&page) == [16, 16, 16]).then_some(page)
    })
    .await;
    assert!(
        before["title"]
            .as_str()
            .is_some_and(|t| t.contains("plexsphere-demo-r0-")),
        "{before}"
    );
    let updates_before = before["updates"].as_u64().unwrap();

    // Kill replica 2: its session ends, and the survivors take its shards.
    let started = demo.line(DEMO_BOOT, "replica=2 pid=").await;
    let pid: i32 = started
        .split("pid=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let after = eventually(
        Duration::from_secs(20),
        "the open page shows 2 x 24 without a reload",
        || async {
            let page = browser.eval(READ_PAGE).await;
            (counts(&page) == [24, 24]).then_some(page)
        },
    )
    .await;
    assert!(
        after["updates"].as_u64().unwrap() > updates_before,
        "refreshed by events: {before} then {after}"
    );
    assert!(after["began"].as_u64().unwrap() > 0, "{after}");
    browser.stop().await;

    // The owners swept the ticked loops' items: transitions by more than one replica.
    let client = db.admin();
    eventually(
        Duration::from_secs(20),
        "items swept by their shard owners",
        || async {
            let row = client
                .query_one(
                    "SELECT count(DISTINCT actor) FROM plexsphere_demo.transitions",
                    &[],
                )
                .await
                .ok()?;
            (row.get::<_, i64>(0) >= 2).then_some(())
        },
    )
    .await;
    drop(demo);
    db.cleanup().await.unwrap();
}
