//! Symmetry reduction over the identical sharded replicas (see the single-lock models' note:
//! stateright 0.31's breadth-first checker does not apply `symmetry()`).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::state::State;
use crate::server::Sess;

/// stateright's own hook, for its depth-first and simulation checkers
/// (`CheckerBuilder::symmetry`); the breadth-first check gets representatives from the model.
impl stateright::Representative for State {
    fn representative(&self) -> Self {
        representative(self)
    }
}

/// The representative of `state`'s class under permutations of the replicas.
pub(super) fn representative(state: &State) -> State {
    let keys: Vec<u64> = (0..state.replicas.len()).map(|r| key(state, r)).collect();
    let mut order: Vec<usize> = (0..state.replicas.len()).collect();
    order.sort_by_key(|&r| keys[r]);
    if order.iter().enumerate().all(|(new, &old)| new == old) {
        return state.clone();
    }
    let mut renamed = vec![0u8; order.len()];
    for (new, &old) in order.iter().enumerate() {
        renamed[old] = u8::try_from(new).unwrap_or(u8::MAX);
    }
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
    for session in &mut next.server.sessions {
        session.owner = sess(session.owner);
    }
    next.server.sessions.sort_by_key(|s| s.owner);
    for holder in next.server.holders.iter_mut().flatten() {
        *holder = sess(*holder);
    }
    for flight in &mut next.flights {
        flight.owner = sess(flight.owner);
    }
    next.flights.sort_by_key(|f| f.owner);
    for (from, _) in next.given_up.values_mut() {
        *from = rename(*from);
    }
    next
}

/// A fingerprint of replica `r` and of its part of the environment (its sessions, the shards
/// its sessions hold, its operations in flight, the shards it gave up), free of replica indices.
fn key(state: &State, r: usize) -> u64 {
    let mine = |replica: u8| usize::from(replica) == r;
    let mut hasher = DefaultHasher::new();
    state.replicas[r].hash(&mut hasher);
    for session in state
        .server
        .sessions
        .iter()
        .filter(|s| mine(s.owner.replica))
    {
        (session.owner.run, session.owner.conn, session.pid).hash(&mut hasher);
        (session.idle_limit, session.last_active, session.member).hash(&mut hasher);
    }
    for (shard, holder) in state.server.holders.iter().enumerate() {
        if let Some(holder) = holder.filter(|h| mine(h.replica)) {
            (shard, holder.run, holder.conn).hash(&mut hasher);
        }
    }
    for flight in state.flights.iter().filter(|f| mine(f.owner.replica)) {
        (flight.owner.run, flight.owner.conn).hash(&mut hasher);
        (&flight.stage, flight.abandoned).hash(&mut hasher);
    }
    for (shard, (from, resigned)) in &state.given_up {
        if mine(*from) {
            (shard, resigned).hash(&mut hasher);
        }
    }
    hasher.finish()
}
