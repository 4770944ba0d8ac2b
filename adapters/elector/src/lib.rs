//! plexsphere-leader elects exactly one *background leader* among the replicas of a service
//! through PostgreSQL, and runs the service's background loops only on that leader. It holds a
//! session advisory lock (the default: direct connections and session-mode poolers; handover
//! in milliseconds) or, behind a transaction- or statement-mode pooler or a managed pooled URL,
//! a lease row ([`Config::lease`], with its tables made once by [`lease::setup`]; a crashed
//! leader's lease runs out its TTL first).
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
//! # Where things are
//!
//! The crate root holds what every embedding names: [`Elector`] (run it, ask it, await or take
//! a [`Term`]), [`Config`], [`LockKey`], the published [`Leadership`], why a term ended
//! ([`TermEndCause`], [`LossReason`]), the two errors ([`ConfigError`], [`RunError`]),
//! `CancellationToken` (tokio-util's), and the crates the signatures name (`deadpool_postgres`,
//! `tokio_postgres`, `prometheus`). The rest lives in modules that say what they are:
//!
//! | reach for | when |
//! |---|---|
//! | [`config`] | tuning: the check interval, acquire mode, stop grace, identity, work deadline, and their validation errors |
//! | [`lease`] | the lease mechanism ([`Config::lease`]) behind a transaction-mode pooler: `lease::setup`, the tables it needs, once per database |
//! | [`leadership`] | reading leadership: term events, why `next_term` returned without a term, check failures, the last release, resignation, the stuck-leader verdict |
//! | [`fencing`] | writes that a deposed leader must not make: the epoch check inside your transaction |
//! | [`sharded`] | many leaders at once: a space of shards spread over the replicas |
//! | [`status`] | who leads, from the server's own views (the lease: its row), for operators |
//! | [`metrics`] | the gauges and counters, on prometheus or the `metrics` facade |
//! | [`session`] | another driver: the seam `SessionSource` that the sqlx crate implements |
//! | `sql`, `shard_sql` (feature `wire`) | the exact statements, for operators' tooling, tests and the simulation |
//!
//! The decisions live in the sans-IO crate `plexsphere-leader-core`; this crate drives it with
//! tokio, over deadpool-postgres and tokio-postgres by default ([`Config::new`]) or any other
//! [`session::SessionSource`] ([`Config::with_sessions`]). The leader-gated loops, the
//! supervisor, the probes and their HTTP handlers are in `plexsphere-leader-service`; the
//! `plexsphere-leader status`, `lease` and `shards` commands are in `plexsphere-leader-cli`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
pub mod config;
mod connection;
mod driver;
mod elector;
mod error;
mod failure;
pub mod fencing;
pub mod floor;
mod identity;
mod key;
pub mod leadership;
pub mod lease;
mod log;
pub mod metrics;
mod observe;
mod operation;
mod operator;
mod overdue;
pub mod session;
#[cfg(feature = "wire")]
pub mod shard_sql;
#[cfg(not(feature = "wire"))]
#[allow(dead_code, unreachable_pub)]
mod shard_sql;
pub mod sharded;
mod shared;
#[cfg(feature = "wire")]
pub mod sql;
#[cfg(not(feature = "wire"))]
#[allow(dead_code, unreachable_pub)]
mod sql;
pub mod status;
mod term;
mod trust;

pub use config::Config;
pub use elector::Elector;
pub use error::{ConfigError, RunError};
pub use key::LockKey;
pub use leadership::Leadership;
/// A replica's rank ([`Config::version`], [`Config::priority`]): the release number's order
/// and the candidacies the surveys find.
pub use plexsphere_leader_core::rank;
pub use plexsphere_leader_core::{LossReason, TermEndCause};
pub use term::Term;

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
