//! The lease mechanism of a shard space: a member row renewed every interval, a survey only
//! while ownership changes, takes that bring their epochs, failures that cost nothing until
//! the trust runs out.

use super::*;
use crate::Mechanism;
use crate::lease::Lease;

/// A TTL of three intervals: trusted for 2.7 of them.
fn lease() -> Lease {
    Lease::default_for(CheckInterval::new(I).expect("valid"))
}

fn lease_options(count: u32) -> ShardOptions {
    options(count).mechanism(Mechanism::Lease(lease()))
}

const TRUST: Duration = Duration::from_millis(2700);

/// A lease member of `count` shards registered at `t0` as `ME`, its first survey in flight.
fn member(count: u32, t0: Instant) -> Machine {
    let mut m = Machine::new(lease_options(count));
    m.start(t0).expect("not running");
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::RegisterMember {
            conn: C1,
            ttl_ms: 3000,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: u64::MAX,
            members: 2,
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            log(ShardLogKind::Joined, 0),
            ShardAction::Survey {
                conn: C1,
                floor: FloorStep::Off
            }
        ],
        "no session to detach"
    );
    m
}

/// [`member`], owning `owned` (with epochs 7) after a survey where `OTHER` holds the rest.
fn lease_owning(count: u32, owned: std::ops::Range<u32>, t0: Instant) -> Machine {
    let mut m = member(count, t0);
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
        vec![ShardAction::TakeLeases {
            conn: C1,
            shards: shards(owned.clone()),
            lock_timeout_ms: 500
        }]
    );
    m.handle_event(
        t0,
        ShardEvent::TookLeases {
            conn: C1,
            live: true,
            taken: owned.clone().map(|s| (Shard::new(s), 7)).collect(),
        },
    );
    let began = drain(&mut m);
    assert_eq!(
        began.first(),
        Some(&ShardAction::BeginTerm {
            shard: Shard::new(owned.start),
            term: TermId::new(1),
            epoch: Some(7)
        }),
        "every term fenced by its row's epoch"
    );
    m
}

/// The statement in flight on `m` fails with `cause` at `at`: the actions that follow.
fn failed(m: &mut Machine, at: Instant, cause: &'static str) -> Vec<A> {
    m.handle_event(
        at,
        ShardEvent::StatementFailed {
            conn: C1,
            cause,
            session_ended: false,
        },
    );
    drain(m)
}

/// The log of a failed lease statement, the member going on.
fn failure_logged(cause: &'static str) -> A {
    ShardAction::Log(ShardLog {
        kind: ShardLogKind::LeaseStatementFailed,
        shards: 0,
        reason: None,
        cause: Some(Cause::Error(cause)),
    })
}

fn renewed(m: &mut Machine, at: Instant, members: &[MemberId]) -> Vec<A> {
    m.handle_event(
        at,
        ShardEvent::Renewed {
            conn: C1,
            renewed: true,
            members: members.to_vec(),
        },
    );
    drain(m)
}

#[test]
fn a_settled_member_renews_every_interval_and_surveys_only_when_the_members_change() {
    let t0 = Instant::now();
    let mut m = lease_owning(4, 0..2, t0);
    for n in 1..=3 {
        m.handle_timeout(t0 + n * I);
        assert_eq!(
            drain(&mut m),
            vec![ShardAction::RenewMember {
                conn: C1,
                ttl_ms: 3000
            }],
            "check {n}: the renewal alone"
        );
        let unchanged = renewed(&mut m, t0 + n * I, &[ME, OTHER]);
        // The first renewal found the members the registration saw; none surveys again.
        if n == 1 {
            assert_eq!(
                unchanged,
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
            assert_eq!(drain(&mut m), vec![], "settled: at its cap");
        } else {
            assert_eq!(unchanged, vec![], "settled, members unchanged: no survey");
        }
    }
    assert_eq!(
        m.last_verified(),
        Some(t0 + 3 * I),
        "each renewal proves the member"
    );
    // A third member appears: the next renewal surveys.
    m.handle_timeout(t0 + 4 * I);
    drain(&mut m);
    let third = MemberId::new(300);
    assert_eq!(
        renewed(&mut m, t0 + 4 * I, &[ME, OTHER, third]),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
}

#[test]
fn an_unsettled_member_surveys_after_every_renewal_until_it_reaches_its_cap() {
    let t0 = Instant::now();
    // OTHER holds 3 of 4: this member's cap is 2, it holds 1.
    let mut m = lease_owning(4, 0..1, t0);
    m.handle_timeout(t0 + I);
    drain(&mut m);
    assert_eq!(
        renewed(&mut m, t0 + I, &[ME, OTHER]),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(4, &[(ME, true, vec![0]), (OTHER, true, vec![1, 2, 3])]),
        },
    );
    assert_eq!(drain(&mut m), vec![], "nothing free yet: OTHER gives first");
    m.handle_timeout(t0 + 2 * I);
    drain(&mut m);
    assert_eq!(
        renewed(&mut m, t0 + 2 * I, &[ME, OTHER]),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }],
        "below its cap: it surveys again"
    );
    m.handle_event(
        t0 + 2 * I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(4, &[(ME, true, vec![0]), (OTHER, true, vec![2, 3])]),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::TakeLeases {
            conn: C1,
            shards: vec![Shard::new(1)],
            lock_timeout_ms: 500
        }]
    );
}

#[test]
fn a_renewal_that_renewed_nothing_loses_every_shard_and_a_new_member_registers() {
    let t0 = Instant::now();
    let mut m = lease_owning(4, 0..2, t0);
    m.handle_timeout(t0 + I);
    drain(&mut m);
    m.handle_event(
        t0 + I,
        ShardEvent::Renewed {
            conn: C1,
            renewed: false,
            members: vec![OTHER],
        },
    );
    let lost = TermEndCause::Lost(LossReason::LeaseExpired);
    let actions = drain(&mut m);
    assert_eq!(
        actions[..2],
        [
            ShardAction::EndTerm {
                shard: Shard::new(0),
                term: TermId::new(1),
                cause: lost
            },
            ShardAction::EndTerm {
                shard: Shard::new(1),
                term: TermId::new(2),
                cause: lost
            },
        ]
    );
    assert!(m.owned().is_empty() && m.member().is_none());
    m.handle_timeout(t0 + 2 * I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::RegisterMember {
            conn: ConnId::new(2),
            ttl_ms: 3000,
            floor: FloorStep::Off
        }]
    );
}

#[test]
fn unanswered_renewals_cost_nothing_until_the_trust_of_the_last_success_runs_out() {
    let t0 = Instant::now();
    let mut m = lease_owning(4, 0..2, t0);
    // Registered at t0: trusted until t0 + 2.7 I. Renewals at 1 I and 2 I go unanswered.
    assert_eq!(m.poll_timeout(), Some(t0 + I));
    m.handle_timeout(t0 + I);
    drain(&mut m);
    m.handle_timeout(t0 + 2 * I);
    let at_two = drain(&mut m);
    assert!(
        at_two.contains(&ShardAction::Log(ShardLog {
            kind: ShardLogKind::LeaseStatementFailed,
            shards: 0,
            reason: None,
            cause: Some(Cause::TimedOut(I)),
        })),
        "{at_two:?}"
    );
    // The next renewal goes under a new id: the unanswered one's answer is stale when it
    // comes, so a late answer cannot pass for the newer renewal's (and extend the trust from
    // its later sending, past the member row's expiry: the model check's finding).
    let Some(renewal) = at_two.iter().find_map(|action| match action {
        ShardAction::RenewMember { conn, ttl_ms: 3000 } => Some(*conn),
        _ => None,
    }) else {
        panic!("{at_two:?}");
    };
    assert_ne!(renewal, C1);
    let late = ShardEvent::Renewed {
        conn: C1,
        renewed: true,
        members: vec![],
    };
    assert_eq!(
        m.handle_event(t0 + 2 * I, late),
        Handled::Ignored(Ignored::StaleConnection)
    );
    assert_eq!(m.owned().len(), 2, "still trusted");
    assert_eq!(m.poll_timeout(), Some(t0 + TRUST));
    assert_eq!(m.timeout_reason(), Some(ShardTimer::TrustDeadline));
    m.handle_timeout(t0 + TRUST);
    let lost = drain(&mut m);
    assert!(lost.contains(&ShardAction::EndTerm {
        shard: Shard::new(0),
        term: TermId::new(1),
        cause: TermEndCause::Lost(LossReason::LeaseExpired)
    }));
    assert!(m.owned().is_empty());
}

#[test]
fn a_renewal_extends_the_trust_from_its_sending() {
    let t0 = Instant::now();
    let mut m = lease_owning(4, 0..2, t0);
    m.handle_timeout(t0 + I);
    drain(&mut m);
    // Sent at 1 I, answered late, near the end of its interval: the trust counts from the
    // sending, to 1 I + 2.7 I.
    renewed(&mut m, t0 + I + Duration::from_millis(900), &[ME, OTHER]);
    // The next two renewals go unanswered.
    m.handle_timeout(t0 + 2 * I);
    drain(&mut m);
    m.handle_timeout(t0 + 3 * I);
    drain(&mut m);
    assert_eq!(
        m.owned().len(),
        2,
        "past the first trust's end, still trusted"
    );
    assert_eq!(m.poll_timeout(), Some(t0 + I + TRUST));
    assert_eq!(m.timeout_reason(), Some(ShardTimer::TrustDeadline));
    m.handle_timeout(t0 + I + TRUST);
    assert!(m.owned().is_empty());
}

#[test]
fn a_failed_take_costs_nothing_and_an_unanswered_one_loses_every_shard() {
    let t0 = Instant::now();
    let mut m = member(4, t0);
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(4, &[(ME, true, vec![]), (OTHER, true, vec![2, 3])]),
        },
    );
    drain(&mut m);
    assert_eq!(
        failed(&mut m, t0, "55P03: lock timeout"),
        vec![failure_logged("55P03: lock timeout")]
    );
    assert_eq!(m.member(), Some(ME), "still a member");
    // The next renewal surveys again (not settled), and the take is planned once more.
    m.handle_timeout(t0 + I);
    drain(&mut m);
    assert_eq!(
        renewed(&mut m, t0 + I, &[ME, OTHER]),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    m.handle_event(
        t0 + I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(4, &[(ME, true, vec![]), (OTHER, true, vec![2, 3])]),
        },
    );
    drain(&mut m);
    // This one never answers: it may still commit, so the member starts over.
    m.handle_timeout(t0 + 2 * I);
    let actions = drain(&mut m);
    assert!(
        actions.contains(&ShardAction::CloseSession { conn: C1 }),
        "{actions:?}"
    );
    assert_eq!(m.member(), None);
}

#[test]
fn a_take_by_an_expired_member_loses_the_member() {
    let t0 = Instant::now();
    let mut m = member(4, t0);
    m.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: survey(4, &[(ME, true, vec![]), (OTHER, true, vec![2, 3])]),
        },
    );
    drain(&mut m);
    m.handle_event(
        t0,
        ShardEvent::TookLeases {
            conn: C1,
            live: false,
            taken: vec![],
        },
    );
    assert!(m.owned().is_empty());
    assert_eq!(m.member(), None, "a new member at the next check");
}

#[test]
fn a_lease_stop_ends_every_term_awaits_the_work_then_leaves() {
    let t0 = Instant::now();
    let mut m = lease_owning(4, 0..2, t0);
    m.handle_event(t0, Control::Cancelled.into());
    drain(&mut m);
    for term in [1, 2] {
        m.handle_event(
            t0,
            ShardEvent::WorkDrained {
                term: TermId::new(term),
            },
        );
    }
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
    m.handle_event(t0, ShardEvent::UnlockedAll { conn: C1 });
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::CloseSession { conn: C1 }, ShardAction::Finish]
    );
}

#[test]
fn a_failed_release_of_a_handover_is_retried_at_the_next_check_not_at_once() {
    let t0 = Instant::now();
    let mut m = lease_owning(8, 4..8, t0);
    drain(&mut m);
    let joiner = MemberId::new(300);
    let after_join = survey(
        8,
        &[
            (ME, true, vec![4, 5, 6, 7]),
            (OTHER, true, vec![0, 1, 2, 3]),
            (joiner, true, vec![]),
        ],
    );
    // Renewals show the joiner; surveys until the delay passed and one shard is handed over.
    let mut at = t0;
    let mut handed = None;
    for _ in 0..4 {
        at += I;
        m.handle_timeout(at);
        drain(&mut m);
        renewed(&mut m, at, &[ME, OTHER, joiner]);
        m.handle_event(
            at,
            ShardEvent::Surveyed {
                conn: C1,
                survey: after_join.clone(),
            },
        );
        let actions = drain(&mut m);
        handed = actions.iter().find_map(|a| match a {
            ShardAction::AwaitWork { term } => Some(*term),
            _ => None,
        });
        if handed.is_some() {
            break;
        }
    }
    let term = handed.expect("a handover within the delay");
    let given = m.handing_over();
    m.handle_event(at, ShardEvent::WorkDrained { term });
    let release = ShardAction::Unlock {
        conn: C1,
        shards: given.clone(),
    };
    assert_eq!(drain(&mut m), vec![release.clone()]);
    assert_eq!(
        failed(&mut m, at, "no connection"),
        vec![failure_logged("no connection")],
        "no release again at once"
    );
    assert_eq!(m.handing_over(), given, "still to be released");
    m.handle_timeout(at + I);
    assert_eq!(drain(&mut m), vec![release], "at the next check");
}

#[test]
fn the_trust_deadline_is_the_last_renewals_sending_plus_the_window_while_shards_are_owned() {
    let t0 = Instant::now();
    let m = member(4, t0);
    assert_eq!(m.trust_deadline(), None, "no shard owned");
    let mut m = lease_owning(4, 0..2, t0);
    assert_eq!(m.trust_deadline(), Some(t0 + TRUST), "the registration's");
    m.handle_timeout(t0 + I);
    drain(&mut m);
    renewed(&mut m, t0 + I + Duration::from_millis(300), &[ME, OTHER]);
    assert_eq!(
        m.trust_deadline(),
        Some(t0 + I + TRUST),
        "the renewal's sending"
    );
    let advisory = owning(4, 0..2, t0);
    assert_eq!(
        advisory.trust_deadline(),
        None,
        "advisory locks need no trust window"
    );
}
