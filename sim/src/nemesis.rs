//! The nemesis: faults drawn from the run's seed, injected between turmoil steps.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::setup::{FaultKind, RunKind, SERVERS, Space};
use crate::world::World;

/// What a fault occupies; two faults that share a resource never run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Resource {
    Replica(usize),
    Server(usize),
    Link(usize, usize),
}

/// A fault in progress, and how to heal it.
#[derive(Debug, Clone, Copy)]
enum Active {
    Partition {
        r: usize,
        s: usize,
    },
    OneWay {
        r: usize,
        s: usize,
        to_server: bool,
    },
    Hold {
        r: usize,
        s: usize,
    },
    Down {
        r: usize,
    },
    SilentDeath {
        r: usize,
    },
    Stopped {
        r: usize,
    },
    ServerDown {
        s: usize,
    },
    FailedOver {
        old: usize,
        partitioned: bool,
    },
    Latency {
        s: usize,
    },
    Ineligible {
        r: usize,
    },
    Paused {
        r: usize,
    },
    /// The rollout stopped replica `r`, which starts again with the new version.
    Upgrading {
        r: usize,
    },
}

#[derive(Debug)]
struct Pending {
    active: Active,
    heal_at: Duration,
    resources: BTreeSet<Resource>,
}

/// The nemesis of one run.
pub(crate) struct Nemesis {
    rng: StdRng,
    kind: RunKind,
    /// The kinds a mixed run draws from.
    mixed: Vec<FaultKind>,
    next_at: Duration,
    pending: Vec<Pending>,
    /// A rollout run's rolling restart ([`FaultKind::Rollout`]), which goes on whatever else
    /// the nemesis injects.
    rollout: Option<Rollout>,
}

/// A rolling deploy: each replica in a random order is stopped gracefully and started with
/// the new version, the first at 4·I, each next one 8·I to 11·I after the previous stop (a
/// window W = 2·I for the leadership to move, with room for the restarts and a steady spell).
#[derive(Debug)]
struct Rollout {
    /// The order of the replicas; empty until the first tick.
    order: Vec<usize>,
    /// How many were upgraded.
    done: usize,
    next_at: Duration,
}

/// At most this many faults at once.
const MAX_ACTIVE: usize = 2;

impl Nemesis {
    /// The nemesis of the run of `seed` in `space`; a mixed run draws from every fault kind
    /// of the space ([`Space::faults`]).
    pub(crate) fn new(seed: u64, kind: RunKind, interval: Duration, space: Space) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7300),
            kind,
            mixed: space.faults(),
            next_at: 2 * interval,
            pending: Vec::new(),
            rollout: space.is_rollout().then(|| Rollout {
                order: Vec::new(),
                done: 0,
                next_at: 4 * interval,
            }),
        }
    }

    /// The rollout's next restart, when its time has come and its replica is up and no other
    /// fault occupies it (else at a later tick).
    fn roll(&mut self, world: &mut World<'_>) {
        let now = world.now();
        let interval = world.params.interval;
        let taken = self.taken();
        let Some(rollout) = self.rollout.as_mut() else {
            return;
        };
        if rollout.order.is_empty() {
            let mut order: Vec<usize> = (0..world.replicas.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, self.rng.random_range(0..=i));
            }
            rollout.order = order;
        }
        let Some(&r) = rollout.order.get(rollout.done) else {
            return;
        };
        if now < rollout.next_at || taken.contains(&Resource::Replica(r)) || !world.is_up(r) {
            return;
        }
        rollout.done += 1;
        let after = self.between(8 * interval, 11 * interval);
        let heal_in = self.between(interval / 2, 2 * interval);
        if let Some(rollout) = self.rollout.as_mut() {
            rollout.next_at = now + after;
        }
        let active = Active::Upgrading { r };
        apply(world, active);
        self.add(world, active, heal_in);
    }

    /// Heals the faults that are due, then injects one when its time has come.
    pub(crate) fn tick(&mut self, world: &mut World<'_>) {
        self.heal_due(world, false);
        self.roll(world);
        let now = world.now();
        if now < self.next_at {
            return;
        }
        let interval = world.params.interval;
        self.next_at = now + self.between(interval / 2, 3 * interval);
        if self.pending.len() >= MAX_ACTIVE {
            return;
        }
        let kind = match self.kind {
            // The rollout alone: its restarts are all the faults.
            RunKind::Only(FaultKind::Rollout) => return,
            RunKind::Only(kind) => kind,
            RunKind::Mixed => self.mixed[self.rng.random_range(0..self.mixed.len())],
        };
        self.inject(world, kind);
    }

    /// Heals every fault now (the liveness phase); a graceful stop still in progress is
    /// healed once the replica has stopped. True when nothing is left to heal.
    pub(crate) fn heal_all(&mut self, world: &mut World<'_>) -> bool {
        self.heal_due(world, true);
        self.pending.is_empty()
    }

    fn heal_due(&mut self, world: &mut World<'_>, all: bool) {
        let now = world.now();
        let mut index = 0;
        while index < self.pending.len() {
            let pending = &self.pending[index];
            let due = all || pending.heal_at <= now;
            let ready = match pending.active {
                Active::Stopped { r } | Active::Upgrading { r } => world.has_finished(r),
                _ => true,
            };
            if due && ready {
                let pending = self.pending.remove(index);
                heal(world, pending.active);
            } else {
                index += 1;
            }
        }
    }

    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let low = u64::try_from(low.as_millis()).unwrap_or(0);
        let high = u64::try_from(high.as_millis()).unwrap_or(low).max(low);
        Duration::from_millis(self.rng.random_range(low..=high))
    }

    fn taken(&self) -> BTreeSet<Resource> {
        self.pending
            .iter()
            .flat_map(|p| p.resources.iter().copied())
            .collect()
    }

    /// A replica no fault occupies: the leader with probability 0.6, otherwise any.
    fn pick_replica(&mut self, world: &World<'_>) -> Option<usize> {
        let taken = self.taken();
        let free: Vec<usize> = (0..world.replicas.len())
            .filter(|&r| !taken.contains(&Resource::Replica(r)) && world.is_up(r))
            .collect();
        let leader = world
            .leaders()
            .into_iter()
            .find(|leader| free.contains(leader));
        let prefer_leader = self.rng.random_bool(0.6);
        match leader {
            Some(leader) if prefer_leader => Some(leader),
            _ if free.is_empty() => None,
            _ => Some(free[self.rng.random_range(0..free.len())]),
        }
    }

    fn add(&mut self, world: &mut World<'_>, active: Active, heal_in: Duration) {
        let resources = resources(active, world.replicas.len());
        let heal_at = world.now() + heal_in;
        self.pending.push(Pending {
            active,
            heal_at,
            resources,
        });
        world.history.faults += 1;
    }

    fn free(&self, wanted: &BTreeSet<Resource>) -> bool {
        self.taken().is_disjoint(wanted)
    }

    fn inject(&mut self, world: &mut World<'_>, kind: FaultKind) {
        let interval = world.params.interval;
        let s = world.primary_index();
        match kind {
            FaultKind::Partition | FaultKind::PartitionOneWay | FaultKind::Hold => {
                let Some(r) = self.pick_replica(world) else {
                    return;
                };
                if !self.free(&BTreeSet::from([Resource::Link(r, s), Resource::Server(s)])) {
                    return;
                }
                let active = match kind {
                    FaultKind::Partition => Active::Partition { r, s },
                    FaultKind::Hold => Active::Hold { r, s },
                    _ => Active::OneWay {
                        r,
                        s,
                        to_server: self.rng.random_bool(0.5),
                    },
                };
                let heal_in = self.between(interval / 2, 5 * interval);
                apply(world, active);
                self.add(world, active, heal_in);
            }
            FaultKind::Crash | FaultKind::SilentDeath | FaultKind::GracefulStop => {
                let Some(r) = self.pick_replica(world) else {
                    return;
                };
                let (active, heal_in) = match kind {
                    FaultKind::Crash => {
                        (Active::Down { r }, self.between(interval / 2, 4 * interval))
                    }
                    FaultKind::SilentDeath => {
                        let links: BTreeSet<Resource> =
                            (0..SERVERS.len()).map(|s| Resource::Link(r, s)).collect();
                        if !self.free(&links) {
                            return;
                        }
                        (
                            Active::SilentDeath { r },
                            self.between(5 * interval, 8 * interval),
                        )
                    }
                    _ => (
                        Active::Stopped { r },
                        self.between(interval / 2, 3 * interval),
                    ),
                };
                apply(world, active);
                self.add(world, active, heal_in);
            }
            FaultKind::Restart => {
                if let Some(r) = self.pick_replica(world) {
                    world.bounce(r);
                    world.history.faults += 1;
                }
            }
            FaultKind::Terminate => self.terminate(world, s),
            FaultKind::Resign => self.resign(world),
            FaultKind::Pause => {
                let Some(r) = self.pick_replica(world) else {
                    return;
                };
                let active = Active::Paused { r };
                if !self.free(&resources(active, world.replicas.len())) {
                    return;
                }
                let heal_in = self.between(interval, 9 * interval);
                apply(world, active);
                self.add(world, active, heal_in);
            }
            FaultKind::ServerRestart => {
                if self.free(&BTreeSet::from([Resource::Server(s)])) {
                    world.server_crash(s);
                    world.server_restart(s);
                    world.history.faults += 1;
                }
            }
            FaultKind::ServerCrash | FaultKind::Failover | FaultKind::Latency => {
                self.server_fault(world, kind, s);
            }
            // The rolling restart runs on its own schedule (`roll`).
            FaultKind::Rollout => {}
        }
    }

    /// An operator's control: a resign (hold-off 0 to 3·I), or with probability 0.3 an
    /// ineligible spell of I/2 to 3·I.
    fn resign(&mut self, world: &mut World<'_>) {
        let interval = world.params.interval;
        let Some(r) = self.pick_replica(world) else {
            return;
        };
        if self.rng.random_bool(0.3) {
            let active = Active::Ineligible { r };
            let heal_in = self.between(interval / 2, 3 * interval);
            apply(world, active);
            self.add(world, active, heal_in);
        } else {
            let hold_off = self.between(Duration::ZERO, 3 * interval);
            world.resign(r, hold_off);
            world.history.faults += 1;
        }
    }

    fn terminate(&mut self, world: &mut World<'_>, s: usize) {
        let holder = world.lock_holder(s);
        let pids = world.session_pids(s);
        let pid = match holder {
            Some(pid) if self.rng.random_bool(0.7) => Some(pid),
            _ if pids.is_empty() => None,
            _ => Some(pids[self.rng.random_range(0..pids.len())]),
        };
        if let Some(pid) = pid {
            world.terminate(s, pid);
            world.history.faults += 1;
        }
    }

    fn server_fault(&mut self, world: &mut World<'_>, kind: FaultKind, s: usize) {
        let interval = world.params.interval;
        let (active, heal_in) = match kind {
            FaultKind::ServerCrash => (
                Active::ServerDown { s },
                self.between(interval / 2, 3 * interval),
            ),
            FaultKind::Latency => (Active::Latency { s }, self.between(interval, 4 * interval)),
            _ => (
                Active::FailedOver {
                    old: s,
                    partitioned: self.rng.random_bool(0.5),
                },
                self.between(interval, 6 * interval),
            ),
        };
        if !self.free(&resources(active, world.replicas.len())) {
            return;
        }
        if let Active::Latency { s } = active {
            let latency = self.between(interval / 2, interval * 3 / 2);
            world.set_latency(s, latency);
        } else {
            apply(world, active);
        }
        self.add(world, active, heal_in);
    }
}

fn resources(active: Active, replicas: usize) -> BTreeSet<Resource> {
    match active {
        Active::Partition { r, s } | Active::OneWay { r, s, .. } | Active::Hold { r, s } => {
            BTreeSet::from([Resource::Replica(r), Resource::Link(r, s)])
        }
        Active::Down { r }
        | Active::Stopped { r }
        | Active::Ineligible { r }
        | Active::Upgrading { r } => BTreeSet::from([Resource::Replica(r)]),
        Active::SilentDeath { r } | Active::Paused { r } => (0..SERVERS.len())
            .map(|s| Resource::Link(r, s))
            .chain([Resource::Replica(r)])
            .collect(),
        Active::ServerDown { s } | Active::Latency { s } => BTreeSet::from([Resource::Server(s)]),
        Active::FailedOver { old, .. } => (0..replicas)
            .map(|r| Resource::Link(r, old))
            .chain((0..SERVERS.len()).map(Resource::Server))
            .collect(),
    }
}

fn apply(world: &mut World<'_>, active: Active) {
    match active {
        Active::Partition { r, s } => world.partition(r, s),
        Active::OneWay { r, s, to_server } => world.partition_oneway(r, s, to_server),
        Active::Hold { r, s } => world.hold(r, s),
        Active::Down { r } => world.crash(r),
        Active::SilentDeath { r } => {
            for s in 0..SERVERS.len() {
                world.partition(r, s);
            }
            world.crash(r);
        }
        Active::Stopped { r } => world.stop(r),
        Active::ServerDown { s } => world.server_crash(s),
        Active::FailedOver { old, partitioned } => {
            world.fail_over_to(1 - old);
            if partitioned {
                for r in 0..world.replicas.len() {
                    world.partition(r, old);
                }
            } else {
                world.server_crash(old);
            }
        }
        Active::Latency { .. } => {}
        Active::Ineligible { r } => world.set_eligible(r, false),
        Active::Paused { r } => world.pause(r),
        Active::Upgrading { r } => world.upgrade(r),
    }
}

fn heal(world: &mut World<'_>, active: Active) {
    match active {
        Active::Partition { r, s } => world.repair(r, s),
        Active::OneWay { r, s, to_server } => world.repair_oneway(r, s, to_server),
        Active::Hold { r, s } => world.release(r, s),
        Active::Down { r } | Active::Stopped { r } | Active::Upgrading { r } => world.bounce(r),
        Active::SilentDeath { r } => {
            for s in 0..SERVERS.len() {
                world.repair(r, s);
            }
            world.bounce(r);
        }
        Active::ServerDown { s } => world.server_restart(s),
        Active::FailedOver { old, partitioned } => {
            if partitioned {
                world.server_crash(old);
                for r in 0..world.replicas.len() {
                    world.repair(r, old);
                }
            }
            world.server_restart(old);
        }
        Active::Latency { s } => world.set_latency(s, Duration::ZERO),
        Active::Ineligible { r } => world.set_eligible(r, true),
        Active::Paused { r } => world.resume(r),
    }
}
