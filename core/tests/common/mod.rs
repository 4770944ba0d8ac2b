//! An in-memory, virtual-time world: N elections, a model of PostgreSQL's lock table, and a
//! model driver that answers each action after a per-replica latency. Every step is checked with
//! the crate's invariant checker, and the cross-replica bounds are checked between steps.
#![allow(dead_code)] // reason: each test binary uses a different part of the world

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use plexsphere_leader_core::invariants::{Checker, Input};
use plexsphere_leader_core::rank::{Candidate, FloorStep, Rank, Version};
use plexsphere_leader_core::{
    AcquireMode, Action, CheckInterval, ConnId, Election, Event, LockCheck, Options,
};

/// The check interval of the world.
pub(crate) const I: Duration = Duration::from_millis(100);

/// A driver error.
pub(crate) type Cause = &'static str;

/// One replica: an election, its checker, and the model driver's state.
pub(crate) struct Replica {
    pub(crate) election: Election<Cause>,
    checker: Checker,
    /// Latency of every answer this replica gets.
    pub(crate) latency: Duration,
    /// The next answer is lost (no completion ever comes).
    pub(crate) lose_next_reply: bool,
    /// The next operation fails with an error.
    pub(crate) fail_next: bool,
    /// Lease statements neither reach the server nor answer (a partition).
    pub(crate) partitioned: bool,
    /// The server refuses this replica's fitness probe (a missing privilege).
    pub(crate) unfit: bool,
    /// The connection the replica leads on, as the model driver saw it.
    lock_conn: Option<ConnId>,
    /// Number of terms begun.
    pub(crate) terms: u64,
    /// When the current or last term began.
    pub(crate) began_at: Option<Instant>,
    /// Runs started: with the replica's index, a lease holder's identity.
    runs: u64,
    /// The version floor this replica's last survey found.
    surveyed_floor: Option<Version>,
    /// The epoch of the open lease term.
    lease_epoch: Option<u64>,
}

/// The model lease row (lease mechanism).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRow {
    /// The holder: a replica and its run.
    pub(crate) holder: (usize, u64),
    pub(crate) epoch: u64,
    pub(crate) expires: Instant,
}

/// The model server: which session holds the lock, which sessions are open.
#[derive(Default)]
pub(crate) struct Server {
    /// The session holding the lock and when it was granted.
    pub(crate) holder: Option<((usize, ConnId), Instant)>,
    open: BTreeMap<(usize, ConnId), ()>,
    /// Sessions that held the lock when they ended, and when they ended.
    lost: BTreeMap<(usize, ConnId), Instant>,
    /// Sessions waiting in the lock queue (queued mode), first first, with the sequence number
    /// of the refusal their `lock_timeout` will deliver.
    waiters: Vec<((usize, ConnId), u64)>,
    /// The fencing epoch last handed out.
    pub(crate) epoch: u64,
    /// The lease row, once claimed.
    pub(crate) lease: Option<LeaseRow>,
    /// Each replica's published candidacy: its rank, since when it has been a candidate
    /// without a break, and its last survey (live while within [`CANDIDATE_FRESH`]).
    pub(crate) candidates: BTreeMap<usize, (Rank, Instant, Instant)>,
    /// The version floor: the newest version that has led.
    pub(crate) floor: Option<Version>,
}

/// How long a published candidacy stays live after its last survey: two intervals.
pub(crate) const CANDIDATE_FRESH: Duration = Duration::from_millis(2 * I.as_millis() as u64);

/// The world.
pub(crate) struct World {
    pub(crate) t0: Instant,
    pub(crate) now: Instant,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) server: Server,
    /// Completions in flight: (delivery time, sequence, replica, event). Never cancelled, so stale
    /// answers reach the elections too.
    pending: Vec<(Instant, u64, usize, Event<Cause>)>,
    seq: u64,
    /// How long a session granted the lock may go unled (an unanswered grant's budget).
    grant_budget: Duration,
    /// Whether the elections hold a lease.
    lease: bool,
    /// Terms begun by a replica older than the version floor the server held then.
    pub(crate) terms_below_floor: u64,
}

impl World {
    pub(crate) fn new(replicas: usize, latency: Duration) -> Self {
        Self::with_options(replicas, latency, options())
    }

    pub(crate) fn with_options(replicas: usize, latency: Duration, options: Options) -> Self {
        Self::with_each(latency, vec![options; replicas])
    }

    /// A world of one replica per entry of `options` (which may differ in their ranks only).
    pub(crate) fn with_each(latency: Duration, each: Vec<Options>) -> Self {
        let options = each[0];
        let t0 = Instant::now();
        let grant_budget = if options.acquire_mode() == AcquireMode::Queue {
            options.queued_grant_budget()
        } else {
            I
        };
        let replicas = each
            .into_iter()
            .map(|options| Replica {
                election: Election::with_options(options),
                checker: match options.lease_of() {
                    Some(lease) => Checker::new().for_lease(lease),
                    None => Checker::new(),
                },
                latency,
                lose_next_reply: false,
                fail_next: false,
                partitioned: false,
                unfit: false,
                lock_conn: None,
                terms: 0,
                began_at: None,
                runs: 0,
                surveyed_floor: None,
                lease_epoch: None,
            })
            .collect();
        Self {
            t0,
            now: t0,
            replicas,
            server: Server::default(),
            pending: Vec::new(),
            seq: 0,
            grant_budget,
            lease: options.lease_of().is_some(),
            terms_below_floor: 0,
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.now - self.t0
    }

    pub(crate) fn leaders(&self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&r| self.replicas[r].election.is_leader())
            .collect()
    }

    pub(crate) fn start(&mut self, r: usize) -> Result<(), String> {
        let accepted = self.replicas[r].election.start(self.now).is_ok();
        if accepted {
            self.replicas[r].runs += 1;
        }
        self.after_input(r, Input::Start { accepted })
    }

    pub(crate) fn event(&mut self, r: usize, event: impl Into<Event<Cause>>) -> Result<(), String> {
        let event = event.into();
        let handled = self.replicas[r]
            .election
            .handle_event(self.now, event.clone());
        self.after_input(
            r,
            Input::Event {
                event: &event,
                handled,
            },
        )
    }

    /// The server ends replica `r`'s newest session (pg_terminate_backend); the replica's
    /// driver notices the closed lock connection after its latency.
    pub(crate) fn terminate(&mut self, r: usize) {
        if let Some((_, conn)) = self.terminate_silently(r)
            && self.replicas[r].lock_conn == Some(conn)
        {
            let event = Event::SessionEnded {
                conn,
                cause: "terminated",
            };
            self.deliver(r, event);
        }
    }

    /// The server ends replica `r`'s newest session and the replica hears nothing (the FIN is
    /// lost: a partition).
    pub(crate) fn terminate_silently(&mut self, r: usize) -> Option<(usize, ConnId)> {
        let session = self
            .server
            .open
            .keys()
            .rev()
            .find(|(owner, _)| *owner == r)
            .copied()?;
        self.end_session(session);
        Some(session)
    }

    fn deliver(&mut self, r: usize, event: Event<Cause>) -> u64 {
        self.seq += 1;
        let at = self.now + self.replicas[r].latency;
        self.pending.push((at, self.seq, r, event));
        self.seq
    }

    /// Advances virtual time by `by`, firing every deadline and delivering every answer due on
    /// the way, in time order, checking the bounds after each step.
    pub(crate) fn advance(&mut self, by: Duration) -> Result<(), String> {
        let target = self.now + by;
        let mut budget = 100_000u32;
        loop {
            budget = budget.checked_sub(1).ok_or("livelock: too many steps")?;
            let next_timer = (0..self.replicas.len())
                .filter_map(|r| self.replicas[r].election.poll_timeout().map(|t| (t, r)))
                .min();
            let next_answer = self.pending.iter().map(|(t, seq, _, _)| (*t, *seq)).min();
            let step = match (next_timer, next_answer) {
                (Some((t, r)), Some((a, _))) if t <= a => Some((t, Some(r), None)),
                (_, Some((a, seq))) => Some((a, None, Some(seq))),
                (Some((t, r)), None) => Some((t, Some(r), None)),
                (None, None) => None,
            };
            match step {
                Some((at, timer, answer)) if at <= target => {
                    self.now = self.now.max(at);
                    if let Some(r) = timer {
                        self.replicas[r].election.handle_timeout(self.now);
                        self.after_input(r, Input::Timeout)?;
                    } else if let Some(seq) = answer {
                        let index = self.pending.iter().position(|p| p.1 == seq).ok_or("lost")?;
                        let (_, seq, r, event) = self.pending.remove(index);
                        self.server.waiters.retain(|(_, refusal)| *refusal != seq);
                        self.event(r, event)?;
                    }
                }
                _ => {
                    self.now = target;
                    return self.check_bounds();
                }
            }
        }
    }

    fn after_input(&mut self, r: usize, input: Input<'_, Event<Cause>>) -> Result<(), String> {
        let actions: Vec<_> =
            std::iter::from_fn(|| self.replicas[r].election.poll_action()).collect();
        let timeout = self.replicas[r].election.poll_timeout();
        let now = self.now;
        self.replicas[r]
            .checker
            .check(now, input, &actions, timeout)
            .map_err(|v| format!("replica {r}: {v}"))?;
        for action in actions {
            self.perform(r, action);
        }
        self.check_bounds()
    }

    /// The model driver and server.
    fn perform(&mut self, r: usize, action: Action<Cause>) {
        let replica = &mut self.replicas[r];
        if replica.partitioned
            && matches!(
                action,
                Action::ClaimLease { .. } | Action::RenewLease { .. } | Action::ReleaseLease { .. }
            )
        {
            return;
        }
        let fail = std::mem::take(&mut replica.fail_next);
        let answer = match action {
            Action::AcquireConnection { conn } if fail => Some(Event::AcquireFailed {
                conn,
                cause: "pool error",
            }),
            Action::AcquireConnection { conn } => {
                self.server.open.insert((r, conn), ());
                Some(Event::ConnectionAcquired { conn })
            }
            Action::ProbePool { conn, .. } if fail => Some(Event::AcquireFailed {
                conn,
                cause: "pool error",
            }),
            // The model server is reached directly: two held connections, two backends.
            Action::ProbePool { conn, .. } => {
                let base = i32::try_from(r).unwrap_or(i32::MAX / 4) * 1000 + 900_000;
                Some(Event::PoolProbed {
                    conn,
                    proof: plexsphere_leader_core::proof::PoolProof::excluding(base + 1, base + 2),
                })
            }
            Action::ProbeFitness { conn } if fail => Some(Event::ProbeFailed {
                conn,
                cause: "probe error",
            }),
            Action::ProbeFitness { conn } if replica.unfit => Some(Event::Unfit {
                conn,
                cause: "permission denied",
            }),
            Action::ProbeFitness { conn } => Some(Event::Fit { conn }),
            Action::SurveyCandidates { conn, .. } if fail => Some(Event::SurveyFailed {
                conn,
                cause: "survey error",
            }),
            Action::SurveyCandidates {
                conn,
                publish,
                floor,
            } => Some(self.survey(r, conn, publish, floor)),
            Action::TryLock { conn } if fail => Some(Event::LockQueryFailed {
                conn,
                cause: "query error",
            }),
            Action::TryLock { conn } => Some(self.try_lock(r, conn)),
            Action::WaitForLock { conn, .. } if fail => Some(Event::LockQueryFailed {
                conn,
                cause: "query error",
            }),
            Action::WaitForLock {
                conn,
                lock_timeout_ms,
            } => match self.try_lock(r, conn) {
                Event::LockRefused { conn } => {
                    // Queued: 55P03 when lock_timeout ends, unless granted first.
                    self.seq += 1;
                    let lock_timeout = Duration::from_millis(u64::from(lock_timeout_ms));
                    let at = self.now + lock_timeout + self.replicas[r].latency;
                    self.pending
                        .push((at, self.seq, r, Event::LockWaitTimedOut { conn }));
                    self.server.waiters.push(((r, conn), self.seq));
                    None
                }
                answer => Some(answer),
            },
            Action::ReleaseIfHeld { conn } if fail => Some(Event::LockQueryFailed {
                conn,
                cause: "release error",
            }),
            Action::ReleaseIfHeld { conn } => {
                let held = self.server.holder.is_some_and(|(s, _)| s == (r, conn));
                if held {
                    self.server.holder = None;
                    self.grant_next_waiter();
                }
                Some(Event::ReleasedIfHeld {
                    conn,
                    released: held,
                })
            }
            Action::AdvanceEpoch { conn, .. } if fail => Some(Event::EpochFailed {
                conn,
                cause: "fence error",
            }),
            Action::AdvanceEpoch { conn, .. } => {
                self.server.epoch += 1;
                Some(Event::EpochAdvanced {
                    conn,
                    epoch: self.server.epoch,
                })
            }
            // A failure here stands for work that ignores its cancelled token.
            Action::AwaitWork { .. } if fail => None,
            Action::AwaitWork { term } => Some(Event::WorkDrained { term }),
            Action::ReturnToPool { conn } => {
                // Back in the pool: the session lives on but is no longer the election's.
                self.server.open.remove(&(r, conn));
                None
            }
            Action::Hijack { conn, .. } => {
                self.replicas[r].lock_conn = Some(conn);
                None
            }
            Action::Ping { conn, .. } if fail => Some(Event::PingFailed {
                conn,
                cause: "ping error",
            }),
            Action::Ping { conn, .. } => Some(if self.server.open.contains_key(&(r, conn)) {
                let holds_lock = self.server.holder.is_some_and(|(s, _)| s == (r, conn));
                Event::PingAnswered {
                    conn,
                    found: LockCheck {
                        holds_lock,
                        ..LockCheck::holding(backend_pid(r, conn))
                    },
                }
            } else {
                Event::PingFailed {
                    conn,
                    cause: "connection closed",
                }
            }),
            Action::Unlock { conn } if fail => Some(Event::UnlockFailed {
                conn,
                cause: "unlock error",
            }),
            Action::Unlock { conn } => {
                let held = self.server.holder.is_some_and(|(s, _)| s == (r, conn));
                if held {
                    self.server.holder = None;
                    self.grant_next_waiter();
                }
                Some(Event::UnlockDone {
                    conn,
                    released: held,
                })
            }
            Action::CloseConnection { conn } => {
                self.end_session((r, conn));
                if self.replicas[r].lock_conn == Some(conn) {
                    self.replicas[r].lock_conn = None;
                }
                None
            }
            Action::BeginTerm { epoch, .. } => {
                // Below the floor its own last survey found (a grant already queued for when
                // another leader raised the floor is the leader's survey's to end).
                let options = self.replicas[r].election.options();
                let seen = self.replicas[r].surveyed_floor;
                let below = options.rank_of().zip(seen).is_some_and(|(rank, floor)| {
                    !options.may_lead_below_floor() && rank.version < floor
                });
                self.terms_below_floor += u64::from(below);
                let replica = &mut self.replicas[r];
                replica.terms += 1;
                replica.began_at = Some(self.now);
                replica.lease_epoch = epoch;
                None
            }
            Action::ClaimLease { conn, .. } if fail => Some(Event::LockQueryFailed {
                conn,
                cause: "claim error",
            }),
            Action::ClaimLease { conn, ttl_ms } => Some(self.claim(r, conn, ttl_ms)),
            Action::RenewLease { conn, .. } if fail => Some(Event::PingFailed {
                conn,
                cause: "renew error",
            }),
            Action::RenewLease {
                conn,
                epoch,
                ttl_ms,
            } => {
                let holder = (r, self.replicas[r].runs);
                let ttl = Duration::from_millis(ttl_ms.into());
                match &mut self.server.lease {
                    Some(row) if row.holder == holder && row.epoch == epoch => {
                        row.expires = self.now + ttl;
                        Some(Event::LeaseRenewed { conn })
                    }
                    _ => Some(Event::LeaseLost { conn }),
                }
            }
            Action::ReleaseLease { conn, .. } if fail => Some(Event::UnlockFailed {
                conn,
                cause: "release error",
            }),
            Action::ReleaseLease { conn, epoch } => {
                let holder = (r, self.replicas[r].runs);
                let released = match &mut self.server.lease {
                    Some(row) if row.holder == holder && row.epoch == epoch => {
                        row.expires = self.now;
                        true
                    }
                    _ => false,
                };
                Some(Event::UnlockDone { conn, released })
            }
            Action::EndTerm { .. }
            | Action::ReportOverdueWork { .. }
            | Action::Log(_)
            | Action::Fail(_)
            | Action::Finish => None,
        };
        if let Some(event) = answer {
            if std::mem::take(&mut self.replicas[r].lose_next_reply) {
                return;
            }
            self.deliver(r, event);
        }
    }

    /// The lock was released: the first queued session that is still open gets it.
    fn grant_next_waiter(&mut self) {
        while !self.server.waiters.is_empty() {
            let ((r, conn), refusal) = self.server.waiters.remove(0);
            if !self.server.open.contains_key(&(r, conn)) {
                continue;
            }
            self.server.holder = Some(((r, conn), self.now));
            // PostgreSQL's race: a waiter granted as its lock_timeout fires (here: within its
            // reply latency of it) gets 55P03 all the same, and its session holds the lock.
            let timeout_due = self
                .pending
                .iter()
                .find(|(_, seq, _, _)| *seq == refusal)
                .map(|(at, _, _, _)| *at);
            if timeout_due.is_some_and(|at| at <= self.now + self.replicas[r].latency) {
                return;
            }
            self.pending.retain(|(_, seq, _, _)| *seq != refusal);
            let backend_pid = backend_pid(r, conn);
            self.deliver(r, Event::LockGranted { conn, backend_pid });
            return;
        }
    }

    /// The claim's compare-and-set, executed by the server as it is sent (the instant nearest
    /// the leader's trust).
    fn claim(&mut self, r: usize, conn: ConnId, ttl_ms: u32) -> Event<Cause> {
        let holder = (r, self.replicas[r].runs);
        let expires = self.now + Duration::from_millis(ttl_ms.into());
        match self.server.lease {
            Some(row) if row.holder != holder && row.expires > self.now => {
                Event::LockRefused { conn }
            }
            row => {
                let epoch = row.map_or(1, |row| row.epoch + 1);
                self.server.lease = Some(LeaseRow {
                    holder,
                    epoch,
                    expires,
                });
                Event::LeaseClaimed { conn, epoch }
            }
        }
    }

    /// Whether a lease row is held (not yet expired) at the world's time.
    pub(crate) fn lease_held(&self) -> bool {
        self.server.lease.is_some_and(|row| row.expires > self.now)
    }

    /// The lease mechanism's bound: a leader's term is on the row's current holder and epoch,
    /// before its expiry (so at most one replica leads at any instant).
    fn check_lease_bounds(&self) -> Result<(), String> {
        for (r, replica) in self.replicas.iter().enumerate() {
            if !replica.election.is_leader() {
                continue;
            }
            let row = self
                .server
                .lease
                .ok_or(format!("replica {r} leads with no lease row"))?;
            let ours = row.holder == (r, replica.runs) && Some(row.epoch) == replica.lease_epoch;
            if !ours || row.expires <= self.now {
                return Err(format!(
                    "replica {r} leads (epoch {:?}) on a lease it does not hold: {row:?} at {:?}",
                    replica.lease_epoch,
                    self.now - self.t0
                ));
            }
        }
        Ok(())
    }

    fn try_lock(&mut self, r: usize, conn: ConnId) -> Event<Cause> {
        if !self.server.open.contains_key(&(r, conn)) {
            return Event::LockQueryFailed {
                conn,
                cause: "connection closed",
            };
        }
        match self.server.holder {
            Some((session, _)) if session != (r, conn) => Event::LockRefused { conn },
            _ => {
                self.server.holder = Some(((r, conn), self.now));
                Event::LockGranted {
                    conn,
                    backend_pid: backend_pid(r, conn),
                }
            }
        }
    }

    /// The model server's survey: `r` publishes `publish` (as the server's time minus its
    /// age), takes the floor's step, and reads every other live candidacy and the floor.
    fn survey(
        &mut self,
        r: usize,
        conn: ConnId,
        publish: Option<Candidate>,
        step: FloorStep,
    ) -> Event<Cause> {
        match step {
            FloorStep::Off | FloorStep::Read => {}
            FloorStep::Raise(version) => {
                self.server.floor = self.server.floor.max(Some(version));
            }
            FloorStep::Set(version) => self.server.floor = Some(version),
        }
        let floor = match step {
            FloorStep::Off => None,
            _ => self.server.floor,
        };
        self.replicas[r].surveyed_floor = floor;
        let now = self.now;
        let live = |seen: Instant| now.saturating_duration_since(seen) <= CANDIDATE_FRESH;
        if let Some(mine) = publish {
            let since = now.checked_sub(mine.live_for).unwrap_or(now);
            self.server.candidates.insert(r, (mine.rank, since, now));
        }
        let candidates = self
            .server
            .candidates
            .iter()
            .filter(|(other, (_, _, seen))| **other != r && live(*seen))
            .map(|(_, &(rank, since, _))| Candidate {
                rank,
                live_for: now - since,
            })
            .collect();
        Event::CandidatesSurveyed {
            conn,
            candidates,
            floor,
        }
    }

    fn end_session(&mut self, session: (usize, ConnId)) {
        self.server.open.remove(&session);
        self.server.waiters.retain(|(waiter, _)| *waiter != session);
        if self.server.holder.is_some_and(|(s, _)| s == session) {
            self.server.holder = None;
            // The replica may not know it was granted yet: the answer can still be on its way.
            self.server.lost.insert(session, self.now);
            self.grant_next_waiter();
        }
    }

    /// The cross-replica bounds of design.md section 6 that hold between any two steps.
    pub(crate) fn check_bounds(&self) -> Result<(), String> {
        if self.lease {
            return self.check_lease_bounds();
        }
        for (r, replica) in self.replicas.iter().enumerate() {
            let holds = self
                .server
                .holder
                .is_some_and(|((owner, conn), _)| owner == r && replica.lock_conn == Some(conn));
            if replica.election.is_leader() && !holds {
                let lost_at = replica
                    .lock_conn
                    .and_then(|conn| self.server.lost.get(&(r, conn)))
                    .ok_or(format!("replica {r} leads on a lock it never held"))?;
                // Detection is bounded from the later of the loss and the moment the replica
                // learned it leads: a grant answer can arrive after the session already ended.
                let since = replica
                    .began_at
                    .map_or(*lost_at, |began| began.max(*lost_at));
                if self.now - since > 2 * I {
                    return Err(format!(
                        "replica {r} still leads {:?} after losing its session (bound 2 x {I:?})",
                        self.now - since
                    ));
                }
            }
        }
        if let Some(((owner, conn), granted)) = self.server.holder {
            let replica = &self.replicas[owner];
            let led = replica.election.is_leader() && replica.lock_conn == Some(conn);
            let releasing = replica.lock_conn == Some(conn);
            if !led && !releasing && self.now - granted > self.grant_budget {
                return Err(format!(
                    "lock held by replica {owner}'s {conn} that does not lead, for {:?} (bound {:?})",
                    self.now - granted,
                    self.grant_budget
                ));
            }
        }
        Ok(())
    }
}

/// The spec's options with the world's interval.
pub(crate) fn options() -> Options {
    Options::new(CheckInterval::new(I).expect("valid interval"))
}

/// The model server's backend pid of replica `r`'s session `conn`: one per session.
fn backend_pid(r: usize, conn: ConnId) -> i32 {
    let pid = r as u64 * 1_000_000 + conn.get();
    i32::try_from(pid % i32::MAX as u64).unwrap_or(i32::MAX)
}
