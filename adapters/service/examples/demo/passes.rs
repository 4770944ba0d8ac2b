//! The demo's schema and the small real work each loop does on it.
//!
//! Every write is a compare-and-set: a row moves from one state to the next only if it is still
//! in the state (and at the version) the statement read, so two replicas that run the same pass
//! at once (the overlap window of a handover, or the ungated boot passes) never apply one
//! transition twice. Each transition a pass really made leaves one row in `transitions`, which
//! is how the tests see a double application.
//!
//! Every statement goes over the unnamed statement, its parameters' types given
//! (`execute_typed`, `query_typed_one`): one round trip, no named prepared statement, so the
//! passes run behind a transaction-mode pooler that cannot carry prepared statements (PgBouncer
//! before 1.21) as well as on a direct connection.
//!
//! This file depends only on `tokio-postgres`, so the tests include it with `#[path]`.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};

/// A `pg_advisory_xact_lock(bigint)` key that serialises schema creation across replicas
/// (concurrent `CREATE TABLE IF NOT EXISTS` can otherwise collide in the catalog). A bigint key
/// never collides with the two-int4 leader lock.
const SCHEMA_LOCK: i64 = 0x706C_7873_6465_6D6F; // "plxsdemo"

const DDL: &str = "
CREATE SCHEMA IF NOT EXISTS plexsphere_demo;
CREATE TABLE IF NOT EXISTS plexsphere_demo.items (
    id         bigserial PRIMARY KEY,
    loop_name  text        NOT NULL,
    state      text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
    due_at     timestamptz NOT NULL,
    version    integer     NOT NULL DEFAULT 0,
    done_at    timestamptz,
    done_by    text
);
CREATE INDEX IF NOT EXISTS items_due ON plexsphere_demo.items (loop_name, state, due_at);
CREATE TABLE IF NOT EXISTS plexsphere_demo.transitions (
    id        bigserial PRIMARY KEY,
    item_id   bigint      NOT NULL,
    loop_name text        NOT NULL,
    actor     text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    mirrored  boolean     NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS plexsphere_demo.transitions_archive (
    LIKE plexsphere_demo.transitions INCLUDING DEFAULTS
);
CREATE TABLE IF NOT EXISTS plexsphere_demo.cursors (
    name     text PRIMARY KEY,
    position bigint NOT NULL DEFAULT 0
);
INSERT INTO plexsphere_demo.cursors (name) VALUES ('sse-relay') ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS plexsphere_demo.crossings (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    above   boolean     NOT NULL,
    pending bigint      NOT NULL
);
CREATE TABLE IF NOT EXISTS plexsphere_demo.durables (
    name      text PRIMARY KEY,
    orphaned  boolean NOT NULL DEFAULT false,
    delivered bigint  NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS plexsphere_demo.rate_budgets (
    bucket    text PRIMARY KEY,
    spent     bigint      NOT NULL DEFAULT 0,
    last_used timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS plexsphere_demo.sse_nonces (
    nonce     text PRIMARY KEY,
    last_seen timestamptz NOT NULL DEFAULT now()
);
";

/// The ticked loop that reclaims idle rate-budget token buckets.
pub(crate) const RATE_BUDGET_SWEEP: &str = "rate-budget-sweep";

/// The spec's idle rule of `rate-budget-sweep`: a token bucket unused for longer than this is
/// reclaimed.
pub(crate) const RATE_BUDGET_IDLE: Duration = Duration::from_secs(3600);

/// The ticked loop that deletes stale signed-event-bus nonces; it ticks once per
/// `PLEXSPHERE_SSE_NONCE_TTL`, which is also its freshness window.
pub(crate) const SSE_NONCE_SWEEP: &str = "sse-nonce-sweep";

/// Creates the schema, idempotently and safely from several replicas at once.
pub(crate) async fn create_schema(client: &mut Client) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &[(&SCHEMA_LOCK, Type::INT8)],
    )
    .await?;
    tx.batch_execute(DDL).await?;
    tx.commit().await
}

/// Adds one pending item for `loop_name`, due within `within` from now.
pub(crate) async fn seed(
    client: &impl GenericClient,
    loop_name: &str,
    within: Duration,
) -> Result<(), tokio_postgres::Error> {
    let seconds = within.as_secs_f64();
    client
        .execute_typed(
            "INSERT INTO plexsphere_demo.items (loop_name, due_at) \
             VALUES ($1, now() + make_interval(secs => $2 * random()))",
            &[(&loop_name, Type::TEXT), (&seconds, Type::FLOAT8)],
        )
        .await?;
    Ok(())
}

/// The sweep of `loop_name`: moves the items that fell due from `pending` to `done` with a
/// compare-and-set on `(state, version)`, and records one transition per item it moved. Returns
/// how many it moved. A row another replica moved first is skipped: the update re-checks the
/// row after waiting for the other writer's lock.
pub(crate) async fn sweep(
    client: &impl GenericClient,
    loop_name: &str,
    actor: &str,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed(
            "WITH due AS ( \
                 SELECT id, version FROM plexsphere_demo.items \
                 WHERE loop_name = $1 AND state = 'pending' AND due_at <= now() \
                 ORDER BY due_at LIMIT 100 \
             ), moved AS ( \
                 UPDATE plexsphere_demo.items i \
                 SET state = 'done', version = i.version + 1, done_at = now(), done_by = $2 \
                 FROM due \
                 WHERE i.id = due.id AND i.version = due.version AND i.state = 'pending' \
                 RETURNING i.id \
             ) \
             INSERT INTO plexsphere_demo.transitions (item_id, loop_name, actor) \
             SELECT id, $1, $2 FROM moved",
            &[(&loop_name, Type::TEXT), (&actor, Type::TEXT)],
        )
        .await
}

/// Deletes the items of `loop_name` done for longer than `keep`.
pub(crate) async fn prune(
    client: &impl GenericClient,
    loop_name: &str,
    keep: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let seconds = keep.as_secs_f64();
    client
        .execute_typed(
            "DELETE FROM plexsphere_demo.items \
             WHERE loop_name = $1 AND state = 'done' \
               AND done_at < now() - make_interval(secs => $2)",
            &[(&loop_name, Type::TEXT), (&seconds, Type::FLOAT8)],
        )
        .await
}

/// One pass of a ticked loop: seed one item, sweep what fell due, prune what is old; then the
/// loop's own rule, where the spec gives one: [`RATE_BUDGET_SWEEP`] reclaims the buckets idle
/// for longer than [`RATE_BUDGET_IDLE`], [`SSE_NONCE_SWEEP`] deletes the nonces last seen
/// before the freshness window, which is its `period` (the nonce TTL). Returns how many items
/// the sweep moved.
pub(crate) async fn ticked_pass(
    client: &impl GenericClient,
    loop_name: &str,
    actor: &str,
    period: Duration,
) -> Result<u64, tokio_postgres::Error> {
    seed(client, loop_name, period * 2).await?;
    let moved = sweep(client, loop_name, actor).await?;
    upkeep(client, loop_name, period).await?;
    Ok(moved)
}

/// One pass of a ticked loop whose sweep the shard owners do (`demo --shards K`, see
/// [`sweep_shards`]): seed one item, prune what is old, then the loop's own rule.
pub(crate) async fn ticked_pass_sharded(
    client: &impl GenericClient,
    loop_name: &str,
    period: Duration,
) -> Result<(), tokio_postgres::Error> {
    seed(client, loop_name, period * 2).await?;
    upkeep(client, loop_name, period).await
}

/// The sweep of every loop's due items in `shards` of a space of `count` shards (item `id`
/// mod `count`), by the replica that owns them: the same compare-and-set as [`sweep`], so a
/// shard's old and new owner never move one item twice. Returns how many it moved.
pub(crate) async fn sweep_shards(
    client: &impl GenericClient,
    shards: &[i32],
    count: u32,
    actor: &str,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed(
            "WITH due AS ( \
                 SELECT id, version FROM plexsphere_demo.items \
                 WHERE state = 'pending' AND due_at <= now() \
                   AND (id % $2)::int4 = ANY($1::int4[]) \
                 ORDER BY due_at LIMIT 1000 \
             ), moved AS ( \
                 UPDATE plexsphere_demo.items i \
                 SET state = 'done', version = i.version + 1, done_at = now(), done_by = $3 \
                 FROM due \
                 WHERE i.id = due.id AND i.version = due.version AND i.state = 'pending' \
                 RETURNING i.id, i.loop_name \
             ) \
             INSERT INTO plexsphere_demo.transitions (item_id, loop_name, actor) \
             SELECT id, loop_name, $3 FROM moved",
            &[
                (&shards, Type::INT4_ARRAY),
                (&i64::from(count), Type::INT8),
                (&actor, Type::TEXT),
            ],
        )
        .await
}

/// After a pass's sweep: prune what is old, then the loop's own rule, where the spec gives one:
/// [`RATE_BUDGET_SWEEP`] reclaims the buckets idle for longer than [`RATE_BUDGET_IDLE`],
/// [`SSE_NONCE_SWEEP`] deletes the nonces last seen before the freshness window, which is its
/// `period` (the nonce TTL).
async fn upkeep(
    client: &impl GenericClient,
    loop_name: &str,
    period: Duration,
) -> Result<(), tokio_postgres::Error> {
    prune(client, loop_name, Duration::from_secs(600)).await?;
    match loop_name {
        RATE_BUDGET_SWEEP => {
            reclaim_rate_budgets(client, RATE_BUDGET_IDLE).await?;
        }
        SSE_NONCE_SWEEP => {
            sweep_nonces(client, period).await?;
        }
        _ => {}
    }
    Ok(())
}

/// Spends one token of the rate-budget bucket `bucket` (every-replica traffic: each replica
/// has its own bucket), creating it when missing; the bucket's `last_used` becomes now.
pub(crate) async fn spend_rate_budget(
    client: &impl GenericClient,
    bucket: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(
            "INSERT INTO plexsphere_demo.rate_budgets (bucket, spent) VALUES ($1, 1) \
             ON CONFLICT (bucket) DO UPDATE \
             SET spent = plexsphere_demo.rate_budgets.spent + 1, last_used = now()",
            &[(&bucket, Type::TEXT)],
        )
        .await?;
    Ok(())
}

/// Deletes the rate-budget buckets unused for longer than `idle`. Returns how many. A bucket
/// spent from while the delete waits on its row is re-checked and kept; one spent from after
/// the delete is created afresh.
pub(crate) async fn reclaim_rate_budgets(
    client: &impl GenericClient,
    idle: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let seconds = idle.as_secs_f64();
    client
        .execute_typed(
            "DELETE FROM plexsphere_demo.rate_budgets \
             WHERE last_used < now() - make_interval(secs => $1)",
            &[(&seconds, Type::FLOAT8)],
        )
        .await
}

/// Records a fresh nonce of the signed event bus (what a relayed event carries), last seen now.
pub(crate) async fn record_nonce(client: &impl GenericClient) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(
            "INSERT INTO plexsphere_demo.sse_nonces (nonce) \
             VALUES (md5(random()::text || clock_timestamp()::text)) ON CONFLICT DO NOTHING",
            &[],
        )
        .await?;
    Ok(())
}

/// Deletes the nonces last seen before the freshness window `ttl` (before now − `ttl`).
/// Returns how many.
pub(crate) async fn sweep_nonces(
    client: &impl GenericClient,
    ttl: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let seconds = ttl.as_secs_f64();
    client
        .execute_typed(
            "DELETE FROM plexsphere_demo.sse_nonces \
             WHERE last_seen < now() - make_interval(secs => $1)",
            &[(&seconds, Type::FLOAT8)],
        )
        .await
}

/// The authz outbox consumer's step: marks up to 50 unmirrored transitions mirrored (skipping
/// rows another consumer holds). Returns how many.
pub(crate) async fn mirror_outbox(
    client: &impl GenericClient,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed(
            "UPDATE plexsphere_demo.transitions SET mirrored = true \
             WHERE id IN ( \
                 SELECT id FROM plexsphere_demo.transitions WHERE NOT mirrored \
                 ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED \
             ) AND NOT mirrored",
            &[],
        )
        .await
}

/// The audit archiver's step: moves up to 100 mirrored transitions older than a minute to the
/// archive, in one statement. Returns how many.
pub(crate) async fn archive_audit(
    client: &impl GenericClient,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed(
            "WITH moved AS ( \
                 DELETE FROM plexsphere_demo.transitions WHERE id IN ( \
                     SELECT id FROM plexsphere_demo.transitions \
                     WHERE mirrored AND at < now() - interval '1 minute' \
                     ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED \
                 ) RETURNING * \
             ) \
             INSERT INTO plexsphere_demo.transitions_archive SELECT * FROM moved",
            &[],
        )
        .await
}

/// How many items are pending, over all loops (what the capacity collector samples).
pub(crate) async fn pending(client: &impl GenericClient) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_typed_one(
            "SELECT count(*) FROM plexsphere_demo.items WHERE state = 'pending'",
            &[],
        )
        .await?;
    row.try_get(0)
}

/// The capacity collector's audit row for a crossing (the gated part).
pub(crate) async fn record_crossing(
    client: &impl GenericClient,
    actor: &str,
    above: bool,
    pending: i64,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(
            "INSERT INTO plexsphere_demo.crossings (actor, above, pending) VALUES ($1, $2, $3)",
            &[
                (&actor, Type::TEXT),
                (&above, Type::BOOL),
                (&pending, Type::INT8),
            ],
        )
        .await?;
    Ok(())
}

/// One relay tick: advances the relay cursor under `FOR UPDATE SKIP LOCKED`, which serialises the
/// ticks across replicas, and records the nonce of the event it relayed. Returns whether this
/// replica got the cursor.
pub(crate) async fn relay(client: &mut Client) -> Result<bool, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let row = tx
        .query_typed_opt(
            "SELECT position FROM plexsphere_demo.cursors WHERE name = 'sse-relay' \
             FOR UPDATE SKIP LOCKED",
            &[],
        )
        .await?;
    let Some(row) = row else {
        tx.rollback().await?;
        return Ok(false);
    };
    let position: i64 = row.try_get(0)?;
    tx.execute_typed(
        "UPDATE plexsphere_demo.cursors SET position = $1 WHERE name = 'sse-relay'",
        &[(&(position + 1), Type::INT8)],
    )
    .await?;
    record_nonce(&tx).await?;
    tx.commit().await?;
    Ok(true)
}

/// One consume step of the durable `durable`: counts a delivery on it (every replica drains its
/// share). Creates the durable when missing.
pub(crate) async fn consume(
    client: &impl GenericClient,
    durable: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(
            "INSERT INTO plexsphere_demo.durables (name, delivered) VALUES ($1, 1) \
             ON CONFLICT (name) DO UPDATE SET delivered = plexsphere_demo.durables.delivered + 1",
            &[(&durable, Type::TEXT)],
        )
        .await?;
    Ok(())
}

/// The gated part of the consume loops: removes the durables marked orphaned.
pub(crate) async fn remove_orphaned_durables(
    client: &impl GenericClient,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed("DELETE FROM plexsphere_demo.durables WHERE orphaned", &[])
        .await
}
