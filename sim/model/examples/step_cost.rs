//! How many states per second one real core step allows: the cost of a model transition (state
//! clone, the core's inputs, the environment, the representative) against the cost of the core
//! step alone (an election cloned, one deadline fired, its actions drained), along a fixed
//! fault-free path of the advisory model.
//!
//! `cargo run --release -p plexsphere-leader-model --example step_cost`

use std::hint::black_box;
use std::time::Instant;

use plexsphere_leader_model::engine::ElectionModel;
use plexsphere_leader_model::single::Mechanism;
use stateright::Model;

fn main() {
    let model = ElectionModel::single(Mechanism::Advisory).with_faults(0);
    let mut state = model.init_states().remove(0);
    let mut path = Vec::new();
    for _ in 0..400 {
        let mut steps = Vec::new();
        model.actions(&state, &mut steps);
        let Some(step) = steps.first().copied() else {
            break;
        };
        path.push((state.clone(), step));
        match model.next_state(&state, step) {
            Some(next) => state = next,
            None => break,
        }
    }
    let rounds = 500;
    let started = Instant::now();
    for _ in 0..rounds {
        for (state, step) in &path {
            black_box(model.next_state(state, *step));
        }
    }
    let transitions = (rounds * path.len()) as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for _ in 0..rounds {
        for (state, _) in &path {
            let mut election = state.replicas[0].machine.clone();
            if let Some(at) = election.poll_timeout() {
                election.handle_timeout(at);
            }
            while let Some(action) = election.poll_action() {
                black_box(action);
            }
            black_box(&election);
        }
    }
    let core = (rounds * path.len()) as f64 / started.elapsed().as_secs_f64();
    println!(
        "path of {} steps: {:.0} model transitions per second, {:.0} core steps per second \
         (clone, deadline fired, actions drained) on one thread",
        path.len(),
        transitions,
        core
    );
}
