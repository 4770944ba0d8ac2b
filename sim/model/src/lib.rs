//! An exhaustive, bounded model check of plexsphere-leader's core machines on
//! [stateright](https://docs.rs/stateright): the state holds the **real** core machines of three
//! replicas (the advisory [`Election`](plexsphere_leader_core::Election), the lease election and
//! the [`ShardedElection`](plexsphere_leader_core::shards::ShardedElection)), driven only through
//! the [`Machine`](plexsphere_leader_core::Machine) contract. The model is the environment alone:
//! sessions, the lock manager and its queue, the lease row on the server's clock, the fence's
//! epoch, operations in flight, the replicas' clocks, and faults as steps. The election's rules
//! are never written twice.
//!
//! - [`engine`]: the model engine, written once for every mode.
//! - [`single`]: the single-lock mode, the advisory lock and the lease.
//! - [`sharded`]: the sharded mode, over a space of four shards held by advisory locks or leases.
//! - [`check`]: running a check breadth-first and reporting it.
//! - [`sabotage`]: planted bugs, to prove the properties can fail.
//! - [`trace`]: a counterexample as the inputs a core unit test replays.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod clock;
pub mod engine;
pub mod flight;
pub mod rename;
pub mod sabotage;
pub mod server;
pub mod sharded;
pub mod single;
pub mod step;
pub mod trace;
