//! Ranked shard spaces: the best-ranked members take free shards and the extra slots first, a
//! member below the version floor owns nothing (unless allowed), equal ranks change nothing,
//! and the machine says once that it fell below the floor.

use super::*;
use crate::rank::{FloorStep, Rank, Version};

const OLD: Version = Version::new(1, 9, 0);
const NEW: Version = Version::new(1, 10, 0);

fn at(version: Version) -> Standing {
    Standing {
        rank: Some(Rank::of_version(version)),
        below_floor_allowed: false,
    }
}

fn ranked(survey: Survey, standings: &[(MemberId, Standing)]) -> Survey {
    survey.with_standings(standings.iter().copied())
}

#[test]
fn free_shards_go_to_the_best_ranked_member_with_room_first() {
    // Each holds one of four shards and has room for one more: the better rank takes the
    // first free shard whatever the rendezvous scores say.
    let s = survey(4, &[(ME, true, vec![0]), (OTHER, true, vec![1])]);
    for (better, worse) in [(ME, OTHER), (OTHER, ME)] {
        let s = ranked(s.clone(), &[(better, at(NEW)), (worse, at(OLD))]);
        assert_eq!(plan(&s, better).take, vec![Shard::new(2)]);
        assert_eq!(plan(&s, worse).take, vec![Shard::new(3)]);
    }
    // An unranked member ranks below every ranked one.
    let s = ranked(s, &[(OTHER, at(OLD))]);
    assert_eq!(plan(&s, OTHER).take, vec![Shard::new(2)]);
}

#[test]
fn the_extra_slots_go_to_the_best_ranked_members_first() {
    let third = MemberId::new(300);
    let s = survey(
        5,
        &[
            (ME, true, vec![]),
            (OTHER, true, vec![]),
            (third, true, vec![]),
        ],
    );
    // Unranked, the hash gives the two extra slots to ME and the third member.
    let lucky = |s: &Survey| -> Vec<MemberId> {
        caps(s)
            .into_iter()
            .filter(|c| c.1 == 2)
            .map(|c| c.0)
            .collect()
    };
    assert_eq!(lucky(&s), vec![ME, third]);
    let s = ranked(s, &[(OTHER, at(NEW)), (ME, at(OLD)), (third, at(OLD))]);
    assert_eq!(
        lucky(&s),
        vec![ME, OTHER],
        "the new version first, then the hash"
    );
}

#[test]
fn a_member_below_the_floor_has_no_cap_and_gives_up_what_it_holds() {
    let rows = [(ME, true, vec![0, 1]), (OTHER, true, vec![2, 3])];
    let s = ranked(survey(4, &rows), &[(ME, at(OLD)), (OTHER, at(NEW))]).with_floor(Some(NEW));
    assert!(s.is_below_floor(ME) && !s.is_below_floor(OTHER));
    assert_eq!(caps(&s), vec![(ME, 0), (OTHER, 4)]);
    let mine = plan(&s, ME);
    assert_eq!((mine.cap, mine.give.len(), mine.take.len()), (0, 2, 0));
    // Allowed below it (a deliberate rollback), or unranked, it owns its share.
    let allowed = Standing {
        below_floor_allowed: true,
        ..at(OLD)
    };
    for standing in [allowed, Standing::default()] {
        let s = ranked(survey(4, &rows), &[(ME, standing), (OTHER, at(NEW))]).with_floor(Some(NEW));
        assert!(!s.is_below_floor(ME));
        assert_eq!(caps(&s), vec![(ME, 2), (OTHER, 2)]);
    }
    // Nobody above the floor: nobody owns anything, and nothing is planned.
    let s = ranked(survey(4, &rows), &[(ME, at(OLD)), (OTHER, at(OLD))]).with_floor(Some(NEW));
    assert_eq!(caps(&s), vec![(ME, 0), (OTHER, 0)]);
    assert!(plan(&s, OTHER).take.is_empty());
}

#[test]
fn equal_ranks_plan_exactly_as_without_ranks() {
    let members: Vec<MemberId> = (1..=7).map(|m| MemberId::new(m * 37)).collect();
    for count in [1, 5, 64, 1000] {
        let rows: Vec<(MemberId, bool, Vec<u32>)> = members
            .iter()
            .enumerate()
            .map(|(i, &m)| {
                let held = (0..count).filter(|s| s % 11 == i as u32).collect();
                (m, true, held)
            })
            .collect();
        let plain = survey(count, &rows);
        let equal: Vec<(MemberId, Standing)> = members.iter().map(|&m| (m, at(NEW))).collect();
        let same = ranked(plain.clone(), &equal).with_floor(Some(OLD));
        assert_eq!(caps(&plain), caps(&same), "K = {count}");
        for &m in &members {
            assert_eq!(plan(&plain, m), plan(&same, m), "K = {count}, {m:?}");
        }
    }
}

#[test]
fn the_join_raises_the_floor_or_sets_it_when_allowed_below_and_an_unranked_space_has_none() {
    let ranked = options(4).preference(Rank::of_version(NEW));
    assert_eq!(ranked.join_floor_step(), FloorStep::Off);
    assert!(!ranked.reads_floor());
    let floor = ranked.version_floor(true);
    assert_eq!(floor.join_floor_step(), FloorStep::Raise(NEW));
    assert!(floor.reads_floor());
    assert!(!floor.standing().below_floor_allowed);
    let rollback = floor.below_floor(true);
    assert_eq!(rollback.join_floor_step(), FloorStep::Set(NEW));
    assert!(rollback.standing().below_floor_allowed);
    // Allowed below a floor that is off: nothing to publish.
    assert!(!ranked.below_floor(true).standing().below_floor_allowed);
    let unranked = options(4).version_floor(true);
    assert_eq!(unranked.join_floor_step(), FloorStep::Off);
    assert!(!unranked.reads_floor());
    assert_eq!(unranked.standing(), Standing::default());
}

#[test]
fn a_survey_below_the_floor_says_so_once_and_the_replica_gives_every_shard_up() {
    let t0 = Instant::now();
    let options = options(4)
        .preference(Rank::of_version(OLD))
        .version_floor(true);
    let mut m = owning_with(options, 0..2, t0);
    let below = ranked(
        survey(4, &[(ME, true, vec![0, 1]), (OTHER, true, vec![2, 3])]),
        &[(ME, at(OLD)), (OTHER, at(NEW))],
    )
    .with_floor(Some(NEW));
    let mut said = ShardLog::new(ShardLogKind::BelowFloor, 0);
    said.cause = Some(Cause::BelowFloor {
        floor: NEW,
        mine: OLD,
    });
    let check = |m: &mut Machine, at: Instant| {
        m.handle_timeout(at);
        drain(m);
        m.handle_event(
            at,
            ShardEvent::Surveyed {
                conn: C1,
                survey: below.clone(),
            },
        );
        drain(m)
    };
    let first = check(&mut m, t0 + I);
    assert_eq!(first[0], ShardAction::Log(said));
    assert!(m.is_below_floor());
    // Both shards are handed over (the move limit is one per interval for 4 shards).
    let handed: usize = first
        .iter()
        .filter(|a| matches!(a, ShardAction::EndTerm { .. }))
        .count();
    assert_eq!(handed, 1);
    let second = check(&mut m, t0 + 2 * I);
    assert!(
        !second
            .iter()
            .any(|a| matches!(a, ShardAction::Log(l) if l.kind == ShardLogKind::BelowFloor)),
        "said once: {second:?}"
    );
    assert!(
        second.contains(&ShardAction::EndTerm {
            shard: Shard::new(1),
            term: TermId::new(2),
            cause: TermEndCause::HandedOver
        }) || second.contains(&ShardAction::EndTerm {
            shard: Shard::new(0),
            term: TermId::new(1),
            cause: TermEndCause::HandedOver
        })
    );
    assert!(m.owned().is_empty());
    // The floor lowered (a deliberate rollback elsewhere): said once at INFO.
    let handing: Vec<u32> = m.handing_over().iter().map(|s| s.get()).collect();
    m.handle_timeout(t0 + 3 * I);
    drain(&mut m);
    m.handle_event(
        t0 + 3 * I,
        ShardEvent::Surveyed {
            conn: C1,
            survey: ranked(
                survey(4, &[(ME, true, handing), (OTHER, true, vec![2, 3])]),
                &[(ME, at(OLD)), (OTHER, at(NEW))],
            )
            .with_floor(Some(OLD)),
        },
    );
    let actions = drain(&mut m);
    assert!(
        actions.contains(&log(ShardLogKind::AboveFloorAgain, 0)),
        "{actions:?}"
    );
    assert!(!m.is_below_floor());
}

#[test]
fn the_join_takes_its_floor_step_once_in_the_first_survey_or_the_lease_registration() {
    let t0 = Instant::now();
    let floor = options(4)
        .preference(Rank::of_version(NEW))
        .version_floor(true);
    // Advisory: the join cannot write (it refuses a server in recovery); its first survey does.
    let mut advisory = Machine::new(floor);
    advisory.start(t0).expect("not running");
    drain(&mut advisory);
    advisory.handle_event(t0, ShardEvent::Acquired { conn: C1 });
    let register = drain(&mut advisory);
    assert!(matches!(register[..], [ShardAction::Register { .. }]));
    advisory.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: 6400,
            members: 1,
        },
    );
    let first = drain(&mut advisory);
    assert!(first.contains(&ShardAction::Survey {
        conn: C1,
        floor: FloorStep::Raise(NEW)
    }));
    let answer = ranked(survey(4, &[(ME, true, vec![])]), &[(ME, at(NEW))]).with_floor(Some(NEW));
    advisory.handle_event(
        t0,
        ShardEvent::Surveyed {
            conn: C1,
            survey: answer,
        },
    );
    drain(&mut advisory);
    advisory.handle_timeout(t0 + I);
    let next = drain(&mut advisory);
    assert!(
        next.contains(&ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Read
        }),
        "{next:?}"
    );
    // Lease: the registration's own transaction raises it, and every survey reads it.
    let lease = floor.mechanism(crate::Mechanism::Lease(crate::Lease::default_for(
        CheckInterval::new(I).expect("valid"),
    )));
    let mut member = Machine::new(lease);
    member.start(t0).expect("not running");
    assert_eq!(
        drain(&mut member),
        vec![ShardAction::RegisterMember {
            conn: C1,
            ttl_ms: 3000,
            floor: FloorStep::Raise(NEW)
        }]
    );
    member.handle_event(
        t0,
        ShardEvent::Registered {
            conn: C1,
            backend: ME,
            granted: true,
            lock_capacity: u64::MAX,
            members: 1,
        },
    );
    let first = drain(&mut member);
    assert!(
        first.contains(&ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Read
        }),
        "{first:?}"
    );
}
