//! Exact-action tests of the sharded election, one per row of the module's table, and the
//! assignment's rules.

use std::time::{Duration, Instant};

use super::*;
use crate::cause::{Cause, LossReason, TermEndCause};
use crate::control::Control;
use crate::handled::{Handled, Ignored};
use crate::ids::{ConnId, TermId};
use crate::interval::CheckInterval;
use crate::options::OnOverdue;
use crate::rank::FloorStep;

const I: Duration = Duration::from_secs(1);
const ME: MemberId = MemberId::new(100);
const OTHER: MemberId = MemberId::new(200);
const C1: ConnId = ConnId::new(1);

type Machine = ShardedElection<&'static str>;
type A = ShardAction<&'static str>;

fn options(count: u32) -> ShardOptions {
    ShardOptions::new(CheckInterval::new(I).expect("valid"), count).expect("valid")
}

fn drain(m: &mut Machine) -> Vec<A> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn log(kind: ShardLogKind, shards: u32) -> A {
    ShardAction::Log(ShardLog {
        kind,
        shards,
        reason: None,
        cause: None,
    })
}

fn shards(range: std::ops::Range<u32>) -> Vec<Shard> {
    range.map(Shard::new).collect()
}

fn survey(count: u32, rows: &[(MemberId, bool, Vec<u32>)]) -> Survey {
    Survey::new(count, ME, rows.iter().cloned()).expect("valid rows")
}

/// A machine of `count` shards that joined at `t0` as `ME` with one other member, its first
/// survey in flight.
fn joined(count: u32, t0: Instant) -> Machine {
    joined_with(options(count), t0)
}

/// [`joined`], with `options`.
fn joined_with(options: ShardOptions, t0: Instant) -> Machine {
    let mut m = Machine::new(options);
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 2,
        },
    );
    drain(&mut m);
    m
}

/// [`joined`], then owning `owned` after a survey where `OTHER` holds the rest.
fn owning(count: u32, owned: std::ops::Range<u32>, t0: Instant) -> Machine {
    owning_with(options(count), owned, t0)
}

/// [`owning`], with `options`.
fn owning_with(options: ShardOptions, owned: std::ops::Range<u32>, t0: Instant) -> Machine {
    let count = options.count();
    let mut m = joined_with(options, t0);
    let rest: Vec<u32> = (0..count).filter(|s| !owned.contains(s)).collect();
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(count, &[(ME, true, vec![]), (OTHER, true, rest)]),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Take {
            conn: C1,
            shards: shards(owned.clone())
        }]
    );
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: shards(owned),
        },
    );
    drain(&mut m);
    m
}

#[test]
fn an_owner_is_stuck_only_strictly_past_two_intervals_since_its_last_proving_survey() {
    let t0 = Instant::now();
    let m = joined(4, t0);
    assert_eq!(m.last_verified(), None, "a member that owns no shard");
    assert_eq!(m.stuck(t0 + 10 * I), Ok(()), "is never stuck");
    let mut m = owning(4, 0..2, t0);
    assert_eq!(
        m.last_verified(),
        Some(t0),
        "the registration and first survey, at t0"
    );
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(4, &[(ME, true, vec![0, 1]), (OTHER, true, vec![2, 3])]),
        },
    );
    drain(&mut m);
    assert_eq!(
        m.last_verified(),
        Some(t0 + I),
        "the survey proved the holdings"
    );
    assert_eq!(m.stuck(t0 + 3 * I), Ok(()));
    let stuck = m
        .stuck(t0 + 3 * I + Duration::from_nanos(1))
        .expect_err("strictly past two intervals");
    assert_eq!(stuck.bound, 2 * I);
    assert_eq!(stuck.since_last_check, 2 * I + Duration::from_nanos(1));
    // The driver's trait gives the same verdict.
    let through_trait = crate::Machine::stuck(&m, t0 + 3 * I + Duration::from_nanos(1));
    assert_eq!(through_trait, Err(stuck));
}

#[test]
fn a_shard_is_its_number_however_it_is_built() {
    assert_eq!(Shard::from(7), Shard::new(7));
    assert_eq!(Shard::from(7).get(), 7);
    assert_eq!(Shard::from(7).to_string(), "7");
}

#[test]
fn start_acquires_a_session_at_once() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession { conn: C1 }]
    );
    assert_eq!(m.poll_timeout(), Some(t0 + I));
    assert_eq!(m.timeout_reason(), Some(ShardTimer::AcquireDeadline));
    assert_eq!(m.phase(), ShardPhase::Acquiring);
    assert!(m.is_running());
    assert_eq!(m.start(t0), Err(crate::AlreadyRunning));
}

#[test]
fn a_space_that_proves_its_pool_borrows_its_session_only_after_a_proof() {
    use crate::proof::{PoolProof, SecondSession, Unproven};
    let t0 = Instant::now();
    let mut m = Machine::new(options(8).prove_pool(true));
    m.start(t0).expect("not running");
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::ProbePool {
            conn: C1,
            second_within: I / 2
        }]
    );
    assert_eq!(m.phase(), ShardPhase::Acquiring);
    // Nothing proven (no second session in time): no session this check, a WARN.
    let late = PoolProof {
        first: 10,
        second: SecondSession::TimedOut,
        exclusion: None,
    };
    m.handle_event(
        t0,
        ShardEvent::PoolProbed {
            conn: C1,
            proof: late,
        },
    );
    let mut warned = ShardLog::new(ShardLogKind::ProofInconclusive, 0);
    warned.cause = Some(Cause::Unproven(Unproven::NoSecondSession));
    assert_eq!(drain(&mut m), vec![ShardAction::Log(warned)]);
    assert_eq!(m.phase(), ShardPhase::Detached);
    assert_eq!(ShardLogKind::ProofInconclusive.level(), crate::Level::Warn);
    // The next check proves again; proven, the session is borrowed at once.
    m.handle_timeout(t0 + I);
    let conn = ConnId::new(2);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::ProbePool {
            conn,
            second_within: I / 2
        }]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::PoolProbed {
            conn,
            proof: PoolProof::excluding(10, 11),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession {
            conn: ConnId::new(3)
        }]
    );
}

#[test]
fn a_lost_session_is_proven_again_before_the_space_is_joined_again() {
    use crate::proof::PoolProof;
    let t0 = Instant::now();
    let mut m = Machine::new(options(8).prove_pool(true));
    m.start(t0).expect("not running");
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::PoolProbed {
            conn: C1,
            proof: PoolProof::excluding(10, 11),
        },
    );
    let conn = ConnId::new(2);
    assert_eq!(drain(&mut m), vec![ShardAction::AcquireSession { conn }]);
    m.handle_event(t0, ShardEvent::Acquired { conn });
    drain(&mut m);
    // The session ends before it joined: the next check proves again (a failover may have
    // put another server behind the pool).
    m.handle_event(t0, ShardEvent::SessionEnded { conn });
    drain(&mut m);
    m.handle_timeout(t0 + I);
    assert!(
        matches!(drain(&mut m).as_slice(), [ShardAction::ProbePool { .. }]),
        "proven again"
    );
    // Without a proof asked for, a lost session is simply joined again.
    let mut plain = Machine::new(options(8));
    plain.start(t0).expect("not running");
    drain(&mut plain);
    plain.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    drain(&mut plain);
    plain.handle_event(t0, ShardEvent::SessionEnded { conn: C1 });
    drain(&mut plain);
    plain.handle_timeout(t0 + I);
    assert!(matches!(
        drain(&mut plain).as_slice(),
        [ShardAction::AcquireSession { .. }]
    ));
}

#[test]
fn a_lock_granted_to_two_sessions_fails_the_space_before_any_shard() {
    use crate::proof::PoolProof;
    let t0 = Instant::now();
    let mut m = Machine::new(options(8).prove_pool(true));
    m.start(t0).expect("not running");
    drain(&mut m);
    let mut proof = PoolProof::excluding(10, 11);
    if let Some(test) = proof.exclusion.as_mut() {
        test.second_granted = true;
    }
    m.handle_event(t0, ShardEvent::PoolProbed { conn: C1, proof });
    let finding = crate::LockFinding::LockNotExclusive {
        first: 10,
        second: 11,
    };
    let mut refuted = ShardLog::new(ShardLogKind::ProofRefuted, 0);
    refuted.cause = Some(Cause::LockNotVerified(finding));
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::Log(refuted),
            ShardAction::Fail(ShardFailure::Refuted(finding)),
            ShardAction::Finish,
        ]
    );
    assert!(!m.is_running());
    assert_eq!(ShardLogKind::ProofRefuted.level(), crate::Level::Error);
}

#[test]
fn a_lease_space_never_proves_its_pool() {
    let lease = crate::Lease::new(CheckInterval::new(I).unwrap(), 3 * I).unwrap();
    let options = options(8)
        .mechanism(crate::Mechanism::Lease(lease))
        .prove_pool(true);
    assert!(!options.proves_pool());
}

#[test]
fn an_acquired_session_registers_with_four_intervals_of_idle_timeout() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    drain(&mut m);
    assert_eq!(
        m.handle_event(t0, ShardEvent::Acquired { conn: C1 }),
        Handled::Applied
    );
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Register {
            conn: C1,
            idle_session_timeout_ms: 4000
        }]
    );
    assert_eq!(m.phase(), ShardPhase::Registering);
}

#[test]
fn a_lock_table_too_small_fails_the_run() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 16,
            members: 1,
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            ShardAction::Fail(ShardFailure::LockTableTooSmall(LockTableTooSmall {
                needed: 9,
                capacity: 16
            })),
            ShardAction::Finish,
        ]
    );
    assert!(!m.is_running());
}

#[test]
fn a_lock_table_with_room_for_exactly_half_accepts_the_space() {
    assert_eq!(options(8).check_lock_table(18, 1), Ok(()));
    assert_eq!(
        options(8).check_lock_table(17, 1),
        Err(LockTableTooSmall {
            needed: 9,
            capacity: 17
        })
    );
}

#[test]
fn a_registered_session_detaches_and_surveys_at_once() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 1,
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::Detach {
                conn: C1,
                backend: ME
            },
            log(ShardLogKind::Joined, 0),
            ShardAction::Survey {
                conn: C1,
                floor: FloorStep::Off
            },
        ]
    );
    assert_eq!(m.member(), Some(ME));
    assert_eq!(m.phase(), ShardPhase::Busy);
}

#[test]
fn a_refused_member_lock_closes_the_session_and_tries_again_at_the_next_check() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: false,
            lock_capacity: 6400,
            members: 0,
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            log(ShardLogKind::MemberLockRefused, 0)
        ]
    );
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession {
            conn: ConnId::new(2)
        }]
    );
}

#[test]
fn a_cold_start_waits_the_rebalance_delay_then_takes_its_share() {
    let t0 = Instant::now();
    let mut m = joined(8, t0);
    let empty = survey(8, &[(ME, true, vec![]), (OTHER, true, vec![])]);
    m.handle_event(
        t0 + Duration::from_millis(5),
        ShardEvent::Surveyed {
            conn: C1,
            survey: empty.clone(),
        },
    );
    assert_eq!(drain(&mut m), vec![], "nothing held by anyone: wait");
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: empty.clone(),
        },
    );
    let expected = plan(&empty, ME).take;
    assert_eq!(expected.len(), 4, "half of 8");
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Take {
            conn: C1,
            shards: expected
        }]
    );
}

#[test]
fn free_shards_are_taken_at_once_when_others_hold_shards() {
    let t0 = Instant::now();
    let mut m = joined(8, t0);
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, vec![]), (OTHER, true, vec![0, 1, 2, 3])]),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Take {
            conn: C1,
            shards: shards(4..8)
        }]
    );
}

#[test]
fn granted_shards_begin_terms_and_refused_ones_do_not() {
    let t0 = Instant::now();
    let mut m = joined(8, t0);
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, vec![]), (OTHER, true, vec![0, 1, 2, 3])]),
        },
    );
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: vec![Shard::new(5), Shard::new(7), Shard::new(99)],
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::BeginTerm {
                shard: Shard::new(5),
                term: TermId::new(1),
                epoch: None
            },
            ShardAction::BeginTerm {
                shard: Shard::new(7),
                term: TermId::new(2),
                epoch: None
            },
            log(ShardLogKind::Took, 2),
        ],
        "a shard not asked for is not believed"
    );
    assert_eq!(m.term_of(Shard::new(5)), Some(TermId::new(1)));
    assert_eq!(m.term_of(Shard::new(4)), None);
    assert_eq!(m.phase(), ShardPhase::Member);
}

#[test]
fn a_survey_missing_an_owned_shard_loses_every_shard_and_the_session() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(
                8,
                &[(ME, true, vec![4, 5, 6]), (OTHER, true, vec![0, 1, 2, 3])],
            ),
        },
    );
    let lost = TermEndCause::Lost(LossReason::LockNotHeld);
    let mut expected: Vec<A> = (4..8)
        .map(|s| ShardAction::EndTerm {
            shard: Shard::new(s),
            term: TermId::new(u64::from(s) - 3),
            cause: lost,
        })
        .collect();
    expected.push(ShardAction::CloseSession { conn: C1 });
    expected.push(ShardAction::Log(ShardLog {
        kind: ShardLogKind::SessionLost,
        shards: 4,
        reason: Some(lost),
        cause: None,
    }));
    assert_eq!(drain(&mut m), expected);
    assert!(m.owned().is_empty());
    assert_eq!(m.phase(), ShardPhase::Detached);
    m.handle_timeout(t0 + 2 * I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession {
            conn: ConnId::new(2)
        }]
    );
}

#[test]
fn a_survey_showing_an_unexpected_shard_or_no_member_lock_loses_the_session() {
    for rows in [
        vec![
            (ME, true, vec![3, 4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2]),
        ],
        vec![
            (ME, false, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
        ],
    ] {
        let t0 = Instant::now();
        let mut m = owning(8, 4..8, t0);
        m.handle_timeout(t0 + I);
        drain(&mut m);
        m.handle_event(
            t0 + I,
            ShardEvent::Surveyed {
                conn: C1,
                survey: survey(8, &rows),
            },
        );
        let actions = drain(&mut m);
        assert!(
            actions.contains(&ShardAction::CloseSession { conn: C1 }),
            "{rows:?}"
        );
        assert!(m.owned().is_empty());
    }
}

#[test]
fn a_survey_answered_by_another_backend_loses_the_session() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    m.handle_timeout(t0 + I);
    drain(&mut m);
    let moved = Survey::new(8, OTHER, [(ME, true, vec![4u32, 5, 6, 7])]).expect("valid");
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: moved,
        },
    );
    let actions = drain(&mut m);
    assert!(actions.contains(&ShardAction::EndTerm {
        shard: Shard::new(4),
        term: TermId::new(1),
        cause: TermEndCause::Lost(LossReason::BackendChanged)
    }));
}

#[test]
fn a_join_hands_the_excess_over_after_the_delay_work_first_then_unlock() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    let joiner = MemberId::new(300);
    let after_join = survey(
        8,
        &[
            (ME, true, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
            (joiner, true, vec![]),
        ],
    );
    m.handle_timeout(t0 + I);
    drain(&mut m);
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: after_join.clone(),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![],
        "the membership changed: wait the delay"
    );
    let p = plan(&after_join, ME);
    assert_eq!(p.cap, 3, "8 over 3 members: 3, 3 and 2 for the joiner");
    let given = p.give.clone();
    assert_eq!(given.len(), 1);
    let term = m.term_of(given[0]).expect("owned");
    m.handle_timeout(t0 + 2 * I);
    drain(&mut m);
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: after_join.clone(),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::EndTerm {
                shard: given[0],
                term,
                cause: TermEndCause::HandedOver
            },
            ShardAction::AwaitWork { term },
            log(ShardLogKind::HandingOver, 1),
        ]
    );
    assert_eq!(m.handing_over(), given);
    assert_eq!(m.term_of(given[0]), None);
    m.handle_event(t0 + 2 * I, ShardEvent::WorkDrained { term });
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Unlock {
            conn: C1,
            shards: given.clone()
        }]
    );
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Unlocked {
            conn: C1,
            not_held: vec![],
        },
    );
    assert_eq!(drain(&mut m), vec![log(ShardLogKind::HandedOver, 1)]);
    assert!(m.handing_over().is_empty());
}

#[test]
fn handovers_per_interval_stop_at_the_move_limit() {
    let t0 = Instant::now();
    let mut m = Machine::new(
        options(8)
            .max_moves(1)
            .expect("valid")
            .rebalance_delay(Duration::ZERO),
    );
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 1,
        },
    );
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, vec![])]),
        },
    );
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: shards(0..8),
        },
    );
    drain(&mut m);
    let crowded = survey(
        8,
        &[
            (ME, true, (0..8).collect()),
            (OTHER, true, vec![]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    for k in 1..=2u32 {
        let now = t0 + I * k;
        m.handle_timeout(now);
        drain(&mut m);
        m.handle_event(
            now,
            ShardEvent::Surveyed {
                conn: C1,
                survey: crowded.clone(),
            },
        );
        let ended = drain(&mut m)
            .into_iter()
            .filter(|a| matches!(a, ShardAction::EndTerm { .. }))
            .count();
        assert_eq!(ended, 1, "interval {k}");
    }
    assert_eq!(m.handing_over().len(), 2);
}

#[test]
fn a_handover_whose_work_outlives_its_grace_warns_once_and_keeps_the_lock() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    let crowded = survey(
        8,
        &[
            (ME, true, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    for k in 1..=2u32 {
        m.handle_timeout(t0 + I * k);
        drain(&mut m);
        m.handle_event(
            t0 + I * k,
            ShardEvent::Surveyed {
                conn: C1,
                survey: crowded.clone(),
            },
        );
        drain(&mut m);
    }
    assert_eq!(m.handing_over().len(), 1);
    assert_eq!(m.poll_timeout(), Some(t0 + 3 * I));
    m.handle_timeout(t0 + 3 * I);
    let actions = drain(&mut m);
    assert_eq!(actions[0], log(ShardLogKind::HandoverOverdue, 1));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, ShardAction::Unlock { .. }))
    );
    assert_eq!(m.handing_over().len(), 1);
}

#[test]
fn an_unanswered_survey_loses_every_shard_after_one_interval() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    m.handle_timeout(t0 + I);
    drain(&mut m);
    assert_eq!(m.poll_timeout(), Some(t0 + 2 * I));
    assert_eq!(m.timeout_reason(), Some(ShardTimer::StatementDeadline));
    m.handle_timeout(t0 + 2 * I);
    let actions = drain(&mut m);
    let lost = TermEndCause::Lost(LossReason::CheckTimedOut);
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, ShardAction::EndTerm { cause, .. } if *cause == lost))
            .count(),
        4
    );
    assert!(actions.contains(&ShardAction::CloseSession { conn: C1 }));
    assert!(actions.contains(&ShardAction::Log(ShardLog {
        kind: ShardLogKind::SessionLost,
        shards: 4,
        reason: Some(lost),
        cause: Some(Cause::TimedOut(I)),
    })));
    assert_eq!(
        actions.last(),
        Some(&ShardAction::AcquireSession {
            conn: ConnId::new(2)
        }),
        "the check due at the same instant opens a new session"
    );
}

#[test]
fn a_failed_statement_or_an_ended_session_loses_every_shard() {
    for (event, reason) in [
        (
            ShardEvent::StatementFailed {
                conn: C1,
                cause: "boom",
                session_ended: false,
            },
            LossReason::CheckFailed,
        ),
        (
            ShardEvent::StatementFailed {
                conn: C1,
                cause: "57P01",
                session_ended: true,
            },
            LossReason::SessionEnded,
        ),
        (
            ShardEvent::SessionEnded { conn: C1 },
            LossReason::SessionEnded,
        ),
    ] {
        let t0 = Instant::now();
        let mut m = owning(8, 4..8, t0);
        m.handle_timeout(t0 + I);
        drain(&mut m);
        assert_eq!(m.handle_event(t0 + I, event), Handled::Applied);
        let actions = drain(&mut m);
        assert!(actions.contains(&ShardAction::EndTerm {
            shard: Shard::new(7),
            term: TermId::new(4),
            cause: TermEndCause::Lost(reason)
        }));
        assert!(m.owned().is_empty());
    }
}

#[test]
fn a_completion_for_an_older_session_is_ignored() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::SessionEnded {
                conn: ConnId::new(7)
            }
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::Took {
                conn: C1,
                granted: vec![]
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(m.owned().len(), 4);
}

#[test]
fn a_stop_ends_every_term_awaits_the_work_then_unlocks_all() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    let now = t0 + Duration::from_millis(10);
    m.handle_event(now, Control::Cancelled.into());
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::EndTerm {
                shard: Shard::new(6),
                term: TermId::new(1),
                cause: TermEndCause::Stopped
            },
            ShardAction::EndTerm {
                shard: Shard::new(7),
                term: TermId::new(2),
                cause: TermEndCause::Stopped
            },
            ShardAction::AwaitWork {
                term: TermId::new(1)
            },
            ShardAction::AwaitWork {
                term: TermId::new(2)
            },
        ]
    );
    assert_eq!(m.phase(), ShardPhase::Stopping);
    assert_eq!(m.poll_timeout(), Some(now + I), "the stop grace");
    m.handle_event(
        now,
        ShardEvent::WorkDrained {
            term: TermId::new(1),
        },
    );
    assert_eq!(drain(&mut m), vec![]);
    m.handle_event(
        now,
        ShardEvent::WorkDrained {
            term: TermId::new(2),
        },
    );
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
    m.handle_event(now, ShardEvent::UnlockedAll { conn: C1 });
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::CloseSession { conn: C1 }, ShardAction::Finish]
    );
    assert!(!m.is_running());
}

#[test]
fn a_stop_whose_work_outlives_the_grace_unlocks_anyway_and_says_so() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::Cancelled.into());
    drain(&mut m);
    assert_eq!(m.timeout_reason(), Some(ShardTimer::DrainDeadline));
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![
            log(ShardLogKind::WorkOutlivedStop, 2),
            ShardAction::UnlockAll { conn: C1 }
        ]
    );
    assert_eq!(m.poll_timeout(), Some(t0 + I + crate::UNLOCK_BUDGET));
    m.handle_timeout(t0 + I + crate::UNLOCK_BUDGET);
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            ShardAction::Log(ShardLog {
                kind: ShardLogKind::ReleaseFailed,
                shards: 0,
                reason: None,
                cause: Some(Cause::TimedOut(crate::UNLOCK_BUDGET)),
            }),
            ShardAction::Finish,
        ]
    );
}

#[test]
fn a_stop_during_a_statement_waits_for_its_answer_and_begins_no_term() {
    let t0 = Instant::now();
    let mut m = joined(8, t0);
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, vec![]), (OTHER, true, vec![0, 1, 2, 3])]),
        },
    );
    drain(&mut m);
    m.handle_event(t0, Control::Cancelled.into());
    assert_eq!(drain(&mut m), vec![], "the take is in flight");
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: shards(4..8),
        },
    );
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
}

#[test]
fn a_stop_without_a_session_finishes_at_once() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    drain(&mut m);
    m.handle_event(t0, Control::Cancelled.into());
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::CloseSession { conn: C1 }, ShardAction::Finish]
    );
    assert_eq!(
        m.handle_event(t0, Control::Cancelled.into()),
        Handled::Ignored(Ignored::NotRunning)
    );
}

#[test]
fn a_panic_ends_every_term_as_lost_and_closes_without_unlocking() {
    let t0 = Instant::now();
    let mut m = owning(8, 7..8, t0);
    m.handle_event(t0, Control::Panicked.into());
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::EndTerm {
                shard: Shard::new(7),
                term: TermId::new(1),
                cause: TermEndCause::Lost(LossReason::Panicked)
            },
            ShardAction::CloseSession { conn: C1 },
            log(ShardLogKind::AbandonedAfterPanic, 0),
            ShardAction::Finish,
        ]
    );
}

#[test]
fn an_unlock_that_finds_a_shard_not_held_loses_the_session() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    let crowded = survey(
        8,
        &[
            (ME, true, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    for k in 1..=2u32 {
        m.handle_timeout(t0 + I * k);
        drain(&mut m);
        m.handle_event(
            t0 + I * k,
            ShardEvent::Surveyed {
                conn: C1,
                survey: crowded.clone(),
            },
        );
    }
    let actions = drain(&mut m);
    let Some(ShardAction::AwaitWork { term }) = actions.get(1).cloned() else {
        panic!("{actions:?}");
    };
    m.handle_event(t0 + 2 * I, ShardEvent::WorkDrained { term });
    let Some(ShardAction::Unlock { shards, .. }) = drain(&mut m).pop() else {
        panic!("an unlock");
    };
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Unlocked {
            conn: C1,
            not_held: shards,
        },
    );
    let actions = drain(&mut m);
    assert!(actions.contains(&ShardAction::CloseSession { conn: C1 }));
    assert!(m.owned().is_empty());
}

// The assignment.

fn balanced(count: u32, members: &[i32]) -> Survey {
    let rows: Vec<(MemberId, bool, Vec<u32>)> = members
        .iter()
        .map(|&m| (MemberId::new(m), true, vec![]))
        .collect();
    let mut s = Survey::new(count, MemberId::new(members[0]), rows.clone()).expect("valid");
    // Hand every member its plan, one after another, as the cluster would.
    for _ in 0..members.len() {
        let mut next = rows.clone();
        for (i, &m) in members.iter().enumerate() {
            let mut held = s.held_by(MemberId::new(m));
            held.extend(plan(&s, MemberId::new(m)).take);
            next[i].2 = held.iter().map(|s| s.get()).collect();
        }
        s = Survey::new(count, MemberId::new(members[0]), next).expect("valid");
    }
    s
}

#[test]
fn caps_give_the_remainder_by_the_members_hash_whatever_they_hold() {
    let members = [ME, OTHER, MemberId::new(300), MemberId::new(400)];
    let held = survey(
        10,
        &[
            (ME, true, vec![0, 1, 2, 3]),
            (OTHER, true, vec![4, 5, 6]),
            (MemberId::new(300), true, vec![7, 8, 9]),
            (MemberId::new(400), true, vec![]),
        ],
    );
    let caps = caps(&held);
    assert_eq!(caps.iter().map(|c| c.1).sum::<u32>(), 10);
    // The same membership holding nothing has the same caps: they do not follow the loads.
    let rows: Vec<(MemberId, bool, Vec<u32>)> =
        members.iter().map(|&m| (m, true, vec![])).collect();
    assert_eq!(super::caps(&survey(10, &rows)), caps);
}

#[test]
fn a_fresh_space_is_split_evenly_without_two_members_planning_one_shard() {
    let members = [11, 22, 33, 44, 55];
    let s = balanced(1024, &members);
    let loads = s.loads();
    assert!(
        loads.iter().all(|(_, n)| *n == 204 || *n == 205),
        "{loads:?}"
    );
    assert_eq!(s.held_count(), 1024);
}

#[test]
fn a_join_moves_only_the_joiners_share() {
    let before = balanced(1024, &[11, 22, 33, 44, 55, 66, 77, 88]);
    let joiner = MemberId::new(99);
    let mut rows: Vec<(MemberId, bool, Vec<u32>)> = before
        .members()
        .iter()
        .map(|&m| (m, true, before.held_by(m).iter().map(|s| s.get()).collect()))
        .collect();
    rows.push((joiner, true, vec![]));
    let after = Survey::new(1024, joiner, rows).expect("valid");
    let given: usize = after
        .members()
        .iter()
        .map(|&m| plan(&after, m).give.len())
        .sum();
    let joiners_cap = plan(&after, joiner).cap;
    assert!(joiners_cap == 1024 / 9 || joiners_cap == 1024 / 9 + 1);
    assert_eq!(given, joiners_cap as usize, "the joiner's cap and no more");
}

#[test]
fn survey_rows_outside_the_space_or_held_twice_are_rejected() {
    assert_eq!(
        Survey::new(4, ME, [(ME, true, vec![4u32])]),
        Err(SurveyError::ShardOutOfRange { shard: 4, count: 4 })
    );
    assert_eq!(
        Survey::new(4, ME, [(ME, true, vec![1u32]), (OTHER, true, vec![1])]),
        Err(SurveyError::TwoHolders {
            shard: Shard::new(1)
        })
    );
}

#[test]
fn options_reject_an_empty_space_and_a_zero_move_limit() {
    let interval = CheckInterval::new(I).expect("valid");
    assert_eq!(
        ShardOptions::new(interval, 0),
        Err(ShardOptionsError::ShardCount(0))
    );
    assert_eq!(
        ShardOptions::new(interval, MAX_SHARDS + 1),
        Err(ShardOptionsError::ShardCount(MAX_SHARDS + 1))
    );
    assert_eq!(options(8).max_moves(0), Err(ShardOptionsError::NoMoves));
    assert!(options(8).stop_grace(3 * I).is_err());
    assert_eq!(options(8).moves(), 2);
    assert_eq!(options(1024).moves(), 256);
}

// Further transitions, and the fixed texts and functions other versions rely on.

#[test]
fn an_acquire_without_answer_within_one_interval_is_abandoned_and_retried_at_once() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    drain(&mut m);
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            ShardAction::Log(ShardLog {
                kind: ShardLogKind::AcquireFailed,
                shards: 0,
                reason: None,
                cause: Some(Cause::TimedOut(I)),
            }),
            ShardAction::AcquireSession {
                conn: ConnId::new(2)
            },
        ]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::AcquireFailed {
            conn: ConnId::new(2),
            cause: "refused",
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Log(ShardLog {
            kind: ShardLogKind::AcquireFailed,
            shards: 0,
            reason: None,
            cause: Some(Cause::Error("refused")),
        })]
    );
    assert_eq!(m.phase(), ShardPhase::Detached);
    assert_eq!(m.timeout_reason(), Some(ShardTimer::NextCheck));
    assert_eq!(m.poll_timeout(), Some(t0 + 2 * I));
}

#[test]
fn a_failed_registration_closes_the_session_with_nothing_to_end() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    drain(&mut m);
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::StatementFailed {
                conn: C1,
                cause: "in recovery",
                session_ended: false,
            },
        ),
        Handled::Applied
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            ShardAction::Log(ShardLog {
                kind: ShardLogKind::SessionLost,
                shards: 0,
                reason: Some(TermEndCause::Lost(LossReason::CheckFailed)),
                cause: Some(Cause::Error("in recovery")),
            }),
        ]
    );
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::StatementFailed {
                conn: C1,
                cause: "late",
                session_ended: false,
            },
        ),
        Handled::Ignored(Ignored::StaleConnection)
    );
}

#[test]
fn a_statement_failure_with_no_statement_in_flight_is_ignored() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::StatementFailed {
                conn: C1,
                cause: "?",
                session_ended: false,
            },
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(
        m.handle_event(t0, ShardEvent::UnlockedAll { conn: C1 }),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::Unlocked {
                conn: C1,
                not_held: vec![]
            }
        ),
        Handled::Ignored(Ignored::Unexpected)
    );
    assert_eq!(
        m.handle_event(
            t0,
            ShardEvent::WorkDrained {
                term: TermId::new(1)
            }
        ),
        Handled::Ignored(Ignored::Unexpected),
        "term 1 is open, not handed over"
    );
    assert_eq!(m.owned().len(), 4);
}

#[test]
fn a_second_survey_while_handovers_wait_gives_up_only_the_rest_of_the_excess() {
    let t0 = Instant::now();
    // ME takes 7 of 8 beside OTHER's 1, then OTHER and a third replica are members: caps 3, 3
    // and 2.
    let mut m = Machine::new(options(8).rebalance_delay(Duration::ZERO));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 2,
        },
    );
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            // OTHER holds shard 0 before it joins: ME alone may own the other 7.
            survey: survey(8, &[(ME, true, vec![]), (OTHER, false, vec![0])]),
        },
    );
    assert_eq!(
        drain(&mut m).last(),
        Some(&ShardAction::Take {
            conn: C1,
            shards: shards(1..8)
        })
    );
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: shards(1..8),
        },
    );
    drain(&mut m);
    let crowded = survey(
        8,
        &[
            (ME, true, (1..8).collect()),
            (OTHER, true, vec![0]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    let ended = |actions: &[A]| {
        actions
            .iter()
            .filter(|a| matches!(a, ShardAction::EndTerm { .. }))
            .count()
    };
    m.handle_timeout(t0 + I);
    drain(&mut m);
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: crowded.clone(),
        },
    );
    // ME holds 7 with a cap of 3: 4 to give, within the default limit of 2 per interval.
    let first = drain(&mut m);
    assert_eq!(ended(&first), 2, "{first:?}");
    m.handle_timeout(t0 + 2 * I);
    drain(&mut m);
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: crowded.clone(),
        },
    );
    assert_eq!(ended(&drain(&mut m)), 2, "two more: 4 in all");
    m.handle_timeout(t0 + 3 * I);
    drain(&mut m);
    m.handle_event(
        t0 + 3 * I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: crowded,
        },
    );
    assert_eq!(
        ended(&drain(&mut m)),
        0,
        "the four waiting for their work are the whole excess"
    );
    assert_eq!(m.handing_over().len(), 4);
    assert_eq!(m.owned().len(), 3);
    assert_eq!(m.last_survey().map(|s| s.members().len()), Some(3));
}

#[test]
fn a_stop_during_a_handover_awaits_the_handed_over_work_once() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    let crowded = survey(
        8,
        &[
            (ME, true, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    for k in 1..=2u32 {
        m.handle_timeout(t0 + I * k);
        drain(&mut m);
        m.handle_event(
            t0 + I * k,
            ShardEvent::Surveyed {
                conn: C1,
                survey: crowded.clone(),
            },
        );
    }
    let handed = drain(&mut m);
    let Some(ShardAction::AwaitWork { term: handed_term }) = handed.get(1).cloned() else {
        panic!("{handed:?}");
    };
    m.handle_event(t0 + 2 * I, Control::Cancelled.into());
    let actions = drain(&mut m);
    let awaited: Vec<TermId> = actions
        .iter()
        .filter_map(|a| match a {
            ShardAction::AwaitWork { term } => Some(*term),
            _ => None,
        })
        .collect();
    assert_eq!(awaited.len(), 3, "the three stopped terms: {actions:?}");
    assert!(!awaited.contains(&handed_term));
    assert_eq!(
        m.handle_event(t0 + 2 * I, Control::Cancelled.into()),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    for term in awaited {
        m.handle_event(t0 + 2 * I, ShardEvent::WorkDrained { term });
    }
    assert_eq!(drain(&mut m), vec![], "the handed-over work still runs");
    m.handle_event(t0 + 2 * I, ShardEvent::WorkDrained { term: handed_term });
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::StatementFailed {
            conn: C1,
            cause: "broken",
            session_ended: true,
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            ShardAction::Log(ShardLog {
                kind: ShardLogKind::ReleaseFailed,
                shards: 0,
                reason: None,
                cause: Some(Cause::Error("broken")),
            }),
            ShardAction::Finish,
        ]
    );
}

#[test]
fn a_session_lost_while_stopping_finishes_the_run() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::Cancelled.into());
    drain(&mut m);
    m.handle_event(t0, ShardEvent::SessionEnded { conn: C1 });
    let actions = drain(&mut m);
    assert_eq!(actions.last(), Some(&ShardAction::Finish));
    assert!(actions.contains(&ShardAction::CloseSession { conn: C1 }));
    assert!(!m.is_running());
}

#[test]
fn a_drop_ends_every_term_as_lost_and_says_so() {
    let t0 = Instant::now();
    let mut m = owning(8, 7..8, t0);
    m.handle_event(t0, Control::Dropped.into());
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::EndTerm {
                shard: Shard::new(7),
                term: TermId::new(1),
                cause: TermEndCause::Lost(LossReason::Dropped)
            },
            ShardAction::CloseSession { conn: C1 },
            log(ShardLogKind::AbandonedAfterDrop, 0),
            ShardAction::Finish,
        ]
    );
    assert_eq!(m.phase(), ShardPhase::Idle);
    assert!(m.owned().is_empty());
    assert_eq!(m.member(), None);
    assert!(
        m.last_survey().is_some(),
        "kept for status pages after the run"
    );
    assert_eq!(m.options(), options(8));
}

#[test]
fn the_rendezvous_score_is_a_fixed_function() {
    // Replicas of different versions must agree on it: these values never change.
    assert_eq!(
        score(MemberId::new(0), Shard::new(0)),
        12_035_550_249_420_947_055
    );
    assert_eq!(
        score(MemberId::new(100), Shard::new(7)),
        1_681_264_479_885_822_876
    );
    assert_ne!(
        score(MemberId::new(100), Shard::new(7)),
        score(MemberId::new(7), Shard::new(100))
    );
}

#[test]
fn tied_loads_give_the_extra_slots_by_the_members_fixed_hash() {
    let s = survey(
        5,
        &[
            (ME, true, vec![]),
            (OTHER, true, vec![]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    let caps = caps(&s);
    assert_eq!(caps.iter().map(|c| c.1).sum::<u32>(), 5);
    let lucky: Vec<MemberId> = caps.iter().filter(|c| c.1 == 2).map(|c| c.0).collect();
    assert_eq!(lucky, vec![ME, MemberId::new(300)]);
    let nobody = Survey::new(5, ME, Vec::<(MemberId, bool, Vec<u32>)>::new()).expect("valid");
    assert!(super::caps(&nobody).is_empty());
}

#[test]
fn the_excess_given_up_is_the_lowest_scoring_for_the_giver() {
    let s = survey(6, &[(ME, true, (0..6).collect()), (OTHER, true, vec![])]);
    let p = plan(&s, ME);
    assert_eq!((p.cap, p.held), (3, 6));
    let mut by_score: Vec<Shard> = (0..6).map(Shard::new).collect();
    by_score.sort_by_key(|&s| score(ME, s));
    assert_eq!(p.give, by_score[..3].to_vec());
    assert!(p.take.is_empty());
    // A backend that is not a member gives everything up.
    let outsider = plan(&survey(6, &[(ME, false, vec![1, 2])]), ME);
    assert_eq!((outsider.cap, outsider.give.len()), (0, 2));
}

#[test]
fn free_shards_go_to_the_member_with_room_that_scores_them_highest() {
    let s = survey(4, &[(ME, true, vec![]), (OTHER, true, vec![])]);
    let mine = plan(&s, ME).take;
    let theirs = plan(&s, OTHER).take;
    assert_eq!(mine.len() + theirs.len(), 4);
    assert!(mine.iter().all(|s| !theirs.contains(s)));
    // The first free shard goes to whoever scores it higher.
    let first = Shard::new(0);
    let winner = if score(ME, first) > score(OTHER, first) {
        &mine
    } else {
        &theirs
    };
    assert!(winner.contains(&first));
}

#[test]
fn a_survey_reports_its_members_holders_and_loads() {
    let s = survey(
        4,
        &[
            (OTHER, true, vec![0, 2]),
            (ME, true, vec![1]),
            (MemberId::new(300), false, vec![3]),
        ],
    );
    assert_eq!(s.backend(), ME);
    assert_eq!(s.members(), &[ME, OTHER]);
    assert_eq!(s.shard_count(), 4);
    assert_eq!(s.holder(Shard::new(3)), Some(MemberId::new(300)));
    assert_eq!(s.holder(Shard::new(9)), None);
    assert_eq!(s.held_count(), 4);
    assert_eq!(s.loads(), vec![(ME, 1), (OTHER, 2)]);
    assert_eq!(s.held_by(OTHER), vec![Shard::new(0), Shard::new(2)]);
}

#[test]
fn every_text_says_what_it_means() {
    let interval = CheckInterval::new(I).expect("valid");
    assert_eq!(
        ShardOptionsError::ShardCount(0).to_string(),
        "shard count 0 is outside 1..=1048576"
    );
    assert_eq!(
        ShardOptionsError::NoMoves.to_string(),
        "the move limit per interval must be at least 1"
    );
    let Err(grace) = ShardOptions::new(interval, 8)
        .expect("valid")
        .stop_grace(3 * I)
    else {
        panic!("too long");
    };
    assert!(grace.to_string().contains("3s"), "{grace}");
    let too_small = LockTableTooSmall {
        needed: 9,
        capacity: 16,
    };
    assert!(too_small.to_string().starts_with(
        "the shard space needs 9 advisory locks (one per shard and one per replica), more than \
         half of the server's lock table of 16 slots"
    ));
    assert_eq!(
        SurveyError::ShardOutOfRange { shard: 4, count: 4 }.to_string(),
        "survey row names shard 4, outside 0..4"
    );
    assert_eq!(
        SurveyError::TwoHolders {
            shard: Shard::new(1)
        }
        .to_string(),
        "survey rows show two holders of shard 1"
    );
    assert_eq!(MemberId::new(42).to_string(), "pid 42");
    let lost: ShardLog<&str> = ShardLog {
        kind: ShardLogKind::SessionLost,
        shards: 3,
        reason: Some(TermEndCause::Lost(LossReason::CheckTimedOut)),
        cause: Some(Cause::TimedOut(I)),
    };
    assert_eq!(
        lost.to_string(),
        "sharded leader: lock session lost with every shard it held: leadership lost: the check \
         did not answer in time: no answer within 1s"
    );
    assert_eq!(TermEndCause::HandedOver.label(), "handed_over");
    assert_eq!(
        TermEndCause::HandedOver.to_string(),
        "shard handed over for balance"
    );
    assert!(!TermEndCause::HandedOver.is_loss());
    use crate::action::Level;
    for (kind, level) in [
        (ShardLogKind::Joined, Level::Info),
        (ShardLogKind::Took, Level::Info),
        (ShardLogKind::HandingOver, Level::Info),
        (ShardLogKind::HandedOver, Level::Info),
        (ShardLogKind::SessionLost, Level::Warn),
        (ShardLogKind::AcquireFailed, Level::Warn),
        (ShardLogKind::MemberLockRefused, Level::Warn),
        (ShardLogKind::HandoverOverdue, Level::Warn),
        (ShardLogKind::ReleaseFailed, Level::Warn),
        (ShardLogKind::WorkOutlivedStop, Level::Warn),
        (ShardLogKind::AbandonedAfterPanic, Level::Warn),
        (ShardLogKind::AbandonedAfterDrop, Level::Warn),
    ] {
        assert_eq!(kind.level(), level, "{kind:?}");
        assert!(kind.message().starts_with("sharded leader: "), "{kind:?}");
    }
}

#[test]
fn builder_options_are_kept_and_long_windows_are_shortened() {
    let o = options(8)
        .rebalance_delay(Duration::from_millis(1500))
        .handover_grace(Duration::from_millis(700))
        .stop_grace(2 * I)
        .expect("two intervals")
        .max_moves(3)
        .expect("valid");
    assert_eq!(o.delay(), Duration::from_millis(1500));
    assert_eq!(o.handover(), Duration::from_millis(700));
    assert_eq!(o.grace(), 2 * I);
    assert_eq!(o.moves(), 3);
    assert_eq!(o.count(), 8);
    assert_eq!(o.interval().get(), I);
    let long = Duration::from_secs(30 * 24 * 3600);
    assert_eq!(
        options(8).rebalance_delay(long).delay(),
        crate::MAX_HOLD_OFF
    );
    assert_eq!(
        options(8).handover_grace(long).handover(),
        crate::MAX_HOLD_OFF
    );
}

fn fenced_taking(t0: Instant) -> Machine {
    let mut m = Machine::new(options(8).fencing(true));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 2,
        },
    );
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, vec![]), (OTHER, true, vec![0, 1, 2, 3, 7])]),
        },
    );
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: shards(4..7),
        },
    );
    m
}

#[test]
fn with_fencing_granted_shards_begin_terms_with_their_epochs() {
    let t0 = Instant::now();
    let mut m = fenced_taking(t0);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AdvanceEpochs {
            conn: C1,
            shards: shards(4..7),
            lock_timeout_ms: 500,
        }],
        "no term before the epochs"
    );
    assert!(m.owned().is_empty());
    m.handle_event(
        t0,
        ShardEvent::EpochsAdvanced {
            conn: C1,
            epochs: vec![(Shard::new(4), 7), (Shard::new(5), 3)],
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::BeginTerm {
                shard: Shard::new(4),
                term: TermId::new(1),
                epoch: Some(7),
            },
            ShardAction::BeginTerm {
                shard: Shard::new(5),
                term: TermId::new(2),
                epoch: Some(3),
            },
            log(ShardLogKind::Took, 2),
            log(ShardLogKind::FencingFailed, 1),
            ShardAction::Unlock {
                conn: C1,
                shards: vec![Shard::new(6)]
            },
        ],
        "a shard the answer left out is released"
    );
    m.handle_event(
        t0,
        ShardEvent::Unlocked {
            conn: C1,
            not_held: vec![],
        },
    );
    assert_eq!(drain(&mut m), vec![], "a release is not a handover");
    assert_eq!(m.owned().len(), 2);
}

#[test]
fn a_failed_epoch_advance_releases_the_granted_shards_and_keeps_the_session() {
    let t0 = Instant::now();
    let mut m = fenced_taking(t0);
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::StatementFailed {
            conn: C1,
            cause: "55P03",
            session_ended: false,
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::Log(ShardLog {
                kind: ShardLogKind::FencingFailed,
                shards: 3,
                reason: None,
                cause: Some(Cause::Error("55P03")),
            }),
            ShardAction::Unlock {
                conn: C1,
                shards: shards(4..7)
            },
        ]
    );
    // Until the unlock answers, the survey would show them: they are believed held.
    assert_eq!(m.phase(), ShardPhase::Busy);
}

#[test]
fn an_unanswered_epoch_advance_loses_the_session() {
    let t0 = Instant::now();
    let mut m = fenced_taking(t0);
    drain(&mut m);
    m.handle_timeout(t0 + I);
    let actions = drain(&mut m);
    assert!(
        actions.contains(&ShardAction::CloseSession { conn: C1 }),
        "{actions:?}"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, ShardAction::BeginTerm { .. }))
    );
}

#[test]
fn a_stop_during_an_epoch_advance_begins_no_term() {
    let t0 = Instant::now();
    let mut m = fenced_taking(t0);
    drain(&mut m);
    m.handle_event(t0, Control::Cancelled.into());
    assert_eq!(drain(&mut m), vec![]);
    m.handle_event(
        t0,
        ShardEvent::EpochsAdvanced {
            conn: C1,
            epochs: vec![(Shard::new(4), 1)],
        },
    );
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
}

#[test]
fn a_registration_without_answer_within_one_interval_loses_the_session() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    drain(&mut m);
    assert_eq!(m.timeout_reason(), Some(ShardTimer::StatementDeadline));
    assert_eq!(m.poll_timeout(), Some(t0 + I));
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![
            ShardAction::CloseSession { conn: C1 },
            ShardAction::Log(ShardLog {
                kind: ShardLogKind::SessionLost,
                shards: 0,
                reason: Some(TermEndCause::Lost(LossReason::CheckTimedOut)),
                cause: Some(Cause::TimedOut(I)),
            }),
            ShardAction::AcquireSession {
                conn: ConnId::new(2)
            },
        ]
    );
}

#[test]
fn an_advance_that_fences_nothing_begins_nothing_and_says_only_that() {
    let t0 = Instant::now();
    let mut m = fenced_taking(t0);
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::EpochsAdvanced {
            conn: C1,
            epochs: vec![],
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            log(ShardLogKind::FencingFailed, 3),
            ShardAction::Unlock {
                conn: C1,
                shards: shards(4..7)
            },
        ]
    );
}

#[test]
fn an_overdue_handover_is_reported_once_and_drained_ones_never() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8).rebalance_delay(Duration::ZERO));
    m.start(t0).expect("not running");
    m.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 1,
        },
    );
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, vec![])]),
        },
    );
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: shards(0..8),
        },
    );
    drain(&mut m);
    let crowded = survey(8, &[(ME, true, (0..8).collect()), (OTHER, true, vec![])]);
    let overdue = |actions: &[A]| -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                ShardAction::Log(ShardLog {
                    kind: ShardLogKind::HandoverOverdue,
                    shards,
                    ..
                }) => Some(*shards),
                _ => None,
            })
            .collect()
    };
    let awaited = |actions: &[A]| -> Vec<TermId> {
        actions
            .iter()
            .filter_map(|a| match a {
                ShardAction::AwaitWork { term } => Some(*term),
                _ => None,
            })
            .collect()
    };
    // At I two shards are handed over (the default limit of 2 per interval), due at 2I.
    m.handle_timeout(t0 + I);
    drain(&mut m);
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: crowded.clone(),
        },
    );
    let first = awaited(&drain(&mut m));
    assert_eq!(first.len(), 2);
    // One of them drains at 1.5I; its unlock is still in flight at 2I.
    m.handle_event(t0 + I * 3 / 2, ShardEvent::WorkDrained { term: first[1] });
    let unlock = drain(&mut m);
    let [
        ShardAction::Unlock {
            shards: unlocked, ..
        },
    ] = unlock.as_slice()
    else {
        panic!("{unlock:?}");
    };
    let unlocked = unlocked.clone();
    m.handle_timeout(t0 + 2 * I);
    assert_eq!(
        overdue(&drain(&mut m)),
        vec![1],
        "the drained one is not late"
    );
    // The unlock answers; the survey due at 2I runs and hands two more over, due at 3I.
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Unlocked {
            conn: C1,
            not_held: vec![],
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            log(ShardLogKind::HandedOver, 1),
            ShardAction::Survey {
                conn: C1,
                floor: FloorStep::Off
            }
        ]
    );
    let held: Vec<u32> = (0..8)
        .filter(|s| !unlocked.contains(&Shard::new(*s)))
        .collect();
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(8, &[(ME, true, held), (OTHER, true, vec![])]),
        },
    );
    assert_eq!(awaited(&drain(&mut m)).len(), 2);
    m.handle_timeout(t0 + 3 * I);
    assert_eq!(
        overdue(&drain(&mut m)),
        vec![2],
        "the two new ones; the first late one was reported at 2I already"
    );
}

#[test]
fn a_survey_answered_while_stopping_waits_for_the_work_instead_of_losing_the_session() {
    // The simulation's finding 1: a stop while a survey was in flight took the stopped shards
    // out of the believed set, the answer then contradicted it, and the session was closed
    // (every lock freed) while the stopped work still ran.
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(t0 + I, Control::Cancelled.into());
    let awaited: Vec<TermId> = drain(&mut m)
        .into_iter()
        .filter_map(|a| match a {
            ShardAction::AwaitWork { term } => Some(term),
            _ => None,
        })
        .collect();
    assert_eq!(awaited.len(), 4);
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(
                8,
                &[
                    (ME, true, vec![4, 5, 6, 7]),
                    (OTHER, true, vec![0, 1, 2, 3]),
                ],
            ),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![],
        "no loss, no release before the work returned"
    );
    for term in awaited {
        m.handle_event(t0 + I, ShardEvent::WorkDrained { term });
    }
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
}

#[test]
fn an_unlock_missing_a_lock_while_stopping_still_waits_for_the_work() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    let crowded = survey(
        8,
        &[
            (ME, true, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
            (MemberId::new(300), true, vec![]),
        ],
    );
    for k in 1..=2u32 {
        m.handle_timeout(t0 + I * k);
        drain(&mut m);
        m.handle_event(
            t0 + I * k,
            ShardEvent::Surveyed {
                conn: C1,
                survey: crowded.clone(),
            },
        );
    }
    let handed = drain(&mut m);
    let Some(ShardAction::AwaitWork { term }) = handed.get(1).cloned() else {
        panic!("{handed:?}");
    };
    m.handle_event(t0 + 2 * I, ShardEvent::WorkDrained { term });
    let Some(ShardAction::Unlock {
        shards: unlocking, ..
    }) = drain(&mut m).pop()
    else {
        panic!("an unlock");
    };
    m.handle_event(t0 + 2 * I, Control::Cancelled.into());
    drain(&mut m);
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Unlocked {
            conn: C1,
            not_held: unlocking,
        },
    );
    let actions = drain(&mut m);
    assert!(
        !actions.contains(&ShardAction::CloseSession { conn: C1 }),
        "{actions:?}"
    );
    assert_eq!(m.phase(), ShardPhase::Stopping);
}

// ---- resign and eligibility ----

/// The ending, draining and release of shards 6 and 7 of [`owning`] (terms 1 and 2) with `cause`,
/// as at a stop; the release's `CloseSession` (and `Finish` when `finished`) drained too.
fn give_up_both(m: &mut Machine, now: Instant, cause: TermEndCause, finished: bool) {
    assert_eq!(
        drain(m),
        vec![
            ShardAction::EndTerm {
                shard: Shard::new(6),
                term: TermId::new(1),
                cause
            },
            ShardAction::EndTerm {
                shard: Shard::new(7),
                term: TermId::new(2),
                cause
            },
            ShardAction::AwaitWork {
                term: TermId::new(1)
            },
            ShardAction::AwaitWork {
                term: TermId::new(2)
            },
        ]
    );
    for term in [1, 2] {
        m.handle_event(
            now,
            ShardEvent::WorkDrained {
                term: TermId::new(term),
            },
        );
    }
    assert_eq!(drain(m), vec![ShardAction::UnlockAll { conn: C1 }]);
    m.handle_event(now, ShardEvent::UnlockedAll { conn: C1 });
    let mut closed = vec![ShardAction::CloseSession { conn: C1 }];
    if finished {
        closed.push(ShardAction::Finish);
    }
    assert_eq!(drain(m), closed);
}

#[test]
fn a_resign_gives_up_every_shard_as_a_stop_does_then_rejoins_after_the_hold_off() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    let now = t0 + Duration::from_millis(10);
    let hold_off = 10 * I;
    assert_eq!(
        m.handle_event(now, Control::Resign { hold_off }.into()),
        Handled::Applied
    );
    assert_eq!(m.phase(), ShardPhase::Stopping);
    assert_eq!(
        m.handle_event(now, Control::Resign { hold_off: I }.into()),
        Handled::Applied,
        "a second resign during the release: the later end wins, no second release"
    );
    give_up_both(&mut m, now, TermEndCause::Resigned, false);
    assert!(m.is_running(), "a resign does not end the run");
    assert_eq!(m.phase(), ShardPhase::Detached);
    assert_eq!(m.held_off_until(), Some(now + hold_off));
    assert_eq!(m.poll_timeout(), Some(now + hold_off), "no check before it");
    m.handle_timeout(now + hold_off);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession {
            conn: ConnId::new(2)
        }]
    );
    assert_eq!(m.held_off_until(), None);
}

#[test]
fn a_second_resign_with_a_shorter_hold_off_keeps_the_later_end_as_one_election_does() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    let hold_off = 10 * I;
    m.handle_event(t0, Control::Resign { hold_off }.into());
    give_up_both(&mut m, t0, TermEndCause::Resigned, false);
    assert_eq!(m.held_off_until(), Some(t0 + hold_off));
    let later = t0 + I;
    m.handle_event(later, Control::Resign { hold_off: I }.into());
    drain(&mut m);
    assert_eq!(
        m.held_off_until(),
        Some(t0 + hold_off),
        "the shorter hold-off does not shorten the one in progress"
    );
    assert_eq!(m.poll_timeout(), Some(t0 + hold_off));
}

#[test]
fn a_longer_resign_during_a_resigns_release_delays_the_rejoin_to_its_end() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::Resign { hold_off: I }.into());
    let later = t0 + Duration::from_millis(1);
    assert_eq!(
        m.handle_event(later, Control::Resign { hold_off: 10 * I }.into()),
        Handled::Applied
    );
    give_up_both(&mut m, later, TermEndCause::Resigned, false);
    assert_eq!(m.held_off_until(), Some(later + 10 * I));
    assert_eq!(
        m.poll_timeout(),
        Some(later + 10 * I),
        "no rejoin before it"
    );
}

#[test]
fn a_resign_during_a_stops_release_is_ignored() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::Cancelled.into());
    assert_eq!(
        m.handle_event(t0, Control::Resign { hold_off: I }.into()),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    assert_eq!(m.held_off_until(), None);
    give_up_both(&mut m, t0, TermEndCause::Stopped, true);
}

#[test]
fn a_hold_off_longer_than_the_maximum_is_shortened_to_it() {
    let t0 = Instant::now();
    let mut m = joined(8, t0);
    m.handle_event(
        t0,
        Control::Resign {
            hold_off: crate::MAX_HOLD_OFF * 2,
        }
        .into(),
    );
    assert_eq!(m.held_off_until(), Some(t0 + crate::MAX_HOLD_OFF));
}

#[test]
fn a_stop_during_a_resign_finishes_the_run_after_the_release() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::Resign { hold_off: I }.into());
    assert_eq!(
        m.handle_event(t0, Control::Cancelled.into()),
        Handled::Applied
    );
    assert_eq!(
        m.handle_event(t0, Control::Cancelled.into()),
        Handled::Ignored(Ignored::AlreadyStopping)
    );
    give_up_both(&mut m, t0, TermEndCause::Resigned, true);
    assert!(!m.is_running(), "the Finish came with the release");
}

#[test]
fn a_resign_while_acquiring_closes_the_session_and_waits_out_the_hold_off() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.start(t0).expect("not running");
    drain(&mut m);
    m.handle_event(t0, Control::Resign { hold_off: 3 * I }.into());
    assert_eq!(drain(&mut m), vec![ShardAction::CloseSession { conn: C1 }]);
    assert_eq!(m.poll_timeout(), Some(t0 + 3 * I));
    assert_eq!(m.timeout_reason(), Some(ShardTimer::NextCheck));
    m.handle_timeout(t0 + I);
    assert_eq!(drain(&mut m), vec![], "early: nothing");
}

#[test]
fn an_ineligible_owner_gives_up_its_shards_and_rejoins_only_once_eligible() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    assert!(m.is_eligible());
    assert_eq!(
        m.handle_event(t0, Control::SetEligible { eligible: false }.into()),
        Handled::Applied
    );
    assert!(!m.is_eligible());
    give_up_both(&mut m, t0, TermEndCause::Resigned, false);
    assert!(m.is_running());
    assert_eq!(m.poll_timeout(), None, "no check while ineligible");
    assert_eq!(
        m.handle_event(t0, Control::SetEligible { eligible: false }.into()),
        Handled::Ignored(Ignored::Unchanged)
    );
    let later = t0 + 5 * I;
    m.handle_event(later, Control::SetEligible { eligible: true }.into());
    assert_eq!(m.poll_timeout(), Some(later), "a check at once");
    m.handle_timeout(later);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession {
            conn: ConnId::new(2)
        }]
    );
}

#[test]
fn eligibility_is_kept_while_not_running_and_an_ineligible_run_opens_no_session() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    assert_eq!(
        m.handle_event(t0, Control::SetEligible { eligible: false }.into()),
        Handled::Applied
    );
    assert_eq!(
        m.handle_event(t0, Control::SetEligible { eligible: false }.into()),
        Handled::Ignored(Ignored::Unchanged)
    );
    m.start(t0).expect("not running");
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), None);
    assert_eq!(
        m.handle_event(t0, Control::Resign { hold_off: I }.into()),
        Handled::Applied
    );
    m.handle_event(t0, Control::SetEligible { eligible: true }.into());
    assert_eq!(m.poll_timeout(), Some(t0 + I), "the hold-off still runs");
}

#[test]
fn a_session_lost_during_a_resign_leaves_a_run_that_rejoins_after_the_hold_off() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::Resign { hold_off: 2 * I }.into());
    drain(&mut m);
    m.handle_event(t0, ShardEvent::SessionEnded { conn: C1 });
    let actions = drain(&mut m);
    assert!(
        actions.contains(&ShardAction::CloseSession { conn: C1 }),
        "{actions:?}"
    );
    assert!(!actions.contains(&ShardAction::Finish), "{actions:?}");
    assert!(m.is_running());
    assert_eq!(m.poll_timeout(), Some(t0 + 2 * I));
}

#[test]
fn made_eligible_again_during_the_release_the_replica_rejoins_as_it_ends() {
    let t0 = Instant::now();
    let mut m = owning(8, 6..8, t0);
    m.handle_event(t0, Control::SetEligible { eligible: false }.into());
    let later = t0 + Duration::from_millis(30);
    assert_eq!(
        m.handle_event(later, Control::SetEligible { eligible: true }.into()),
        Handled::Applied
    );
    give_up_both(&mut m, later, TermEndCause::Resigned, false);
    assert_eq!(
        m.poll_timeout(),
        Some(later),
        "a check at the release's end"
    );
    m.handle_timeout(later);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession {
            conn: ConnId::new(2)
        }]
    );
}

/// The overdue reports among `actions`: (term, abort, run finished).
fn overdue_reports(actions: &[A]) -> Vec<(u64, bool, bool)> {
    actions
        .iter()
        .filter_map(|a| match a {
            ShardAction::ReportOverdueWork {
                term,
                abort,
                run_finished,
            } => Some((term.get(), *abort, *run_finished)),
            _ => None,
        })
        .collect()
}

#[test]
fn lost_shard_terms_work_deadlines_come_due_after_it_each_once() {
    let t0 = Instant::now();
    let deadline = options(8).work_deadline(3 * I, OnOverdue::Abort);
    let mut m = owning_with(deadline, 4..8, t0);
    m.handle_event(t0, ShardEvent::SessionEnded { conn: C1 });
    let actions = drain(&mut m);
    assert!(overdue_reports(&actions).is_empty(), "{actions:?}");
    m.handle_timeout(t0 + 3 * I - Duration::from_millis(1));
    assert!(
        overdue_reports(&drain(&mut m)).is_empty(),
        "not before the deadline"
    );
    m.handle_timeout(t0 + 3 * I);
    let reports = overdue_reports(&drain(&mut m));
    assert_eq!(
        reports,
        vec![
            (1, true, false),
            (2, true, false),
            (3, true, false),
            (4, true, false)
        ]
    );
    m.handle_timeout(t0 + 10 * I);
    assert!(overdue_reports(&drain(&mut m)).is_empty(), "each once");
}

#[test]
fn a_stop_reports_pending_work_deadlines_as_it_finishes_and_forgets_drained_work() {
    let t0 = Instant::now();
    let deadline = options(8).work_deadline(10 * I, OnOverdue::Report);
    let mut m = owning_with(deadline, 6..8, t0);
    m.handle_event(t0, Control::Cancelled.into());
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::WorkDrained {
            term: TermId::new(1),
        },
    );
    assert_eq!(m.timeout_reason(), Some(ShardTimer::DrainDeadline));
    m.handle_timeout(t0 + I);
    drain(&mut m);
    m.handle_event(t0 + I, ShardEvent::UnlockedAll { conn: C1 });
    let actions = drain(&mut m);
    assert_eq!(overdue_reports(&actions), vec![(2, false, true)]);
    assert_eq!(actions.last(), Some(&ShardAction::Finish));
}

#[test]
fn without_a_work_deadline_nothing_is_reported_overdue() {
    let t0 = Instant::now();
    let mut m = owning(8, 4..8, t0);
    m.handle_event(t0, ShardEvent::SessionEnded { conn: C1 });
    m.handle_timeout(t0 + 100 * I);
    m.handle_event(t0 + 100 * I, Control::Cancelled.into());
    let actions = drain(&mut m);
    assert!(overdue_reports(&actions).is_empty(), "{actions:?}");
}

#[test]
fn made_eligible_after_its_hold_off_passed_a_replica_rejoins_now_not_in_the_past() {
    let t0 = Instant::now();
    let mut m = Machine::new(options(8));
    m.handle_event(t0, Control::SetEligible { eligible: false }.into());
    m.start(t0).expect("not running");
    assert_eq!(drain(&mut m), vec![]);
    m.handle_event(t0, Control::Resign { hold_off: I }.into());
    drain(&mut m);
    let later = t0 + 10 * I;
    m.handle_event(later, Control::SetEligible { eligible: true }.into());
    assert_eq!(
        m.poll_timeout(),
        Some(later),
        "due now, not when the hold-off ended"
    );
    m.handle_timeout(later);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::AcquireSession { conn: C1 }]
    );
}

mod lease;
mod rank;
