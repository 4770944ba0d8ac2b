//! Both machines through the one trait, as the driver sees them.

use std::time::{Duration, Instant};

use super::*;
use crate::interval::CheckInterval;
use crate::options::Options;
use crate::shards::{MemberId, ShardOptions};

const C1: ConnId = ConnId::new(1);

/// One request of each kind from outside the run.
const CONTROLS: [Control; 5] = [
    Control::Cancelled,
    Control::Resign {
        hold_off: Duration::from_secs(3),
    },
    Control::SetEligible { eligible: false },
    Control::Panicked,
    Control::Dropped,
];

/// Starts `machine` through the trait and checks what every machine does: a second start is
/// refused, the first action and a deadline are queued, and firing that deadline moves it on.
fn starts_and_fires<M: Machine>(machine: &mut M) -> M::Action {
    let t0 = Instant::now();
    assert!(!machine.is_running(), "not started");
    // Made ineligible, then eligible, while no run is in progress: each kept for the next run.
    assert_eq!(
        machine.handle_event(t0, M::control(Control::SetEligible { eligible: false })),
        Handled::Applied
    );
    assert!(!machine.is_eligible(), "the trait reads the setting");
    assert_eq!(
        machine.handle_event(t0, M::control(Control::SetEligible { eligible: true })),
        Handled::Applied
    );
    assert!(machine.is_eligible());
    assert!(machine.start(t0).is_ok());
    assert!(machine.is_running());
    assert!(machine.start(t0).is_err(), "already running");
    let first = machine.poll_action().expect("a first action");
    let deadline = machine.poll_timeout().expect("a deadline while running");
    machine.handle_timeout(deadline);
    assert_ne!(machine.poll_timeout(), Some(deadline), "the deadline fired");
    first
}

#[test]
fn the_election_through_the_trait() {
    let options = Options::new(CheckInterval::new(Duration::from_millis(100)).expect("valid"));
    let mut election = Election::<&str>::with_options(options);
    let first = starts_and_fires(&mut election);
    assert_eq!(first, Action::AcquireConnection { conn: C1 });
    type M = Election<&'static str>;
    assert_eq!(M::conn(&M::session_ended(C1, "gone")), Some(C1));
    for control in CONTROLS {
        assert_eq!(M::control(control), Event::Control(control));
    }
    let granted = Event::LockGranted {
        conn: C1,
        backend_pid: 7,
    };
    assert!(M::answers_check(&granted));
    assert!(M::answers_check(&Event::PingAnswered {
        conn: C1,
        found: crate::LockCheck::holding(7),
    }));
    assert!(M::answers_check(&Event::LeaseClaimed {
        conn: C1,
        epoch: 1
    }));
    assert!(M::answers_check(&Event::LeaseRenewed { conn: C1 }));
    assert!(!M::answers_check(&Event::ConnectionAcquired { conn: C1 }));
    assert!(!M::answers_check(&M::session_ended(C1, "gone")));
    assert!(!M::answers_check(&Event::LeaseLost { conn: C1 }));
}

#[test]
fn the_sharded_election_through_the_trait() {
    let interval = CheckInterval::new(Duration::from_millis(100)).expect("valid");
    let options = ShardOptions::new(interval, 4).expect("valid");
    let mut election = ShardedElection::<&str>::new(options);
    let first = starts_and_fires(&mut election);
    assert_eq!(first, ShardAction::AcquireSession { conn: C1 });
    type M = ShardedElection<&'static str>;
    assert_eq!(M::conn(&M::session_ended(C1, "gone")), Some(C1));
    for control in CONTROLS {
        assert_eq!(M::control(control), ShardEvent::Control(control));
    }
    let registered = ShardEvent::Registered {
        conn: C1,
        backend: MemberId::new(7),
        granted: true,
        lock_capacity: 6400,
        members: 1,
    };
    assert!(M::answers_check(&registered));
    assert!(!M::answers_check(&ShardEvent::Acquired { conn: C1 }));
    assert!(!M::answers_check(&M::session_ended(C1, "gone")));
}
