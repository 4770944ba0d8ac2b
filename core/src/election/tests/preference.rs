//! The preferred leader (`Options::preference`): the survey before each attempt and after each
//! check that proved the hold, deferral, the yield after the window, the minimum tenure and
//! the one yield per window; each asserting the exact actions.

use super::*;
use crate::lease::Lease;
use crate::rank::{Candidate, FloorStep, Rank, Version};

/// W: the default window, two intervals.
const WMS: u64 = 2 * IMS;

fn rank(version: &str) -> Rank {
    Rank::of_version(Version::parse(version).unwrap())
}

fn candidate(version: &str, live_ms: u64) -> Candidate {
    Candidate {
        rank: rank(version),
        live_for: Duration::from_millis(live_ms),
    }
}

fn ranked(version: &str) -> Options {
    spec_options().preference(rank(version))
}

fn surveyed(conn: ConnId, candidates: Vec<Candidate>) -> E {
    E::CandidatesSurveyed {
        conn,
        candidates,
        floor: None,
    }
}

/// A better candidate that has been live for an hour without taking over (the case the defer
/// limit exists for): the limit counts from the deferral's start.
fn stuck_candidate() -> Candidate {
    candidate("1.5.0", 3_600_000)
}

fn outranked(by: Candidate, mine: &str) -> Option<Cause<&'static str>> {
    Some(Cause::Outranked {
        by,
        mine: rank(mine),
    })
}

/// A ranked standby whose first check's connection came: its survey is in flight on it.
fn surveying_standby(version: &str) -> Fixture {
    let mut f = Fixture::started_with(ranked(version));
    f.event(3, E::ConnectionAcquired { conn: C1 });
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C1,
            publish: Some(candidate(version, 0)),
            floor: FloorStep::Off,
        }]
    );
    assert_eq!(f.election.timeout_reason(), Some(Timer::ProbeDeadline));
    f
}

/// Leading at `version` on conn 1 since t0 + 10 ms (its survey before the grant found no
/// one); actions drained.
fn ranked_leader(version: &str) -> Fixture {
    let mut f = surveying_standby(version);
    f.event(4, surveyed(C1, vec![]));
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    f.event(
        10,
        E::LockGranted {
            conn: C1,
            backend_pid: PID,
        },
    );
    f.drain();
    assert!(f.election.is_leader());
    f
}

/// The leader's check at `ms` proves the lock: its survey follows on the lock session.
fn check_proves(f: &mut Fixture, ms: u64) {
    f.timeout(ms);
    assert_eq!(
        f.drain(),
        vec![A::Ping {
            conn: C1,
            backend_pid: PID
        }]
    );
    f.event(
        ms + 1,
        E::PingAnswered {
            conn: C1,
            found: LockCheck::holding(PID),
        },
    );
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C1,
            publish: None,
            floor: FloorStep::Off,
        }]
    );
}

#[test]
fn an_unranked_election_never_surveys() {
    let mut f = Fixture::started();
    f.event(3, E::ConnectionAcquired { conn: C1 });
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
}

#[test]
fn a_standby_with_no_better_candidate_tries_the_lock_on_the_surveyed_connection() {
    let mut f = surveying_standby("1.4.0");
    // Equal and worse ranks are no reason to defer.
    f.event(
        4,
        surveyed(C1, vec![candidate("1.4", 9_000), candidate("1.3.9", 1)]),
    );
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    assert_eq!(f.election.deferring_to(f.at(4)), None);
}

#[test]
fn a_standby_defers_to_a_better_candidate_saying_so_once_until_the_defer_limit() {
    let mut f = surveying_standby("1.4.0");
    let better = stuck_candidate();
    f.event(4, surveyed(C1, vec![better, candidate("1.4.0", 1)]));
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C1 },
            log(LogKind::Deferring, None, outranked(better, "1.4.0")),
        ]
    );
    assert_eq!(f.election.deferring_to(f.at(4)), Some(rank("1.5.0")));
    assert!(!f.election.is_leader());
    // The next checks defer again, silently, while the same candidate is live.
    let limit = f.election.options().defer_limit();
    assert_eq!(limit, Duration::from_millis(WMS + 2 * IMS));
    let mut conn = 1;
    let mut at = IMS;
    while at < 4 + WMS + 2 * IMS {
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(at);
        assert_eq!(f.drain(), vec![A::AcquireConnection { conn: c }]);
        f.event(at + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        f.event(at + 2, surveyed(c, vec![better]));
        assert_eq!(f.drain(), vec![A::ReturnToPool { conn: c }], "at {at}");
        at += IMS;
    }
    // Past the limit it attempts again, and says why once.
    let c = ConnId::new(conn + 1);
    f.timeout(at);
    f.drain();
    f.event(at + 1, E::ConnectionAcquired { conn: c });
    f.drain();
    f.event(at + 4, surveyed(c, vec![better]));
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::DeferLimitReached, None, outranked(better, "1.4.0")),
            A::TryLock { conn: c },
        ]
    );
    assert_eq!(f.election.deferring_to(f.at(at + 4)), None);
    assert_eq!(LogKind::DeferLimitReached.level(), Level::Warn);
    assert_eq!(LogKind::Deferring.level(), Level::Info);
}

#[test]
fn a_candidate_that_restarted_gets_the_whole_defer_limit_again() {
    // W + 2 I = 20 s; the deferral begins at 4 ms, to a candidate live for 1 s.
    let limit = WMS + 2 * IMS;
    let mut f = surveying_standby("1.4.0");
    f.event(4, surveyed(C1, vec![candidate("1.5.0", 1_000)]));
    f.drain();
    // At 3 I its survey finds the same rank live for 2 ms only: the candidate restarted at
    // 3 I - 2 ms, and the limit now counts from there.
    let restart = 3 * IMS - 2;
    let mut conn = 1;
    let mut at = IMS;
    while at <= restart + limit {
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(at);
        f.drain();
        f.event(at + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        let live = if at < 3 * IMS {
            1_000 + at - 4
        } else {
            at + 2 - restart
        };
        f.event(at + 2, surveyed(c, vec![candidate("1.5.0", live)]));
        let actions = f.drain();
        let deferred = actions == vec![A::ReturnToPool { conn: c }];
        // Without the restart the limit would pass at 4 ms + 20 s.
        assert_eq!(deferred, at + 2 < restart + limit, "at {at}: {actions:?}");
        let until = f.election.deferring_to(f.at(at + 2));
        assert_eq!(until.is_some(), deferred, "at {at}");
        at += IMS;
    }
}

#[test]
fn a_better_candidate_begins_a_new_deferral() {
    let mut f = surveying_standby("1.0.0");
    f.event(4, surveyed(C1, vec![candidate("1.1.0", 1)]));
    f.drain();
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.drain();
    let newest = candidate("2.0.0", 1);
    f.event(IMS + 2, surveyed(C2, vec![candidate("1.1.0", IMS), newest]));
    assert_eq!(
        f.drain(),
        vec![
            A::ReturnToPool { conn: C2 },
            log(LogKind::Deferring, None, outranked(newest, "1.0.0")),
        ]
    );
}

#[test]
fn the_leader_surveys_after_each_proof_and_with_none_better_awaits_its_next_check() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, IMS);
    f.event(IMS + 2, surveyed(C1, vec![candidate("1.0.0", 60_000)]));
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
}

#[test]
fn a_resign_during_a_yields_release_holds_the_standby_off_after_it() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, 3 * IMS);
    f.event(3 * IMS + 2, surveyed(C1, vec![candidate("1.1.0", WMS)]));
    f.drain();
    let hold_off = Duration::from_secs(12);
    assert_eq!(
        f.event(3 * IMS + 3, Control::Resign { hold_off }),
        Handled::Applied,
        "the operator's hold-off is not lost to the yield in progress"
    );
    assert_eq!(f.drain(), vec![]);
    f.event(
        3 * IMS + 4,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    assert_eq!(
        f.election.poll_timeout(),
        Some(f.at(3 * IMS + 3) + hold_off)
    );
    assert_eq!(
        f.election.held_off_until(f.at(3 * IMS + 4)),
        Some(f.at(3 * IMS + 3) + hold_off)
    );
}

#[test]
fn the_leader_yields_to_a_better_candidate_live_for_the_window_and_stays_a_standby() {
    let mut f = ranked_leader("1.0.0");
    // Led since 10 ms: the tenure of one window is over at 10 + W.
    check_proves(&mut f, 3 * IMS);
    let better = candidate("1.1.0", WMS);
    f.event(3 * IMS + 2, surveyed(C1, vec![better]));
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::Yielded, Some(T1), outranked(better, "1.0.0")),
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Yielded
            },
            A::Unlock { conn: C1 },
        ]
    );
    assert!(!f.election.is_leader());
    f.event(
        3 * IMS + 3,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(LogKind::YieldReleased, Some(T1), None),
        ]
    );
    assert_eq!(f.election.phase(), Phase::StandbyWaiting);
    // Its next check defers to that candidate.
    f.timeout(4 * IMS);
    f.drain();
    f.event(4 * IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.drain();
    f.event(4 * IMS + 2, surveyed(C2, vec![better]));
    assert_eq!(f.drain()[0], A::ReturnToPool { conn: C2 });
    assert_eq!(TermEndCause::Yielded.label(), "yielded");
    assert!(!TermEndCause::Yielded.is_loss());
}

#[test]
fn a_candidate_not_yet_live_for_the_window_brings_the_next_check_to_its_end() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, 3 * IMS);
    // Live for 3 s of the 10 s window: 7 s to go, after the grid's next check.
    f.event(3 * IMS + 2, surveyed(C1, vec![candidate("1.1.0", 3_000)]));
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(4 * IMS)));
    // Live for 8 s: 2 s to go, before the grid's next check.
    check_proves(&mut f, 4 * IMS);
    f.event(4 * IMS + 2, surveyed(C1, vec![candidate("1.1.0", 8_000)]));
    assert_eq!(f.drain(), vec![]);
    assert_eq!(f.election.timeout_reason(), Some(Timer::NextCheck));
    assert_eq!(f.election.poll_timeout(), Some(f.at(4 * IMS + 2 + 2_000)));
    // At that check the candidate has been live for the window: the leader yields.
    check_proves(&mut f, 4 * IMS + 2 + 2_000);
    f.event(4 * IMS + 2_005, surveyed(C1, vec![candidate("1.1.0", WMS)]));
    assert!(f.drain().contains(&A::EndTerm {
        term: T1,
        cause: TermEndCause::Yielded
    }));
}

#[test]
fn a_candidate_that_vanishes_during_the_window_cancels_the_yield() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, 3 * IMS);
    f.event(3 * IMS + 2, surveyed(C1, vec![candidate("1.1.0", 8_000)]));
    f.drain();
    let early = 3 * IMS + 2 + 2_000;
    assert_eq!(f.election.poll_timeout(), Some(f.at(early)));
    check_proves(&mut f, early);
    f.event(early + 2, surveyed(C1, vec![]));
    assert_eq!(f.drain(), vec![]);
    assert!(f.election.is_leader());
    assert_eq!(f.election.poll_timeout(), Some(f.at(4 * IMS)));
}

#[test]
fn a_new_leader_leads_for_the_window_before_it_yields() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, IMS);
    // A candidate long live, but the leader has led only 4.99 s of its 10 s tenure.
    f.event(IMS + 2, surveyed(C1, vec![candidate("2.0.0", 60_000)]));
    assert_eq!(f.drain(), vec![]);
    assert!(f.election.is_leader());
    assert_eq!(f.election.poll_timeout(), Some(f.at(2 * IMS)));
    check_proves(&mut f, 2 * IMS);
    f.event(2 * IMS + 2, surveyed(C1, vec![candidate("2.0.0", 60_000)]));
    assert_eq!(f.drain(), vec![]);
    // The tenure ends at 10 + W: the next check comes then.
    assert_eq!(f.election.poll_timeout(), Some(f.at(10 + WMS)));
    check_proves(&mut f, 10 + WMS);
    f.event(12 + WMS, surveyed(C1, vec![candidate("2.0.0", 60_000)]));
    assert!(f.drain().contains(&A::EndTerm {
        term: T1,
        cause: TermEndCause::Yielded
    }));
}

#[test]
fn a_replica_that_yielded_and_leads_again_leads_a_window_before_its_next_yield() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, 3 * IMS);
    f.event(3 * IMS + 2, surveyed(C1, vec![candidate("1.1.0", WMS)]));
    f.drain();
    f.event(
        3 * IMS + 3,
        E::UnlockDone {
            conn: C1,
            released: true,
        },
    );
    f.drain();
    // The candidate never took the lock and is gone: this replica leads again at once.
    f.timeout(4 * IMS);
    f.drain();
    f.event(4 * IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.drain();
    f.event(4 * IMS + 2, surveyed(C2, vec![]));
    assert_eq!(f.drain(), vec![A::TryLock { conn: C2 }]);
    f.event(
        4 * IMS + 3,
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
    );
    f.drain();
    let survey_at = |f: &mut Fixture, ms: u64| {
        f.timeout(ms);
        f.drain();
        f.event(
            ms + 1,
            E::PingAnswered {
                conn: C2,
                found: LockCheck::holding(PID),
            },
        );
        f.drain();
        f.event(ms + 2, surveyed(C2, vec![candidate("1.1.0", 60_000)]));
        f.drain()
    };
    // A better candidate live for long: no yield before a window of the new term.
    assert_eq!(survey_at(&mut f, 5 * IMS), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(6 * IMS)));
    assert_eq!(survey_at(&mut f, 6 * IMS), vec![]);
    assert_eq!(f.election.poll_timeout(), Some(f.at(4 * IMS + 3 + WMS)));
    let actions = survey_at(&mut f, 4 * IMS + 3 + WMS);
    assert!(actions.contains(&A::EndTerm {
        term: T2,
        cause: TermEndCause::Yielded
    }));
}

#[test]
fn an_advisory_leaders_survey_answered_with_an_error_keeps_the_term_and_one_unanswered_ends_it() {
    let mut f = ranked_leader("1.0.0");
    check_proves(&mut f, IMS);
    f.event(
        IMS + 2,
        E::SurveyFailed {
            conn: C1,
            cause: "relation plexsphere_leader_floor does not exist",
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::SurveyFailed,
            Some(T1),
            Some(Cause::Error(
                "relation plexsphere_leader_floor does not exist"
            ))
        )]
    );
    assert!(f.election.is_leader());
    // Unanswered on the lock session within the check: its state is unknown, the term ends.
    check_proves(&mut f, 2 * IMS);
    f.timeout(3 * IMS);
    let actions = f.drain();
    assert!(
        actions.contains(&A::EndTerm {
            term: T1,
            cause: TermEndCause::Lost(LossReason::CheckTimedOut)
        }),
        "{actions:?}"
    );
}

#[test]
fn a_standbys_survey_that_fails_ends_its_check_and_closes_the_connection() {
    let mut f = surveying_standby("1.0.0");
    f.event(
        4,
        E::SurveyFailed {
            conn: C1,
            cause: "connection reset",
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::CloseConnection { conn: C1 },
            log(
                LogKind::SurveyFailed,
                None,
                Some(Cause::Error("connection reset"))
            ),
        ]
    );
    // Unanswered within the interval: the same.
    let mut f = surveying_standby("1.0.0");
    f.timeout(3 + IMS);
    assert_eq!(f.drain()[0], A::CloseConnection { conn: C1 });
}

#[test]
fn a_probing_standby_surveys_after_its_probe_passed_on_the_same_connection() {
    let mut f = Fixture::started_with(ranked("1.0.0").probe_fitness(true));
    f.event(3, E::ConnectionAcquired { conn: C1 });
    assert_eq!(f.drain(), vec![A::ProbeFitness { conn: C1 }]);
    f.event(4, E::Fit { conn: C1 });
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C1,
            publish: Some(candidate("1.0.0", 0)),
            floor: FloorStep::Off,
        }]
    );
}

fn lease_ranked(version: &str) -> Options {
    let options = ranked(version);
    options.lease(Lease::default_for(options.interval()))
}

#[test]
fn a_lease_election_surveys_as_operations_of_their_own() {
    let mut f = Fixture::with(lease_ranked("1.0.0"));
    f.election.start(f.t0).unwrap();
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C1,
            publish: Some(candidate("1.0.0", 0)),
            floor: FloorStep::Off,
        }]
    );
    // A deferring lease standby has nothing to give back.
    let better = candidate("2.0.0", 1);
    f.event(1, surveyed(C1, vec![better]));
    assert_eq!(
        f.drain(),
        vec![log(LogKind::Deferring, None, outranked(better, "1.0.0"))]
    );
    // None better: it claims, as an operation of its own.
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, surveyed(C2, vec![]));
    assert!(
        matches!(f.drain().as_slice(), [A::ClaimLease { conn, .. }] if *conn == ConnId::new(3))
    );
    f.event(
        IMS + 2,
        E::LeaseClaimed {
            conn: ConnId::new(3),
            epoch: 1,
        },
    );
    f.drain();
    f.timeout(2 * IMS);
    f.drain();
    f.event(
        2 * IMS + 1,
        E::LeaseRenewed {
            conn: ConnId::new(4),
        },
    );
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: ConnId::new(5),
            publish: None,
            floor: FloorStep::Off,
        }]
    );
    // A lease leader's survey that fails keeps the term.
    f.event(
        2 * IMS + 2,
        E::SurveyFailed {
            conn: ConnId::new(5),
            cause: "pool timed out",
        },
    );
    assert_eq!(
        f.drain(),
        vec![log(
            LogKind::SurveyFailed,
            Some(T1),
            Some(Cause::Error("pool timed out"))
        )]
    );
    assert!(f.election.is_leader());
}

#[test]
fn a_standby_publishes_how_long_its_candidacy_has_gone_on_without_a_break() {
    let mut f = surveying_standby("1.0.0");
    f.event(4, surveyed(C1, vec![candidate("2.0.0", 1)]));
    f.drain();
    // The next check, an interval on: the same candidacy, older by that interval.
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 3, E::ConnectionAcquired { conn: C2 });
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C2,
            publish: Some(candidate("1.0.0", IMS)),
            floor: FloorStep::Off,
        }]
    );
    f.event(IMS + 4, surveyed(C2, vec![candidate("2.0.0", 1)]));
    f.drain();
    // Ineligible for three intervals: its candidacy broke, and begins again.
    f.event(IMS + 5, Control::SetEligible { eligible: false });
    f.drain();
    f.event(4 * IMS + 5, Control::SetEligible { eligible: true });
    f.drain();
    f.timeout(5 * IMS);
    let acquire = f.drain();
    let Some(A::AcquireConnection { conn }) = acquire.first().cloned() else {
        panic!("{acquire:?}");
    };
    f.event(5 * IMS + 1, E::ConnectionAcquired { conn });
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn,
            publish: Some(candidate("1.0.0", 0)),
            floor: FloorStep::Off,
        }]
    );
}

fn floored(version: &str) -> Options {
    ranked(version).version_floor(true)
}

fn surveyed_with_floor(conn: ConnId, floor: &str) -> E {
    E::CandidatesSurveyed {
        conn,
        candidates: vec![],
        floor: Some(Version::parse(floor).unwrap()),
    }
}

#[test]
fn with_the_floor_standbys_read_it_and_leaders_raise_it_in_their_surveys() {
    let mut f = Fixture::started_with(floored("1.4.0"));
    f.event(3, E::ConnectionAcquired { conn: C1 });
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C1,
            publish: Some(candidate("1.4.0", 0)),
            floor: FloorStep::Read,
        }]
    );
    f.event(4, surveyed_with_floor(C1, "1.4.0"));
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    f.event(
        10,
        E::LockGranted {
            conn: C1,
            backend_pid: PID,
        },
    );
    f.drain();
    f.timeout(IMS);
    f.drain();
    f.event(
        IMS + 1,
        E::PingAnswered {
            conn: C1,
            found: LockCheck::holding(PID),
        },
    );
    assert_eq!(
        f.drain(),
        vec![A::SurveyCandidates {
            conn: C1,
            publish: None,
            floor: FloorStep::Raise(Version::parse("1.4.0").unwrap()),
        }]
    );
    // Allowed below the floor (a deliberate rollback), the leader sets it instead.
    let options = floored("1.4.0").below_floor(true);
    assert_eq!(
        options.floor_step(true),
        FloorStep::Set(Version::parse("1.4.0").unwrap())
    );
    assert_eq!(ranked("1.4.0").floor_step(true), FloorStep::Off);
    assert_eq!(
        spec_options().version_floor(true).floor_step(false),
        FloorStep::Off
    );
}

#[test]
fn a_standby_older_than_the_floor_makes_no_attempt_and_says_so_once_each_way() {
    let mut f = Fixture::started_with(floored("1.4.0"));
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(4, surveyed_with_floor(C1, "1.10.0"));
    assert_eq!(
        f.drain(),
        vec![
            log(
                LogKind::BelowFloor,
                None,
                Some(Cause::BelowFloor {
                    floor: Version::parse("1.10.0").unwrap(),
                    mine: Version::parse("1.4.0").unwrap(),
                })
            ),
            A::ReturnToPool { conn: C1 },
        ]
    );
    assert!(f.election.is_below_floor());
    assert_eq!(LogKind::BelowFloor.level(), Level::Warn);
    // Still below: silently no attempt.
    f.timeout(IMS);
    f.drain();
    f.event(IMS + 1, E::ConnectionAcquired { conn: C2 });
    f.drain();
    f.event(IMS + 2, surveyed_with_floor(C2, "1.10.0"));
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: C2 }]);
    // The floor was lowered (another replica's deliberate rollback): it may lead again.
    let c3 = ConnId::new(3);
    f.timeout(2 * IMS);
    f.drain();
    f.event(2 * IMS + 1, E::ConnectionAcquired { conn: c3 });
    f.drain();
    f.event(2 * IMS + 2, surveyed_with_floor(c3, "1.4.0"));
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::AboveFloorAgain, None, None),
            A::TryLock { conn: c3 }
        ]
    );
    assert!(!f.election.is_below_floor());
}

#[test]
fn a_replica_allowed_below_the_floor_attempts_all_the_same() {
    let mut f = Fixture::started_with(floored("1.4.0").below_floor(true));
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(4, surveyed_with_floor(C1, "2.0.0"));
    assert_eq!(f.drain(), vec![A::TryLock { conn: C1 }]);
    assert!(!f.election.is_below_floor());
}

#[test]
fn a_leader_granted_below_a_floor_raised_meanwhile_yields_at_its_first_survey() {
    let mut f = Fixture::started_with(floored("1.4.0"));
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    f.event(4, surveyed_with_floor(C1, "1.4.0"));
    f.drain();
    f.event(
        10,
        E::LockGranted {
            conn: C1,
            backend_pid: PID,
        },
    );
    f.drain();
    f.timeout(IMS);
    f.drain();
    f.event(
        IMS + 1,
        E::PingAnswered {
            conn: C1,
            found: LockCheck::holding(PID),
        },
    );
    f.drain();
    f.event(IMS + 2, surveyed_with_floor(C1, "2.0.0"));
    let actions = f.drain();
    assert_eq!(
        actions[..2],
        [
            log(
                LogKind::BelowFloor,
                None,
                Some(Cause::BelowFloor {
                    floor: Version::parse("2.0.0").unwrap(),
                    mine: Version::parse("1.4.0").unwrap(),
                })
            ),
            A::EndTerm {
                term: T1,
                cause: TermEndCause::Yielded
            },
        ]
    );
    assert!(!f.election.is_leader());
}

#[test]
fn an_attempt_past_the_defer_limit_refused_by_a_leader_begins_the_deferral_anew() {
    let mut f = surveying_standby("1.4.0");
    let better = stuck_candidate();
    f.event(4, surveyed(C1, vec![better]));
    f.drain();
    // Checks every interval, deferring, until the limit (W + 2 I = 20 s) has passed.
    let mut conn = 1;
    let mut at = IMS;
    let attempt = loop {
        // Bounded, so that a broken deferral fails the test instead of hanging it.
        assert!(conn < 20, "no attempt within 20 checks");
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(at);
        f.drain();
        f.event(at + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        f.event(at + 2, surveyed(c, vec![better]));
        if f.drain().contains(&A::TryLock { conn: c }) {
            break c;
        }
        at += IMS;
    };
    // Another replica leads: refused. The deferral begins anew, so the next checks defer.
    f.event(at + 3, E::LockRefused { conn: attempt });
    f.drain();
    assert_eq!(f.election.deferring_to(f.at(at + 3)), Some(rank("1.5.0")));
    let c = ConnId::new(conn + 1);
    f.timeout(at + IMS);
    f.drain();
    f.event(at + IMS + 1, E::ConnectionAcquired { conn: c });
    f.drain();
    f.event(at + IMS + 2, surveyed(c, vec![better]));
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: c }]);
}

#[test]
fn in_queue_mode_an_attempt_past_the_defer_limit_only_tries_and_a_refusal_defers_anew() {
    let options = ranked("1.4.0").acquire(AcquireMode::Queue);
    let mut f = Fixture::started_with(options);
    f.event(3, E::ConnectionAcquired { conn: C1 });
    f.drain();
    let better = stuck_candidate();
    f.event(4, surveyed(C1, vec![better]));
    f.drain();
    let mut conn = 1;
    let mut at = IMS;
    let attempt = loop {
        // Bounded, so that a broken deferral fails the test instead of hanging it.
        assert!(conn < 20, "no attempt within 20 checks");
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(at);
        f.drain();
        f.event(at + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        f.event(at + 2, surveyed(c, vec![better]));
        let actions = f.drain();
        // Queued, it would win the release meant for the better candidate: it only tries.
        assert!(
            !actions.iter().any(|a| matches!(a, A::WaitForLock { .. })),
            "queued past the limit: {actions:?}"
        );
        if actions.contains(&A::TryLock { conn: c }) {
            break c;
        }
        at += IMS;
    };
    f.event(at + 3, E::LockRefused { conn: attempt });
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: attempt }]);
    assert_eq!(f.election.deferring_to(f.at(at + 3)), Some(rank("1.5.0")));
    // With no better candidate it queues again.
    let c = ConnId::new(conn + 1);
    f.timeout(at + IMS);
    f.drain();
    f.event(at + IMS + 1, E::ConnectionAcquired { conn: c });
    f.drain();
    f.event(at + IMS + 2, surveyed(c, vec![]));
    assert_eq!(
        f.drain(),
        vec![A::WaitForLock {
            conn: c,
            lock_timeout_ms: f.election.options().lock_timeout_millis()
        }]
    );
}

/// A standby deferring since 4 ms to a better candidate, through its checks at I, 2 I, 3 I;
/// at 4 I its connection came (conn 5) and the survey is in flight; the candidate.
fn deferring_until_the_fourth_check() -> (Fixture, Candidate) {
    let mut f = surveying_standby("1.4.0");
    let better = stuck_candidate();
    f.event(4, surveyed(C1, vec![better]));
    f.drain();
    for check in 1..=4 {
        let c = ConnId::new(check + 1);
        f.timeout(check * IMS);
        f.drain();
        f.event(check * IMS + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        if check < 4 {
            f.event(check * IMS + 2, surveyed(c, vec![better]));
            assert_eq!(f.drain(), vec![A::ReturnToPool { conn: c }]);
        }
    }
    (f, better)
}

#[test]
fn the_defer_limit_is_reached_exactly_at_its_end_and_said_once_however_often_a_leader_refuses() {
    // The limit: W + 2 I = 20 s after the deferral began at 4 ms.
    let limit = WMS + 2 * IMS;
    let c5 = ConnId::new(5);
    let (mut f, better) = deferring_until_the_fourth_check();
    assert_eq!(
        f.election.deferring_to(f.at(3 + limit)),
        Some(rank("1.5.0"))
    );
    assert_eq!(f.election.deferring_to(f.at(4 + limit)), None);
    // A millisecond before the limit: still deferring.
    f.event(3 + limit, surveyed(c5, vec![better]));
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: c5 }]);
    // At the limit exactly: the attempt, said once.
    let (mut f, better) = deferring_until_the_fourth_check();
    f.event(4 + limit, surveyed(c5, vec![better]));
    assert_eq!(
        f.drain(),
        vec![
            log(LogKind::DeferLimitReached, None, outranked(better, "1.4.0")),
            A::TryLock { conn: c5 }
        ]
    );
    // A leader refuses it: the deferral begins anew (the next checks defer), and when the
    // limit passes again the attempt is made without saying so again.
    f.event(5 + limit, E::LockRefused { conn: c5 });
    f.drain();
    let mut conn = 5;
    let mut at = 5 * IMS;
    let attempt = loop {
        // Bounded, so that a broken deferral fails the test instead of hanging it.
        assert!(conn < 20, "no attempt within 20 checks");
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(at);
        f.drain();
        f.event(at + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        f.event(at + 2, surveyed(c, vec![better]));
        let actions = f.drain();
        if actions != vec![A::ReturnToPool { conn: c }] {
            break actions;
        }
        at += IMS;
    };
    assert!(at >= 5 + 2 * limit, "deferred anew until {at}");
    assert_eq!(
        attempt,
        vec![A::TryLock {
            conn: ConnId::new(conn)
        }]
    );
}

#[test]
fn the_window_is_the_default_of_two_intervals_unless_set() {
    assert_eq!(
        spec_options().preempt_window_of(),
        Duration::from_millis(WMS)
    );
    let three = Duration::from_secs(3);
    assert_eq!(
        spec_options().preempt_window(three).preempt_window_of(),
        three
    );
    assert_eq!(
        spec_options()
            .preempt_window(Duration::ZERO)
            .preempt_window_of(),
        Duration::from_millis(WMS)
    );
}

/// A standby that began deferring at 4 ms to a candidate live for 1 ms (a new replica of a
/// rollout, whose candidacy grows with time), through its checks every interval until the one
/// whose survey reaches the defer limit (W + 2 I after 4 ms): that check's attempt, with the
/// candidate as the survey found it.
fn attempting_past_the_limit_after_a_young_candidate() -> (Fixture, ConnId, u64, Candidate) {
    let mut f = surveying_standby("1.4.0");
    f.event(4, surveyed(C1, vec![candidate("1.5.0", 1)]));
    f.drain();
    let limit = WMS + 2 * IMS;
    let mut conn = 1;
    let mut at = IMS;
    loop {
        // Bounded, so that a broken deferral fails the test instead of hanging it.
        assert!(conn < 20, "no attempt within 20 checks");
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(at);
        f.drain();
        f.event(at + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        let seen = candidate("1.5.0", at + 2 - 3);
        f.event(at + 2, surveyed(c, vec![seen]));
        let actions = f.drain();
        if at + 2 < 4 + limit {
            assert_eq!(actions, vec![A::ReturnToPool { conn: c }], "at {at}");
        } else {
            // Past the limit it attempts, and says nothing yet: a candidacy live for no
            // longer than the limit and three intervals may be a leftover of a replica that
            // took the lock meanwhile (it stops publishing, and stays visible a while).
            assert_eq!(actions, vec![A::TryLock { conn: c }], "at {at}");
            return (f, c, at + 2, seen);
        }
        at += IMS;
    }
}

#[test]
fn the_defer_limit_is_not_said_when_a_leader_refuses_the_attempt_the_candidate_may_lead() {
    let (mut f, attempt, at, _) = attempting_past_the_limit_after_a_young_candidate();
    // The lock is held: by the better candidate, which took over. Nothing is said, and the
    // deferral begins anew.
    f.event(at + 1, E::LockRefused { conn: attempt });
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: attempt }]);
    assert_eq!(f.election.deferring_to(f.at(at + 1)), Some(rank("1.5.0")));
    // Its leftover candidacy is gone at the next survey: the standby attempts, silently.
    let c = ConnId::new(attempt.get() + 1);
    f.timeout(at - 2 + IMS);
    f.drain();
    f.event(at - 1 + IMS, E::ConnectionAcquired { conn: c });
    f.drain();
    f.event(at + IMS, surveyed(c, vec![]));
    assert_eq!(f.drain(), vec![A::TryLock { conn: c }]);
    f.event(at + IMS + 1, E::LockRefused { conn: c });
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: c }]);
}

#[test]
fn the_defer_limit_is_said_when_the_attempt_past_it_is_granted() {
    let (mut f, attempt, at, seen) = attempting_past_the_limit_after_a_young_candidate();
    // The lock was free: the better candidate really did not take over. Said once, as the
    // term begins.
    f.event(
        at + 1,
        E::LockGranted {
            conn: attempt,
            backend_pid: PID,
        },
    );
    assert_eq!(
        f.drain(),
        vec![
            A::Hijack {
                conn: attempt,
                backend_pid: PID
            },
            log(LogKind::DeferLimitReached, None, outranked(seen, "1.4.0")),
            A::BeginTerm {
                term: T1,
                epoch: None
            },
            log(LogKind::LeadershipAcquired, Some(T1), None),
        ]
    );
    assert!(f.election.is_leader());
}

#[test]
fn the_defer_limit_is_said_at_the_attempt_when_the_candidacy_outlived_any_leftover() {
    // A candidacy live for longer than the limit and three intervals is still published:
    // its replica is a standby that could not take over, whatever the lock's state.
    let limit = WMS + 2 * IMS;
    let (mut f, better) = deferring_until_the_fourth_check();
    let outlived = candidate("1.5.0", limit + 3 * IMS + 1);
    f.event(4 + limit, surveyed(ConnId::new(5), vec![outlived]));
    assert_eq!(
        f.drain(),
        vec![
            log(
                LogKind::DeferLimitReached,
                None,
                outranked(outlived, "1.4.0")
            ),
            A::TryLock {
                conn: ConnId::new(5)
            },
        ]
    );
    assert_eq!(better.rank, outlived.rank);
    // A candidacy exactly that old is not yet proof: the attempt goes silently.
    let (mut f, _) = deferring_until_the_fourth_check();
    let borderline = candidate("1.5.0", limit + 3 * IMS);
    f.event(4 + limit, surveyed(ConnId::new(5), vec![borderline]));
    assert_eq!(
        f.drain(),
        vec![A::TryLock {
            conn: ConnId::new(5)
        }]
    );
}

#[test]
fn the_defer_limit_is_said_once_though_attempts_past_it_fail_and_go_on() {
    let limit = WMS + 2 * IMS;
    let (mut f, _) = deferring_until_the_fourth_check();
    let outlived = |extra: u64| candidate("1.5.0", limit + 3 * IMS + 1 + extra);
    let c5 = ConnId::new(5);
    f.event(4 + limit, surveyed(c5, vec![outlived(0)]));
    assert_eq!(
        f.drain(),
        vec![
            log(
                LogKind::DeferLimitReached,
                None,
                outranked(outlived(0), "1.4.0")
            ),
            A::TryLock { conn: c5 },
        ]
    );
    // The attempt's statement fails: no leader was found, and the next check attempts again,
    // without saying the limit a second time.
    f.event(
        5 + limit,
        E::LockQueryFailed {
            conn: c5,
            cause: "broken pipe",
        },
    );
    f.drain();
    let at = ((5 + limit) / IMS + 1) * IMS;
    let c6 = ConnId::new(6);
    f.timeout(at);
    f.drain();
    f.event(at + 1, E::ConnectionAcquired { conn: c6 });
    f.drain();
    f.event(at + 2, surveyed(c6, vec![outlived(at - 4 - limit)]));
    assert_eq!(f.drain(), vec![A::TryLock { conn: c6 }]);
}

#[test]
fn the_defer_limit_is_not_said_while_a_leader_refuses_however_long_the_candidate_stays_live() {
    // A rollout's second new replica: a better candidate than this old standby, but an equally
    // new leader holds the lock, so it never takes over and stays live.
    let (mut f, attempt, at, _) = attempting_past_the_limit_after_a_young_candidate();
    f.event(at + 1, E::LockRefused { conn: attempt });
    assert_eq!(f.drain(), vec![A::ReturnToPool { conn: attempt }]);
    let limit = WMS + 2 * IMS;
    let mut conn = attempt.get();
    let mut check = at - 2 + IMS;
    let mut attempts = 0;
    // Three more limits: the candidacy soon outlives any leftover, yet nothing is said.
    while check < at + 3 * limit {
        conn += 1;
        let c = ConnId::new(conn);
        f.timeout(check);
        f.drain();
        f.event(check + 1, E::ConnectionAcquired { conn: c });
        f.drain();
        f.event(
            check + 2,
            surveyed(c, vec![candidate("1.5.0", check + 2 - 3)]),
        );
        let actions = f.drain();
        assert!(
            actions == vec![A::ReturnToPool { conn: c }] || actions == vec![A::TryLock { conn: c }],
            "at {check}: {actions:?}"
        );
        if actions == vec![A::TryLock { conn: c }] {
            attempts += 1;
            f.event(check + 3, E::LockRefused { conn: c });
            assert_eq!(f.drain(), vec![A::ReturnToPool { conn: c }], "at {check}");
        }
        check += IMS;
    }
    assert!(attempts >= 2, "{attempts} attempts");
}
