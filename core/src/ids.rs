//! Identifiers the election hands out: connection generations and term numbers.

use std::fmt;

/// One database connection of the election, numbered in the order the election asked for them.
///
/// Every I/O action names the connection it concerns, and every completion event echoes it back;
/// the election ignores a completion whose connection is not the one it is waiting on, so a late
/// answer from a closed connection can never affect a newer one. Numbers start at 1 and strictly
/// increase for the life of an [`Election`](crate::Election), across runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(u64);

impl ConnId {
    /// Builds an identifier from its number. Drivers echo the identifiers they were given; this is
    /// for tests and for replaying recorded traces.
    pub const fn new(number: u64) -> Self {
        Self(number)
    }

    /// The number of this connection, 1 for the first one the election asked for.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}", self.0)
    }
}

/// One term of leadership: from the grant of the lock to the end of leading.
///
/// Numbers start at 1 and strictly increase for the life of an [`Election`](crate::Election),
/// across runs, so a term id never names two different leaderships of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TermId(u64);

impl TermId {
    /// Builds an identifier from its number (tests and trace replays).
    pub const fn new(number: u64) -> Self {
        Self(number)
    }

    /// The number of this term, 1 for the first term of the election.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TermId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a machine's ids come from: every connection (or operation) and every term gets the
/// next one, never reused for the machine's lifetime, across runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct IdSource {
    last_conn: u64,
    last_term: u64,
}

impl IdSource {
    /// A fresh connection or operation id.
    pub(crate) fn next_conn(&mut self) -> ConnId {
        self.last_conn += 1;
        ConnId::new(self.last_conn)
    }

    /// A fresh term id.
    pub(crate) fn next_term(&mut self) -> TermId {
        self.last_term += 1;
        TermId::new(self.last_term)
    }
}
