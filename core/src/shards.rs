//! Sharded leadership: `K` shards spread over the live replicas, each shard owned by at most one
//! replica at a time, all of a replica's shard locks on one session.
//!
//! A shard space is one advisory-lock class id: shard `s` is the lock `(class, s)` and the member
//! lock is `(class, -1)`, which every live replica holds in shared mode on its lock session.
//! Every interval the replica runs one statement, the **survey**, that returns the space's rows of
//! `pg_locks`: who holds the member lock and who holds which shard. The [`ShardedElection`]
//! verifies its own rows against the shards it believes it holds (any difference ends the
//! session and every shard with it), then computes its part of the balanced assignment
//! ([`plan`]) and acts on it: it ends the terms of the shards it gives up, waits for their work
//! and unlocks them; it takes free shards up to its cap in one statement.
//!
//! | rule | where |
//! |---|---|
//! | at most one owner per shard | the server's exclusive advisory locks; the survey proves ours |
//! | cap `⌊K/R⌋`, `K mod R` members one more, extra slots stay put | [`caps`] |
//! | a join or leave moves about `K/R` shards | [`plan`]: sticky holders, rendezvous order |
//! | hand over: end the term, wait for the work, unlock, then the new owner locks | [`ShardedElection`] |
//! | a short window after a membership change before moving shards | [`ShardOptions::rebalance_delay`] |
//! | a limit on shards given up per interval | [`ShardOptions::max_moves`] |
//! | a cold start waits the window before its first take | [`ShardedElection`] |
//! | losing the session demotes every shard at once | [`ShardedElection`] |
//! | the server's lock table has room for `K + R` locks | [`ShardOptions::check_lock_table`] |
//! | free shards and the extra slots go to the best-ranked members first | [`plan`], [`caps`], [`ShardOptions::preference`] |
//! | a ranked member below the version floor owns no shard | [`Standing`], [`ShardOptions::version_floor`] |

mod assign;
mod event;
mod machine;
mod options;

use std::fmt;

pub use assign::{Plan, Standing, Survey, SurveyError, caps, plan, score};
pub use event::{ShardAction, ShardEvent, ShardFailure, ShardLog, ShardLogKind};
pub use machine::{ShardPhase, ShardTimer, ShardedElection};
pub use options::{LockTableTooSmall, MAX_SHARDS, ShardOptions, ShardOptionsError};

/// One shard of a space: the advisory lock `(class, shard)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shard(u32);

impl Shard {
    /// The shard numbered `number` (`0..K`).
    pub const fn new(number: u32) -> Self {
        Self(number)
    }

    /// Its number.
    pub const fn get(self) -> u32 {
        self.0
    }

    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }
}

impl From<u32> for Shard {
    /// The shard numbered `number`, as [`Shard::new`].
    fn from(number: u32) -> Self {
        Self::new(number)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A member of a shard space: the backend pid of its lock session, as `pg_locks` shows it.
///
/// A replica that loses its session and opens another becomes a new member; the server ends the
/// old one (and its locks) within `idle_session_timeout` at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(i32);

impl MemberId {
    /// The member whose lock session is backend `pid`.
    pub const fn new(pid: i32) -> Self {
        Self(pid)
    }

    /// The backend pid.
    pub const fn get(self) -> i32 {
        self.0
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.0)
    }
}

#[cfg(test)]
mod tests;
