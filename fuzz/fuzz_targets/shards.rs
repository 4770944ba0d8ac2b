//! Replays an arbitrary sequence of (delay, input) through one sharded election and checks every
//! step with the core's trace checker (`invariants::shards::ShardChecker`: terms open and end
//! once with the causes their inputs imply, takes and unlocks, work reports, the finish, the
//! deadlines), plus what only the election itself can say: its owned set is the set of open
//! terms, and a take never asks for a shard it is handing over. Surveys are either consistent
//! with what the replica holds (other members and holders arbitrary) or arbitrary rows. Half the
//! options hold the space by leases, whose renewals and takes are inputs too.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plexsphere_leader_core::invariants::Input;
use plexsphere_leader_core::invariants::shards::ShardChecker;
use plexsphere_leader_core::shards::{
    MemberId, Shard, ShardAction, ShardEvent, ShardOptions, ShardedElection, Survey,
};
use plexsphere_leader_core::{
    CheckInterval, ConnId, Control, Handled, Lease, MIN_CHECK_INTERVAL, Mechanism, TermId,
};

#[derive(Debug, Arbitrary)]
struct Step {
    delay_ms: u16,
    input: FuzzInput,
}

#[derive(Debug, Arbitrary)]
enum FuzzInput {
    Start,
    Acquired(Which),
    AcquireFailed(Which),
    /// Registered as backend `pid`, granted or not, with this lock capacity and member count.
    Registered(Which, u8, bool, u16, u8),
    /// A survey consistent with the believed set: other members (pids) and, for each free
    /// shard, a holder index into them (or none).
    ConsistentSurvey(Which, Vec<u8>, Vec<Option<u8>>),
    /// Arbitrary rows: (pid, member, shards).
    RawSurvey(Which, u8, Vec<(u8, bool, Vec<u8>)>),
    /// Grants these shards (by index into the asked set, or any number).
    Took(Which, Vec<u8>),
    /// Epochs for these shards (by index into the last take's, or any number).
    EpochsAdvanced(Which, Vec<(u8, u8)>),
    Unlocked(Which, Vec<u8>),
    UnlockedAll(Which),
    Failed(Which, bool),
    SessionEnded(Which),
    WorkDrained(u8),
    Cancelled,
    /// A resign with a hold-off of this many milliseconds.
    Resign(u16),
    SetEligible(bool),
    Panicked,
    Dropped,
    /// Lease mechanism: a renewal answered, renewed or not, with these other members (pids).
    Renewed(Which, bool, Vec<u8>),
    /// Lease mechanism: a take answered, live or not, with these shards (by index into the
    /// asked set, or any number) and epochs.
    TookLeases(Which, bool, Vec<(u8, u8)>),
}

#[derive(Debug, Arbitrary)]
enum Which {
    Newest,
    Number(u8),
}

#[derive(Debug, Arbitrary)]
struct FuzzOptions {
    fencing: bool,
    interval_ms: u16,
    shards: u8,
    delay_ms: u16,
    moves: u8,
    grace_ms: u16,
    /// Holds the space by leases (the default TTL of three intervals).
    lease: bool,
}

#[derive(Default)]
struct Model {
    checker: ShardChecker,
    newest: u64,
    backend: i32,
    last_take: Vec<Shard>,
    last_unlock: Vec<Shard>,
}

/// Performs the queued actions of the step whose input was `input` at `now` and checks it.
fn drain(
    election: &mut ShardedElection<u8>,
    model: &mut Model,
    now: Instant,
    input: Input<'_, ShardEvent<u8>>,
) {
    let actions: Vec<ShardAction<u8>> = std::iter::from_fn(|| election.poll_action()).collect();
    for action in &actions {
        match action {
            ShardAction::AcquireSession { conn } | ShardAction::RegisterMember { conn, .. } => {
                model.newest = conn.get();
            }
            ShardAction::Take { shards, .. } | ShardAction::TakeLeases { shards, .. } => {
                for s in shards {
                    assert!(
                        !election.handing_over().contains(s),
                        "take of a shard being handed over {s}"
                    );
                }
                model.last_take = shards.clone();
            }
            ShardAction::Unlock { shards, .. } => model.last_unlock = shards.clone(),
            _ => {}
        }
    }
    if let Err(violation) = model
        .checker
        .check(now, input, &actions, election.poll_timeout())
    {
        panic!("{violation}: {actions:?}");
    }
    if election.is_running() {
        let owned: Vec<(Shard, TermId)> = election.owned().into_iter().collect();
        assert_eq!(
            owned,
            model.checker.open_terms(),
            "owned() differs from the open terms"
        );
    }
}

/// Each pick's shard (by index into the last take's, or any number) with its epoch.
fn picked_epochs<'a>(
    model: &'a Model,
    picks: &'a [(u8, u8)],
) -> impl Iterator<Item = (Shard, u64)> + 'a {
    picks.iter().map(|(i, epoch)| {
        let shard = model
            .last_take
            .get(usize::from(*i))
            .copied()
            .unwrap_or(Shard::new(u32::from(*i)));
        (shard, u64::from(*epoch))
    })
}

fuzz_target!(|input: (FuzzOptions, Vec<Step>)| {
    let (o, steps) = input;
    let Ok(interval) =
        CheckInterval::new(Duration::from_millis(u64::from(o.interval_ms)).max(MIN_CHECK_INTERVAL))
    else {
        return;
    };
    let count = u32::from(o.shards % 16) + 1;
    let Ok(options) = ShardOptions::new(interval, count) else {
        return;
    };
    let Ok(options) = options.max_moves(u32::from(o.moves.max(1))) else {
        return;
    };
    let Ok(options) = options
        .fencing(o.fencing)
        .rebalance_delay(Duration::from_millis(u64::from(o.delay_ms)))
        .stop_grace(Duration::from_millis(u64::from(o.grace_ms)))
    else {
        return;
    };
    let options = if o.lease {
        options.mechanism(Mechanism::Lease(Lease::default_for(interval)))
    } else {
        options
    };
    let mut election = ShardedElection::<u8>::new(options);
    let mut model = Model::default();
    let mut now = Instant::now();
    for step in steps {
        now += Duration::from_millis(u64::from(step.delay_ms));
        if election.poll_timeout().is_some_and(|at| at <= now) {
            election.handle_timeout(now);
            drain(&mut election, &mut model, now, Input::Timeout);
        }
        let conn = |w: &Which, model: &Model| match w {
            Which::Newest => ConnId::new(model.newest),
            Which::Number(n) => ConnId::new(u64::from(*n)),
        };
        let event = match step.input {
            FuzzInput::Start => {
                let accepted = election.start(now).is_ok();
                drain(&mut election, &mut model, now, Input::Start { accepted });
                continue;
            }
            FuzzInput::Acquired(w) => ShardEvent::Acquired {
                conn: conn(&w, &model),
            },
            FuzzInput::AcquireFailed(w) => ShardEvent::AcquireFailed {
                conn: conn(&w, &model),
                cause: 1,
            },
            FuzzInput::Registered(w, pid, granted, capacity, members) => {
                model.backend = i32::from(pid) + 1;
                ShardEvent::Registered {
                    conn: conn(&w, &model),
                    backend: MemberId::new(model.backend),
                    granted,
                    lock_capacity: u64::from(capacity),
                    members: u32::from(members),
                }
            }
            FuzzInput::ConsistentSurvey(w, others, holders) => {
                let me = MemberId::new(model.backend);
                let mut held: BTreeSet<Shard> = model
                    .checker
                    .open_terms()
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
                held.extend(election.handing_over());
                let others: Vec<MemberId> = others
                    .iter()
                    .map(|p| MemberId::new(1000 + i32::from(*p)))
                    .collect();
                let mut rows: BTreeMap<MemberId, (bool, Vec<u32>)> = BTreeMap::new();
                rows.insert(me, (true, held.iter().map(|s| s.get()).collect()));
                for m in &others {
                    rows.entry(*m).or_default().0 = true;
                }
                let mut free = (0..count).filter(|s| !held.contains(&Shard::new(*s)));
                for holder in holders {
                    let Some(s) = free.next() else { break };
                    if let Some(i) = holder
                        && !others.is_empty()
                    {
                        let m = others[usize::from(i) % others.len()];
                        rows.entry(m).or_default().1.push(s);
                    }
                }
                let Ok(survey) = Survey::new(
                    count,
                    me,
                    rows.into_iter()
                        .map(|(m, (member, shards))| (m, member, shards)),
                ) else {
                    continue;
                };
                ShardEvent::Surveyed {
                    conn: conn(&w, &model),
                    survey,
                }
            }
            FuzzInput::RawSurvey(w, backend, rows) => {
                let Ok(survey) = Survey::new(
                    count,
                    MemberId::new(i32::from(backend)),
                    rows.into_iter().map(|(pid, member, shards)| {
                        (
                            MemberId::new(i32::from(pid)),
                            member,
                            shards.into_iter().map(u32::from).collect::<Vec<_>>(),
                        )
                    }),
                ) else {
                    continue;
                };
                ShardEvent::Surveyed {
                    conn: conn(&w, &model),
                    survey,
                }
            }
            FuzzInput::Took(w, picks) => {
                let granted = picks
                    .iter()
                    .filter_map(|i| {
                        model
                            .last_take
                            .get(usize::from(*i))
                            .copied()
                            .or(Some(Shard::new(u32::from(*i))))
                    })
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                ShardEvent::Took {
                    conn: conn(&w, &model),
                    granted,
                }
            }
            FuzzInput::EpochsAdvanced(w, picks) => ShardEvent::EpochsAdvanced {
                conn: conn(&w, &model),
                epochs: picked_epochs(&model, &picks).collect(),
            },
            FuzzInput::Unlocked(w, picks) => ShardEvent::Unlocked {
                conn: conn(&w, &model),
                not_held: picks
                    .iter()
                    .filter_map(|i| model.last_unlock.get(usize::from(*i)).copied())
                    .collect(),
            },
            FuzzInput::UnlockedAll(w) => ShardEvent::UnlockedAll {
                conn: conn(&w, &model),
            },
            FuzzInput::Failed(w, ended) => ShardEvent::StatementFailed {
                conn: conn(&w, &model),
                cause: 2,
                session_ended: ended,
            },
            FuzzInput::SessionEnded(w) => ShardEvent::SessionEnded {
                conn: conn(&w, &model),
            },
            FuzzInput::WorkDrained(t) => ShardEvent::WorkDrained {
                term: TermId::new(u64::from(t)),
            },
            FuzzInput::Resign(ms) => Control::Resign {
                hold_off: Duration::from_millis(u64::from(ms)),
            }
            .into(),
            FuzzInput::SetEligible(eligible) => Control::SetEligible { eligible }.into(),
            FuzzInput::Cancelled => Control::Cancelled.into(),
            FuzzInput::Panicked => Control::Panicked.into(),
            FuzzInput::Dropped => Control::Dropped.into(),
            FuzzInput::Renewed(w, renewed, others) => {
                let mut members: Vec<MemberId> = others
                    .iter()
                    .map(|p| MemberId::new(1000 + i32::from(*p)))
                    .chain([MemberId::new(model.backend)])
                    .collect();
                members.sort_unstable();
                members.dedup();
                ShardEvent::Renewed {
                    conn: conn(&w, &model),
                    renewed,
                    members,
                }
            }
            FuzzInput::TookLeases(w, live, picks) => ShardEvent::TookLeases {
                conn: conn(&w, &model),
                live,
                taken: picked_epochs(&model, &picks)
                    .collect::<BTreeMap<_, _>>()
                    .into_iter()
                    .collect(),
            },
        };
        let handled: Handled = election.handle_event(now, event.clone());
        let input = Input::Event {
            event: &event,
            handled,
        };
        drain(&mut election, &mut model, now, input);
    }
});
