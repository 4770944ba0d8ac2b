//! A counterexample is the sequence of inputs each core machine received: replayed on fresh
//! elections, outside the model, it reproduces what the model saw (here, a standby that
//! skipped the queue leading on a lock it does not hold).

use plexsphere_leader_core::{Action, Election};
use plexsphere_leader_model::engine::ElectionModel;
use plexsphere_leader_model::sabotage::Sabotage;
use plexsphere_leader_model::single::Mechanism;
use plexsphere_leader_model::trace::replay;
use stateright::{Checker, HasDiscoveries, Model};

#[test]
fn a_counterexample_replays_on_the_core_as_the_same_leaders() {
    let model = ElectionModel::single(Mechanism::Advisory).with_sabotage(Sabotage::SkipQueue);
    let checker = model
        .clone()
        .checker()
        .target_max_depth(14)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let path = checker
        .discovery("no overlap beyond the bound")
        .expect("the planted bug is found");
    let recorder = model.record(&path);
    let leaders: Vec<_> = path
        .last_state()
        .replicas
        .iter()
        .filter(|r| r.machine.is_leader())
        .map(|r| (r.name.0, r.run))
        .collect();
    // The standby that skipped the queue leads on a lock another session holds.
    assert!(!leaders.is_empty(), "a replica leads at the end");
    for (name, run) in leaders {
        let inputs = recorder.inputs_of(name, run);
        let mut election = Election::with_options(model.mode.options);
        let actions = replay(&mut election, &inputs);
        assert!(election.is_leader(), "r{name}.{run} leads after its replay");
        let begun = actions
            .iter()
            .flatten()
            .filter(|a| matches!(a, Action::BeginTerm { .. }))
            .count();
        assert_eq!(begun, 1, "r{name}.{run} began one term: {actions:?}");
    }
}
