//! The benchmarks of plexsphere-leader: print tables, assert nothing.
//!
//! ```text
//! cargo run --release -p plexsphere-leader-tests --bin bench -- single [flags]   # one election
//! cargo run --release -p plexsphere-leader-tests --bin bench -- shards [flags]   # sharded
//! cargo run --release -p plexsphere-leader-tests --bin bench -- busy [flags]     # a busy server
//! cargo run --release -p plexsphere-leader-tests --bin bench -- <single|shards> --help
//! ```
//!
//! - [`single`]: the single election's failover table, cost per check, scale and detection
//!   floor.
//! - [`shards`]: sharded leadership's cost against single elections, membership changes and
//!   SIGKILL.
//! - [`busy`]: the leader's check and the shard survey while another session holds N locks.
//!
//! Replicas are OS processes: this binary re-run as `bench replica …`, a hidden subcommand that
//! runs `plexsphere_leader_tests::replica_child` (the election for `single`, `--shards K` for
//! `shards`). Needs the local PostgreSQL of the test suite (`PLEXSPHERE_TEST_DSN`) and the
//! server binaries for throwaway clusters. See `docs/benchmarks.md`.
//!
//! A counting global allocator (`stats_alloc`) serves the whole binary, the replica processes
//! included: `single --only costs` reads it.
#![forbid(unsafe_code)]

mod busy;
mod common;
mod shards;
mod single;

use std::alloc::System;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};
use plexsphere_leader_tests::replica_child::{self, ChildArgs};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The benchmarks of plexsphere-leader: print tables, assert nothing.
#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The single election: failover per fault, cost per check, scale, detection floor.
    Single(single::Options),
    /// Sharded leadership: cost against single elections, membership changes, SIGKILL.
    Shards(shards::Options),
    /// The leader's check and the shard survey on a server busy with other sessions' locks.
    Busy(busy::Options),
    /// A replica process of `single`'s and `shards`' rounds (the benchmark runs itself) and of
    /// `tests/tests/sharded_process.rs`.
    #[command(hide = true)]
    Replica(ChildArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Single(options) => common::block_on(single::run(options)),
        Command::Shards(options) => {
            if let Err(message) = options.check() {
                Cli::command()
                    .error(ErrorKind::ValueValidation, message)
                    .exit();
            }
            common::block_on(shards::run(options))
        }
        Command::Busy(options) => common::block_on(busy::run(options)),
        Command::Replica(args) => replica_child::run_process(args),
    }
}
