//! The pure election of plexsphere-leader. **This crate performs no I/O, reads no clock and uses
//! no randomness**: time enters as an argument of every input, and every effect leaves as an
//! [`Action`] for a driver to perform.
//!
//! One [`Election`] is the state machine of one replica: a standby tries a PostgreSQL session
//! advisory lock every check interval, the replica whose session holds it leads, and the leader
//! verifies its session every interval; with [`Options::lease`] it claims and renews a lease
//! row instead, trusting it for a bounded time on its own clock ([`lease`]). The crate `plexsphere-leader` drives it with tokio and
//! tokio-postgres; the simulation drives the same driver under turmoil.
//!
//! - [`Election`]: the state machine, its inputs ([`Event`], timeouts) and outputs ([`Action`]).
//! - [`Control`]: the requests from outside a run (stop, resign, eligibility, panic, drop),
//!   the same for both machines.
//! - [`CheckInterval`]: the validated interval and the `idle_session_timeout` derived from it.
//! - [`work`]: the outcome table of a unit of leader work (the spec's `Do`).
//! - [`shards`]: sharded leadership, `K` shards balanced over the live replicas on one lock
//!   session each.
//! - [`proof`]: the exclusion proof, which a run of the advisory lock passes before its first
//!   attempt (the sessions are the pool's own, and the server's lock excludes).
//! - [`failures`]: how a run of failed checks is reported (a permanent mistake is an ERROR).
//! - [`invariants`]: a checker of the safety properties over a trace, shared by the property
//!   tests, the fuzz target and the simulation.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod action;
mod cause;
mod control;
mod election;
mod event;
pub mod failures;
mod handled;
mod hold_off;
mod ids;
mod interval;
pub mod invariants;
pub mod lease;
mod liveness;
mod machine;
mod mechanism;
mod options;
mod overdue;
pub mod proof;
pub mod rank;
pub mod readiness;
mod release;
mod schedule;
pub mod shards;
pub mod supervision;
mod verify;
pub mod work;

pub use action::{Action, Level, LogKind, LogRecord};
pub use cause::{Cause, LockFinding, LossReason, TermEndCause};
pub use control::Control;
pub use election::{Election, MAX_HOLD_OFF, Phase, Timer};
pub use event::Event;
pub use handled::{AlreadyRunning, Handled, Ignored};
pub use ids::{ConnId, TermId};
pub use interval::{
    CheckInterval, DEFAULT_CHECK_INTERVAL, IDLE_SESSION_TIMEOUT_INTERVALS, IntervalError,
    MAX_CHECK_INTERVAL, MIN_CHECK_INTERVAL, UNLOCK_BUDGET,
};
pub use lease::{LEASE_TTL_INTERVALS, Lease, LeaseTtlError};
pub use liveness::{STUCK_AFTER_INTERVALS, StuckLeader};
pub use machine::Machine;
pub use mechanism::Mechanism;
pub use options::{
    AcquireMode, MAX_STOP_GRACE_INTERVALS, OnOverdue, Options, PREEMPT_WINDOW_INTERVALS,
    StopGraceTooLong, WorkDeadline,
};
pub use release::{Release, ReleaseOutcome};
pub use verify::LockCheck;

/// Compiles the package README's example.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
