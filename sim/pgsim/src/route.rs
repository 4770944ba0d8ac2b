//! Failover routing: which server host clients connect to.

use std::sync::{Arc, Mutex, PoisonError};

/// The name of the host that currently plays the primary, shared by every client that
/// connects through it. A failover is [`Primary::fail_over_to`]: clients that connect
/// afterwards reach the new host, an independent [`SimPostgres`](super::SimPostgres)
/// instance that never saw the old primary's sessions or locks. Existing connections are
/// untouched; crash or partition the old host to cut them.
///
/// `Send + Sync`, so that a `deadpool_postgres::Connect` (which must be) can hold it.
#[derive(Debug, Clone)]
pub struct Primary {
    host: Arc<Mutex<String>>,
}

impl Primary {
    /// Routes clients to `host`.
    pub fn new(host: impl Into<String>) -> Self {
        Self {
            host: Arc::new(Mutex::new(host.into())),
        }
    }

    /// The host clients should connect to now.
    pub fn host(&self) -> String {
        self.host
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Routes clients to `host` from now on.
    pub fn fail_over_to(&self, host: impl Into<String>) {
        *self.host.lock().unwrap_or_else(PoisonError::into_inner) = host.into();
    }
}
