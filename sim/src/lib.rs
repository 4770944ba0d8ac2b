//! Deterministic turmoil simulation of plexsphere-leader against a simulated PostgreSQL.
//!
//! [`server`] is the simulated PostgreSQL: a turmoil host speaking the wire protocol to an
//! unmodified `tokio_postgres` client, with session advisory locks, `idle_session_timeout`,
//! backend termination, crash and restart, and a ground-truth log for checkers.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod server;
