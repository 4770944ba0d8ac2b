//! The sharded simulation's findings about the core, reproduced on the pure
//! `plexsphere_leader_core::shards` API alone: each test states the behaviour the bounds of the
//! simulation (and the core's own documentation) promise, and failed on the core of `9c28836`
//! with the counterexample; the core's fixes (stopping surveys, membership-only caps) made them
//! pass, and they stay as regression tests:
//!
//! ```sh
//! cargo test -p plexsphere-leader-sim --test core_findings
//! ```
//!
//! See docs/simulation.md, "Sharded runs", for the seeds that show each in a whole run.
#![allow(clippy::unwrap_used)] // tests: an unexpected failure is the assertion
#![allow(missing_docs)] // test functions

use std::time::{Duration, Instant};

use plexsphere_leader_core::rank::FloorStep;
use plexsphere_leader_core::shards::{
    MemberId, Shard, ShardAction, ShardEvent, ShardOptions, ShardedElection, Survey, plan,
};
use plexsphere_leader_core::{CheckInterval, ConnId, Control, TermEndCause, TermId};

const I: Duration = Duration::from_millis(100);
const ME: MemberId = MemberId::new(100);
const OTHER: MemberId = MemberId::new(200);
const C1: ConnId = ConnId::new(1);

type Machine = ShardedElection<&'static str>;

fn drain(m: &mut Machine) -> Vec<ShardAction<&'static str>> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// A member owning shards 6 and 7 of 8 (`OTHER` holds the rest) after its first survey, at
/// `t0`.
fn owning_two(t0: Instant) -> Machine {
    let options = ShardOptions::new(CheckInterval::new(I).unwrap(), 8).unwrap();
    let mut m = Machine::new(options);
    m.start(t0).unwrap();
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
    let rows = [(ME, true, vec![]), (OTHER, true, (0..6).collect())];
    let survey = Survey::new(8, ME, rows).unwrap();
    m.handle_event(t0, ShardEvent::Surveyed { conn: C1, survey });
    m.handle_event(
        t0,
        ShardEvent::Took {
            conn: C1,
            granted: vec![Shard::new(6), Shard::new(7)],
        },
    );
    drain(&mut m);
    m
}

/// Finding 1: a graceful stop requested while a survey is in flight. `cancelled` moves every
/// owned shard out of `owned` (into the terms the stop awaits) while their locks are still
/// held, so the survey's answer, which shows them held by this member, contradicts what
/// `surveyed` compares it with: the core loses the session (`CloseSession`, `Finish`) at once,
/// before the stopped terms' work drained and without `UnlockAll`. The close frees the locks
/// while that work still runs, which the zero overlap of a graceful stop rules out.
#[test]
fn a_stop_during_a_survey_still_awaits_the_work_then_unlocks_all() {
    let t0 = Instant::now();
    let mut m = owning_two(t0);
    // The next check: the survey goes out.
    m.handle_timeout(t0 + I);
    assert_eq!(
        drain(&mut m),
        vec![ShardAction::Survey {
            conn: C1,
            floor: FloorStep::Off
        }]
    );
    let now = t0 + I + Duration::from_millis(1);
    m.handle_event(now, Control::Cancelled.into());
    let stop = drain(&mut m);
    assert!(
        stop.contains(&ShardAction::EndTerm {
            shard: Shard::new(6),
            term: TermId::new(1),
            cause: TermEndCause::Stopped
        }),
        "{stop:?}"
    );
    // The survey answers: the member still holds 6 and 7, as it should until the unlock.
    let rows = [(ME, true, vec![6, 7]), (OTHER, true, (0..6).collect())];
    let survey = Survey::new(8, ME, rows).unwrap();
    m.handle_event(now, ShardEvent::Surveyed { conn: C1, survey });
    let answered = drain(&mut m);
    assert!(
        !answered
            .iter()
            .any(|a| matches!(a, ShardAction::CloseSession { .. } | ShardAction::Finish)),
        "the survey answered during the stop's drain ended the run before the work drained: {answered:?}"
    );
    for term in [TermId::new(1), TermId::new(2)] {
        m.handle_event(now, ShardEvent::WorkDrained { term });
    }
    assert_eq!(drain(&mut m), vec![ShardAction::UnlockAll { conn: C1 }]);
}

/// Finding 2: the plan of a free shard flips between two members' surveys. Every member plans
/// from its own survey; a free shard goes to the member with room that ranks it highest, and
/// room depends on the caps, whose `K mod R` extra slots go to the members holding the most
/// shards at that survey. A take between two members' surveys can move an extra slot, so
/// member A's survey plans the free shard for B, and B's survey, after A's take, plans it for
/// A: the shard waits for A's next survey, one more interval than "taken at the next survey".
/// The search runs over every holding of 8 shards by 3 members.
#[test]
fn a_free_shard_planned_for_another_member_is_planned_for_it_by_that_member_too() {
    let members = [MemberId::new(1), MemberId::new(2), MemberId::new(3)];
    let count = 8_u32;
    let (a, b) = (members[0], members[1]);
    for code in 0..4_u32.pow(count) {
        // Each shard free (0) or held by member 1, 2 or 3.
        let holders: Vec<Option<MemberId>> = (0..count)
            .map(|s| match (code / 4_u32.pow(s)) % 4 {
                0 => None,
                m => Some(members[m as usize - 1]),
            })
            .collect();
        let first = survey_of(count, a, &members, &holders);
        let taken = plan(&first, a).take;
        let mut after = holders.clone();
        for shard in &taken {
            after[shard.get() as usize] = Some(a);
        }
        let second = survey_of(count, b, &members, &after);
        let for_b_by_a = plan(&first, b).take;
        let by_b = plan(&second, b).take;
        let for_a_by_b = plan(&second, a).take;
        let flipped = (0..count).map(Shard::new).find(|shard| {
            after[shard.get() as usize].is_none()
                && for_b_by_a.contains(shard)
                && !by_b.contains(shard)
                && for_a_by_b.contains(shard)
        });
        if let Some(shard) = flipped {
            panic!(
                "shard {shard} is free; member 1's survey of {holders:?} plans it for member 2, and \
                 member 1 takes {taken:?}; member 2's survey right after plans it for member 1 \
                 (loads {:?} then {:?}): it waits for member 1's next survey",
                first.loads(),
                second.loads()
            );
        }
    }
}

/// The survey answered by `backend` when every member of `members` holds the member lock and
/// the shards `holders` names.
fn survey_of(
    count: u32,
    backend: MemberId,
    members: &[MemberId],
    holders: &[Option<MemberId>],
) -> Survey {
    let rows = members.iter().map(|&m| {
        let shards: Vec<u32> = (0..count)
            .filter(|&s| holders[s as usize] == Some(m))
            .collect();
        (m, true, shards)
    });
    Survey::new(count, backend, rows).unwrap()
}
