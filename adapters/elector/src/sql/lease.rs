//! The lease mechanism's statements ([`Config::lease`](crate::Config::lease)): each one
//! autocommit statement in the simple query protocol, with no session state (no session-level
//! `SET`, no prepared statement, no `LISTEN`), so that it runs unchanged on any pooled
//! connection: PgBouncer in transaction or statement mode, Supavisor, RDS Proxy (which it does
//! not pin) and a direct connection.
//!
//! The lease row (`plexsphere_leader_lease`, one per [`LockKey`]) names its holder (the
//! replica's identity and a per-run nonce) and its expiry, set by the server's clock. The
//! term's epoch is the election's fence row (`plexsphere_leader_fence`, the advisory
//! mechanism's fencing table), advanced by every claim in the claim's own statement: the
//! fenced-write API ([`fencing::check`](crate::fencing::check)) is the same for both
//! mechanisms, and a claim waits, as the advisory advance does, for a former leader's fenced
//! transaction to end (under a transaction-local `lock_timeout`), while a renewal touches only
//! the lease row and never waits for the leader's own fenced work.

use super::{DURABLE_COMMIT, FENCE_SETUP, QUIET_SETUP, quote_literal};
use crate::key::LockKey;

/// The lease table (in the election's schema, [`DEFAULT_SCHEMA`] unless
/// [`Config::lease_schema`](crate::Config::lease_schema) says otherwise).
pub const LEASE_TABLE: &str = "plexsphere_leader_lease";

/// The schema of the lease's tables by default: `public`. Every statement names its tables
/// with their schema, so that every replica of an election reaches the same rows whatever
/// its connection's `search_path` (a replica whose path resolved the unqualified names in
/// another schema used to create tables of its own there and run a second election under the
/// same key).
pub const DEFAULT_SCHEMA: &str = "public";

/// `schema`'s lease table, qualified.
fn lease_table(schema: &str) -> String {
    format!("{schema}.{LEASE_TABLE}")
}

/// `schema`'s fence table, qualified.
pub(crate) fn fence_table(schema: &str) -> String {
    format!("{schema}.{}", super::FENCE_TABLE)
}

/// The transaction-level advisory lock that serializes every setup ([`serialized_setup`]): a
/// one-`bigint` key (`plxs_set` in ASCII), a key space apart from the elections' two-`int4` keys.
pub const SETUP_LOCK: i64 = 0x706C_7873_5F73_6574;

/// `statements` (idempotent `CREATE … IF NOT EXISTS`) as every setup sends them: quietly
/// ([`QUIET_SETUP`]), in the one implicit transaction of their query string, after
/// [`SETUP_LOCK`]. Two concurrent `CREATE TABLE IF NOT EXISTS` of one table fail one of them
/// with a unique violation of `pg_type` (`pg_type_typname_nsp_index`); under the lock the later
/// one waits for the earlier one's commit and then finds the table. Every setup (the fence's,
/// the floor's, the lease's and the lease shards') takes the same lock, so that different
/// setups creating one table do not race either.
pub fn serialized_setup(statements: &str) -> String {
    format!("{QUIET_SETUP}SELECT pg_advisory_xact_lock({SETUP_LOCK}); {statements}")
}

/// The idempotent setup the lease mechanism needs, run once per database (by a migration or
/// [`lease::setup`](crate::lease::setup)): the lease table, the fence table and the unlogged
/// table of ranked replicas' candidacies ([`CANDIDATE_TABLE`](super::candidacy::CANDIDATE_TABLE)),
/// [serialized](serialized_setup), so that replicas starting together do not race. The tables
/// are created in `schema` (which must exist), named with it.
pub fn setup(schema: &str) -> String {
    let fence = FENCE_SETUP.replacen(super::FENCE_TABLE, &fence_table(schema), 1);
    serialized_setup(&format!(
        "CREATE TABLE IF NOT EXISTS {} (\
         classid int4 NOT NULL, objid int4 NOT NULL, holder text NOT NULL, \
         expires_at timestamptz NOT NULL, PRIMARY KEY (classid, objid)); {fence}; {candidates} {floor}",
        lease_table(schema),
        candidates = super::candidacy::setup(&super::candidacy::candidate_table(schema)),
        floor =
            super::candidacy::floor_setup(&format!("{schema}.{}", super::candidacy::FLOOR_TABLE))
    ))
}

/// `now() + <ms> milliseconds`, the server's clock.
fn expiry(ttl_ms: u32) -> String {
    format!("now() + {ttl_ms} * interval '1 millisecond'")
}

/// The one-`bigint` transaction-level advisory lock that serializes the claims of `key` in
/// every schema of the database (the key's two `int4`s as one `bigint`: a key space apart
/// from the elections' two-`int4` session locks, so that a lease election and an advisory one
/// of the same key never wait for each other).
pub fn claim_lock(key: LockKey) -> i64 {
    (i64::from(key.class_id) << 32) | i64::from(key.obj_id.cast_unsigned())
}

/// The schemas other than `schema` whose lease table has a row of `key`, `', '`-separated
/// (`NULL` for none), read only where this role may (a schema's `USAGE` and the table's
/// `SELECT`): another election of the same key, which replicas configured with another
/// [`Config::lease_schema`](crate::Config::lease_schema) run.
fn elsewhere(schema: &str, key: LockKey) -> String {
    format!(
        "SELECT string_agg(n.nspname, ', ' ORDER BY n.nspname) AS schemas \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = '{LEASE_TABLE}' AND c.relkind IN ('r', 'p') AND n.nspname <> '{schema}' \
         AND CASE WHEN has_schema_privilege(n.oid, 'USAGE') \
         AND has_table_privilege(c.oid, 'SELECT') \
         THEN query_to_xml(format('SELECT 1 FROM %I.{LEASE_TABLE} \
         WHERE classid = {} AND objid = {}', n.nspname), false, true, '')::text <> '' \
         ELSE false END",
        key.class_id, key.obj_id
    )
}

/// The standby's claim of `key` for `holder`: takes the row when it is missing, expired by the
/// server's clock, or already `holder`'s, sets its expiry to `now() + ttl_ms`, and advances
/// the fence row in the same statement. The fence row's wait is bounded by a
/// transaction-local `lock_timeout` of `lock_timeout_ms` (SQLSTATE 55P03 then).
///
/// One election per key whatever a replica's schema: the claim first takes [`claim_lock`]
/// (until it commits), so that the claims of `key` in every schema run one after the other,
/// then claims only when no other schema's lease table has a row of `key` (read where the role may):
/// the first schema to hold the key keeps it, and a replica configured with another one never
/// claims. Its last result row is the new epoch and `NULL` (claimed), `NULL` and `NULL`
/// (another holder's lease has not expired), or `NULL` and the other schemas.
pub fn claim(
    schema: &str,
    key: LockKey,
    holder: &str,
    ttl_ms: u32,
    lock_timeout_ms: u32,
) -> String {
    let (c, o, holder) = (key.class_id, key.obj_id, quote_literal(holder));
    let (lease, fence) = (lease_table(schema), fence_table(schema));
    format!(
        "SET LOCAL lock_timeout = '{lock_timeout_ms}'; {DURABLE_COMMIT}\
         SELECT pg_advisory_xact_lock({lock}); \
         WITH elsewhere AS ({elsewhere}), \
         claimed AS (\
         INSERT INTO {lease} AS l (classid, objid, holder, expires_at) \
         SELECT {c}, {o}, {holder}, {expiry} FROM elsewhere WHERE schemas IS NULL \
         ON CONFLICT (classid, objid) DO UPDATE \
         SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at \
         WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder RETURNING 1), \
         fenced AS (INSERT INTO {fence} AS f (classid, objid, epoch) \
         SELECT {c}, {o}, 1 FROM claimed \
         ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch) \
         SELECT (SELECT epoch FROM fenced), schemas FROM elsewhere",
        lock = claim_lock(key),
        elsewhere = elsewhere(schema, key),
        expiry = expiry(ttl_ms)
    )
}

/// The leader's check: extends `holder`'s lease of `key` to `now() + ttl_ms` while it has not
/// expired; one row when renewed, none when the row names another holder (the lease expired
/// and was claimed) or expired (released, or not renewed in time: the leader's trust ended
/// before, since it is shorter than the TTL). A renewal that arrives late, after the leader's
/// release, cannot revive the lease.
pub fn renew(schema: &str, key: LockKey, holder: &str, ttl_ms: u32) -> String {
    format!(
        "{DURABLE_COMMIT}UPDATE {} SET expires_at = {} \
         WHERE classid = {} AND objid = {} AND holder = {} AND expires_at > now() RETURNING 1",
        lease_table(schema),
        expiry(ttl_ms),
        key.class_id,
        key.obj_id,
        quote_literal(holder)
    )
}

/// The graceful release: expires `holder`'s lease of `key` at once, so that a standby's next
/// claim takes it; one row when released, none when it was no longer `holder`'s or had
/// expired.
pub fn release(schema: &str, key: LockKey, holder: &str) -> String {
    format!(
        "UPDATE {} SET expires_at = now() \
         WHERE classid = {} AND objid = {} AND holder = {} AND expires_at > now() RETURNING 1",
        lease_table(schema),
        key.class_id,
        key.obj_id,
        quote_literal(holder)
    )
}

/// Who holds the lease of `key`: one row (`holder`, the fence `epoch`, `expires_at` as unix
/// seconds with a fraction, and whether it is still held by the server's clock), or none when
/// no replica ever claimed it.
pub fn who_holds(schema: &str, key: LockKey) -> String {
    format!(
        "SELECT l.holder, f.epoch, date_part('epoch', l.expires_at), l.expires_at > now() \
         FROM {} l LEFT JOIN {} f \
         USING (classid, objid) WHERE l.classid = {} AND l.objid = {}",
        lease_table(schema),
        fence_table(schema),
        key.class_id,
        key.obj_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: LockKey = LockKey::DEFAULT;

    #[test]
    fn every_statement_names_the_key_and_the_holder_and_keeps_no_session_state() {
        let claim = claim(DEFAULT_SCHEMA, KEY, "svc@h 0f", 15_000, 2_500);
        assert_eq!(claim_lock(KEY), 8_100_982_265_049_251_841);
        assert_eq!(
            claim_lock(LockKey::new(-1, -1)),
            -1,
            "both halves as written"
        );
        assert!(claim.starts_with(
            "SET LOCAL lock_timeout = '2500'; SET LOCAL synchronous_commit = on; \
             SELECT pg_advisory_xact_lock(8100982265049251841); WITH elsewhere AS (\
             SELECT string_agg(n.nspname, ', ' ORDER BY n.nspname) AS schemas \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname = 'plexsphere_leader_lease' AND c.relkind IN ('r', 'p') \
             AND n.nspname <> 'public' AND CASE WHEN has_schema_privilege(n.oid, 'USAGE') \
             AND has_table_privilege(c.oid, 'SELECT') THEN query_to_xml(format('SELECT 1 FROM \
             %I.plexsphere_leader_lease WHERE classid = 1886156915 AND objid = 1', n.nspname), \
             false, true, '')::text <> '' ELSE false END), "
        ));
        assert!(claim.ends_with(
            "claimed AS (INSERT INTO \
             public.plexsphere_leader_lease AS l (classid, objid, holder, expires_at) SELECT \
             1886156915, 1, 'svc@h 0f', now() + 15000 * interval '1 millisecond' FROM elsewhere \
             WHERE schemas IS NULL ON CONFLICT \
             (classid, objid) DO UPDATE SET holder = EXCLUDED.holder, expires_at = \
             EXCLUDED.expires_at WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder \
             RETURNING 1), fenced AS (INSERT INTO public.plexsphere_leader_fence AS f (classid, \
             objid, epoch) SELECT 1886156915, 1, 1 FROM claimed ON CONFLICT (classid, objid) DO \
             UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch) SELECT (SELECT epoch FROM fenced), \
             schemas FROM elsewhere"
        ));
        assert_eq!(
            renew(DEFAULT_SCHEMA, KEY, "it's", 600),
            "SET LOCAL synchronous_commit = on; \
             UPDATE public.plexsphere_leader_lease SET expires_at = now() + 600 * interval \
             '1 millisecond' WHERE classid = 1886156915 AND objid = 1 AND holder = 'it''s' \
             AND expires_at > now() RETURNING 1"
        );
        assert!(
            release(DEFAULT_SCHEMA, KEY, "a")
                .ends_with("holder = 'a' AND expires_at > now() RETURNING 1")
        );
        for statement in [
            claim,
            renew(DEFAULT_SCHEMA, KEY, "a", 1),
            release(DEFAULT_SCHEMA, KEY, "a"),
            who_holds(DEFAULT_SCHEMA, KEY),
        ] {
            // Only a transaction-local setting, never a session's.
            assert!(!statement.contains("SET SESSION") && !statement.contains("set_config"));
            assert!(!statement.contains("PREPARE") && !statement.contains("LISTEN"));
        }
        assert!(
            setup("leader").contains("CREATE TABLE IF NOT EXISTS leader.plexsphere_leader_fence")
        );
        assert!(
            setup("leader").contains("CREATE TABLE IF NOT EXISTS leader.plexsphere_leader_lease")
        );
    }
}
