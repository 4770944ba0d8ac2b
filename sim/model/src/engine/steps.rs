//! The steps a state allows, in a fixed order: time, the operations in flight, the faults and
//! the operator's controls while the path has faults left.

use plexsphere_leader_core::Machine;

use super::state::State;
use super::{ElectionModel, Mode, due, props};
use crate::flight::Stage;
use crate::step::Step;

/// Pushes the steps `s` allows onto `steps`.
pub(super) fn allowed<M: Mode>(model: &ElectionModel<M>, s: &State<M>, steps: &mut Vec<Step>) {
    if s.broken.is_some() || !props::safe(model, s) {
        // A violation: nothing after it matters.
        return;
    }
    let faulty = s.faults_left > 0;
    if due::next_instant(model, s).is_some() && (!awaited(s) || faulty) {
        steps.push(Step::Advance);
    }
    flights(model, s, faulty, steps);
    for r in 0..s.replicas.len() {
        replica(s, r, faulty, steps);
    }
    if faulty {
        steps.push(Step::Restart);
        steps.push(Step::Failover);
    }
}

/// What can happen to each operation in flight.
fn flights<M: Mode>(model: &ElectionModel<M>, s: &State<M>, faulty: bool, steps: &mut Vec<Step>) {
    let stragglers = model.mode.stragglers();
    for (i, flight) in s.flights.iter().enumerate() {
        let Ok(i) = u8::try_from(i) else { break };
        let owner = &s.replicas[usize::from(flight.owner.replica)];
        let sent = matches!(flight.stage, Stage::Sent(_));
        if flight.abandoned {
            // A request given up: it never arrives, or (a fault) arrives late.
            steps.push(Step::Lose(i));
            if faulty && sent {
                steps.push(Step::Deliver(i));
            }
            continue;
        }
        if owner.partitioned {
            // Nothing reaches it: its answers are lost; a request sent before the cut may
            // still arrive (late) where the mode lets stragglers in.
            steps.push(Step::Lose(i));
            if stragglers && faulty && sent {
                steps.push(Step::Delay(i));
            }
            continue;
        }
        if !owner.paused {
            steps.push(Step::Deliver(i));
        }
        if faulty {
            if sent {
                steps.push(Step::Delay(i));
            }
            steps.push(Step::Lose(i));
        }
    }
}

/// What can happen to replica `r`: the end of its fault, else (with faults left) a new one.
fn replica<M: Mode>(s: &State<M>, r: usize, faulty: bool, steps: &mut Vec<Step>) {
    let Ok(index) = u8::try_from(r) else { return };
    let replica = &s.replicas[r];
    if replica.paused {
        steps.push(Step::Resume(index));
        return;
    }
    if replica.partitioned {
        steps.push(Step::Heal(index));
    }
    let eligible = M::is_eligible(&replica.machine);
    if !eligible {
        steps.push(Step::Eligible(index, true));
    }
    if !faulty {
        return;
    }
    for fin in [true, false] {
        steps.push(Step::Crash {
            replica: index,
            fin,
        });
    }
    if M::terminable(s, r).is_some() {
        steps.push(Step::Terminate(index));
    }
    if !replica.partitioned {
        steps.push(Step::Partition(index));
    }
    if replica.machine.is_running() {
        steps.push(Step::Pause(index));
        steps.push(Step::Stop(index));
        if M::leads(&replica.machine) {
            steps.push(Step::Resign(index));
        }
        if eligible {
            steps.push(Step::Eligible(index, false));
        }
    }
}

/// Whether an answer is awaited that time passing would make late (a fault): an operation
/// in flight that was not given up, of a replica neither paused nor cut off (for those, the
/// pause or the partition is the fault).
pub(super) fn awaited<M: Mode>(s: &State<M>) -> bool {
    s.flights.iter().any(|f| {
        let owner = &s.replicas[usize::from(f.owner.replica)];
        !f.abandoned && !owner.paused && !owner.partitioned
    })
}
