//! The statements of a shard space held by leases (`plexsphere_leader::shard_sql::lease`)
//! against the real local PostgreSQL, over the simple query protocol as a pooled connection
//! sends them: registration, renewal, takes that never take a live member's shard, the reap of
//! an expired member, and both orders of the race between a renewal in flight and a reap. Each
//! test has its own database.

use std::time::Duration;

use plexsphere_leader::session::Row;
use plexsphere_leader::shard_sql::lease::{self, Renewed, Taken};
use plexsphere_leader_core::shards::{MemberId, Shard};
use plexsphere_leader_tests::{TestDb, simple_rows};
use tokio_postgres::Client;

const SCHEMA: &str = "public";
const CLASS: i32 = 77;
const COUNT: u32 = 8;
/// A TTL long enough to outlast every test.
const LONG_MS: u32 = 60_000;

async fn rows(client: &Client, statement: &str) -> Vec<Row> {
    simple_rows(client, statement).await.expect(statement)
}

fn shards(numbers: impl IntoIterator<Item = u32>) -> Vec<Shard> {
    numbers.into_iter().map(Shard::new).collect()
}

async fn space(name: &str) -> (TestDb, Client) {
    let db = TestDb::create(name).await.expect("database");
    let client = db.connect("plx-lease-sql").await.expect("connect");
    client
        .simple_query(&lease::setup(SCHEMA))
        .await
        .expect("setup");
    // Twice: the setup is idempotent.
    client
        .simple_query(&lease::setup(SCHEMA))
        .await
        .expect("setup again");
    (db, client)
}

async fn register(client: &Client, holder: &str, ttl_ms: u32) -> MemberId {
    let statement = lease::register(
        SCHEMA,
        CLASS,
        holder,
        ttl_ms,
        plexsphere_leader::rank::FloorStep::Off,
    );
    lease::parse_registered(&rows(client, &statement).await)
        .expect("register rows")
        .member
}

async fn renew(client: &Client, member: MemberId, holder: &str, ttl_ms: u32) -> Renewed {
    let statement = lease::renew(SCHEMA, CLASS, member, holder, ttl_ms);
    lease::parse_renewed(&rows(client, &statement).await).expect("renew rows")
}

async fn take(client: &Client, member: MemberId, asked: &[Shard]) -> Taken {
    let statement = lease::take(SCHEMA, CLASS, member, asked, 5_000);
    lease::parse_taken(&rows(client, &statement).await).expect("take rows")
}

async fn owned(client: &Client) -> Vec<(MemberId, Vec<Shard>)> {
    let statement = lease::survey(
        SCHEMA,
        CLASS,
        COUNT,
        plexsphere_leader::rank::FloorStep::Off,
    );
    lease::parse_survey(&rows(client, &statement).await)
        .expect("survey rows")
        .into_iter()
        .map(|row| (row.member, row.shards))
        .collect()
}

/// Expires `member`'s lease at once, as the server's clock passing its expiry would.
async fn expire(client: &Client, member: MemberId) {
    client
        .simple_query(&format!(
            "UPDATE public.plexsphere_shard_member SET expires_at = now() - interval '1 second' \
             WHERE classid = {CLASS} AND member = {}",
            member.get()
        ))
        .await
        .expect("expire");
}

#[tokio::test]
async fn a_live_members_shards_are_never_taken_and_epochs_advance_per_owner_change() {
    let (db, client) = space("lease_sql_take").await;
    let a = register(&client, "a 1", LONG_MS).await;
    let b = register(&client, "b 1", LONG_MS).await;
    assert_ne!(a, b);

    let first = take(&client, a, &shards([0, 1, 2, 3])).await;
    assert!(first.live);
    assert_eq!(
        first.shards,
        vec![
            (Shard::new(0), 1),
            (Shard::new(1), 1),
            (Shard::new(2), 1),
            (Shard::new(3), 1)
        ]
    );
    // b asks for a's shards and free ones: it gets only the free ones.
    let second = take(&client, b, &shards([2, 3, 4, 5])).await;
    assert_eq!(second.shards, vec![(Shard::new(4), 1), (Shard::new(5), 1)]);
    // A take of a shard one already owns changes nothing: no new epoch.
    assert!(take(&client, a, &shards([0])).await.shards.is_empty());
    assert_eq!(
        owned(&client).await,
        vec![(a, shards([0, 1, 2, 3])), (b, shards([4, 5]))]
    );

    // a gives 2 and 3 back (and 4, which is not its own): b takes them with new epochs.
    let statement = lease::release(SCHEMA, CLASS, a, &shards([2, 3, 4]));
    let released = lease::parse_released(&rows(&client, &statement).await).unwrap();
    assert_eq!(released, shards([2, 3]));
    let moved = take(&client, b, &shards([2, 3])).await;
    assert_eq!(moved.shards, vec![(Shard::new(2), 2), (Shard::new(3), 2)]);

    // Renewal reads the live members; a renewal with another holder's name renews nothing.
    let renewed = renew(&client, a, "a 1", LONG_MS).await;
    assert_eq!(
        renewed,
        Renewed {
            renewed: true,
            members: vec![a, b]
        }
    );
    assert!(!renew(&client, a, "a 2", LONG_MS).await.renewed);

    // a leaves: its shards are free at once, and b takes them.
    let left = rows(&client, &lease::leave(SCHEMA, CLASS, a)).await;
    assert_eq!(left.len(), 1, "the deleted member row");
    assert_eq!(owned(&client).await, vec![(b, shards([2, 3, 4, 5]))]);
    let rest = take(&client, b, &shards([0, 1])).await;
    assert_eq!(rest.shards, vec![(Shard::new(0), 2), (Shard::new(1), 2)]);
    assert!(!renew(&client, a, "a 1", LONG_MS).await.renewed, "a left");
    db.cleanup().await.expect("cleanup");
}

#[tokio::test]
async fn an_expired_member_is_reaped_by_the_next_take_and_cannot_renew_or_take() {
    let (db, client) = space("lease_sql_reap").await;
    let a = register(&client, "a 1", LONG_MS).await;
    let b = register(&client, "b 1", LONG_MS).await;
    take(&client, a, &shards([0, 1])).await;
    expire(&client, a).await;
    // Expired: its shards show free, and it can take nothing.
    assert_eq!(owned(&client).await, vec![(b, Vec::new())]);
    let late = take(&client, a, &shards([2])).await;
    assert!(!late.live && late.shards.is_empty());
    // The take above reaped a (its own reap): a late renewal cannot revive it.
    assert!(!renew(&client, a, "a 1", LONG_MS).await.renewed);
    let taken = take(&client, b, &shards([0, 1])).await;
    assert_eq!(taken.shards, vec![(Shard::new(0), 2), (Shard::new(1), 2)]);
    db.cleanup().await.expect("cleanup");
}

/// The race of the module's argument, both orders: a renewal in flight (its transaction holds
/// the member row) against a take that would reap the member.
#[tokio::test]
async fn a_renewal_in_flight_and_a_reap_never_both_win() {
    let (db, client) = space("lease_sql_race").await;
    let a = register(&client, "a 1", LONG_MS).await;
    let b = register(&client, "b 1", LONG_MS).await;
    take(&client, a, &shards([0, 1])).await;

    // 1. The renewal commits first. Its transaction renews the row while a's lease has expired
    //    by the take's clock; the take waits for the row and then finds it live.
    let renewer = db.connect("plx-renewer").await.expect("connect");
    expire(&client, a).await;
    renewer.simple_query("BEGIN").await.unwrap();
    renewer
        .simple_query(&format!(
            "UPDATE public.plexsphere_shard_member SET expires_at = now() + interval '1 minute' \
             WHERE classid = {CLASS} AND member = {}",
            a.get()
        ))
        .await
        .unwrap();
    let taker = db.connect("plx-taker").await.expect("connect");
    let statement = lease::take(SCHEMA, CLASS, b, &shards([0, 1]), 5_000);
    let pending = tokio::spawn(async move { rows(&taker, &statement).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !pending.is_finished(),
        "the reap waits for the renewal's row"
    );
    renewer.simple_query("COMMIT").await.unwrap();
    let taken = lease::parse_taken(&pending.await.unwrap()).unwrap();
    assert!(taken.live && taken.shards.is_empty(), "{taken:?}");
    assert_eq!(owned(&client).await, vec![(a, shards([0, 1])), (b, vec![])]);

    // 2. The reap commits first: a renewal sent while the reap holds the row finds it gone. The
    //    renewal's transaction began before the expiry (its `now()` is earlier), so its own
    //    check passes and only the row lock decides.
    let late = db.connect("plx-late").await.expect("connect");
    late.simple_query("BEGIN").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    client
        .simple_query(&format!(
            "UPDATE public.plexsphere_shard_member SET expires_at = now() \
             WHERE classid = {CLASS} AND member = {}",
            a.get()
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reaper = db.connect("plx-reaper").await.expect("connect");
    reaper.simple_query("BEGIN").await.unwrap();
    reaper
        .simple_query(&lease::take(SCHEMA, CLASS, b, &shards([0, 1]), 5_000))
        .await
        .unwrap();
    let renewal = lease::renew(SCHEMA, CLASS, a, "a 1", LONG_MS);
    let pending = tokio::spawn(async move {
        let answer = rows(&late, &renewal).await;
        late.simple_query("COMMIT").await.unwrap();
        answer
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !pending.is_finished(),
        "the renewal waits for the reap's row"
    );
    reaper.simple_query("COMMIT").await.unwrap();
    let renewed = lease::parse_renewed(&pending.await.unwrap()).unwrap();
    assert!(!renewed.renewed, "{renewed:?}");
    assert_eq!(owned(&client).await, vec![(b, shards([0, 1]))]);
    db.cleanup().await.expect("cleanup");
}
