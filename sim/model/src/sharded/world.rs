//! The driver and the server of the sharded model: inputs fed under the `Machine` contract,
//! actions performed against the model's lock table of members and shards.

use plexsphere_leader_core::TermEndCause;
use plexsphere_leader_core::shards::{MemberId, ShardAction, ShardEvent, Survey};

use super::ShardedModel;
use super::state::{Broken, Cause, Session, State, seen};
use crate::clock::{Micros, instant, micros};
use crate::flight::{self, Flight, Stage};
use crate::server::Sess;
use crate::trace::{Input, Line, Recorder};

/// A step being applied to a sharded state.
pub(crate) struct World<'a> {
    pub(crate) model: &'a ShardedModel,
    pub(crate) s: &'a mut State,
    pub(crate) trace: Option<&'a mut Recorder<ShardEvent<Cause>>>,
}

impl World<'_> {
    /// Feeds `input` to replica `r`, then performs what it queued.
    pub(crate) fn feed(&mut self, r: usize, input: Input<ShardEvent<Cause>>) {
        let replica = &self.s.replicas[r];
        let (name, run, at) = (replica.name, replica.run, replica.local);
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push(Line::Input {
                replica: name,
                run,
                at,
                input: input.clone(),
            });
        }
        let now = instant(at);
        let machine = &mut self.s.replicas[r].machine;
        match input {
            Input::Start => {
                let _started = machine.start(now);
            }
            Input::Timeout => machine.handle_timeout(now),
            Input::Event(event) => {
                machine.handle_timeout(now);
                let _handled = machine.handle_event(now, event);
            }
        }
        let mut answers = Vec::new();
        while let Some(action) = self.s.replicas[r].machine.poll_action() {
            if let Some(event) = self.perform(r, action) {
                answers.push(event);
            }
        }
        for event in answers {
            self.feed(r, Input::Event(event));
        }
        let due = self.s.replicas[r]
            .machine
            .poll_timeout()
            .is_some_and(|at| at <= now);
        if due {
            self.feed(r, Input::Timeout);
        }
    }

    fn perform(&mut self, r: usize, action: ShardAction<Cause>) -> Option<ShardEvent<Cause>> {
        let now = self.s.now;
        match action {
            ShardAction::AcquireSession { conn } if self.s.replicas[r].partitioned => {
                Some(ShardEvent::AcquireFailed {
                    conn,
                    cause: "server unreachable",
                })
            }
            ShardAction::AcquireSession { conn } => {
                let owner = self.s.replicas[r].sess(r, conn);
                let server = &mut self.s.server;
                server.backends = server.backends.saturating_add(1);
                let session = Session {
                    owner,
                    pid: server.backends,
                    idle_limit: false,
                    last_active: now,
                    member: false,
                };
                let at = server.sessions.partition_point(|s| s.owner < owner);
                server.sessions.insert(at, session);
                self.s.replicas[r].session = Some(conn);
                Some(ShardEvent::Acquired { conn })
            }
            ShardAction::Register { conn, .. }
            | ShardAction::Survey { conn }
            | ShardAction::Take { conn, .. }
            | ShardAction::AdvanceEpochs { conn, .. }
            | ShardAction::Unlock { conn, .. }
            | ShardAction::UnlockAll { conn } => {
                if !self.s.replicas[r].partitioned {
                    let owner = self.s.replicas[r].sess(r, conn);
                    let stage = Stage::Sent(action);
                    let flight = Flight {
                        owner,
                        stage,
                        abandoned: false,
                    };
                    flight::insert(&mut self.s.flights, flight);
                }
                None
            }
            ShardAction::CloseSession { conn } => {
                let sess = self.s.replicas[r].sess(r, conn);
                self.s.flights.retain(|f| f.owner != sess);
                let replica = &mut self.s.replicas[r];
                if replica.session == Some(conn) {
                    replica.session = None;
                }
                self.end_session(sess, false);
                None
            }
            ShardAction::BeginTerm { shard, epoch, .. } => {
                self.begin_term(r, shard.get(), epoch);
                None
            }
            ShardAction::EndTerm { shard, cause, .. } => {
                let replica = &mut self.s.replicas[r];
                replica.epochs.remove(&shard.get());
                replica.stale.remove(&shard.get());
                let name = u8::try_from(r).unwrap_or(u8::MAX);
                match cause {
                    TermEndCause::HandedOver => {
                        self.s.given_up.insert(shard.get(), (name, false));
                    }
                    TermEndCause::Resigned => {
                        self.s.given_up.insert(shard.get(), (name, true));
                    }
                    _ => {}
                }
                None
            }
            ShardAction::AwaitWork { term } => Some(ShardEvent::WorkDrained { term }),
            ShardAction::Detach { .. }
            | ShardAction::ReportOverdueWork { .. }
            | ShardAction::Log(_)
            | ShardAction::Fail(_)
            | ShardAction::Finish => None,
        }
    }

    fn begin_term(&mut self, r: usize, shard: u32, epoch: Option<u64>) {
        let s = &mut *self.s;
        s.seen |= seen::ELECTED;
        if let (Some(epoch), Some(max)) = (epoch, s.max_epochs.get_mut(shard as usize)) {
            *max = (*max).max(epoch);
        }
        if let Some(epoch) = epoch {
            s.replicas[r].epochs.insert(shard, epoch);
        }
        if let Some((from, resigned)) = s.given_up.get(&shard).copied()
            && usize::from(from) != r
        {
            s.seen |= if resigned {
                seen::RESIGN_HANDOVER
            } else {
                seen::HANDOVER
            };
            s.given_up.remove(&shard);
        }
        let owned: usize = s.replicas.iter().map(|r| r.machine.owned().len()).sum();
        if owned >= self.model.shards as usize {
            s.seen |= seen::ALL_OWNED;
        }
    }

    /// Whether `sess` belongs to the current run of its replica.
    pub(crate) fn is_current(&self, sess: Sess) -> bool {
        self.s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|replica| replica.run == sess.run)
    }

    /// Puts `event` on the way back to `owner`.
    pub(crate) fn reply(&mut self, owner: Sess, event: ShardEvent<Cause>) {
        let flight = Flight {
            owner,
            stage: Stage::Replied(event),
            abandoned: false,
        };
        flight::insert(&mut self.s.flights, flight);
    }

    /// The server ends `sess`, releasing its locks; with `notify` its client hears of it.
    pub(crate) fn end_session(&mut self, sess: Sess, notify: bool) {
        let server = &mut self.s.server;
        if server.session(sess).is_none() {
            return;
        }
        server.sessions.retain(|s| s.owner != sess);
        for holder in &mut server.holders {
            if *holder == Some(sess) {
                *holder = None;
            }
        }
        let reachable = self
            .s
            .replicas
            .get(usize::from(sess.replica))
            .is_some_and(|r| r.run == sess.run && r.session == Some(sess.conn) && !r.partitioned);
        if notify && reachable {
            self.reply(sess, ShardEvent::SessionEnded { conn: sess.conn });
        }
    }

    /// The server runs `action` of `owner` now.
    pub(crate) fn execute(
        &mut self,
        owner: Sess,
        action: &ShardAction<Cause>,
    ) -> Option<ShardEvent<Cause>> {
        let conn = owner.conn;
        let now = self.s.now;
        let Some(pid) = self.s.server.session(owner).map(|s| s.pid) else {
            return Some(ShardEvent::StatementFailed {
                conn,
                cause: "session gone",
                session_ended: true,
            });
        };
        let server = &mut self.s.server;
        if let Some(session) = server.sessions.iter_mut().find(|s| s.owner == owner) {
            session.last_active = now;
        }
        match action {
            ShardAction::Register { .. } => {
                if let Some(session) = server.sessions.iter_mut().find(|s| s.owner == owner) {
                    session.member = true;
                    session.idle_limit = true;
                }
                let members = server.sessions.iter().filter(|s| s.member).count();
                Some(ShardEvent::Registered {
                    conn,
                    backend: MemberId::new(pid),
                    granted: true,
                    lock_capacity: 1 << 20,
                    members: u32::try_from(members).unwrap_or(u32::MAX),
                })
            }
            ShardAction::Survey { .. } => Some(ShardEvent::Surveyed {
                conn,
                survey: self.survey(pid),
            }),
            ShardAction::Take { shards, .. } => {
                let mut granted = Vec::new();
                for shard in shards {
                    if let Some(slot) = server.holders.get_mut(shard.get() as usize)
                        && slot.is_none_or(|holder| holder == owner)
                    {
                        *slot = Some(owner);
                        granted.push(*shard);
                    }
                }
                Some(ShardEvent::Took { conn, granted })
            }
            ShardAction::AdvanceEpochs { shards, .. } => {
                let mut epochs = Vec::new();
                for shard in shards {
                    if let Some(epoch) = server.epochs.get_mut(shard.get() as usize) {
                        *epoch += 1;
                        epochs.push((*shard, *epoch));
                    }
                }
                Some(ShardEvent::EpochsAdvanced { conn, epochs })
            }
            ShardAction::Unlock { shards, .. } => {
                let shards = shards.clone();
                self.note_release(owner, shards.iter().map(|s| s.get()));
                let server = &mut self.s.server;
                let mut not_held = Vec::new();
                for shard in shards {
                    match server.holders.get_mut(shard.get() as usize) {
                        Some(slot) if *slot == Some(owner) => *slot = None,
                        _ => not_held.push(shard),
                    }
                }
                Some(ShardEvent::Unlocked { conn, not_held })
            }
            ShardAction::UnlockAll { .. } => {
                self.note_release(owner, 0..self.model.shards);
                let server = &mut self.s.server;
                for holder in &mut server.holders {
                    if *holder == Some(owner) {
                        *holder = None;
                    }
                }
                if let Some(session) = server.sessions.iter_mut().find(|s| s.owner == owner) {
                    session.member = false;
                }
                Some(ShardEvent::UnlockedAll { conn })
            }
            _ => None,
        }
    }

    /// An unlock of `shards` by `owner` must come after its terms on them ended.
    fn note_release(&mut self, owner: Sess, shards: impl Iterator<Item = u32>) {
        let Some(replica) = self.s.replicas.get(usize::from(owner.replica)) else {
            return;
        };
        if replica.run != owner.run {
            return;
        }
        let owned = replica.owned();
        let held = |shard: u32| {
            self.s.server.holders.get(shard as usize).copied().flatten() == Some(owner)
        };
        if shards
            .into_iter()
            .any(|shard| owned.contains(&shard) && held(shard))
        {
            self.s.broken = Some(Broken::ReleasedWhileOwned);
        }
    }

    /// What the survey statement finds: the members and every shard's holder, by pid.
    fn survey(&self, pid: i32) -> Survey {
        let server = &self.s.server;
        let pid_of = |sess: Sess| server.session(sess).map_or(0, |s| s.pid);
        let rows = server.sessions.iter().map(|session| {
            let shards: Vec<u32> = (0u32..)
                .zip(&server.holders)
                .filter(|(_, holder)| **holder == Some(session.owner))
                .map(|(shard, _)| shard)
                .collect();
            (MemberId::new(pid_of(session.owner)), session.member, shards)
        });
        Survey::new(self.model.shards, MemberId::new(pid), rows)
            .unwrap_or_else(|_| unreachable!("the model holds each shard once"))
    }

    /// The next instant anything is due ([`next_instant`]).
    pub(crate) fn next_instant(&self) -> Option<Micros> {
        next_instant(self.model, self.s)
    }

    /// Time passes to `to`: idle sessions end, every replica's deadlines fire, each owner's
    /// fenced write goes through the fence.
    pub(crate) fn advance(&mut self, to: Micros) {
        let delta = to - self.s.now;
        self.s.now = to;
        let server = &self.s.server;
        let lost: Vec<Vec<u32>> = self
            .s
            .replicas
            .iter()
            .enumerate()
            .map(|(index, replica)| {
                let sess = replica.lock_sess(index);
                replica
                    .owned()
                    .into_iter()
                    .filter(|shard| {
                        server.holders.get(*shard as usize).copied().flatten() != sess
                            || sess.is_none()
                    })
                    .collect()
            })
            .collect();
        for (replica, lost) in self.s.replicas.iter_mut().zip(lost) {
            if !replica.paused {
                replica.local += delta;
                for shard in lost {
                    *replica.stale.entry(shard).or_default() += delta;
                }
            }
        }
        let idle = self.model.idle_timeout();
        while let Some((at, sess)) = next_idle_end(&self.s.server, idle)
            && at <= to
        {
            self.end_session(sess, true);
        }
        for r in 0..self.s.replicas.len() {
            if !self.s.replicas[r].paused && self.s.replicas[r].machine.is_running() {
                self.feed(r, Input::Timeout);
            }
        }
        self.fenced_writes();
    }

    fn fenced_writes(&mut self) {
        let s = &*self.s;
        let stale = s.replicas.iter().filter(|r| !r.paused).any(|replica| {
            replica.epochs.iter().any(|(shard, epoch)| {
                let fence = s.server.epochs.get(*shard as usize).copied().unwrap_or(0);
                let newest = s.max_epochs.get(*shard as usize).copied().unwrap_or(0);
                *epoch >= fence && *epoch < newest
            })
        });
        if stale {
            self.s.broken = Some(Broken::StaleWriteAccepted);
        }
    }

    /// Replica `r` crashes and restarts (`fin`: its sockets close visibly).
    pub(crate) fn crash(&mut self, r: usize, fin: bool) {
        let index = u8::try_from(r).unwrap_or(u8::MAX);
        let run = self.s.replicas[r].run;
        let own = |sess: &Sess| sess.replica == index && sess.run == run;
        self.s.flights.retain(|f| !own(&f.owner));
        if fin {
            let sessions: Vec<Sess> = self
                .s
                .server
                .sessions
                .iter()
                .map(|s| s.owner)
                .filter(own)
                .collect();
            for sess in sessions {
                self.end_session(sess, false);
            }
        }
        let replica = &mut self.s.replicas[r];
        replica.machine = plexsphere_leader_core::shards::ShardedElection::new(self.model.options);
        replica.run += 1;
        replica.paused = false;
        replica.session = None;
        replica.epochs.clear();
        replica.stale.clear();
        self.feed(r, Input::Start);
    }

    /// The server restarts (`fin`: clients see the reset) or fails over: every session ends;
    /// the fence epochs are durable.
    pub(crate) fn restart(&mut self, fin: bool) {
        let sessions: Vec<Sess> = self.s.server.sessions.iter().map(|s| s.owner).collect();
        for sess in sessions {
            self.end_session(sess, fin);
        }
    }
}

/// When the server next ends an idle session, and which.
fn next_idle_end(server: &super::state::Server, idle: Micros) -> Option<(Micros, Sess)> {
    server
        .sessions
        .iter()
        .filter(|s| s.idle_limit)
        .map(|s| (s.last_active + idle, s.owner))
        .min()
}

/// The next instant anything is due: a replica's deadline, an idle session's end, and the
/// instant an owner believing a shard without its lock would pass the detection bound.
pub(crate) fn next_instant(model: &ShardedModel, s: &State) -> Option<Micros> {
    let replicas = s.replicas.iter().filter(|r| !r.paused).filter_map(|r| {
        let due = r.machine.poll_timeout().map(micros)?;
        Some(s.now + due.saturating_sub(r.local).max(1))
    });
    let idle = next_idle_end(&s.server, model.idle_timeout()).map(|(at, _)| at);
    let detection = crate::single::props::DETECTION_INTERVALS * model.interval();
    let bounds = s
        .replicas
        .iter()
        .filter(|r| !r.paused)
        .flat_map(|r| r.stale.values())
        .map(|stale| s.now + detection.saturating_sub(*stale) + 1);
    replicas
        .chain(idle)
        .chain(bounds)
        .map(|at| at.max(s.now + 1))
        .min()
}
