//! One simulated run: the fault phase, the liveness phase and the final graceful stop, then
//! the checks; and the determinism check that runs a seed twice.

use std::time::Duration;

use plexsphere_leader_pgsim::{Event, LockId, LockKey, LockMode, LogEntry};

use crate::capture::Capture;
use crate::checker::{self, Evidence, Measurements, Property, ServerEvidence, Violation, secs};
use crate::nemesis::Nemesis;
use crate::record::{FenceOutcome, FencedWrite, holder_identity};
use crate::setup::{RunOptions, SERVERS, Sharding, application_name};
use crate::world::World;

/// The second half of the member lock `(class, -1)` of a shard space.
const MEMBER: i32 = plexsphere_leader::shard_sql::MEMBER_OBJ_ID;

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The options it ran with.
    pub options: RunOptions,
    /// The largest values it measured.
    pub measurements: Measurements,
    /// Every property it broke, in time order (empty for a clean run).
    pub violations: Vec<Violation>,
    /// The readable trace: faults, incarnations, terms, the adapter's log events and the
    /// servers' ground truth, in simulated time.
    pub trace: Vec<String>,
}

impl RunOutcome {
    /// The report of a failed run: the seed, its violations and the replay command.
    pub fn failure_report(&self) -> String {
        let mut out = format!(
            "seed {} ({}): {} violation(s)\n",
            self.options.seed,
            self.options.describe(),
            self.violations.len()
        );
        for violation in &self.violations {
            out.push_str(&format!("  - {violation}\n"));
        }
        out.push_str(&format!("  replay: {}\n", self.options.replay_command()));
        out
    }
}

/// Runs `options` twice and compares the traces: a difference is a
/// [`Property::Determinism`] violation of the first run.
pub fn run(options: &RunOptions) -> RunOutcome {
    let mut first = run_once(options);
    let second = run_once(options);
    if first.trace != second.trace {
        let index = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b)
            .unwrap_or(first.trace.len().min(second.trace.len()));
        let line = |trace: &[String]| trace.get(index).cloned().unwrap_or_else(|| "<end>".into());
        first.violations.push(Violation {
            at: Duration::ZERO,
            property: Property::Determinism,
            detail: format!(
                "the second run differs at trace line {index}: {:?} vs {:?}",
                line(&first.trace),
                line(&second.trace)
            ),
        });
    }
    first
}

/// Runs `options` once.
pub fn run_once(options: &RunOptions) -> RunOutcome {
    tracing::subscriber::with_default(Capture, || simulate(options))
}

fn simulate(options: &RunOptions) -> RunOutcome {
    let params = options.params;
    let mut world = World::new(options);
    let mut nemesis = Nemesis::new(options.seed, options.kind, params.interval, options.space());
    let _completed = phases(&mut world, &mut nemesis, settle_bound(options));
    world.history.end = world.now();
    let work = world.recorder.borrow().work.clone();
    let fenced = world.recorder.borrow().fenced.clone();
    let servers = world
        .servers
        .iter()
        .map(|handle| ServerEvidence {
            log: handle.log(),
            queries: handle.queries(),
            sessions: handle.sessions(),
            locks: handle.locks(),
        })
        .collect::<Vec<_>>();
    let space = options
        .sharding
        .map(|sharding| (sharding, Sharding::class(options.seed)));
    let trace = trace(&world, &servers, &fenced, space.map(|(_, class)| class));
    let evidence = Evidence {
        params,
        replicas: options.replicas,
        fencing: options.mechanism.has_epochs(options.fencing),
        mechanism: options.mechanism,
        history: &world.history,
        unfit: options.unfit_replica(),
        rollout: options.rollout,
        work: &work,
        fenced: &fenced,
        servers,
    };
    let (measurements, violations) = match space {
        Some((sharding, class)) => checker::shards::check(&evidence, sharding, class),
        None => checker::check(&evidence),
    };
    RunOutcome {
        options: *options,
        measurements,
        violations,
        trace,
    }
}

/// How long after every fault healed and every replica is up the run must have settled: a
/// single leader ([`Params::liveness_bound`](crate::setup::Params::liveness_bound)), or a balanced shard space
/// ([`Params::balance_bound`](crate::setup::Params::balance_bound)).
pub(crate) fn settle_bound(options: &RunOptions) -> Duration {
    let params = options.params;
    match options.sharding {
        Some(sharding) => {
            params.balance_bound(sharding.shards, options.replicas, sharding.moves(params))
        }
        None => params.liveness_bound(),
    }
}

/// Runs the three phases, the liveness phase lasting until `settle` plus four intervals after
/// every replica is up; `Err` when a host failed and the run was cut short.
fn phases(world: &mut World<'_>, nemesis: &mut Nemesis, settle: Duration) -> Result<(), ()> {
    let params = world.params;
    while world.now() < params.fault_phase {
        world.step()?;
        nemesis.tick(world);
    }
    let faults_stopped = world.now();
    world.history.faults_stopped = Some(faults_stopped);
    world
        .history
        .note(faults_stopped, "nemesis", "faults stop: liveness phase");
    loop {
        if world.history.all_up.is_none() && nemesis.heal_all(world) {
            let now = world.now();
            world.history.all_up = Some(now);
            world
                .history
                .note(now, "nemesis", "every fault healed, every replica up");
        }
        let until = world.history.all_up.map(|up| {
            (faults_stopped + params.liveness_phase).max(up + settle + 4 * params.interval)
        });
        if until.is_some_and(|until| world.now() >= until) {
            break;
        }
        if world.now() > faults_stopped + params.liveness_phase + params.stop_budget {
            let now = world.now();
            let what = "the faults could not be healed (a stopped replica never finished)";
            world.history.errors.push((now, what.to_owned()));
            break;
        }
        world.step()?;
    }
    stop_all(world)
}

/// Stops every replica gracefully and waits until their software finished and the servers
/// saw their sockets close.
fn stop_all(world: &mut World<'_>) -> Result<(), ()> {
    let params = world.params;
    let asked = world.now();
    world.history.stop_all = Some(asked);
    world.history.locks_at_stop = world.servers.iter().map(|s| s.locks()).collect();
    world
        .history
        .note(asked, "harness", "every replica is asked to stop");
    for r in 0..world.replicas.len() {
        world.stop(r);
    }
    let all_stopped = |world: &World<'_>| (0..world.replicas.len()).all(|r| world.has_finished(r));
    while !all_stopped(world) && world.now() < asked + params.stop_budget {
        world.step()?;
    }
    world.history.unstopped = (0..world.replicas.len())
        .filter(|&r| !world.has_finished(r))
        .collect();
    let drained = world.now() + 2 * params.round_trip() + 10 * params.tick;
    while world.now() < drained {
        world.step()?;
    }
    Ok(())
}

/// The readable trace: the harness's notes, the fenced writes as the service saw them (at
/// their end) and the servers' logs, merged in time order; in a sharded run (`class`) the
/// locks of the space are named (`shard 3`, `member lock`).
fn trace(
    world: &World<'_>,
    servers: &[ServerEvidence],
    fenced: &[FencedWrite],
    class: Option<i32>,
) -> Vec<String> {
    let mut lines: Vec<(Duration, usize, String, String)> = world
        .history
        .trace
        .iter()
        .enumerate()
        .map(|(order, (at, who, what))| (*at, order, who.clone(), what.clone()))
        .collect();
    let base = lines.len();
    for (order, write) in fenced.iter().enumerate() {
        let who = application_name(write.replica, write.incarnation);
        let at = write.ended.unwrap_or(world.history.end);
        lines.push((at, base + order, who, describe_fenced(write)));
    }
    let base = lines.len();
    for (index, server) in servers.iter().enumerate() {
        for (order, entry) in server.log.iter().enumerate() {
            lines.push((
                entry.at,
                base + index * 1_000_000 + order,
                SERVERS[index].to_owned(),
                describe(entry, class),
            ));
        }
    }
    lines.sort_by_key(|(at, order, _, _)| (*at, *order));
    lines
        .into_iter()
        .map(|(at, _, who, what)| format!("{:>9}  {who:<7} {what}", secs(at)))
        .collect()
}

fn describe_fenced(write: &FencedWrite) -> String {
    let epoch = write
        .epoch
        .map_or_else(|| "no epoch".to_owned(), |e| format!("epoch {e}"));
    let checked = write.checked.map_or_else(
        || "no check".to_owned(),
        |at| format!("checked {}", secs(at)),
    );
    let outcome = match &write.outcome {
        FenceOutcome::Unfinished => "unfinished".to_owned(),
        FenceOutcome::Accepted => "accepted, committed".to_owned(),
        FenceOutcome::Stale { current } => format!("stale (current {current}), rolled back"),
        FenceOutcome::Failed(why) => format!("failed: {why}"),
    };
    format!(
        "fenced write ({epoch}, begun {}, {checked}): {outcome}",
        secs(write.started)
    )
}

/// The name of `lock` in a trace: in a sharded run of `class`, `shard <s>` or `member lock`;
/// otherwise `lock` (the election's only lock).
fn lock_name(lock: &LockId, class: Option<i32>) -> String {
    match (lock.key, class) {
        (LockKey::Pair(held, MEMBER), Some(class)) if held == class => "member lock".to_owned(),
        (LockKey::Pair(held, shard), Some(class)) if held == class => format!("shard {shard}"),
        (key, Some(_)) => format!("lock {key:?}"),
        (_, None) => "lock".to_owned(),
    }
}

fn describe(entry: &LogEntry, class: Option<i32>) -> String {
    match &entry.event {
        Event::ServerStarted => "server started".to_owned(),
        Event::ServerCrashed => "server crashed".to_owned(),
        Event::SessionStarted {
            pid,
            application_name,
            ..
        } => format!("session {pid} opened by {application_name}"),
        Event::SessionEnded { pid, reason, .. } => format!("session {pid} ended: {reason:?}"),
        Event::LockGranted {
            pid,
            count,
            lock,
            mode,
        } => {
            let shared = if *mode == LockMode::Shared {
                " (shared)"
            } else {
                ""
            };
            format!(
                "{}{shared} granted to {pid} (count {count})",
                lock_name(lock, class)
            )
        }
        Event::GrantedAtLockTimeout { pid, .. } => {
            format!("wait of {pid} fails with 55P03 at its lock_timeout, though granted the lock")
        }
        Event::LockReleased {
            pid,
            remaining,
            reason,
            lock,
            ..
        } => format!(
            "{} released by {pid} (count {remaining} left): {reason:?}",
            lock_name(lock, class)
        ),
        Event::EpochAdvanced {
            pid, epoch, waited, ..
        } if waited.is_zero() => format!("epoch advanced to {epoch} by {pid}"),
        Event::EpochAdvanced {
            pid, epoch, waited, ..
        } => format!(
            "epoch advanced to {epoch} by {pid} (waited {} for fenced transactions)",
            checker::ms(*waited)
        ),
        Event::FenceChecked { pid, epoch, .. } => {
            format!("fence checked by {pid}: epoch {epoch} (row share-locked)")
        }
        Event::FencedCommit {
            pid,
            epoch,
            current,
            ..
        } => format!(
            "fenced transaction of {pid} (epoch {epoch}) committed; current epoch {}",
            current.map_or_else(|| "none".to_owned(), |c| c.to_string())
        ),
        Event::LeaseClaimed {
            pid,
            holder,
            expires,
            ..
        } => format!(
            "lease claimed by {pid} for {} until {}",
            holder_identity(holder),
            secs(*expires)
        ),
        Event::LeaseRenewed {
            pid,
            holder,
            expires,
            ..
        } => format!(
            "lease of {} renewed by {pid} until {}",
            holder_identity(holder),
            secs(*expires)
        ),
        Event::LeaseReleased { pid, holder, .. } => {
            format!("lease of {} released by {pid}", holder_identity(holder))
        }
        Event::MemberLive {
            pid,
            member,
            holder,
            expires,
            joined,
            ..
        } => format!(
            "member {member} ({}) {} by {pid} until {}",
            holder_identity(holder),
            if *joined { "registered" } else { "renewed" },
            secs(*expires)
        ),
        Event::MemberGone {
            pid,
            member,
            reaped,
            ..
        } => format!(
            "member {member} {} by {pid}",
            if *reaped { "reaped" } else { "left" }
        ),
        Event::ShardOwned {
            pid, member, shard, ..
        } => format!("shard {shard} taken by {pid} for member {member}"),
        Event::ShardFreed {
            pid, member, shard, ..
        } => format!("shard {shard} of member {member} freed by {pid}"),
    }
}
