//! plexsphere-leader elects exactly one *background leader* among the replicas of a service
//! through a PostgreSQL session advisory lock, and runs the service's background loops only on
//! that leader.
//!
//! ```no_run
//! use std::time::Duration;
//! use plexsphere_leader::{Config, Elector};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let elector = Elector::new(Config::new(pool).check_interval(Duration::from_secs(5)))?;
//! let shutdown = CancellationToken::new();
//! let election = tokio::spawn({
//!     let (elector, shutdown) = (elector.clone(), shutdown.clone());
//!     async move { elector.run(shutdown).await }
//! });
//! // A periodic pass that only the leader runs:
//! let ran = elector
//!     .run_if_leader(&shutdown, |term| async move {
//!         // ... stop early when `term` is cancelled ...
//!         Ok::<_, std::io::Error>(())
//!     })
//!     .await?;
//! shutdown.cancel();
//! election.await??;
//! # let _ = ran; Ok(()) }
//! ```
//!
//! The decisions live in the sans-IO crate `plexsphere-leader-core`; this crate drives it with
//! tokio, over deadpool-postgres and tokio-postgres by default ([`Config::new`]) or any other
//! [`session::SessionSource`] ([`Config::with_sessions`]). The leader-gated loops, the
//! supervisor, the probes and their HTTP handlers are in `plexsphere-leader-service`; the
//! `plexsphere-leader status` command is in `plexsphere-leader-cli`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod config;
mod connection;
mod driver;
mod elector;
mod error;
mod failure;
pub mod fencing;
mod identity;
mod key;
mod leadership;
mod log;
pub mod metrics;
mod observe;
mod overdue;
pub mod session;
pub mod shard_sql;
pub mod sharded;
mod shared;
pub mod sql;
pub mod status;
mod term;

pub use config::{Config, OnOverdue};
pub use elector::{Elector, Resignation};
pub use error::{CheckError, ConfigError, RunError};
pub use identity::{IdentityError, MAX_IDENTITY_LEN};
pub use key::{LockKey, ParseLockKeyError};
pub use leadership::{
    CheckFailing, CheckFailure, Leadership, TermEnd, TermEvent, TermEvents, TermInfo,
    TermWaitCancelled,
};
pub use overdue::OVERDUE_WORK_MESSAGE;
pub use plexsphere_leader_core::failures::FailureClass;
pub use plexsphere_leader_core::work::Interruption;
pub use plexsphere_leader_core::{
    AcquireMode, CheckInterval, DEFAULT_CHECK_INTERVAL, IntervalError, LossReason, MAX_HOLD_OFF,
    MAX_STOP_GRACE_INTERVALS, Release, ReleaseOutcome, STUCK_AFTER_INTERVALS, StopGraceTooLong,
    StuckLeader, TermEndCause, TermId, UNLOCK_BUDGET,
};
pub use term::{Term, named_work};

/// The cancellation token that [`Elector::run`], [`Elector::term`] and the leader work take
/// (tokio-util's): depend on this crate alone to name it.
#[doc(no_inline)]
pub use tokio_util::sync::CancellationToken;

/// The crates this one's signatures name, re-exported so that a service depends on
/// `plexsphere-leader` alone and cannot pick a version whose types do not match (for example
/// `prometheus = "0.13"` against this crate's 0.14).
#[cfg(feature = "deadpool")]
#[doc(no_inline)]
pub use deadpool_postgres;
#[cfg(feature = "prometheus")]
#[doc(no_inline)]
pub use prometheus;
#[cfg(feature = "deadpool")]
#[doc(no_inline)]
pub use tokio_postgres;

/// Compiles the README's example.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
