//! The lock key and every statement the elector sends, public so that operators, tests and the
//! simulation replay exactly what goes over the wire. Simple query protocol only, so that a
//! session-mode pooler can carry them; no prepared statement is ever created. Every statement
//! that names the lock is a function of the election's [`LockKey`].

pub use crate::key::LockKey;

pub mod candidacy;
pub mod lease;

/// The first `int4` of the default leader lock key ([`LockKey::DEFAULT`]): `0x706C7873`, ASCII
/// `plxs`. It shows in `pg_locks` as `classid`.
pub const LOCK_CLASS_ID: i32 = 1_886_156_915;

/// The second `int4` of the default leader lock key. It shows in `pg_locks` as `objid`.
pub const LOCK_OBJ_ID: i32 = 1;

/// The query that finds the leader's backend in the current database: one granted row is the
/// leader's session, no row means no replica leads. (`objsubid = 2` marks the two-`int4` key
/// form, which never collides with a `bigint` key.) The default key's [`leader_query`].
pub const LEADER_QUERY: &str = "SELECT pid, granted \
     FROM pg_locks \
     WHERE locktype = 'advisory' \
       AND classid = 1886156915 \
       AND objid = 1 \
       AND objsubid = 2 \
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// The session setting the grant writes, so that the leader's check can tell that no other
/// client shared its session: `granted` on the session that took the lock, `shared` once a
/// second client's grant statement found the lock already held by the same session.
pub const SESSION_MARKER: &str = "plexsphere.leader_session";

/// The session setting the grant and every leader's check write: the server's unix time in whole
/// seconds. A standby whose grant finds its pooled session already holding the lock reads it to
/// tell a live leader sharing the server session (checked within the idle bound: transaction
/// mode) from a lock a vanished client left there (a pooler without a reset query).
pub const CHECKED_MARKER: &str = "plexsphere.leader_checked";

/// The server's unix time in whole seconds, as text.
const SERVER_SECONDS: &str = "concat(trunc(date_part('epoch', clock_timestamp()))::bigint)";

/// Whether this session carries a leader's mark: [`SESSION_MARKER`] is `granted` or `shared`.
/// The grant statement sets it in the statement that takes the lock, [`unlock`] and
/// [`release_if_held`] clear it, so a marked session is one a client took the lock on (a
/// session shared with, or handed over from, another client when the asker is not that
/// client). Of constant cost, unlike a read of `pg_locks`; the only way to hold the lock
/// unmarked is a queued grant at the instant of its `lock_timeout`, which
/// [`release_if_held`] undoes right after (and, were that lost, a later grant on the session
/// simply takes the lock again, re-entrantly).
fn marked_by_a_grant() -> String {
    format!("nullif(current_setting('{SESSION_MARKER}', true), '') IS NOT NULL")
}

/// `EXISTS` of this session's granted row of `key` in `pg_locks`: its cost grows with the
/// server's lock table, so only [`release_if_held`] reads it, and only when the lock is free or
/// this session's (a handover's instant, not a standby's steady state).
fn held_by_this_session(key: LockKey) -> String {
    format!(
        "EXISTS (SELECT 1 FROM pg_locks \
         WHERE locktype = 'advisory' AND classid = {} AND objid = {} AND objsubid = 2 \
         AND pid = pg_backend_pid() AND granted)",
        key.class_id, key.obj_id
    )
}

/// The arguments of the two-key advisory lock functions: `<class_id>, <obj_id>`.
fn args(key: LockKey) -> String {
    format!("{}, {}", key.class_id, key.obj_id)
}

/// `text` as a SQL string literal: `'…'` with quotes doubled, or `E'…'` with backslashes
/// doubled too when it has one, so that it reads the same whatever
/// `standard_conforming_strings` says.
pub fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if text.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

/// The `application_name` a grant writes: `<identity> since <unix seconds>`, the seconds read
/// from the server's `clock_timestamp()` as the grant statement takes the lock (see
/// [`MAX_IDENTITY_LEN`](crate::config::MAX_IDENTITY_LEN)). An identity outside printable ASCII or
/// longer than that is made to fit (`?` for each other character, then cut).
fn leader_application_name(identity: &str) -> String {
    let identity = crate::identity::sanitize(identity);
    format!(
        "concat({}, trunc(date_part('epoch', clock_timestamp()))::bigint)",
        quote_literal(&format!("{identity}{}", crate::identity::SINCE))
    )
}

/// The outcomes of a grant statement (its first column).
pub mod outcome {
    /// The lock was taken; the session is now the leader's.
    pub const GRANTED: &str = "granted";
    /// Another session holds the lock.
    pub const REFUSED: &str = "refused";
    /// The server is a hot standby: the lock is never taken there.
    pub const IN_RECOVERY: &str = "in_recovery";
    /// The session is read-only (`transaction_read_only`: the role's or database's
    /// `default_transaction_read_only`): a leader on it could not write, so the lock is never
    /// taken on it.
    pub const READ_ONLY: &str = "read_only";
    /// The session held the lock before this client asked: it is shared with another client.
    pub const SHARED: &str = "shared";
}

/// The standby's check (polling mode): tries the lock of `key` and, only when granted, bounds
/// the session with `idle_session_timeout` and `idle_in_transaction_session_timeout`, names it
/// (`application_name` = `<identity> since <server's unix seconds>`) and marks it, in the same
/// statement, so that a reply lost on the way back can never leave an unbounded orphaned lock.
/// Returns five columns: the outcome, `pg_backend_pid()`, `current_database()`, the session's
/// [`CHECKED_MARKER`] and the server's unix seconds; see [`outcome`]. The database
/// is named in the acquired and lost log lines, so replicas pointed at different databases
/// (each then leads its own) show at once. A refused check changes nothing on
/// the pooled session.
///
/// It refuses a server in recovery, a read-only session (`transaction_read_only`), and a session that an earlier grant marked (a pooler that
/// shares one server session between clients, or hands one over from a vanished client), which
/// it marks `shared` so that the client that took the lock first demotes at its next check.
/// Neither reads `pg_locks`: a refused check costs the server the same whatever its lock table
/// holds.
pub fn try_lock(key: LockKey, identity: &str, idle_timeout_ms: u32) -> String {
    grant(
        &format!(
            "WHEN NOT pg_try_advisory_lock({}) THEN '{}' ",
            args(key),
            outcome::REFUSED
        ),
        identity,
        idle_timeout_ms,
    )
}

/// The standby's check (queued mode): waits in the server's lock queue of `key` for at most
/// `lock_timeout_ms` (a transaction-local `lock_timeout`, so the pooled connection keeps its
/// own setting), then as [`try_lock`]. A wait that times out fails with SQLSTATE 55P03. The
/// grant time in `application_name` is read after the wait, when the lock is taken.
///
/// The wait is bounded by its `lock_timeout` alone, whatever the role or database sets: a
/// `SET LOCAL statement_timeout` of twice the wait runs first in the same query string (its
/// implicit transaction ends with the statement, so the pooled session keeps its own value;
/// since PostgreSQL 13 each statement of a query string gets its own statement timeout). A
/// role's `statement_timeout` shorter than the wait would otherwise cancel every wait (57014)
/// long before its `lock_timeout`.
pub fn wait_for_lock(
    key: LockKey,
    identity: &str,
    lock_timeout_ms: u32,
    idle_timeout_ms: u32,
) -> String {
    let statement_timeout_ms = u64::from(lock_timeout_ms) * 2;
    let wait = grant(
        &format!(
            "WHEN set_config('lock_timeout', '{lock_timeout_ms}', true) IS NULL THEN '{refused}' \
             WHEN pg_advisory_lock({args}) IS NULL THEN '{refused}' ",
            args = args(key),
            refused = outcome::REFUSED
        ),
        identity,
        idle_timeout_ms,
    );
    format!("SET LOCAL statement_timeout = '{statement_timeout_ms}'; {wait}")
}

/// The grant statement around `taking`, the `WHEN … THEN 'refused'` branches that take the
/// lock. `CASE` evaluates its branches in order (unlike `AND`/`OR`, whose operands the planner
/// may reorder), so nothing runs after a refusal. The three `set_config` branches only sequence
/// the settings (`set_config` never returns NULL); were one to, the answer would still be
/// `granted`, since the lock is held, and the missing marker would demote at the first check.
fn grant(taking: &str, identity: &str, idle_timeout_ms: u32) -> String {
    format!(
        "SELECT CASE \
         WHEN pg_is_in_recovery() THEN '{in_recovery}' \
         WHEN current_setting('transaction_read_only') = 'on' THEN '{read_only}' \
         WHEN {marked} THEN set_config('{SESSION_MARKER}', '{shared}', false) \
         {taking}\
         WHEN set_config('idle_session_timeout', '{idle_timeout_ms}', false) IS NULL THEN '{granted}' \
         WHEN set_config('idle_in_transaction_session_timeout', '{idle_timeout_ms}', false) IS NULL \
         THEN '{granted}' \
         WHEN set_config('application_name', {name}, false) IS NULL THEN '{granted}' \
         WHEN set_config('{CHECKED_MARKER}', {SERVER_SECONDS}, false) IS NULL THEN '{granted}' \
         ELSE set_config('{SESSION_MARKER}', '{granted}', false) END, pg_backend_pid(), \
         current_database(), current_setting('{CHECKED_MARKER}', true), {SERVER_SECONDS}",
        marked = marked_by_a_grant(),
        name = leader_application_name(identity),
        in_recovery = outcome::IN_RECOVERY,
        read_only = outcome::READ_ONLY,
        shared = outcome::SHARED,
        granted = outcome::GRANTED,
    )
}

/// The leader's check: in one round trip, the backend's pid, whether the server is in
/// recovery, whether this session holds the lock of `key`, and the session marker; it also
/// stamps [`CHECKED_MARKER`] with the server's time (fifth column).
///
/// Whether the session holds the lock is a re-entrant `pg_try_advisory_lock` of `key` on this
/// session: `true` when the session holds it (its hold count grows by one, never dropping to
/// zero, so the lock is never free for an instant), `false` when another session holds it. Its
/// cost does not grow with the server's lock table, as reading `pg_locks` does. A lock freed on
/// this live session (only another client's unlock on a shared server session can do that) is
/// taken again, and held from then on; the extra holds end with [`unlock`] or the session.
pub fn verify(key: LockKey) -> String {
    format!(
        "SELECT pg_backend_pid(), pg_is_in_recovery(), pg_try_advisory_lock({}), \
         current_setting('{SESSION_MARKER}', true), \
         set_config('{CHECKED_MARKER}', {SERVER_SECONDS}, false)",
        args(key)
    )
}

/// The graceful release of `key`: whether the session held it (first column), then every
/// advisory lock of the lock session, the extra holds of [`verify`] included, and the
/// session's [`SESSION_MARKER`] cleared, so that a pooler without a reset query hands the
/// session to its next client unmarked (that client's grant takes the lock on it).
pub fn unlock(key: LockKey) -> String {
    format!(
        "SELECT pg_advisory_unlock({}), pg_advisory_unlock_all(), \
         set_config('{SESSION_MARKER}', '', false)",
        args(key)
    )
}

/// Run on a standby's connection, in a query of its own, right before its queued wait
/// ([`wait_for_lock`]): bounds the session's idle time as a grant would
/// (`idle_session_timeout` and `idle_in_transaction_session_timeout` of `idle_timeout_ms`,
/// four intervals). PostgreSQL can grant the wait at the instant its `lock_timeout` fires and
/// raise 55P03 anyway, keeping the lock; the failed statement rolls back the settings the grant
/// statement would have made, so a standby cut off at that instant (its 55P03 and its close
/// lost) would leave a lock that only TCP keepalives end, hours later. Armed beforehand and
/// committed, the bound ends that session four intervals after the wait. [`release_if_held`]
/// resets both settings when the connection goes back to the pool.
pub fn bound_idle_before_wait(idle_timeout_ms: u32) -> String {
    format!(
        "SELECT set_config('idle_session_timeout', '{idle_timeout_ms}', false), \
         set_config('idle_in_transaction_session_timeout', '{idle_timeout_ms}', false)"
    )
}

/// Run on a standby's connection after its queued wait ([`wait_for_lock`]) ended with
/// `lock_timeout` (SQLSTATE 55P03), and on a pooled session the grant found marked by another
/// client whose lock is judged stranded: releases the lock of `key` if the session holds it,
/// and answers whether it did. PostgreSQL can grant a waiting lock at the instant the timeout
/// fires and raise the error anyway (`LockErrorCleanup` keeps the grant), and a session-level
/// advisory lock outlives the failed statement; without this the pooled session would keep the
/// lock. It first resets the idle bounds [`bound_idle_before_wait`] armed, so the connection
/// goes back to the pool as it came.
///
/// - A marked session (a vanished client's lock session, handed over by a pooler without a reset
///   query) is cleared as `DISCARD ALL` would have: its mark and every advisory lock on it (the
///   vanished leader's checks left one hold each), answering `true`.
/// - Otherwise a re-entrant `pg_try_advisory_lock` answers first: `false` (another session holds
///   the lock, the steady state of a standby) ends the statement at constant cost. Only when it
///   was granted (the lock was free or this session's) is the extra hold given back and this
///   session's row of `pg_locks` read, to release the lock if it was held before.
pub fn release_if_held(key: LockKey) -> String {
    format!(
        "RESET idle_session_timeout; RESET idle_in_transaction_session_timeout; \
         SELECT CASE \
         WHEN {marked} THEN CASE \
         WHEN set_config('{SESSION_MARKER}', '', false) IS NULL THEN true \
         WHEN pg_advisory_unlock_all() IS NULL THEN true ELSE true END \
         WHEN NOT pg_try_advisory_lock({args}) THEN false \
         WHEN NOT pg_advisory_unlock({args}) THEN false \
         WHEN {held} THEN pg_advisory_unlock({args}) ELSE false END",
        marked = marked_by_a_grant(),
        held = held_by_this_session(key),
        args = args(key)
    )
}

/// The query that finds the backend holding (and those waiting for) the lock of `key` in the
/// current database: one granted row is the leader's session, no row means no replica leads.
/// [`LEADER_QUERY`] is the default key's.
pub fn leader_query(key: LockKey) -> String {
    format!(
        "SELECT pid, granted \
         FROM pg_locks \
         WHERE locktype = 'advisory' \
           AND classid = {} \
           AND objid = {} \
           AND objsubid = 2 \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        key.class_id, key.obj_id
    )
}

/// Who leads the election of `key` in the current database, for operators and
/// [`status::who_leads`](crate::status::who_leads): one row per backend holding (`granted`) or
/// waiting for the lock, the holder first, with
///
/// | column           | what |
/// |------------------|------|
/// | `pid`            | the backend |
/// | `granted`        | holds the lock (the leader's session) or waits for it (a queued standby) |
/// | `application_name` | `<identity> since <unix seconds>` on the leader's session |
/// | `leading_since`  | the grant time parsed from it, unix seconds (server clock); NULL when absent |
/// | `backend_start_us` | when the session was opened, unix microseconds (a pooled session: before the grant) |
/// | `client_addr`, `client_port`, `usename` | where the session comes from |
/// | `server_now_us`  | the server's clock, unix microseconds, to measure for how long without a client clock |
///
/// Every column reads as text, so the query runs over the simple protocol of any driver.
///
/// `pg_locks` and `application_name` are visible to every role; `backend_start`,
/// `client_addr` and `client_port` of another role's session are NULL unless the reader is a
/// member of that role, a superuser or a member of `pg_read_all_stats`.
pub fn who_leads(key: LockKey) -> String {
    format!(
        "SELECT l.pid, l.granted, a.application_name, \
         substring(a.application_name FROM ' since ([0-9]{{1,10}})$')::bigint AS leading_since, \
         (extract(epoch FROM a.backend_start) * 1000000)::bigint AS backend_start_us, \
         host(a.client_addr) AS client_addr, a.client_port, a.usename::text AS usename, \
         (extract(epoch FROM statement_timestamp()) * 1000000)::bigint AS server_now_us \
         FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.classid = {} AND l.objid = {} AND l.objsubid = 2 \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         ORDER BY l.granted DESC, l.pid",
        key.class_id, key.obj_id
    )
}

/// The table of fencing epochs: one row per election key, its `epoch` advanced by every new
/// term. Created by [`FENCE_SETUP`], never implicitly.
pub const FENCE_TABLE: &str = "plexsphere_leader_fence";

/// The idempotent setup step that fencing needs (run once per database, by a migration or
/// `fencing::setup`).
pub const FENCE_SETUP: &str = "CREATE TABLE IF NOT EXISTS plexsphere_leader_fence (\
     classid int4 NOT NULL, objid int4 NOT NULL, epoch bigint NOT NULL, \
     PRIMARY KEY (classid, objid))";

/// What every statement whose commit a leader trusts begins with (the fencing epoch's advance,
/// the lease's claim and renewal): its commit waits for its WAL flush (and a synchronous
/// standby's, where one is configured) whatever the server's or role's `synchronous_commit`.
/// With `synchronous_commit = off`, a crash can roll back a commit the server already answered:
/// an epoch advance lost so would hand the next term the same epoch as this one, so that the
/// fence could not tell the two leaders' writes apart; a lost lease renewal would leave the row
/// expiring before the leader's trust in it ends. Transaction-local, so no session state.
pub const DURABLE_COMMIT: &str = "SET LOCAL synchronous_commit = on; ";

/// The exclusion proof's first statement ([`Options::prove_pool`](plexsphere_leader_core::Options::prove_pool),
/// [`plexsphere_leader_core::proof`]), run on a pooled connection and on a session of its own
/// held at once: the server backend that answers it. A direct connection and a session-mode
/// pooler answer two held sessions from two backends; a transaction-mode pooler may run both on
/// one server session.
pub const BACKEND_PID: &str = "SELECT pg_backend_pid()";

/// The exclusion proof's lock test ([`plexsphere_leader_core::proof`]): the answering backend,
/// and `pg_try_advisory_lock` of the proof's `key` in the election's own two-`int4` form. Run
/// on the first session, then on the second while the first holds the key: a lock that
/// excludes refuses the second.
pub fn prove_exclusion(key: LockKey) -> String {
    format!(
        "SELECT pg_backend_pid(), pg_try_advisory_lock({})",
        args(key)
    )
}

/// Releases the exclusion proof's `key` on the session that took it: `true` when it held it.
pub fn release_proof(key: LockKey) -> String {
    format!("SELECT pg_advisory_unlock({})", args(key))
}

/// Begins a setup's query string (the lease's and the fence table's): its
/// `CREATE TABLE IF NOT EXISTS` of a table that exists raises no NOTICE (`relation … already
/// exists, skipping`, which a client logs at every start). Transaction-local, so no session
/// state: the implicit transaction of the query string ends with it.
pub const QUIET_SETUP: &str = "SET LOCAL client_min_messages = warning; ";

/// [`FENCE_SETUP`] as [`fencing::setup`](crate::fencing::setup) sends it: quiet and
/// [serialized](lease::serialized_setup), so that replicas starting together do not race.
pub fn fence_setup() -> String {
    lease::serialized_setup(FENCE_SETUP)
}

/// Run by the new leader of `key` on its lock session right after the grant: the next epoch,
/// strictly greater than every earlier term's (a committed row, so it survives crashes and
/// reaches a synchronous standby when it commits durably: the driver sends it as
/// [`advance_epoch_within`], after [`DURABLE_COMMIT`]).
pub fn advance_epoch(key: LockKey) -> String {
    format!(
        "INSERT INTO plexsphere_leader_fence AS f (classid, objid, epoch) \
         VALUES ({}, 1) \
         ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch",
        args(key)
    )
}

/// [`advance_epoch`] as the driver sends it: after `SET LOCAL lock_timeout` of `lock_timeout_ms`
/// (half a check interval) in the same query string, so the server itself ends a wait for the
/// fence row that a cut-off leader's fenced transaction holds (SQLSTATE 55P03). Without it the
/// backend would go on waiting after its client gave up, holding the advisory lock until that
/// transaction ended. The implicit transaction of the query string ends with it, so the session
/// keeps its own `lock_timeout` and `synchronous_commit` ([`DURABLE_COMMIT`], also in the
/// string).
pub fn advance_epoch_within(key: LockKey, lock_timeout_ms: u32) -> String {
    format!(
        "SET LOCAL lock_timeout = '{lock_timeout_ms}'; {DURABLE_COMMIT}{}",
        advance_epoch(key)
    )
}

/// Run by a pass inside its own transaction before its fenced writes: the current epoch of
/// `key`, row-locked (`FOR SHARE`) until the transaction ends, so that a new leader's epoch can
/// only be advanced after the pass committed or rolled back.
pub fn fence_check(key: LockKey) -> String {
    format!(
        "SELECT epoch FROM plexsphere_leader_fence \
         WHERE classid = {} AND objid = {} FOR SHARE",
        key.class_id, key.obj_id
    )
}

/// [`fence_check`] of the fence table in `schema`, named with it: the lease's fence, which
/// every replica and every writer then reaches whatever its `search_path`.
pub fn fence_check_in(schema: &str, key: LockKey) -> String {
    fence_check(key).replacen(FENCE_TABLE, &format!("{schema}.{FENCE_TABLE}"), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: LockKey = LockKey::DEFAULT;

    #[test]
    fn the_key_spells_plxs() {
        assert_eq!(LOCK_CLASS_ID, 0x706C_7873);
        assert_eq!(&LOCK_CLASS_ID.to_be_bytes(), b"plxs");
        assert_eq!(LockKey::DEFAULT, LockKey::new(LOCK_CLASS_ID, LOCK_OBJ_ID));
        assert_eq!(leader_query(LockKey::DEFAULT), LEADER_QUERY);
    }

    #[test]
    fn the_grant_statement_checks_recovery_read_only_and_sharing_then_bounds_names_and_marks_it() {
        assert_eq!(
            try_lock(KEY, "svc@host", 20_000),
            "SELECT CASE WHEN pg_is_in_recovery() THEN 'in_recovery' \
             WHEN current_setting('transaction_read_only') = 'on' THEN 'read_only' \
             WHEN nullif(current_setting('plexsphere.leader_session', true), '') IS NOT NULL \
             THEN set_config('plexsphere.leader_session', 'shared', false) \
             WHEN NOT pg_try_advisory_lock(1886156915, 1) THEN 'refused' \
             WHEN set_config('idle_session_timeout', '20000', false) IS NULL THEN 'granted' \
             WHEN set_config('idle_in_transaction_session_timeout', '20000', false) IS NULL \
             THEN 'granted' \
             WHEN set_config('application_name', concat('svc@host since ', \
             trunc(date_part('epoch', clock_timestamp()))::bigint), false) IS NULL \
             THEN 'granted' \
             WHEN set_config('plexsphere.leader_checked', \
             concat(trunc(date_part('epoch', clock_timestamp()))::bigint), false) IS NULL \
             THEN 'granted' \
             ELSE set_config('plexsphere.leader_session', 'granted', false) END, pg_backend_pid(), \
             current_database(), current_setting('plexsphere.leader_checked', true), \
             concat(trunc(date_part('epoch', clock_timestamp()))::bigint)"
        );
        assert!(wait_for_lock(KEY, "svc", 5_000, 20_000).contains(
            "THEN set_config('plexsphere.leader_session', 'shared', false) \
             WHEN set_config('lock_timeout', '5000', true) IS NULL THEN 'refused' \
             WHEN pg_advisory_lock(1886156915, 1) IS NULL THEN 'refused' \
             WHEN set_config('idle_session_timeout', '20000', false)"
        ));
        assert_eq!(
            unlock(KEY),
            "SELECT pg_advisory_unlock(1886156915, 1), pg_advisory_unlock_all(), \
             set_config('plexsphere.leader_session', '', false)"
        );
        // Neither a standby's grant nor a refused one reads pg_locks.
        assert!(!try_lock(KEY, "svc", 1).contains("pg_locks"));
        assert!(!wait_for_lock(KEY, "svc", 1, 1).contains("pg_locks"));
        // The leader's check proves the lock with a re-entrant try, not by reading pg_locks.
        assert_eq!(
            verify(KEY),
            "SELECT pg_backend_pid(), pg_is_in_recovery(), pg_try_advisory_lock(1886156915, 1), \
             current_setting('plexsphere.leader_session', true), \
             set_config('plexsphere.leader_checked', \
             concat(trunc(date_part('epoch', clock_timestamp()))::bigint), false)"
        );
        assert!(!verify(KEY).contains("pg_locks"));
    }

    #[test]
    fn the_queued_wait_is_bounded_before_it_starts_and_reset_after_it_timed_out() {
        assert_eq!(
            bound_idle_before_wait(800),
            "SELECT set_config('idle_session_timeout', '800', false), \
             set_config('idle_in_transaction_session_timeout', '800', false)"
        );
        assert_eq!(
            release_if_held(KEY),
            "RESET idle_session_timeout; RESET idle_in_transaction_session_timeout; \
             SELECT CASE \
             WHEN nullif(current_setting('plexsphere.leader_session', true), '') IS NOT NULL \
             THEN CASE \
             WHEN set_config('plexsphere.leader_session', '', false) IS NULL THEN true \
             WHEN pg_advisory_unlock_all() IS NULL THEN true ELSE true END \
             WHEN NOT pg_try_advisory_lock(1886156915, 1) THEN false \
             WHEN NOT pg_advisory_unlock(1886156915, 1) THEN false \
             WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
             AND classid = 1886156915 AND objid = 1 AND objsubid = 2 \
             AND pid = pg_backend_pid() AND granted) \
             THEN pg_advisory_unlock(1886156915, 1) ELSE false END"
        );
    }

    #[test]
    fn the_epoch_advance_waits_for_the_fence_row_at_most_its_lock_timeout_and_commits_durably() {
        assert_eq!(
            advance_epoch_within(KEY, 250),
            format!(
                "SET LOCAL lock_timeout = '250'; SET LOCAL synchronous_commit = on; {}",
                advance_epoch(KEY)
            )
        );
    }

    #[test]
    fn every_statement_names_its_key() {
        let key = LockKey::new(-7, 42);
        for statement in [
            try_lock(key, "x", 1),
            wait_for_lock(key, "x", 1, 1),
            unlock(key),
            verify(key),
            release_if_held(key),
            advance_epoch(key),
            advance_epoch_within(key, 1),
        ] {
            assert!(statement.contains("(-7, 42"), "{statement}");
            assert!(!statement.contains("1886156915"), "{statement}");
        }
        for statement in [
            release_if_held(key),
            leader_query(key),
            who_leads(key),
            fence_check(key),
        ] {
            assert!(statement.contains("classid = -7 AND"), "{statement}");
            assert!(statement.contains("objid = 42"), "{statement}");
        }
    }

    #[test]
    fn identities_are_quoted_whatever_standard_conforming_strings_says() {
        assert_eq!(quote_literal("a"), "'a'");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(r"a\b'c"), r"E'a\\b''c'");
        assert!(try_lock(KEY, "o'brien", 1).contains("concat('o''brien since ', "));
        let long = "z".repeat(60);
        assert!(try_lock(KEY, &long, 1).contains(&format!("'{} since '", "z".repeat(46))));
        assert!(try_lock(KEY, "naïve", 1).contains("'na?ve since '"));
    }
}
