//! Symmetry reduction over the identical replicas: a state is replaced by the representative
//! of its class under permutations of the replicas (ordered by a fingerprint of each replica's
//! own state and its part of the environment), with every replica index in the environment
//! renamed alike.
//!
//! stateright 0.31 applies `CheckerBuilder::symmetry` in its depth-first and simulation
//! checkers only, not in the breadth-first one; the model therefore returns representatives
//! from `init_states` and `next_state` itself. The reduction is sound for any ordering (a state
//! is only ever replaced by a permutation of itself); a tie (a fingerprint collision) keeps the
//! order, which can leave two representatives of one class (less reduction, never a missed
//! state).

use std::hash::{DefaultHasher, Hash, Hasher};

use super::Parts;
use super::state::State;
pub use crate::rename::Renamed;
use crate::server::Sess;

/// stateright's own hook, for its depth-first and simulation checkers
/// (`CheckerBuilder::symmetry`); the breadth-first check gets representatives from the model.
impl<M: Parts> stateright::Representative for State<M> {
    fn representative(&self) -> Self {
        representative(self)
    }
}

/// The representative of `state`'s class.
pub(crate) fn representative<M: Parts>(state: &State<M>) -> State<M> {
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
    permute(state, &order, &renamed)
}

/// A fingerprint of replica `r` and of everything in the environment that is its own (its
/// sessions, its part of the lock table, its operations in flight, its part of the history),
/// free of every replica index: equal keys mean the replicas can be swapped.
fn key<M: Parts>(state: &State<M>, r: usize) -> u64 {
    let mine = |replica: u8| usize::from(replica) == r;
    let mut hasher = DefaultHasher::new();
    state.replicas[r].hash(&mut hasher);
    let server = &state.server;
    for session in server.sessions.iter().filter(|s| mine(s.owner.replica)) {
        (session.owner.run, session.owner.conn, session.pid).hash(&mut hasher);
        (session.idle_limit, session.last_active, session.member).hash(&mut hasher);
    }
    server.locks.fingerprint(&mine, &mut hasher);
    for flight in state.flights.iter().filter(|f| mine(f.owner.replica)) {
        (flight.owner.run, flight.owner.conn).hash(&mut hasher);
        (&flight.stage, flight.abandoned).hash(&mut hasher);
    }
    state.history.fingerprint(&mine, &mut hasher);
    hasher.finish()
}

/// `state` with replica `order[i]` at position `i`; `renamed[old]` is the new index of `old`.
fn permute<M: Parts>(state: &State<M>, order: &[usize], renamed: &[u8]) -> State<M> {
    let rename = |index: u8| renamed.get(usize::from(index)).copied().unwrap_or(index);
    let mut next = state.clone();
    next.replicas = order
        .iter()
        .map(|&old| state.replicas[old].clone())
        .collect();
    for session in &mut next.server.sessions {
        session.owner = sess(session.owner, &rename);
    }
    next.server.sessions.sort_by_key(|s| s.owner);
    next.server.locks.rename(&rename);
    for flight in &mut next.flights {
        flight.owner = sess(flight.owner, &rename);
    }
    next.flights.sort_by_key(|f| f.owner);
    next.history.rename(&rename);
    next
}

/// `s` with its replica renamed by `rename`.
pub fn sess(s: Sess, rename: &dyn Fn(u8) -> u8) -> Sess {
    Sess {
        replica: rename(s.replica),
        ..s
    }
}

/// The run and connection of `s`, when it is a session of a replica `mine` names.
pub fn own(
    s: Option<Sess>,
    mine: &dyn Fn(u8) -> bool,
) -> Option<(u32, plexsphere_leader_core::ConnId)> {
    s.filter(|s| mine(s.replica)).map(|s| (s.run, s.conn))
}

#[cfg(test)]
mod tests {
    use stateright::Model;

    use super::*;
    use crate::engine::ElectionModel;
    use crate::single::{Mechanism, Single};

    /// A state whose replicas differ: the first operations delivered, time advanced, without
    /// the reduction.
    fn distinct_state(mechanism: Mechanism) -> State<Single> {
        let mut model = ElectionModel::single(mechanism);
        model.symmetry = false;
        let mut state = model.init_states().remove(0);
        for _ in 0..6 {
            let mut steps = Vec::new();
            model.actions(&state, &mut steps);
            let Some(step) = steps.last().copied() else {
                break;
            };
            state = model.next_state(&state, step).unwrap_or(state);
        }
        state
    }

    #[test]
    fn the_representative_is_the_same_for_every_permutation_and_stable() {
        for mechanism in [Mechanism::Advisory, Mechanism::Lease] {
            let state = distinct_state(mechanism);
            let canonical = representative(&state);
            assert_eq!(representative(&canonical), canonical);
            for order in [[1, 0, 2], [2, 1, 0], [1, 2, 0]] {
                let mut renamed = [0u8; 3];
                for (new, &old) in order.iter().enumerate() {
                    renamed[old] = new as u8;
                }
                let permuted = permute(&state, &order, &renamed);
                assert_eq!(
                    representative(&permuted),
                    canonical,
                    "{mechanism:?} {order:?}"
                );
            }
        }
    }

    #[test]
    fn the_representative_keeps_each_replica_with_its_sessions() {
        let state = distinct_state(Mechanism::Advisory);
        let canonical = representative(&state);
        let mut names: Vec<u8> = canonical.replicas.iter().map(|r| r.name.0).collect();
        names.sort_unstable();
        assert_eq!(names, vec![0, 1, 2]);
        for session in &canonical.server.sessions {
            let owner = &canonical.replicas[usize::from(session.owner.replica)];
            let before = state
                .server
                .sessions
                .iter()
                .find(|s| s.pid == session.pid)
                .map(|s| state.replicas[usize::from(s.owner.replica)].name.0);
            assert_eq!(
                before,
                Some(owner.name.0),
                "session {} follows its replica",
                session.pid
            );
        }
    }
}
