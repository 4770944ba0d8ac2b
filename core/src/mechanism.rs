//! Which mechanism holds an election's leadership or a space's shards: the session advisory
//! lock, or a lease row. Both machines take it from their options and make every choice that
//! depends on it in one module of their own (`election/mechanism.rs`,
//! `shards/machine/mechanism.rs`).

use crate::lease::Lease;

/// How leadership, or each shard of a space, is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mechanism {
    /// The session advisory lock: granted to a session the machine then keeps and verifies it
    /// on; released by unlocking it, and by the server when the session ends.
    #[default]
    Advisory,
    /// A lease row, for a pool that cannot carry a session lock: claimed, renewed and released
    /// by one autocommit statement each on any pooled connection, and trusted for
    /// [`Lease::trusted_for`] after each success.
    Lease(Lease),
}

impl Mechanism {
    /// The lease's terms, for a lease.
    pub const fn lease(self) -> Option<Lease> {
        match self {
            Self::Lease(lease) => Some(lease),
            Self::Advisory => None,
        }
    }
}
