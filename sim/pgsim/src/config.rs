//! Configuration of one simulated server instance.

use std::time::Duration;

use super::guc::LockTableSettings;

/// Settings of a [`SimPostgres`](super::SimPostgres) instance, built from
/// [`ServerConfig::default`] with the `with_*` methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub(crate) first_pid: i32,
    pub(crate) query_latency: Duration,
    pub(crate) startup_timeout: Duration,
    pub(crate) server_version: String,
    pub(crate) in_recovery: bool,
    pub(crate) row_locks: bool,
    pub(crate) shard_lease_flaw: Option<ShardLeaseFlaw>,
    pub(crate) lock_table: LockTableSettings,
}

/// A deliberately broken take of a lease shard space (`shard_sql::lease::take`), for the
/// checker-must-fail tests; a server without one takes as PostgreSQL does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardLeaseFlaw {
    /// The take owns every asked shard, a live member's too (its `ON CONFLICT … WHERE
    /// o.member IS NULL` dropped): two members own one shard.
    TakesLiveShards,
    /// The take reaps nobody: an expired member keeps its rows, and its shards are never
    /// free again.
    NoReap,
    /// The take does not advance the taken shards' fence rows: it answers each with the
    /// row's epoch as it is (1 for a missing row), so a new owner's writes carry its
    /// predecessor's epoch.
    KeepsEpochs,
}

impl Default for ServerConfig {
    /// First pid 1000, no query latency, a 60 s startup timeout (PostgreSQL's
    /// `authentication_timeout`), `server_version` 16.0, a primary (not in recovery), row
    /// locks on, PostgreSQL's default lock table (`max_locks_per_transaction` 64,
    /// `max_connections` 100, `max_prepared_transactions` 0).
    fn default() -> Self {
        Self {
            first_pid: 1000,
            query_latency: Duration::ZERO,
            startup_timeout: Duration::from_secs(60),
            server_version: "16.0 (plexsphere-leader-sim)".to_owned(),
            in_recovery: false,
            row_locks: true,
            shard_lease_flaw: None,
            lock_table: LockTableSettings::default(),
        }
    }
}

impl ServerConfig {
    /// The backend pid of the first session; later sessions count up from it, across
    /// restarts, so every session of an instance has its own pid.
    #[must_use]
    pub fn with_first_pid(mut self, pid: i32) -> Self {
        self.first_pid = pid;
        self
    }

    /// A delay the server waits before executing each simple Query (default zero); can be
    /// changed later with [`ServerHandle::set_query_latency`](super::ServerHandle::set_query_latency).
    #[must_use]
    pub fn with_query_latency(mut self, latency: Duration) -> Self {
        self.query_latency = latency;
        self
    }

    /// How long a new connection may take to send its startup message before the server
    /// closes it without a word.
    #[must_use]
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// The `server_version` reported in ParameterStatus.
    #[must_use]
    pub fn with_server_version(mut self, version: impl Into<String>) -> Self {
        self.server_version = version.into();
        self
    }

    /// Starts the instance as a hot standby: `pg_is_in_recovery()` is true and writes fail
    /// with 25006, until [`ServerHandle::promote`](super::ServerHandle::promote). Advisory
    /// locks work as on a primary (PostgreSQL does not WAL-log them).
    #[must_use]
    pub fn with_in_recovery(mut self, in_recovery: bool) -> Self {
        self.in_recovery = in_recovery;
        self
    }

    /// Whether `SELECT … FOR SHARE` locks the fence row it reads (default on, as PostgreSQL
    /// does). Off, the row is read but not locked, so an epoch advance never waits for a
    /// fenced transaction: a deliberately broken server, for the checker-must-fail test
    /// (sabotage `fence-without-row-lock`).
    #[must_use]
    pub fn with_row_locks(mut self, row_locks: bool) -> Self {
        self.row_locks = row_locks;
        self
    }

    /// A broken take of a lease shard space (default none): a deliberately broken server,
    /// for the checker-must-fail tests (sabotages `take-live-shards`, `take-without-reap`,
    /// `take-without-fence`).
    #[must_use]
    pub fn with_shard_lease_flaw(mut self, flaw: Option<ShardLeaseFlaw>) -> Self {
        self.shard_lease_flaw = flaw;
        self
    }

    /// The settings that size the lock table, as `current_setting` shows them:
    /// `max_locks_per_transaction`, `max_connections`, `max_prepared_transactions`. The model
    /// never runs out of lock slots; the settings only feed what a sharded replica checks
    /// when it registers (`K + R` within half the table).
    #[must_use]
    pub fn with_lock_table(
        mut self,
        max_locks_per_transaction: u32,
        max_connections: u32,
        max_prepared_transactions: u32,
    ) -> Self {
        self.lock_table = LockTableSettings {
            max_locks_per_transaction,
            max_connections,
            max_prepared_transactions,
        };
        self
    }
}
