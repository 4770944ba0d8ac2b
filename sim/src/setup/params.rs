//! The timing of a simulated run, and the bounds of design.md section 6 derived from it.

use std::time::Duration;

use plexsphere_leader::config::UNLOCK_BUDGET;

/// The timing of one simulated run. [`Params::default`] is what the CLI and CI use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The elector's check interval, I.
    pub interval: Duration,
    /// How much simulated time one turmoil step advances; every observation is made between
    /// steps, so this is the resolution of every measurement.
    pub tick: Duration,
    /// The largest one-way network latency (turmoil draws each message's latency between one
    /// tick and this).
    pub max_latency: Duration,
    /// The longest unit of leader work, T: the simulated service runs ticks of up to this long
    /// that do not look at their term's token.
    pub longest_work: Duration,
    /// How often the simulated service asks for a unit of leader work.
    pub work_period: Duration,
    /// Fencing runs: how long a fenced unit of work may take, from its start to its commit's
    /// answer, before the service gives up on it and closes its connection.
    pub fenced_budget: Duration,
    /// Fencing runs: the `idle_in_transaction_session_timeout` a fenced transaction sets
    /// (`SET LOCAL`), which bounds how long a cut-off leader's transaction can hold the fence
    /// row (and so hold back the next leader's epoch advance).
    pub fenced_idle_timeout: Duration,
    /// How long the nemesis injects faults.
    pub fault_phase: Duration,
    /// How long the liveness phase lasts: faults healed, a leader must appear and stay.
    pub liveness_phase: Duration,
    /// How long the final graceful stop of every replica may take (the unlock budget and a
    /// margin).
    pub stop_budget: Duration,
}

impl Default for Params {
    /// I = 100 ms, ticks of 1 ms, latency up to 5 ms, work units up to I/4 every I/2 (fenced
    /// ones within I, their transactions idle at most I/2), 40 I of faults, 12 I of liveness,
    /// and the 2 s unlock budget plus 10 I to stop.
    fn default() -> Self {
        let interval = Duration::from_millis(100);
        Self {
            interval,
            tick: Duration::from_millis(1),
            max_latency: Duration::from_millis(5),
            longest_work: interval / 4,
            work_period: interval / 2,
            fenced_budget: interval,
            fenced_idle_timeout: interval / 2,
            fault_phase: interval * 40,
            liveness_phase: interval * 12,
            stop_budget: UNLOCK_BUDGET + interval * 10,
        }
    }
}

impl Params {
    /// The longest round trip: two messages of at most `max_latency`, each delivered at the
    /// step after it is due.
    pub fn round_trip(&self) -> Duration {
        2 * (self.max_latency + self.tick)
    }

    /// The round trips a standby's check may need when the lock is free: a TCP connect, the
    /// PostgreSQL startup, the grant statement and its answer. Four round trips, plus four
    /// ticks for timers that tokio rounds up to the millisecond.
    pub fn margin(&self) -> Duration {
        4 * self.round_trip() + 4 * self.tick
    }

    /// What an observation made between steps can add to a duration: the observer's step and
    /// tokio's rounding of timers to the millisecond.
    pub fn slack(&self) -> Duration {
        3 * self.tick.max(Duration::from_millis(1))
    }

    /// Largest overlap of two replicas acting as leader: 2·I + T (+ slack).
    pub fn overlap_bound(&self) -> Duration {
        2 * self.interval + self.longest_work + self.slack()
    }

    /// Largest delay between losing the lock's session and ending the term: 2·I (+ slack).
    pub fn detection_bound(&self) -> Duration {
        2 * self.interval + self.slack()
    }

    /// Lease runs: the lease's TTL, the adapter's default of
    /// [`LEASE_TTL_INTERVALS`](plexsphere_leader_core::LEASE_TTL_INTERVALS) (3) intervals.
    pub fn lease_ttl(&self) -> Duration {
        self.interval * plexsphere_leader_core::LEASE_TTL_INTERVALS
    }

    /// Lease runs: the longest a crashed or cut-off leader keeps the election without a
    /// leader, from the arrival of its last renewal: the TTL, then a standby's claim within the
    /// gap bound (I + margin).
    pub fn lease_handover_bound(&self) -> Duration {
        self.lease_ttl() + self.gap_bound()
    }

    /// Rollout runs: the ranked election's window W, the adapter's default of two intervals
    /// (`Config::preempt_window`): a better candidate is live W before the leader yields, and
    /// a leader leads W before it yields.
    pub fn preempt_window(&self) -> Duration {
        2 * self.interval
    }

    /// Rollout runs: the longest a standby defers to a better candidate, W + 2·I
    /// (`Options::defer_limit`: a candidacy stays live two intervals after its last survey).
    pub fn defer_limit(&self) -> Duration {
        self.preempt_window() + 2 * self.interval
    }

    /// Largest idle period of a session that holds the lock: 4·I (+ slack).
    pub fn orphan_bound(&self) -> Duration {
        4 * self.interval + self.slack()
    }

    /// Largest leaderless gap while the lock is free and a healthy standby exists: I + margin.
    pub fn gap_bound(&self) -> Duration {
        self.interval + self.margin()
    }

    /// [`Params::gap_bound`] of a run whose standbys probe their fitness before they try
    /// (`probing`: a fitness run): one statement more, so one round trip more.
    pub fn gap_bound_of(&self, probing: bool) -> Duration {
        let probe = if probing {
            self.round_trip()
        } else {
            Duration::ZERO
        };
        self.gap_bound() + probe
    }

    /// How long after the faults stop a leader must exist: an orphaned lock ends within 4·I,
    /// a standby cleans up within 3·I (see [`Params::disturbance_tail`]) and then checks within
    /// one I: 6·I + margin, with one I to spare.
    pub fn liveness_bound(&self) -> Duration {
        6 * self.interval + self.margin()
    }

    /// How long a fault still disturbs a replica's checks after it healed: a check in flight
    /// may take up to 2·I (acquire and grant statement are each bounded by one I), and the one
    /// after it may still find a wedged pooled connection and spend one more I on it.
    pub fn disturbance_tail(&self) -> Duration {
        3 * self.interval
    }

    /// How long a replica's first connection setup may be kept when a fault meets it: the
    /// elector keeps a setup its check gave up on for the next check, and bounds one of a
    /// source that never had a connection by twice the longer of the check's wait (I) and an
    /// unproven setup's second (`session::setup`'s `RESUME_FACTOR` × `UNPROVEN_SETUP`): 2 s
    /// at the simulation's intervals, whatever I. Before its first connection, a replica
    /// has no evidence of what a setup takes.
    pub fn first_setup_bound(&self) -> Duration {
        2 * self.interval.max(Duration::from_secs(1))
    }

    /// How long after every fault healed and every replica is up a sharded deployment of
    /// `shards` shards over `replicas` replicas must be balanced (every replica owns ⌊K/R⌋ or
    /// ⌈K/R⌉ shards, every shard owned), with `moves` the elector's move limit per interval:
    ///
    /// - 4·I: a member session cut off without FIN/RST (a ghost) holds its member lock, and
    ///   its shards, until `idle_session_timeout` ends it (a restarted server instead makes a
    ///   cold start: a reconnect within I and the cold-start delay of one I, less than 4·I);
    /// - I: every member's next survey sees the ghost gone (or the last member join);
    /// - I: the rebalance delay, a stable membership before shards move for balance;
    /// - ⌈(K − ⌊K/R⌋) / moves⌉ · I: the rounds of hand-overs, at most `moves` shards per giver
    ///   and interval, for the largest excess one replica can hold (all K but its share);
    /// - T + I: the last round's work drains, the unlock, and the taker's next survey and take;
    /// - the margin's round trips.
    pub fn balance_bound(&self, shards: u32, replicas: usize, moves: u32) -> Duration {
        let replicas = u32::try_from(replicas.max(1)).unwrap_or(u32::MAX);
        let excess = shards - shards / replicas;
        let rounds = excess.div_ceil(moves.max(1));
        (7 + rounds) * self.interval + self.longest_work + self.margin()
    }

    /// The whole simulated time a run may take.
    pub fn total(&self) -> Duration {
        self.fault_phase + self.liveness_phase + self.stop_budget
    }
}
