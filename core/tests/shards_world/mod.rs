//! An in-memory, virtual-time world of sharded elections: replicas, a model of PostgreSQL's
//! advisory locks (shared member lock, exclusive shard locks, sessions, `idle_session_timeout`)
//! and a model driver that answers each action after a latency, or never.
//!
//! The world checks, after every step:
//! - a term of a shard begins only while the replica's session holds the shard's lock;
//! - two replicas own one shard at once only while one of them has lost its session and has not
//!   noticed yet, for at most the detection bound (two intervals plus the largest latency);
//! - every term ends exactly once, and a finished run owns nothing.
#![allow(dead_code)] // reason: each test binary uses a different part of the world

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use plexsphere_leader_core::invariants::Input;
use plexsphere_leader_core::invariants::shards::ShardChecker;
use plexsphere_leader_core::rank::{FloorStep, Version};
use plexsphere_leader_core::shards::{
    MemberId, Shard, ShardAction, ShardEvent, ShardOptions, ShardedElection, Standing, Survey,
};
use plexsphere_leader_core::{CheckInterval, ConnId, TermEndCause, TermId};

/// The check interval of the world.
pub(crate) const I: Duration = Duration::from_millis(100);

type Cause = &'static str;

/// A server session: `(replica slot, incarnation, connection)`.
pub(crate) type Sid = (usize, u32, ConnId);

#[derive(Debug, Clone)]
struct ServerSession {
    pid: i32,
    last_active: Instant,
    idle_limit: Option<Duration>,
}

/// The model server.
#[derive(Debug, Default)]
pub(crate) struct Server {
    sessions: BTreeMap<Sid, ServerSession>,
    members: BTreeSet<Sid>,
    /// Holder of each shard.
    pub(crate) shards: Vec<Option<Sid>>,
    /// The fencing epoch of each shard (the fence table).
    epochs: Vec<u64>,
    next_pid: i32,
    /// What each member session published as it joined.
    standings: BTreeMap<Sid, Standing>,
    /// The space's version floor (the floor table's row).
    pub(crate) floor: Option<Version>,
}

impl Server {
    fn pid(&self, sid: Sid) -> Option<i32> {
        self.sessions.get(&sid).map(|s| s.pid)
    }

    fn end_session(&mut self, sid: Sid) {
        self.sessions.remove(&sid);
        self.members.remove(&sid);
        self.standings.remove(&sid);
        for holder in &mut self.shards {
            if *holder == Some(sid) {
                *holder = None;
            }
        }
    }

    /// The join's step on the floor, as the register statement runs it.
    fn step_floor(&mut self, step: FloorStep) {
        match step {
            FloorStep::Off | FloorStep::Read => {}
            FloorStep::Raise(version) => {
                self.floor = Some(self.floor.map_or(version, |floor| floor.max(version)));
            }
            FloorStep::Set(version) => self.floor = Some(version),
        }
    }

    fn survey(&self, sid: Sid, reads_floor: bool) -> Survey {
        let pid = self.sessions[&sid].pid;
        let mut rows: BTreeMap<i32, (bool, Vec<u32>)> = BTreeMap::new();
        for m in &self.members {
            rows.entry(self.sessions[m].pid).or_default().0 = true;
        }
        for (s, holder) in (0u32..).zip(&self.shards) {
            if let Some(h) = holder {
                rows.entry(self.sessions[h].pid).or_default().1.push(s);
            }
        }
        Survey::new(
            u32::try_from(self.shards.len()).expect("small"),
            MemberId::new(pid),
            rows.into_iter()
                .map(|(p, (member, shards))| (MemberId::new(p), member, shards)),
        )
        .expect("the model holds each shard once")
        .with_standings(
            self.standings
                .iter()
                .map(|(sid, standing)| (MemberId::new(self.sessions[sid].pid), *standing)),
        )
        .with_floor(if reads_floor { self.floor } else { None })
    }
}

/// One replica slot: the current incarnation's election and its bookkeeping.
pub(crate) struct Replica {
    pub(crate) election: Option<ShardedElection<Cause>>,
    incarnation: u32,
    /// The session the driver holds for the election, if any.
    session: Option<ConnId>,
    /// Open terms, by shard.
    pub(crate) owned: BTreeMap<Shard, TermId>,
    /// The next reply is lost.
    pub(crate) lose_next: bool,
    /// Latency of every answer.
    pub(crate) latency: Duration,
    /// The run ended with a failure.
    pub(crate) failed: bool,
    /// The core's trace checker of the current incarnation.
    checker: ShardChecker,
}

/// The world.
pub(crate) struct World {
    pub t0: Instant,
    pub(crate) now: Instant,
    pub(crate) options: ShardOptions,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) server: Server,
    /// Completions in flight: (time, sequence, slot, incarnation, event).
    pending: Vec<(Instant, u64, usize, u32, ShardEvent<Cause>)>,
    seq: u64,
    /// Since when a replica has owned a shard its session no longer holds: (slot, shard) → t.
    unproven: BTreeMap<(usize, Shard), Instant>,
    /// Shards handed from one replica to another, counted at each grant.
    pub(crate) moves: u64,
    /// The last holder slot of each shard, for counting moves.
    last_owner: BTreeMap<Shard, usize>,
    /// The epoch of each open fenced term, by (replica slot, term).
    term_epochs: BTreeMap<(usize, TermId), u64>,
    /// The options of replicas started with their own (a rollout's new version), by slot.
    pub(crate) own_options: BTreeMap<usize, ShardOptions>,
    /// The largest latency a case uses.
    pub(crate) max_latency: Duration,
    /// Closes that do not reach the server (the session lingers until its idle timeout).
    pub(crate) silent_closes: bool,
    /// Every `ReportOverdueWork`: (replica, incarnation, term).
    pub(crate) overdue: BTreeSet<(usize, u32, TermId)>,
}

impl World {
    pub(crate) fn new(
        replicas: usize,
        shards: u32,
        options: impl Fn(ShardOptions) -> ShardOptions,
    ) -> Self {
        let t0 = Instant::now();
        let base = ShardOptions::new(CheckInterval::new(I).expect("valid"), shards).expect("valid");
        Self {
            t0,
            now: t0,
            options: options(base),
            replicas: (0..replicas)
                .map(|_| Replica {
                    election: None,
                    incarnation: 0,
                    session: None,
                    owned: BTreeMap::new(),
                    lose_next: false,
                    latency: Duration::from_millis(1),
                    failed: false,
                    checker: ShardChecker::default(),
                })
                .collect(),
            server: Server {
                shards: vec![None; shards as usize],
                epochs: vec![0; shards as usize],
                next_pid: 1000,
                ..Server::default()
            },
            pending: Vec::new(),
            seq: 0,
            unproven: BTreeMap::new(),
            moves: 0,
            last_owner: BTreeMap::new(),
            term_epochs: BTreeMap::new(),
            own_options: BTreeMap::new(),
            max_latency: Duration::from_millis(1),
            silent_closes: false,
            overdue: BTreeSet::new(),
        }
    }

    /// Starts replica `r` (a new incarnation) unless it runs.
    pub(crate) fn start(&mut self, r: usize) {
        if self.replicas[r].election.is_some() {
            return;
        }
        let mut election = ShardedElection::new(self.options_of(r));
        election.start(self.now).expect("not running");
        let replica = &mut self.replicas[r];
        replica.incarnation += 1;
        replica.election = Some(election);
        replica.failed = false;
        replica.checker = ShardChecker::default();
        self.perform(r, Input::Start { accepted: true });
    }

    /// The options replica `r` starts with: its own, else the world's.
    pub(crate) fn options_of(&self, r: usize) -> ShardOptions {
        self.own_options.get(&r).copied().unwrap_or(self.options)
    }

    /// Feeds `event` to replica `r` now.
    pub(crate) fn feed(&mut self, r: usize, event: impl Into<ShardEvent<Cause>>) {
        let event = event.into();
        let now = self.now;
        if let Some(e) = self.replicas[r].election.as_mut() {
            let handled = e.handle_event(now, event.clone());
            let input = Input::Event {
                event: &event,
                handled,
            };
            self.perform(r, input);
        }
    }

    /// The process of replica `r` dies: the server sees its connection close at once.
    pub(crate) fn crash(&mut self, r: usize) {
        let replica = &mut self.replicas[r];
        if replica.election.take().is_none() {
            return;
        }
        let inc = replica.incarnation;
        replica.owned.clear();
        replica.session = None;
        let sids: Vec<Sid> = self
            .server
            .sessions
            .keys()
            .filter(|(slot, i, _)| *slot == r && *i == inc)
            .copied()
            .collect();
        for sid in sids {
            self.server.end_session(sid);
        }
        self.unproven.retain(|(slot, _), _| *slot != r);
    }

    /// The server terminates replica `r`'s session (`pg_terminate_backend`).
    pub(crate) fn terminate(&mut self, r: usize) {
        let replica = &self.replicas[r];
        let Some(conn) = replica.session else { return };
        let sid = (r, replica.incarnation, conn);
        if self.server.sessions.contains_key(&sid) {
            self.server.end_session(sid);
            self.reply(r, ShardEvent::SessionEnded { conn });
        }
    }

    fn sid(&self, r: usize, conn: ConnId) -> Sid {
        (r, self.replicas[r].incarnation, conn)
    }

    fn reply(&mut self, r: usize, event: ShardEvent<Cause>) {
        let replica = &mut self.replicas[r];
        if replica.lose_next
            && event.conn().is_some()
            && !matches!(event, ShardEvent::SessionEnded { .. })
        {
            replica.lose_next = false;
            return;
        }
        self.seq += 1;
        self.pending.push((
            self.now + replica.latency,
            self.seq,
            r,
            replica.incarnation,
            event,
        ));
    }

    /// Performs what replica `r`'s election queued in answer to `input`, after the core's
    /// trace checker passed the step.
    fn perform(&mut self, r: usize, input: Input<'_, ShardEvent<Cause>>) {
        let replica = &mut self.replicas[r];
        let Some(election) = replica.election.as_mut() else {
            return;
        };
        let actions: Vec<ShardAction<Cause>> =
            std::iter::from_fn(|| election.poll_action()).collect();
        let next = election.poll_timeout();
        if let Err(violation) = replica.checker.check(self.now, input, &actions, next) {
            panic!("replica {r}: {violation}: {actions:?}");
        }
        for action in actions {
            self.act(r, action);
        }
    }

    /// Runs a statement's server side: `None` when the session is gone.
    fn on_server(&mut self, sid: Sid) -> Option<i32> {
        let now = self.now;
        let session = self.server.sessions.get_mut(&sid)?;
        session.last_active = now;
        Some(session.pid)
    }

    fn act(&mut self, r: usize, action: ShardAction<Cause>) {
        if std::env::var("SHARD_TRACE").is_ok() {
            eprintln!("{:>6?} r{r} {action:?}", self.now - self.t0);
        }
        match action {
            // The exclusion proof (off in this world's options): a lock that excludes.
            ShardAction::ProbePool { conn, .. } => {
                let base = i32::try_from(r).unwrap_or(0) * 2;
                let proof = plexsphere_leader_core::proof::PoolProof::excluding(base, base + 1);
                self.reply(r, ShardEvent::PoolProbed { conn, proof });
            }
            ShardAction::AcquireSession { conn } => {
                let sid = self.sid(r, conn);
                self.server.next_pid += 1;
                let pid = self.server.next_pid;
                self.server.sessions.insert(
                    sid,
                    ServerSession {
                        pid,
                        last_active: self.now,
                        idle_limit: None,
                    },
                );
                self.replicas[r].session = Some(conn);
                self.reply(r, ShardEvent::Acquired { conn });
            }
            ShardAction::Register {
                conn,
                idle_session_timeout_ms,
            } => {
                let sid = self.sid(r, conn);
                let Some(pid) = self.on_server(sid) else {
                    return self.failed(r, conn);
                };
                self.server.members.insert(sid);
                let standing = self.options_of(r).standing();
                self.server.standings.insert(sid, standing);
                if let Some(s) = self.server.sessions.get_mut(&sid) {
                    s.idle_limit = Some(Duration::from_millis(idle_session_timeout_ms.into()));
                }
                let members = u32::try_from(self.server.members.len()).expect("small");
                self.reply(
                    r,
                    ShardEvent::Registered {
                        conn,
                        backend: MemberId::new(pid),
                        granted: true,
                        lock_capacity: 1 << 20,
                        members,
                    },
                );
            }
            ShardAction::Detach { .. } => {}
            ShardAction::RegisterMember { .. }
            | ShardAction::RenewMember { .. }
            | ShardAction::TakeLeases { .. } => {
                unreachable!("this world holds its spaces with advisory locks")
            }
            ShardAction::Survey { conn, floor } => {
                let sid = self.sid(r, conn);
                if self.on_server(sid).is_none() {
                    return self.failed(r, conn);
                }
                self.server.step_floor(floor);
                let survey = self.server.survey(sid, floor != FloorStep::Off);
                self.reply(r, ShardEvent::Surveyed { conn, survey });
            }
            ShardAction::Take { conn, shards } => {
                let sid = self.sid(r, conn);
                if self.on_server(sid).is_none() {
                    return self.failed(r, conn);
                }
                let mut granted = Vec::new();
                for s in shards {
                    let slot = &mut self.server.shards[s.get() as usize];
                    if slot.is_none() || *slot == Some(sid) {
                        *slot = Some(sid);
                        granted.push(s);
                    }
                }
                self.reply(r, ShardEvent::Took { conn, granted });
            }
            ShardAction::AdvanceEpochs { conn, shards, .. } => {
                let sid = self.sid(r, conn);
                if self.on_server(sid).is_none() {
                    return self.failed(r, conn);
                }
                let epochs = shards
                    .into_iter()
                    .map(|s| {
                        let epoch = &mut self.server.epochs[s.get() as usize];
                        *epoch += 1;
                        (s, *epoch)
                    })
                    .collect();
                self.reply(r, ShardEvent::EpochsAdvanced { conn, epochs });
            }
            ShardAction::Unlock { conn, shards } => {
                let sid = self.sid(r, conn);
                if self.on_server(sid).is_none() {
                    return self.failed(r, conn);
                }
                let mut not_held = Vec::new();
                for s in shards {
                    let slot = &mut self.server.shards[s.get() as usize];
                    if *slot == Some(sid) {
                        *slot = None;
                    } else {
                        not_held.push(s);
                    }
                }
                self.reply(r, ShardEvent::Unlocked { conn, not_held });
            }
            ShardAction::UnlockAll { conn } => {
                let sid = self.sid(r, conn);
                if self.on_server(sid).is_none() {
                    return self.failed(r, conn);
                }
                self.server.members.remove(&sid);
                for holder in &mut self.server.shards {
                    if *holder == Some(sid) {
                        *holder = None;
                    }
                }
                self.reply(r, ShardEvent::UnlockedAll { conn });
            }
            ShardAction::CloseSession { conn } => {
                let sid = self.sid(r, conn);
                if !self.silent_closes {
                    self.server.end_session(sid);
                }
                if self.replicas[r].session == Some(conn) {
                    self.replicas[r].session = None;
                }
            }
            ShardAction::BeginTerm { shard, term, epoch } => {
                // With fencing every term has an epoch; `check` holds that at most one believed
                // owner of a shard has its current epoch.
                assert_eq!(
                    epoch.is_some(),
                    self.options.is_fencing(),
                    "epoch {epoch:?}"
                );
                if let Some(epoch) = epoch {
                    self.term_epochs.insert((r, term), epoch);
                }
                let sid = self.replicas[r]
                    .session
                    .map(|c| self.sid(r, c))
                    .expect("a term begins on a session");
                // The grant's answer may arrive after the session ended (the detection delay
                // that `check` bounds); a live session must hold the lock.
                assert!(
                    self.server.shards[shard.get() as usize] == Some(sid)
                        || !self.server.sessions.contains_key(&sid),
                    "replica {r} began a term of shard {shard} its live session does not hold"
                );
                let previous = self.replicas[r].owned.insert(shard, term);
                assert!(
                    previous.is_none(),
                    "two open terms of shard {shard} on replica {r}"
                );
                if let Some(&from) = self.last_owner.get(&shard)
                    && from != r
                {
                    self.moves += 1;
                }
                self.last_owner.insert(shard, r);
            }
            ShardAction::EndTerm { shard, term, cause } => {
                let open = self.replicas[r].owned.remove(&shard);
                assert_eq!(
                    open,
                    Some(term),
                    "replica {r} ended a term of {shard} it did not open"
                );
                if cause == TermEndCause::HandedOver {
                    // A handover ends the term while the session still holds the lock.
                    let sid = self.replicas[r].session.map(|c| self.sid(r, c));
                    assert!(
                        self.server.shards[shard.get() as usize] == sid
                            || sid.is_none_or(|sid| !self.server.sessions.contains_key(&sid)),
                        "replica {r} handed shard {shard} over without holding it"
                    );
                }
                self.unproven.remove(&(r, shard));
            }
            ShardAction::AwaitWork { term } => {
                let replica = &self.replicas[r];
                self.seq += 1;
                let delay = Duration::from_millis(self.seq % 150);
                self.pending.push((
                    self.now + delay,
                    self.seq,
                    r,
                    replica.incarnation,
                    ShardEvent::WorkDrained { term },
                ));
            }
            ShardAction::ReportOverdueWork { term, .. } => {
                let replica = &self.replicas[r];
                assert!(
                    !replica.owned.values().any(|owned| *owned == term),
                    "replica {r} reported the work of its open term {term} as overdue"
                );
                let first = self.overdue.insert((r, replica.incarnation, term));
                assert!(first, "replica {r} reported term {term} overdue twice");
            }
            ShardAction::Log(_) => {}
            ShardAction::Fail(_) => self.replicas[r].failed = true,
            ShardAction::Finish => {
                let replica = &mut self.replicas[r];
                assert!(
                    replica.owned.is_empty(),
                    "replica {r} finished owning shards"
                );
                replica.election = None;
                replica.session = None;
            }
        }
    }

    fn failed(&mut self, r: usize, conn: ConnId) {
        self.reply(
            r,
            ShardEvent::StatementFailed {
                conn,
                cause: "session gone",
                session_ended: true,
            },
        );
    }

    /// Advances virtual time by `by`, delivering completions and timeouts in order.
    pub(crate) fn advance(&mut self, by: Duration) {
        let until = self.now + by;
        loop {
            let next_reply = self.pending.iter().map(|p| (p.0, p.1)).min();
            let next_timer = self
                .replicas
                .iter()
                .enumerate()
                .filter_map(|(r, rep)| Some((rep.election.as_ref()?.poll_timeout()?, r)))
                .min();
            let next_idle = self
                .server
                .sessions
                .iter()
                .filter_map(|(sid, s)| Some((s.last_active + s.idle_limit?, *sid)))
                .min();
            let next = [
                next_reply.map(|x| x.0),
                next_timer.map(|x| x.0),
                next_idle.map(|x| x.0),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(t) = next.filter(|t| *t <= until) else {
                self.now = until;
                self.check();
                return;
            };
            self.now = self.now.max(t);
            if let Some((at, sid)) = next_idle
                && at <= self.now
            {
                // The server ends a session idle for longer than its timeout.
                let (r, inc, conn) = sid;
                self.server.end_session(sid);
                if self.replicas[r].incarnation == inc && self.replicas[r].session == Some(conn) {
                    self.reply(r, ShardEvent::SessionEnded { conn });
                }
            } else if let Some((at, seq)) = next_reply
                && at <= self.now
            {
                let index = self
                    .pending
                    .iter()
                    .position(|p| p.1 == seq)
                    .expect("present");
                let (_, _, r, inc, event) = self.pending.swap_remove(index);
                if self.replicas[r].incarnation == inc {
                    self.feed(r, event);
                }
            } else if let Some((_, r)) = next_timer {
                let now = self.now;
                if let Some(e) = self.replicas[r].election.as_mut() {
                    e.handle_timeout(now);
                    self.perform(r, Input::Timeout);
                }
            }
            self.check();
        }
    }

    /// The cross-replica checks.
    fn check(&mut self) {
        // Fencing: of the replicas that believe they own a shard, at most one holds the shard's
        // current epoch (a stale owner's fenced writes are rejected).
        let mut current: BTreeMap<Shard, usize> = BTreeMap::new();
        for (r, replica) in self.replicas.iter().enumerate() {
            for (&shard, &term) in &replica.owned {
                if self.term_epochs.get(&(r, term))
                    == Some(&self.server.epochs[shard.get() as usize])
                {
                    let holders = current.entry(shard).or_default();
                    *holders += 1;
                    assert!(
                        *holders <= 1,
                        "two owners of shard {shard} hold its current epoch"
                    );
                }
            }
        }
        let bound = 2 * I + 2 * self.max_latency + Duration::from_millis(1);
        for (r, replica) in self.replicas.iter().enumerate() {
            let sid = replica.session.map(|c| (r, replica.incarnation, c));
            for &shard in replica.owned.keys() {
                let held = sid.is_some() && self.server.shards[shard.get() as usize] == sid;
                if held {
                    self.unproven.remove(&(r, shard));
                } else {
                    let since = *self.unproven.entry((r, shard)).or_insert(self.now);
                    assert!(
                        self.now - since <= bound,
                        "replica {r} owned shard {shard} without its lock for {:?} (bound {bound:?})",
                        self.now - since
                    );
                }
            }
        }
    }

    /// The replicas whose session holds the member lock, with the shards they own.
    pub(crate) fn loads(&self) -> Vec<(usize, usize)> {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(r, rep)| {
                rep.session
                    .is_some_and(|c| self.server.members.contains(&(*r, rep.incarnation, c)))
            })
            .map(|(r, rep)| (r, rep.owned.len()))
            .collect()
    }

    /// Whether every shard is owned and every member owns ⌊K/R⌋ or ⌈K/R⌉ shards.
    pub(crate) fn balanced(&self) -> bool {
        let loads = self.loads();
        let k = self.server.shards.len();
        let live: BTreeSet<Sid> = self
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(r, rep)| Some((r, rep.incarnation, rep.session?)))
            .collect();
        if loads.is_empty() || self.server.members != live {
            // A member session that is not a replica's current one (a close that never reached
            // the server) still counts in every survey until the server ends it.
            return false;
        }
        // A member below the version floor owns nothing; the others share the space.
        let (below, owning): (Vec<_>, Vec<_>) =
            loads.iter().partition(|(r, _)| self.is_below_floor(*r));
        if owning.is_empty() || below.iter().any(|(_, n)| *n > 0) {
            return false;
        }
        let (lo, hi) = (k / owning.len(), k.div_ceil(owning.len()));
        owning.iter().all(|(_, n)| *n >= lo && *n <= hi)
            && owning.iter().map(|(_, n)| n).sum::<usize>() == k
    }

    /// Whether replica `r`'s member session is below the space's version floor, as every
    /// survey shows it.
    pub(crate) fn is_below_floor(&self, r: usize) -> bool {
        let replica = &self.replicas[r];
        let Some(sid) = replica.session.map(|c| (r, replica.incarnation, c)) else {
            return false;
        };
        self.server
            .standings
            .get(&sid)
            .is_some_and(|standing| standing.is_below(self.server.floor))
    }

    /// Whether every member owns exactly its cap (`shards::caps` of the membership): the steady
    /// state, in which nothing moves any more. Implies [`balanced`](Self::balanced).
    pub(crate) fn settled(&self) -> bool {
        if !self.balanced() {
            return false;
        }
        let Some(sid) = self.server.members.iter().next().copied() else {
            return false;
        };
        let survey = self.server.survey(sid, true);
        let caps = plexsphere_leader_core::shards::caps(&survey);
        self.loads().iter().all(|(r, n)| {
            let replica = &self.replicas[*r];
            let pid = replica
                .session
                .and_then(|c| self.server.pid((*r, replica.incarnation, c)));
            caps.iter()
                .any(|(m, cap)| Some(m.get()) == pid && *cap as usize == *n)
        })
    }

    /// Locks held by a session whose replica has no open term or handover for them.
    pub(crate) fn stranded(&self) -> Vec<Shard> {
        (0u32..)
            .zip(&self.server.shards)
            .filter_map(|(s, holder)| {
                let (r, inc, conn) = (*holder)?;
                let replica = &self.replicas[r];
                let shard = Shard::new(s);
                let accounted = replica.incarnation == inc
                    && replica.session == Some(conn)
                    && replica.election.as_ref().is_some_and(|e| {
                        e.term_of(shard).is_some() || e.handing_over().contains(&shard)
                    });
                (!accounted).then_some(shard)
            })
            .collect()
    }
}
