//! A simulated PostgreSQL server for turmoil, the database of `plexsphere-leader-sim`.
//!
//! It speaks enough of protocol v3 for an unmodified `tokio_postgres` client connected
//! with `Config::connect_raw` over a `turmoil::net::TcpStream` (see [`connect`]): trust
//! authentication, the simple query protocol for the statements in `sql` (the adapter's
//! grant, `SELECT 1` and unlock statements and a few more), and the extended protocol for
//! those statements without parameters (what `tokio_postgres`'s `query` sends). It models
//! session advisory locks with re-entrancy counts,
//! `idle_session_timeout` (FATAL 57P05), `idle_in_transaction_session_timeout` (FATAL 25P03),
//! `pg_advisory_lock`'s FIFO wait queue with `lock_timeout` (ERROR 55P03; a wait granted in
//! the tick its timeout fires still fails with 55P03 and keeps the lock, as PostgreSQL's
//! grant-at-timeout race does, logged as [`Event::GrantedAtLockTimeout`]), transaction-local
//! `set_config`, custom placeholder settings, hot standbys (`pg_is_in_recovery()`, see
//! [`ServerConfig::with_in_recovery`]), the fencing table (committed data that survives
//! crashes and, with [`ServerHandle::replicate_to`], failovers) with `FOR SHARE` row locks
//! that make an epoch advance wait for fenced transactions, the lease mechanism's lease table
//! (`plexsphere_leader::sql::lease`: claim, renew, release, who holds, with `now()` the
//! server's clock; a claim advances the fence row and waits for fenced transactions as an
//! epoch advance does), a lease shard space's members' and owners' tables and members'
//! sequence (`plexsphere_leader::shard_sql::lease`: register, renew, survey, take with its
//! reap and fence advances under its transaction lock, release, leave; see
//! [`ShardLeaseFlaw`] for the broken takes of the sabotages), `pg_terminate_backend`
//! (FATAL 57P01), crash and restart, and keeps a ground-truth [`LogEntry`] log of sessions and locks and a statement
//! log ([`QueryRecord`]) from which idle periods are measured.
//!
//! Deterministic under turmoil: time is read only through `tokio::time` and
//! [`turmoil::sim_elapsed`], all collections are ordered, nothing is spawned.
//!
//! ```no_run
//! use plexsphere_leader_pgsim::{ServerConfig, SimPostgres, connect};
//!
//! let mut sim = turmoil::Builder::new().build();
//! let (server, handle) = SimPostgres::new(ServerConfig::default());
//! sim.host("pg1", move || server.clone().serve(5432));
//! sim.client("app", async move {
//!     let (client, connection) = connect("pg1", 5432, "app", "plexsphere").await?;
//!     tokio::task::spawn_local(connection);
//!     client.simple_query("SELECT 1").await?;
//!     Ok(())
//! });
//! sim.run().unwrap();
//! assert!(handle.check_mutual_exclusion().is_ok());
//! ```
//!
//! # Host crashes
//!
//! [`ServerHandle::crash`] is the precise way to crash the server. A turmoil
//! `Sim::crash("pg1")` or `Sim::bounce("pg1")` drops the host software; the instance
//! then also loses its sessions and locks (reason [`EndReason::Crash`]), stamped with the
//! last simulated time the server observed, because no host clock can be read while
//! turmoil drops the software. Either way turmoil closes the dropped sockets, so peers
//! see a FIN (or a RST if bytes were unread), as after a killed PostgreSQL process.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod candidacy;
mod client;
mod config;
mod exec;
mod extended;
mod frontend;
mod guc;
mod handle;
mod lease;
mod locks;
mod log;
mod prepared;
mod queues;
mod reply;
mod route;
mod rows;
mod session;
mod shard;
mod shard_lease;
mod sql;
mod state;
mod storage;
mod text;
mod timestamp;

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::rc::Rc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use turmoil::net::TcpListener;

pub use client::{ConnectError, SimConnection, connect, connect_with};
pub use config::{ServerConfig, ShardLeaseFlaw};
pub use handle::{ServerHandle, SessionInfo, TransactionStatus};
pub use locks::{HeldLock, LockId, LockKey, LockMode};
pub use log::{EndReason, Event, LogEntry, LogViolation, ReleaseReason, check_mutual_exclusion};
pub use route::Primary;
pub use rows::RowId;
pub use state::QueryRecord;

use state::{Control, Shared, State};

/// The host software of one simulated PostgreSQL instance.
///
/// Each [`SimPostgres::new`] makes an independent instance (own lock table, sessions,
/// pids and log), so two instances on two hosts model a primary and a fresh failover
/// target that never saw the old primary's locks. Clones share the instance.
#[derive(Debug, Clone)]
pub struct SimPostgres {
    shared: Shared,
}

impl SimPostgres {
    /// A new, independent instance and its handle. It runs once [`serve`](Self::serve)
    /// is polled on a turmoil host.
    pub fn new(config: ServerConfig) -> (Self, ServerHandle) {
        let shared = Rc::new(RefCell::new(State::new(config)));
        let handle = ServerHandle {
            shared: Rc::clone(&shared),
        };
        (Self { shared }, handle)
    }

    /// Another handle on this instance.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: Rc::clone(&self.shared),
        }
    }

    /// Runs the server on `port` of the current turmoil host until the host software is
    /// dropped; returns only if the port cannot be bound or accepting fails.
    ///
    /// Each call is a process start: the server runs with an empty lock table, and
    /// pending `crash`/`restart` requests are discarded. Use it as the host software,
    /// `sim.host("pg1", move || server.clone().serve(5432))`; a turmoil bounce of the host
    /// then crashes and restarts the instance.
    pub async fn serve(self, port: u16) -> turmoil::Result {
        {
            let mut state = self.shared.borrow_mut();
            let at = state.clock();
            state.crash(at);
            state.controls.clear();
            state.start(at);
        }
        let _guard = ServeGuard {
            shared: Rc::clone(&self.shared),
        };
        loop {
            self.run_until_crash(port).await?;
            self.wait_for_restart().await;
        }
    }

    /// Accepts and serves sessions until a crash request; then drops every session and
    /// the listener.
    async fn run_until_crash(&self, port: u16) -> turmoil::Result {
        let listener = bind(port).await?;
        let wake = Rc::clone(&self.shared.borrow().server_wake);
        let mut sessions = FuturesUnordered::new();
        loop {
            if self.take_until(Control::Crash) {
                let mut state = self.shared.borrow_mut();
                let at = state.clock();
                state.crash(at);
                return Ok(());
            }
            tokio::select! {
                biased;
                () = wake.notified() => {}
                accepted = listener.accept() => {
                    let (stream, _peer) = accepted?;
                    sessions.push(session::run(stream, Rc::clone(&self.shared)));
                }
                Some(()) = sessions.next(), if !sessions.is_empty() => {}
            }
        }
    }

    async fn wait_for_restart(&self) {
        let wake = Rc::clone(&self.shared.borrow().server_wake);
        while !self.take_until(Control::Restart) {
            wake.notified().await;
        }
        let mut state = self.shared.borrow_mut();
        let at = state.clock();
        state.start(at);
    }

    /// Pops pending controls up to and including the first `wanted` one; true if found.
    /// Others popped on the way are no-ops in the current mode (a restart while running,
    /// a crash while down); controls after `wanted` stay queued for the next mode.
    fn take_until(&self, wanted: Control) -> bool {
        let mut state = self.shared.borrow_mut();
        while let Some(control) = state.controls.pop_front() {
            if control == wanted {
                return true;
            }
        }
        false
    }
}

/// Binds the listener on the unspecified address of the simulation's IP version.
async fn bind(port: u16) -> std::io::Result<TcpListener> {
    match TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)).await {
        Ok(listener) => Ok(listener),
        Err(_) => TcpListener::bind((IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)).await,
    }
}

/// Crashes the instance when the host software is dropped (turmoil crash or bounce).
struct ServeGuard {
    shared: Shared,
}

impl Drop for ServeGuard {
    fn drop(&mut self) {
        if let Ok(mut state) = self.shared.try_borrow_mut() {
            let at = state.last_time;
            state.crash(at);
        }
    }
}
