//! Symmetry reduction over the identical replicas: a state is replaced by the representative
//! of its class under permutations of the replicas (ordered by a fingerprint of each replica's
//! own state), with every replica index in the environment renamed alike.
//!
//! stateright 0.31 applies `CheckerBuilder::symmetry` in its depth-first and simulation
//! checkers only, not in the breadth-first one; the model therefore returns representatives
//! from `init_states` and `next_state` itself. The reduction is sound for any ordering (a state
//! is only ever replaced by a permutation of itself); ties between replicas with equal state
//! keep their order, which can leave two representatives of one class (less reduction, never
//! a missed state).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::state::State;
use crate::server::Sess;

/// The representative of `state`'s class.
pub(super) fn representative(state: &State) -> State {
    let keys: Vec<u64> = state
        .replicas
        .iter()
        .map(|replica| {
            let mut hasher = DefaultHasher::new();
            replica.hash(&mut hasher);
            hasher.finish()
        })
        .collect();
    let mut order: Vec<usize> = (0..state.replicas.len()).collect();
    order.sort_by_key(|&r| keys[r]);
    if order.iter().enumerate().all(|(new, &old)| new == old) {
        return state.clone();
    }
    let mut renamed = vec![0u8; order.len()];
    for (new, &old) in order.iter().enumerate() {
        renamed[old] = u8::try_from(new).unwrap_or(u8::MAX);
    }
    permute(state, &order, &renamed)
}

/// `state` with replica `order[i]` at position `i`; `renamed[old]` is the new index of `old`.
fn permute(state: &State, order: &[usize], renamed: &[u8]) -> State {
    let rename = |index: u8| renamed.get(usize::from(index)).copied().unwrap_or(index);
    let sess = |s: Sess| Sess {
        replica: rename(s.replica),
        ..s
    };
    let mut next = state.clone();
    next.replicas = order
        .iter()
        .map(|&old| state.replicas[old].clone())
        .collect();
    let server = &mut next.server;
    for session in &mut server.sessions {
        session.owner = sess(session.owner);
    }
    server.sessions.sort_by_key(|s| s.owner);
    server.holder = server.holder.map(sess);
    server.queued_grant = server.queued_grant.map(sess);
    for waiter in &mut server.waiters {
        waiter.owner = sess(waiter.owner);
    }
    for row in [&mut server.lease.committed, &mut server.lease.durable]
        .into_iter()
        .flatten()
    {
        row.holder.0 = rename(row.holder.0);
    }
    for flight in &mut next.flights {
        flight.owner = sess(flight.owner);
    }
    next.flights.sort_by_key(|f| f.owner);
    next.resigned = next.resigned.map(rename);
    next
}
