//! Requests on the wire and their answers: a statement sent and not yet run by the server, or
//! run and its answer not yet delivered. Each can be delivered, delayed past a deadline, or lost.

use crate::server::Sess;

/// Where an operation is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stage<A, E> {
    /// Sent; the server has not run it yet.
    Sent(A),
    /// Run; its answer is on the way back.
    Replied(E),
}

/// One operation in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flight<A, E> {
    /// Whose operation, on which connection.
    pub owner: Sess,
    /// Where it is.
    pub stage: Stage<A, E>,
    /// The driver gave it up (or its process is gone): it may still reach the server, but its
    /// answer is dropped.
    pub abandoned: bool,
}

/// Puts an operation of `owner` at `stage` on the wire: into `flights`, kept ordered by owner
/// (a canonical order: equal sets of flights make equal states); among one owner's, in the
/// order they were sent.
pub fn insert<A, E>(flights: &mut Vec<Flight<A, E>>, owner: Sess, stage: Stage<A, E>) {
    let at = flights.partition_point(|f| f.owner <= owner);
    let flight = Flight {
        owner,
        stage,
        abandoned: false,
    };
    flights.insert(at, flight);
}
