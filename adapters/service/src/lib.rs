//! The service kit of plexsphere-leader: the leader-gated background loops, the supervisor that
//! restarts them, the readiness and liveness probes and (feature `http`, on by default) the axum
//! handlers of `/readyz`, `/livez` and `/metrics`: the spec's launchers, probes and supervisor
//! around one [`plexsphere_leader::Elector`].
//!
//! ```no_run
//! use std::time::Duration;
//! use plexsphere_leader::{Config, Elector};
//! use plexsphere_leader_service::loops::{BoxError, pass_fn};
//! use plexsphere_leader_service::{
//!     Background, LeaderTicker, Readiness, shutdown_bound, wire_background,
//! };
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn boot(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let readiness = Readiness::new();
//! let elector = Elector::new(Config::new(pool))?;
//! // How long the shutdown may wait: the elector's stop grace and unlock (8 s with the
//! // defaults; `DEFAULT_SHUTDOWN_BOUND`, 5 s, could cut its unlock short).
//! let bound = shutdown_bound(&elector);
//! let mut background = Background::new(&readiness)?;
//! // The election as the worker `background-leader`, then each leader-gated loop.
//! wire_background(Some(elector), &mut background, |elector, bg| {
//!     let sweep = pass_fn(|term: CancellationToken| async move {
//!         // ... one pass, stopping early when `term` is cancelled ...
//!         # drop(term);
//!         Ok::<(), BoxError>(())
//!     });
//!     bg.ticker(LeaderTicker::new("sweep", elector.clone(), Duration::from_secs(30), sweep))?;
//!     Ok(())
//! })?;
//! let shutdown = CancellationToken::new();
//! background.boot(&shutdown).await; // boot passes: every replica, ungated
//! let running = background.start(&shutdown);
//! // ... serve until asked to stop, then:
//! shutdown.cancel();
//! running.shutdown(bound).await;
//! # Ok(()) }
//! ```
//!
//! A panic of a pass or a worker is caught on its own task ([`std::panic::catch_unwind`] around
//! each poll) and logged; the crate installs no process-wide panic hook. A service that wants
//! the panic's own stack in those logs installs the capturing hook once at start-up
//! ([`capture_panic_stacks`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod failure;
#[cfg(feature = "http")]
pub mod http;
mod liveness;
pub mod loops;
mod panic;
mod readiness;
mod supervisor;
mod task;

pub use failure::{
    Permanent, Reported, UNAVAILABLE_SQLSTATES, UNFIT_SQLSTATES, Unavailable, is_permanent,
    is_unavailable, report,
};
pub use liveness::{ElectorLiveness, Liveness, LivenessReport};
pub use loops::{
    Background, EveryReplica, Gate, LeaderSource, LeaderTicker, WhileLeader, wire_background,
};
pub use panic::capture_panic_stacks;
pub use plexsphere_leader_core::readiness::Tick;
pub use plexsphere_leader_core::supervision::{RestartPolicy, WorkerState};
pub use readiness::{DuplicateProbe, LoopProbe, Probe, ProbeReport, Readiness, ReadinessReport};
pub use supervisor::{
    DEFAULT_SHUTDOWN_BOUND, DuplicateWorker, RunningWorkers, SHUTDOWN_SLACK, ShutdownReport,
    Supervisor, UNAVAILABLE_MAX_BACKOFF, WORKERS_PROBE, WorkersProbe, shutdown_bound,
};

/// Compiles the package README's example.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
