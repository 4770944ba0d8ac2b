//! The next instant anything is due, on the server's clock: what the model's time step jumps
//! to.

use plexsphere_leader_core::Machine;

use super::state::State;
use super::{ElectionModel, Mode};
use crate::clock::{Micros, Rate, micros, server_delta};
use crate::server::Locks;

/// The next instant anything is due, on the server's clock: a replica's deadline (through its
/// clock's rate), the lock table's timeouts, an idle session's end, and the mode's bounds.
pub fn next_instant<M: Mode>(model: &ElectionModel<M>, s: &State<M>) -> Option<Micros> {
    let replicas = s.replicas.iter().filter_map(|replica| {
        if replica.paused || M::skips_deadline(model.sabotage, &replica.machine) {
            return None;
        }
        let due = replica.machine.poll_timeout().map(micros)?;
        let ahead = due.saturating_sub(replica.local);
        Some(s.now + server_delta(ahead, replica.rate.ppm()).max(1))
    });
    let server = [
        s.server.locks.next_wait_timeout().map(|(at, _)| at),
        s.server
            .next_idle_end(model.idle_timeout())
            .map(|(at, _)| at),
        M::bound_instant(model, s),
    ];
    replicas
        .chain(server.into_iter().flatten())
        .map(|at| at.max(s.now + 1))
        .min()
}
