//! The software of one replica host: the real `Elector::run` of the adapter, on a pool of
//! turmoil connections, and a simulated service that runs units of leader work through
//! `run_if_leader` (fenced ones in fencing runs, see [`crate::fenced`]); in sharded runs the
//! real `ShardedElector::run` instead, and a unit of work per shard through `run_if_owner`.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

use plexsphere_leader::leadership::Resignation;
use plexsphere_leader::sharded::{ShardConfig, ShardedElector};
use plexsphere_leader::{Config, Elector, LockKey};
use plexsphere_leader_pgsim::Primary;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::capture::Tagged;
use crate::clock::{ClockRate, DriftingClock};
use crate::connect::TurmoilConnect;
use crate::fenced::{self, FencedUnit};
use crate::record::{SharedRecorder, WorkGuard};
use crate::sabotage::{SabotagedSessions, StaleSurveySessions};
use crate::setup::{DriverSabotage, Mechanism, Params, ShardSabotage, Sharding, application_name};
use plexsphere_leader::session::PoolSessions;

/// The port every simulated server listens on.
pub(crate) const PORT: u16 = 5432;
/// The database every replica connects to.
pub(crate) const DATABASE: &str = "plexsphere";
/// How many connections a replica's pool may hold (the election uses one at a time).
const POOL_SIZE: usize = 2;

/// What the harness sees of one replica host, shared with its software.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// The number of times the software started; the current incarnation.
    pub(crate) incarnation: u32,
    /// The running incarnation's elector and stop token.
    pub(crate) live: Option<Live>,
    /// The current incarnation's `run` returned and the software finished.
    pub(crate) finished: bool,
    /// The harness asked the current incarnation to stop, possibly before it started.
    pub(crate) stop_requested: bool,
    /// Whether the host's process is paused ([`crate::pause`]): its software runs behind it.
    pub(crate) gate: Rc<crate::pause::Gate>,
    /// Pause runs: what the running incarnation's `is_leader()` answered at its last sample
    /// (every tick, from a task the gate does not hold: a call made at that moment, as from
    /// another thread of a stalled process); `None` outside pause runs or before a sample.
    pub(crate) believes: Option<bool>,
    /// Sharded pause runs: the shards the running incarnation's `ownership()` showed at its
    /// last sample (trusted ones only: what `is_owner()` answers), sampled as
    /// [`Slot::believes`] is.
    pub(crate) owns: Option<BTreeSet<u32>>,
    /// Rollout runs: the version the next incarnation is ranked with (`Config::version`);
    /// `None` runs unranked.
    pub(crate) version: Option<&'static str>,
    /// The version the current incarnation started with.
    pub(crate) started_version: Option<&'static str>,
}

/// The handles of a running incarnation.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) elector: Elected,
    pub(crate) shutdown: CancellationToken,
}

/// The elector an incarnation runs: the single election, or its part of a shard space.
#[derive(Debug, Clone)]
pub(crate) enum Elected {
    Single(Elector),
    Sharded(ShardedElector),
}

impl Elected {
    /// An operator's resign with `hold_off`: the single election's term, or every shard.
    pub(crate) fn resign_for(&self, hold_off: Duration) -> Resignation {
        match self {
            Self::Single(elector) => elector.resign_for(hold_off),
            Self::Sharded(elector) => elector.resign_for(hold_off),
        }
    }

    /// An operator makes the replica eligible to lead (own shards), or not.
    pub(crate) fn set_eligible(&self, eligible: bool) {
        match self {
            Self::Single(elector) => elector.set_eligible(eligible),
            Self::Sharded(elector) => elector.set_eligible(eligible),
        }
    }

    /// The run's identity.
    pub(crate) fn identity(&self) -> &str {
        match self {
            Self::Single(elector) => elector.identity(),
            Self::Sharded(elector) => elector.identity(),
        }
    }

    pub(crate) fn single(&self) -> Option<&Elector> {
        match self {
            Self::Single(elector) => Some(elector),
            Self::Sharded(_) => None,
        }
    }

    pub(crate) fn sharded(&self) -> Option<&ShardedElector> {
        match self {
            Self::Single(_) => None,
            Self::Sharded(elector) => Some(elector),
        }
    }
}

/// Everything the software of replica `index` is built from.
pub(crate) struct ReplicaEnv {
    pub(crate) index: usize,
    pub(crate) seed: u64,
    pub(crate) params: Params,
    pub(crate) primary: Primary,
    pub(crate) sabotage: Option<DriverSabotage>,
    /// A sharded run's space; `None` runs the single election.
    pub(crate) sharding: Option<Sharding>,
    /// A sharded run's deliberately broken behaviour, if any.
    pub(crate) shard_sabotage: Option<ShardSabotage>,
    /// Whether the run fences: the elector advances an epoch per term and the service's
    /// units of work are fenced writes.
    pub(crate) fencing: bool,
    /// How the elector's standby asks for the lock.
    pub(crate) mode: plexsphere_leader::config::AcquireMode,
    /// Whether the elector holds the advisory lock or a lease.
    pub(crate) mechanism: Mechanism,
    /// The rate of the clock the election runs on ([`RunOptions::clock_rate`](crate::RunOptions::clock_rate)).
    pub(crate) clock: ClockRate,
    /// The replica's fitness probe ([`RunOptions::fitness_probe`](crate::RunOptions::fitness_probe)).
    pub(crate) fitness_probe: Option<&'static str>,
    /// Pause runs: sample `is_leader()` every tick into [`Slot::believes`].
    pub(crate) sample_beliefs: bool,
    pub(crate) slot: Rc<RefCell<Slot>>,
    pub(crate) recorder: SharedRecorder,
    /// Where the run's connections signal their ends to the electors (one per run).
    pub(crate) session_ends: plexsphere_leader::session::SessionEnds,
}

/// The election's key in the run of `seed`: the spec's default key for one seed in three, else
/// one drawn from the seed (negative halves included, which `pg_locks` shows as large `oid`s).
/// Every replica of a run shares it; the checker follows whichever lock the server grants.
pub(crate) fn election_key(seed: u64) -> LockKey {
    if seed.is_multiple_of(3) {
        return LockKey::DEFAULT;
    }
    let mixed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes();
    let half = |bytes: &[u8]| i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    LockKey::new(half(&mixed[..4]), half(&mixed[4..]))
}

/// One incarnation of the replica's software: in fencing runs first sets the fence table up
/// (in lease runs the lease table and the fence table), then runs the election until the harness cancels it, then closes the pool so that no
/// session is left behind.
pub(crate) async fn software(env: Rc<ReplicaEnv>) -> turmoil::Result {
    let incarnation = {
        let mut slot = env.slot.borrow_mut();
        slot.incarnation += 1;
        slot.finished = false;
        slot.started_version = slot.version;
        slot.incarnation
    };
    let mut pg = tokio_postgres::Config::new();
    pg.user("app")
        .dbname(DATABASE)
        .application_name(application_name(env.index, incarnation));
    let connect = TurmoilConnect::new(env.primary.clone(), PORT, env.session_ends.clone());
    let pool = connect.pool(pg, POOL_SIZE)?;
    let sessions = PoolSessions::new(pool.clone()).session_ends(env.session_ends.clone());
    if let Some(sharding) = env.sharding {
        return sharded_software(env, incarnation, sharding, pool, sessions).await;
    }
    let key = election_key(env.seed);
    let config = match env.sabotage {
        Some(sabotage) => Config::with_sessions(SabotagedSessions::new(
            sessions,
            sabotage,
            key,
            env.params.interval,
        )),
        None => Config::with_sessions(sessions),
    }
    .check_interval(env.params.interval)
    .acquire_mode(env.mode)
    .fencing(env.fencing)
    .key(key)
    .identity(application_name(env.index, incarnation));
    let config = env.mechanism.configure(config);
    let config = match env.fitness_probe {
        Some(probe) => config.fitness_probe(probe),
        None => config,
    };
    let version = env.slot.borrow().started_version;
    let config = match version {
        Some(version) => config.version(version),
        None => config,
    };
    // Tokio's clock (the simulation's) unless the run gives this replica another rate.
    let config = if env.clock == ClockRate::EXACT {
        config
    } else {
        config.clock(DriftingClock::new(env.clock))
    };
    let elector = Elector::new(config)?;
    let shutdown = CancellationToken::new();
    {
        let mut slot = env.slot.borrow_mut();
        if slot.stop_requested {
            shutdown.cancel();
        }
        slot.live = Some(Live {
            elector: Elected::Single(elector.clone()),
            shutdown: shutdown.clone(),
        });
    }
    if env.mechanism.has_epochs(env.fencing) {
        fenced::set_up(&pool, &shutdown, &env.params, env.mechanism, false).await;
    }
    if env.sample_beliefs {
        let elected = Elected::Single(elector.clone());
        tokio::task::spawn_local(sample_beliefs(Rc::clone(&env), elected));
    }
    let gate = Rc::clone(&env.slot.borrow().gate);
    let service = tokio::task::spawn_local(gate.gated(Tagged::new(
        env.index,
        service(
            Rc::clone(&env),
            elector.clone(),
            shutdown.clone(),
            incarnation,
            pool.clone(),
        ),
    )));
    let result = Tagged::new(env.index, elector.run(shutdown.clone())).await;
    shutdown.cancel();
    let _ended = service.await;
    finish(&env, pool).await;
    Ok(result?)
}

/// Pause runs: `is_leader()` of `elected` (a sharded one's trusted `ownership()`) every tick
/// into the slot, until the incarnation's run is over. Not behind the gate: it is the
/// harness's question, asked at that moment, on the host's runtime (whose clock the elector's
/// trust is read on).
async fn sample_beliefs(env: Rc<ReplicaEnv>, elected: Elected) {
    let mut tick = tokio::time::interval(env.params.tick);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let mut slot = env.slot.borrow_mut();
        let current = slot
            .live
            .as_ref()
            .is_some_and(|live| live.elector.identity() == elected.identity());
        if !current || slot.finished {
            slot.believes = None;
            slot.owns = None;
            return;
        }
        match &elected {
            Elected::Single(elector) => slot.believes = Some(elector.is_leader()),
            Elected::Sharded(elector) => {
                slot.owns = Some(elector.ownership().shards.keys().copied().collect());
            }
        }
    }
}

/// After `run` returned: closes the pool, so that no session is left, and tells the harness.
async fn finish(env: &ReplicaEnv, pool: deadpool_postgres::Pool) {
    pool.close();
    drop(pool);
    // Let the runtime drop the aborted connection tasks, so their sockets close (FIN) before
    // the software returns and turmoil stops ticking this host.
    tokio::time::sleep(2 * env.params.tick).await;
    let mut slot = env.slot.borrow_mut();
    slot.live = None;
    slot.finished = true;
}

/// One incarnation of a sharded replica: the real `ShardedElector::run` on the pool's
/// sessions (its one lock session), and a unit of work per shard every `work_period`, until
/// the harness cancels it; then the pool closes.
async fn sharded_software(
    env: Rc<ReplicaEnv>,
    incarnation: u32,
    sharding: Sharding,
    pool: deadpool_postgres::Pool,
    sessions: PoolSessions,
) -> turmoil::Result {
    let class = Sharding::class(env.seed);
    let config = match env.shard_sabotage {
        Some(ShardSabotage::KeepShardsOnFailedSurvey) => ShardConfig::with_sessions(
            StaleSurveySessions::new(
                sessions,
                class,
                sharding.shards,
                env.params.interval,
                env.mechanism,
            ),
            sharding.shards,
        ),
        _ => ShardConfig::with_sessions(sessions, sharding.shards),
    }
    .class(class)
    .check_interval(env.params.interval)
    .identity(application_name(env.index, incarnation));
    let config = match env.mechanism.lease_ttl() {
        Some(ttl) => config.lease(ttl),
        None => config,
    };
    let elector = ShardedElector::new(config)?;
    let shutdown = CancellationToken::new();
    {
        let mut slot = env.slot.borrow_mut();
        if slot.stop_requested {
            shutdown.cancel();
        }
        slot.live = Some(Live {
            elector: Elected::Sharded(elector.clone()),
            shutdown: shutdown.clone(),
        });
    }
    if env.mechanism.has_epochs(false) {
        fenced::set_up(&pool, &shutdown, &env.params, env.mechanism, true).await;
    }
    if env.sample_beliefs {
        let elected = Elected::Sharded(elector.clone());
        tokio::task::spawn_local(sample_beliefs(Rc::clone(&env), elected));
    }
    // The shard work behind the host's gate, as the single election's service: a paused
    // process runs none of it.
    let gate = Rc::clone(&env.slot.borrow().gate);
    let workers: Vec<_> = (0..sharding.shards)
        .map(|shard| {
            tokio::task::spawn_local(gate.gated(Tagged::new(
                env.index,
                shard_work(
                    Rc::clone(&env),
                    elector.clone(),
                    shutdown.clone(),
                    incarnation,
                    shard,
                ),
            )))
        })
        .collect();
    let result = Tagged::new(env.index, elector.run(shutdown.clone())).await;
    shutdown.cancel();
    for worker in workers {
        let _ended = worker.await;
    }
    finish(&env, pool).await;
    Ok(result?)
}

/// The simulated work of one shard: every `work_period` a unit of random length up to
/// `longest_work` through `run_if_owner`, which does not look at its term's token (the worst
/// case); the shard's handover waits for it. With the sabotage
/// [`ShardSabotage::WorkOutlivesTerm`] the unit gives its term handle back as it starts.
async fn shard_work(
    env: Rc<ReplicaEnv>,
    elector: ShardedElector,
    shutdown: CancellationToken,
    incarnation: u32,
    shard: u32,
) {
    let mut rng = StdRng::seed_from_u64(
        env.seed
            ^ ((env.index as u64) << 48)
            ^ (u64::from(incarnation) << 32)
            ^ (u64::from(shard) << 16)
            ^ 0x5ba2_d0c4,
    );
    let mut ticker = tokio::time::interval(env.params.work_period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let longest = u64::try_from(env.params.longest_work.as_micros()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let length = Duration::from_micros(rng.random_range(0..=longest));
        // The term `run_if_owner` takes: nothing awaits in between.
        let Some(term) = elector.ownership().shards.get(&shard).map(|o| o.term.get()) else {
            continue;
        };
        let (recorder, replica) = (Rc::clone(&env.recorder), env.index);
        if env.shard_sabotage == Some(ShardSabotage::WorkOutlivesTerm) {
            // The term handle goes back at once: a handover no longer waits for the work.
            drop(elector.term(shard, &shutdown));
            let _work = WorkGuard::begin(recorder, replica, incarnation, shard, term);
            tokio::time::sleep(length).await;
            continue;
        }
        let _ran = elector
            .run_if_owner(shard, &shutdown, |_token| async move {
                let _work = WorkGuard::begin(recorder, replica, incarnation, shard, term);
                tokio::time::sleep(length).await;
                Ok::<(), Infallible>(())
            })
            .await;
    }
}

/// The simulated service: every `work_period` it asks for one unit of leader work, which
/// runs for a random time up to `longest_work` without looking at its term's token (the
/// worst case the overlap bound allows for). In fencing runs the unit is a fenced write on a
/// connection of `pool` that holds its transaction open that long.
async fn service(
    env: Rc<ReplicaEnv>,
    elector: Elector,
    shutdown: CancellationToken,
    incarnation: u32,
    pool: deadpool_postgres::Pool,
) {
    let mut rng = StdRng::seed_from_u64(
        env.seed ^ ((env.index as u64) << 48) ^ (u64::from(incarnation) << 32) ^ 0x5e41_71ce,
    );
    let mut ticker = tokio::time::interval(env.params.work_period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let longest = u64::try_from(env.params.longest_work.as_micros()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let length = Duration::from_micros(rng.random_range(0..=longest));
        let recorder = Rc::clone(&env.recorder);
        let index = env.index;
        // The term `run_if_leader` takes, and its epoch: nothing awaits in between.
        let Some((term, epoch)) = elector
            .leadership()
            .term()
            .map(|term| (term.id.get(), term.epoch))
        else {
            continue;
        };
        if env.fencing {
            let unit = FencedUnit {
                recorder,
                replica: index,
                incarnation,
                term,
                epoch,
                key: elector.key(),
                length,
            };
            let (pool, params) = (&pool, &env.params);
            let _ran = elector
                .run_if_leader(&shutdown, |_term| async move {
                    unit.run(pool, params).await;
                    Ok::<(), Infallible>(())
                })
                .await;
            continue;
        }
        let _ran = elector
            .run_if_leader(&shutdown, |_token| async move {
                let _work = WorkGuard::begin(recorder, index, incarnation, 0, term);
                tokio::time::sleep(length).await;
                Ok::<(), Infallible>(())
            })
            .await;
    }
}
