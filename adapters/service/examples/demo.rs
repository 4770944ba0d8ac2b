//! The multi-replica demo: `cargo run --release --example demo`.
//!
//! It starts `--replicas` replica processes (default 3) of a small service. Each builds an
//! Elector on its database pool first, wires every loop of the spec's three tables (fifteen
//! leader-ticked loops, two while-leader loops, the every-replica loops with their gated parts)
//! under the supervisor, runs the boot passes, then serves `/readyz`, `/livez`, `/metrics` and
//! `/status` on port `--http-port` + its index. One replica leads; kill it and another takes
//! over within about one `--check-interval`. Every leadership change prints one line:
//!
//! ```text
//! [demo] replica=1 pid=4242 event=acquired term=1
//! [demo] replica=1 pid=4242 event=lost term=1 cause="leadership lost: ..."
//! [demo] replica=1 pid=4242 event=released term=1 cause="election stopped: lock released"
//! ```
//!
//! With `--shards K` every replica also runs a sharded elector of K shards: the ticked loops'
//! sweeps are spread over the replicas by item id mod K, each replica prints
//! `event=shards owned=N took=T gave=G` when its shards change, and each replica's `/` serves a
//! live page of who owns which shards.
//!
//! With `--rollout` every replica ranks itself by its version (`Config::version`, 1.0.0), and
//! once one leads the demo replaces them one at a time with version 1.1.0 in the surge order of
//! a Kubernetes rolling update (a new replica starts, in one spare slot, before an old one
//! stops), printing each leadership move (`event=leadership-moved from=… to=… version=…
//! cause=yielded`) and, at the end, `event=rollout-done moves=M to_new=N …` (one move per
//! deploy); then it keeps running.
//!
//! `/status` also lists the wired workers and readiness probes. `sse-nonce-sweep` ticks once per
//! `$PLEXSPHERE_SSE_NONCE_TTL` (default 5m) instead of once per interval.
//!
//! The command line is a stable contract: see `docs/loops.md`.
#![forbid(unsafe_code)]

#[path = "demo/cli.rs"]
mod cli;
#[path = "demo/database.rs"]
mod database;
#[path = "demo/parent.rs"]
mod parent;
#[path = "demo/passes.rs"]
mod passes;
#[path = "demo/replica.rs"]
mod replica;
#[path = "demo/rollout.rs"]
mod rollout;
#[path = "demo/shards.rs"]
mod shards;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Refused here, in the flags' words, before any replica starts (each replica runs the
    // same check on the command line its parent gave it).
    let args = match cli::Args::parse().validated() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("[demo] error: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("[demo] cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let replica = std::env::var(cli::REPLICA_ENV).ok();
    let result = match replica.map(|index| index.parse::<u16>()) {
        Some(Ok(index)) => runtime.block_on(replica::run(args, index)),
        Some(Err(error)) => Err(format!("{}: {error}", cli::REPLICA_ENV).into()),
        None => runtime.block_on(parent::run(args)),
    };
    // The task reading standard input sits in a blocking read that never returns: do not wait
    // for it.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("[demo] error: {error}");
            ExitCode::FAILURE
        }
    }
}
