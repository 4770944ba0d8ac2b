//! Test harness for `plexsphere-leader` against a real PostgreSQL server.
//!
//! The harness gives each test what the fault matrix of the design (sections 5 and 6) needs:
//!
//! - [`TestDb`]: a fresh, uniquely named database per test on the local server. Advisory locks
//!   are scoped to one database, so tests that run at the same time never see each other's lock.
//! - [`FaultProxy`]: a TCP proxy between a client and PostgreSQL that forwards, delays,
//!   blackholes (keeps both sockets open and drops bytes), resets, closes or refuses.
//! - [`Cluster`]: a throwaway PostgreSQL cluster that a test may stop, restart, or fail over to a
//!   promoted standby.
//! - [`LockObserver`]: polls `pg_locks` for the leader lock and records who held it when.
//! - [`Timeline`] and the pure functions of [`timeline`]: merge events from many replicas and
//!   compute overlaps (two replicas believing they lead) and leaderless gaps.
//! - [`replica_child`]: the replica child process (the election, a sharded elector, or one
//!   elector per shard key), and [`replica_process`]: the harness side that starts such
//!   processes ([`Launcher`], [`ReplicaProcess`]) and reads what they print.
//!
//! Nothing here relies on process-global state shared between tests: each test may run in its
//! own process (nextest) or in threads of one process (`cargo test`).
//!
//! The base DSN is read from `PLEXSPHERE_TEST_DSN`, default [`DEFAULT_DSN`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
pub mod clock;
mod cluster;
mod db;
mod error;
mod observer;
mod pg;
mod pgbouncer;
pub mod procfs;
mod proxy;
pub mod replica_child;
pub mod replica_process;
pub mod timeline;

pub use backend::{Backend, BackendPool};
pub use cluster::{Cluster, StopMode};
pub use db::{Session, TestDb};
pub use error::HarnessError;
pub use observer::{Holder, HolderChange, LockObserver};
pub use pg::{base_config, connect, pool_for, retarget, simple_rows};
pub use pgbouncer::{PgBouncer, PoolMode};
pub use proxy::{Direction, FaultProxy, Mode};
pub use replica_child::{ChildArgs, Mechanism};
pub use replica_process::{CpuSample, ExitReport, Launcher, PoolReport, Record, ReplicaProcess};
pub use timeline::{Event, Interval, Span, Timeline};

/// Default base DSN when `PLEXSPHERE_TEST_DSN` is not set.
pub const DEFAULT_DSN: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";

/// Environment variable holding the base DSN (a `tokio_postgres` key/value string or URL).
pub const DSN_ENV: &str = "PLEXSPHERE_TEST_DSN";

/// First half of the leader lock key: `0x706C7873`, ASCII `plxs`.
pub const LOCK_CLASSID: i32 = 1_886_156_915;

/// Second half of the leader lock key.
pub const LOCK_OBJID: i32 = 1;

/// `application_name` prefix of the harness's own sessions (admin client, lock observer).
///
/// [`TestDb::backend_count`] leaves these sessions out.
pub const HARNESS_APP_PREFIX: &str = "plx-harness";

/// Compiles the repository README's examples (they are no package's own).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct RootReadme;

/// Compiles the examples of docs/ that a user would copy: each page's Rust blocks.
#[cfg(doctest)]
mod docs_examples {
    #[doc = include_str!("../../docs/reference.md")]
    struct Reference;
    #[doc = include_str!("../../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../../docs/loops.md")]
    struct Loops;
    #[doc = include_str!("../../docs/metrics.md")]
    struct Metrics;
}
