//! The lock key and every statement the elector sends, public so that operators, tests and the
//! simulation replay exactly what goes over the wire. Simple query protocol only, so that a
//! session-mode pooler can carry them; no prepared statement is ever created.

/// The first `int4` of the leader lock key: `0x706C7873`, ASCII `plxs`. It shows in `pg_locks`
/// as `classid`.
pub const LOCK_CLASS_ID: i32 = 1_886_156_915;

/// The second `int4` of the leader lock key. It shows in `pg_locks` as `objid`.
pub const LOCK_OBJ_ID: i32 = 1;

/// The query that finds the leader's backend in the current database: one granted row is the
/// leader's session, no row means no replica leads. (`objsubid = 2` marks the two-`int4` key
/// form, which never collides with a `bigint` key.)
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

/// `EXISTS` of this session's granted row of the lock in `pg_locks`.
const HELD_BY_THIS_SESSION: &str = "EXISTS (SELECT 1 FROM pg_locks \
     WHERE locktype = 'advisory' AND classid = 1886156915 AND objid = 1 AND objsubid = 2 \
     AND pid = pg_backend_pid() AND granted)";

/// The outcomes of a grant statement (its first column).
pub mod outcome {
    /// The lock was taken; the session is now the leader's.
    pub const GRANTED: &str = "granted";
    /// Another session holds the lock.
    pub const REFUSED: &str = "refused";
    /// The server is a hot standby: the lock is never taken there.
    pub const IN_RECOVERY: &str = "in_recovery";
    /// The session held the lock before this client asked: it is shared with another client.
    pub const SHARED: &str = "shared";
}

/// The standby's check (polling mode): tries the lock and, only when granted, bounds the
/// session with `idle_session_timeout` and `idle_in_transaction_session_timeout` and marks it,
/// in the same statement, so that a reply lost on the way back can never leave an unbounded
/// orphaned lock. Returns `(outcome, pg_backend_pid())`; see [`outcome`].
///
/// It refuses a server in recovery, and a session that already holds the lock (a pooler that
/// shares one server session between clients), which it marks `shared` so that the client
/// that took the lock first demotes at its next check.
pub fn try_lock(idle_timeout_ms: u32) -> String {
    grant(
        &format!(
            "WHEN NOT pg_try_advisory_lock({LOCK_CLASS_ID}, {LOCK_OBJ_ID}) THEN '{}' ",
            outcome::REFUSED
        ),
        idle_timeout_ms,
    )
}

/// The standby's check (queued mode): waits in the server's lock queue for at most
/// `lock_timeout_ms` (a transaction-local `lock_timeout`, so the pooled connection keeps its
/// own setting), then as [`try_lock`]. A wait that times out fails with SQLSTATE 55P03.
pub fn wait_for_lock(lock_timeout_ms: u32, idle_timeout_ms: u32) -> String {
    grant(
        &format!(
            "WHEN set_config('lock_timeout', '{lock_timeout_ms}', true) IS NULL THEN '{refused}' \
             WHEN pg_advisory_lock({LOCK_CLASS_ID}, {LOCK_OBJ_ID}) IS NULL THEN '{refused}' ",
            refused = outcome::REFUSED
        ),
        idle_timeout_ms,
    )
}

/// The grant statement around `taking`, the `WHEN … THEN 'refused'` branches that take the
/// lock. `CASE` evaluates its branches in order (unlike `AND`/`OR`, whose operands the planner
/// may reorder), so nothing runs after a refusal. The two `set_config` branches only sequence
/// the settings (`set_config` never returns NULL); were one to, the answer would still be
/// `granted`, since the lock is held, and the missing marker would demote at the first check.
fn grant(taking: &str, idle_timeout_ms: u32) -> String {
    format!(
        "SELECT CASE \
         WHEN pg_is_in_recovery() THEN '{in_recovery}' \
         WHEN {HELD_BY_THIS_SESSION} THEN set_config('{SESSION_MARKER}', '{shared}', false) \
         {taking}\
         WHEN set_config('idle_session_timeout', '{idle_timeout_ms}', false) IS NULL THEN '{granted}' \
         WHEN set_config('idle_in_transaction_session_timeout', '{idle_timeout_ms}', false) IS NULL \
         THEN '{granted}' \
         ELSE set_config('{SESSION_MARKER}', '{granted}', false) END, pg_backend_pid()",
        in_recovery = outcome::IN_RECOVERY,
        shared = outcome::SHARED,
        granted = outcome::GRANTED,
    )
}

/// Sabotage only: the grant without `idle_session_timeout`.
pub fn try_lock_unbounded() -> String {
    format!(
        "SELECT CASE WHEN pg_try_advisory_lock({LOCK_CLASS_ID}, {LOCK_OBJ_ID}) \
         THEN '{granted}' ELSE '{refused}' END, pg_backend_pid()",
        granted = outcome::GRANTED,
        refused = outcome::REFUSED,
    )
}

/// The plain `SELECT 1` check of the spec, kept for the sabotage variants.
pub const PING: &str = "SELECT 1";

/// The leader's check: in one round trip, the backend's pid, whether the server is in
/// recovery, whether this session still holds the lock, and the session marker.
pub fn verify() -> String {
    format!(
        "SELECT pg_backend_pid(), pg_is_in_recovery(), {HELD_BY_THIS_SESSION}, \
         current_setting('{SESSION_MARKER}', true)"
    )
}

/// The graceful release.
pub fn unlock() -> String {
    format!("SELECT pg_advisory_unlock({LOCK_CLASS_ID}, {LOCK_OBJ_ID})")
}

/// Run on a standby's connection after its queued wait ([`wait_for_lock`]) ended with
/// `lock_timeout` (SQLSTATE 55P03): releases the lock if the session holds it, and answers
/// whether it did. PostgreSQL can grant a waiting lock at the instant the timeout fires and
/// raise the error anyway (`LockErrorCleanup` keeps the grant), and a session-level advisory
/// lock outlives the failed statement; without this the pooled session would keep the lock.
pub fn release_if_held() -> String {
    format!(
        "SELECT CASE WHEN {HELD_BY_THIS_SESSION} \
         THEN pg_advisory_unlock({LOCK_CLASS_ID}, {LOCK_OBJ_ID}) ELSE false END"
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

/// Run by the new leader on its lock session right after the grant: the next epoch, strictly
/// greater than every earlier term's (a committed row, so it survives crashes and reaches a
/// synchronous standby).
pub fn advance_epoch() -> String {
    format!(
        "INSERT INTO plexsphere_leader_fence AS f (classid, objid, epoch) \
         VALUES ({LOCK_CLASS_ID}, {LOCK_OBJ_ID}, 1) \
         ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch"
    )
}

/// Run by a pass inside its own transaction before its fenced writes: the current epoch,
/// row-locked (`FOR SHARE`) until the transaction ends, so that a new leader's epoch can only
/// be advanced after the pass committed or rolled back.
pub const FENCE_CHECK: &str = "SELECT epoch FROM plexsphere_leader_fence \
     WHERE classid = 1886156915 AND objid = 1 FOR SHARE";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_spells_plxs() {
        assert_eq!(LOCK_CLASS_ID, 0x706C_7873);
        assert_eq!(&LOCK_CLASS_ID.to_be_bytes(), b"plxs");
    }

    #[test]
    fn the_grant_statement_checks_recovery_and_sharing_then_bounds_and_marks_the_session() {
        assert_eq!(
            try_lock(20_000),
            "SELECT CASE WHEN pg_is_in_recovery() THEN 'in_recovery' \
             WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
             AND classid = 1886156915 AND objid = 1 AND objsubid = 2 \
             AND pid = pg_backend_pid() AND granted) \
             THEN set_config('plexsphere.leader_session', 'shared', false) \
             WHEN NOT pg_try_advisory_lock(1886156915, 1) THEN 'refused' \
             WHEN set_config('idle_session_timeout', '20000', false) IS NULL THEN 'granted' \
             WHEN set_config('idle_in_transaction_session_timeout', '20000', false) IS NULL \
             THEN 'granted' \
             ELSE set_config('plexsphere.leader_session', 'granted', false) END, pg_backend_pid()"
        );
        assert!(wait_for_lock(5_000, 20_000).contains(
            "THEN set_config('plexsphere.leader_session', 'shared', false) \
             WHEN set_config('lock_timeout', '5000', true) IS NULL THEN 'refused' \
             WHEN pg_advisory_lock(1886156915, 1) IS NULL THEN 'refused' \
             WHEN set_config('idle_session_timeout', '20000', false)"
        ));
        assert_eq!(unlock(), "SELECT pg_advisory_unlock(1886156915, 1)");
    }
}
