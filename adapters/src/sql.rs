//! The lock key and the statements the elector sends (simple query protocol only, so a
//! session-mode pooler can carry them; no prepared statement is ever created).

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

/// The standby's check: tries the lock and, only when granted, bounds the session with
/// `idle_session_timeout` in the same statement, so that a reply lost on the way back can never
/// leave an unbounded orphaned lock.
pub(crate) fn try_lock(idle_session_timeout_ms: u32) -> String {
    format!(
        "SELECT CASE WHEN pg_try_advisory_lock({LOCK_CLASS_ID}, {LOCK_OBJ_ID}) \
         THEN set_config('idle_session_timeout', '{idle_session_timeout_ms}', false) IS NOT NULL \
         ELSE false END"
    )
}

/// Sabotage only: the grant without `idle_session_timeout`.
pub(crate) fn try_lock_unbounded() -> String {
    format!("SELECT pg_try_advisory_lock({LOCK_CLASS_ID}, {LOCK_OBJ_ID})")
}

/// The leader's check.
pub(crate) const PING: &str = "SELECT 1";

/// The graceful release.
pub(crate) fn unlock() -> String {
    format!("SELECT pg_advisory_unlock({LOCK_CLASS_ID}, {LOCK_OBJ_ID})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_spells_plxs() {
        assert_eq!(LOCK_CLASS_ID, 0x706C_7873);
        assert_eq!(&LOCK_CLASS_ID.to_be_bytes(), b"plxs");
    }

    #[test]
    fn the_grant_statement_sets_the_idle_timeout_only_when_granted() {
        assert_eq!(
            try_lock(20_000),
            "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
             set_config('idle_session_timeout', '20000', false) IS NOT NULL ELSE false END"
        );
        assert_eq!(unlock(), "SELECT pg_advisory_unlock(1886156915, 1)");
    }
}
