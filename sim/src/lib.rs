//! Deterministic turmoil simulation of plexsphere-leader against a simulated PostgreSQL.
//!
//! Every replica is a turmoil host running the real, unmodified
//! [`Elector::run`](plexsphere_leader::Elector::run) of the adapter on a `deadpool_postgres` pool
//! whose connections are `turmoil::net::TcpStream`s ([`TurmoilConnect`]). Two hosts of the
//! simulated server ([`plexsphere_leader_pgsim`], a crate of its own) play the primary and the
//! failover target. A seeded nemesis injects faults ([`FaultKind`]), a liveness phase follows, then
//! every replica is stopped gracefully; the checker then holds the run against the bounds of
//! design.md section 6 ([`Property`]). Each seed picks its fault kind, its acquire mode (the spec's
//! polling or the server's lock queue) and whether it fences, so that every combination runs within
//! [`RunOptions::CYCLE`] consecutive seeds of the space ([`Space::seed_at`]); a seed names its
//! kind by the kind's fixed code ([`RunOptions`](RunOptions#what-a-seed-runs)). In
//! fencing runs every term gets an epoch and the simulated service's work is fenced writes, checked
//! for rising epochs and a fence that holds.
//!
//! Sharded runs ([`RunOptions::sharded`], a seed space of their own, see [`Sharding`]) run
//! the real [`ShardedElector::run`](plexsphere_leader::sharded::ShardedElector::run) on every
//! replica instead, with a unit of work per shard through `run_if_owner`, under the same
//! nemesis; the checker holds every shard to the single election's bounds (one believed owner
//! but within the detection delay of a lost session, none across a graceful handover,
//! demotion within 2·I, re-owned within I, the orphan bound) and the space to its balance
//! after the faults ([`ShardMeasurements`], [`Report::new`]). Sharded runs over leases
//! (`--sharded --mechanism lease`, [`Space::ShardedLease`], and its pause seeds,
//! [`Space::ShardedPause`]) hold the space with `ShardConfig::lease`: the same rules over
//! the rows' tenures, with the lease's bounds (no believed owner past its member's lease, no
//! overlap) and every shard term's epoch rising.
//!
//! ```no_run
//! use plexsphere_leader_sim::{RunOptions, run};
//!
//! // A terminate seed (kind code 7, run 0), run twice: the traces must be identical.
//! let outcome = run(&RunOptions::new(70_000));
//! assert!(outcome.violations.is_empty(), "{}", outcome.failure_report());
//! ```
//!
//! See docs/simulation.md for the model, the faults, the invariants and the measured maxima.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod capture;
mod checker;
mod clock;
mod connect;
mod fenced;
mod nemesis;
mod pause;
mod record;
mod replica;
mod report;
mod run;
mod sabotage;
mod setup;
mod world;

pub use checker::{Cases, Measurements, Property, ShardMeasurements, Violation};
pub use clock::ClockRate;
pub use connect::TurmoilConnect;
pub use report::Report;
pub use run::{RunOutcome, run, run_once};
pub use setup::{
    DriverSabotage, FaultKind, Mechanism, Params, RunKind, RunOptions, SEED_STRIDE, Sabotage,
    ShardSabotage, Sharding, Space, mode_from_name, mode_name, run_number,
};
