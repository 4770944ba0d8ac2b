//! The sharded driver performs the election's actions; the server runs its statements
//! against the lock table of members and shards, or (a lease space) against its member and
//! owner rows as `shard_sql::lease` does.

use plexsphere_leader_core::TermEndCause;
use plexsphere_leader_core::shards::{
    MemberId, Shard, ShardAction, ShardEvent, ShardTimer, ShardedElection, Survey,
};

use super::table::{Member, Owner, Rows};
use super::{Sharded, owned};
use crate::clock::Micros;
use crate::engine::{Broken, Cause, Driver, World, seen};
use crate::sabotage::Sabotage;
use crate::server::Sess;

impl Driver for Sharded {
    /// Performs one action of replica `r`; returns the answer given at once, if any.
    fn perform(
        w: &mut World<'_, Sharded>,
        r: usize,
        action: ShardAction<Cause>,
    ) -> Option<ShardEvent<Cause>> {
        match action {
            ShardAction::AcquireSession { conn } | ShardAction::ProbePool { conn, .. }
                if w.s.replicas[r].partitioned =>
            {
                Some(ShardEvent::AcquireFailed {
                    conn,
                    cause: "server unreachable",
                })
            }
            // The exclusion proof (off in the model's options, on in the adapter): the model's
            // server is reached directly and its lock excludes.
            ShardAction::ProbePool { conn, .. } => {
                let base = i32::try_from(r).unwrap_or(0) * 2;
                Some(ShardEvent::PoolProbed {
                    conn,
                    proof: plexsphere_leader_core::proof::PoolProof::excluding(base, base + 1),
                })
            }
            ShardAction::AcquireSession { conn } => {
                w.open(r, conn);
                w.s.replicas[r].lock_conn = Some(conn);
                Some(ShardEvent::Acquired { conn })
            }
            ShardAction::Register { conn, .. }
            | ShardAction::Survey { conn, .. }
            | ShardAction::Take { conn, .. }
            | ShardAction::AdvanceEpochs { conn, .. }
            | ShardAction::Unlock { conn, .. }
            | ShardAction::UnlockAll { conn }
            | ShardAction::RegisterMember { conn, .. }
            | ShardAction::RenewMember { conn, .. }
            | ShardAction::TakeLeases { conn, .. } => {
                // Every statement of a lease member names the member's `conn`, and an answer
                // still on the way after its statement's deadline may be fed once the driver
                // fired that deadline, when the next statement is in flight: as the adapter's
                // driver does with an answer that arrived while its process was paused (it
                // fires the deadlines due, then feeds the answer).
                w.send(r, conn, action);
                None
            }
            // A lease member holds no connection: its statements in flight, each on a pooled
            // connection, are given up and may still land.
            ShardAction::CloseSession { conn } if w.model.mode.lease().is_some() => {
                let sess = w.s.replicas[r].sess(r, conn);
                w.abandon(sess);
                None
            }
            ShardAction::CloseSession { conn } => {
                w.close(r, conn);
                None
            }
            ShardAction::BeginTerm { shard, epoch, .. } => {
                begin_term(w, r, shard.get(), epoch);
                None
            }
            ShardAction::EndTerm { shard, cause, .. } => {
                let terms = &mut w.s.replicas[r].terms;
                terms.epochs.remove(&shard.get());
                terms.stale.remove(&shard.get());
                let name = u8::try_from(r).unwrap_or(u8::MAX);
                let resigned = match cause {
                    TermEndCause::HandedOver => false,
                    TermEndCause::Resigned => true,
                    _ => return None,
                };
                w.s.history.given_up.insert(shard.get(), (name, resigned));
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

    /// A sabotaged driver ([`Sabotage::StaleSurvey`]) answers a failed survey with the
    /// session's last good one.
    fn execute(
        world: &mut World<'_, Self>,
        owner: Sess,
        action: &ShardAction<Cause>,
    ) -> Option<ShardEvent<Cause>> {
        let answer = world.execute_statement(owner, action);
        let survey = matches!(action, ShardAction::Survey { .. });
        let failed = matches!(answer, Some(ShardEvent::StatementFailed { .. }));
        let stale = world.model.sabotage == Sabotage::StaleSurvey && survey && failed;
        let last = world
            .s
            .replicas
            .get(usize::from(owner.replica))
            .and_then(|r| r.machine.last_survey().cloned());
        match last {
            Some(survey) if stale => Some(ShardEvent::Surveyed {
                conn: owner.conn,
                survey,
            }),
            _ => answer,
        }
    }

    fn release(world: &mut World<'_, Self>, sess: Sess, _notify: bool) {
        world.s.server.locks.release(sess);
    }

    /// A sabotaged server's WAL writer ([`Sabotage::NonDurableLeaseWrite`]) flushes what was
    /// committed by the last instant.
    fn lock_timeouts(world: &mut World<'_, Self>) {
        if world.model.sabotage == Sabotage::NonDurableLeaseWrite {
            world.s.server.locks.rows.flush();
        }
    }

    /// [`Sabotage::UnboundedTrust`]: a lease member's trust deadline never fires.
    fn skips_deadline(sabotage: Sabotage, machine: &ShardedElection<Cause>) -> bool {
        sabotage == Sabotage::UnboundedTrust
            && machine.timeout_reason() == Some(ShardTimer::TrustDeadline)
    }

    /// [`Sabotage::StaleSurvey`]: the driver does not watch its session.
    fn ignores(sabotage: Sabotage, event: &ShardEvent<Cause>) -> bool {
        sabotage == Sabotage::StaleSurvey && matches!(event, ShardEvent::SessionEnded { .. })
    }
}

/// A shard term begins on replica `r` with `epoch`: the epochs' rule, and the discoveries.
fn begin_term(w: &mut World<'_, Sharded>, r: usize, shard: u32, epoch: Option<u64>) {
    let shards = w.model.mode.shards as usize;
    let s = &mut *w.s;
    s.seen |= seen::ELECTED;
    if let (Some(epoch), Some(max)) = (epoch, s.history.max_epochs.get_mut(shard as usize)) {
        *max = (*max).max(epoch);
    }
    if let Some(epoch) = epoch {
        s.replicas[r].terms.epochs.insert(shard, epoch);
    }
    let member = s.replicas[r].machine.member().map(MemberId::get);
    let reaped = Owner {
        member,
        reaped: true,
    };
    if member.is_some() && s.server.locks.rows.committed.owners.get(shard as usize) == Some(&reaped)
    {
        s.seen |= seen::EXPIRY_TAKEOVER;
    }
    if let Some((from, resigned)) = s.history.given_up.get(&shard).copied()
        && usize::from(from) != r
    {
        s.seen |= if resigned {
            seen::RESIGN_HANDOVER
        } else {
            seen::HANDOVER
        };
        s.history.given_up.remove(&shard);
    }
    let owned: usize = s.replicas.iter().map(|r| r.machine.owned().len()).sum();
    if owned >= shards {
        s.seen |= seen::ALL_OWNED;
    }
}

impl World<'_, Sharded> {
    /// The server runs `action` of `owner` now.
    fn execute_statement(
        &mut self,
        owner: Sess,
        action: &ShardAction<Cause>,
    ) -> Option<ShardEvent<Cause>> {
        if self.model.mode.lease().is_some() {
            return self.execute_lease(owner, action);
        }
        let conn = owner.conn;
        let now = self.s.now;
        if !self.s.server.is_open(owner) {
            return Some(ShardEvent::StatementFailed {
                conn,
                cause: "session gone",
                session_ended: true,
            });
        }
        let pid = self.s.server.backend_pid(owner);
        let server = &mut self.s.server;
        server.touch(owner, now);
        match action {
            ShardAction::Register { .. } => {
                server.limit_idle(owner);
                if let Some(session) = server.session_mut(owner) {
                    session.member = true;
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
                    if let Some(slot) = server.locks.holders.get_mut(shard.get() as usize)
                        && slot.is_none_or(|holder| holder == owner)
                    {
                        *slot = Some(owner);
                        granted.push(*shard);
                    }
                }
                Some(ShardEvent::Took { conn, granted })
            }
            ShardAction::AdvanceEpochs { shards, .. } => {
                let mut rows = server.locks.rows.committed.clone();
                let mut epochs = Vec::new();
                for shard in shards {
                    if let Some(epoch) = rows.epochs.get_mut(shard.get() as usize) {
                        *epoch += 1;
                        epochs.push((*shard, *epoch));
                    }
                }
                self.hand_out(&epochs);
                self.write(rows);
                Some(ShardEvent::EpochsAdvanced { conn, epochs })
            }
            ShardAction::Unlock { shards, .. } => {
                self.note_release(owner, shards.iter().map(|s| s.get()));
                let holders = &mut self.s.server.locks.holders;
                let mut not_held = Vec::new();
                for shard in shards {
                    match holders.get_mut(shard.get() as usize) {
                        Some(slot) if *slot == Some(owner) => *slot = None,
                        _ => not_held.push(*shard),
                    }
                }
                Some(ShardEvent::Unlocked { conn, not_held })
            }
            ShardAction::UnlockAll { .. } => {
                self.note_release(owner, 0..self.model.mode.shards);
                let server = &mut self.s.server;
                server.locks.release(owner);
                if let Some(session) = server.session_mut(owner) {
                    session.member = false;
                }
                Some(ShardEvent::UnlockedAll { conn })
            }
            _ => None,
        }
    }

    /// An unlock of `shards` by `owner` must come after its terms on them ended.
    fn note_release(&mut self, owner: Sess, mut shards: impl Iterator<Item = u32>) {
        let Some(replica) = self.s.replicas.get(usize::from(owner.replica)) else {
            return;
        };
        if replica.run != owner.run {
            return;
        }
        let owned = owned(&replica.machine);
        if shards.any(|shard| owned.contains(&shard) && self.held(owner, shard)) {
            self.s.broken = Some(Broken::ReleasedWhileLeading);
        }
    }

    /// Whether `owner` holds `shard` on the server: its advisory lock, or its owner row.
    fn held(&self, owner: Sess, shard: u32) -> bool {
        let locks = &self.s.server.locks;
        if self.model.mode.lease().is_none() {
            return locks.holder(shard) == Some(owner);
        }
        let rows = &locks.rows.committed;
        rows.member_of(owner).is_some_and(|member| {
            rows.owners
                .get(shard as usize)
                .is_some_and(|o| o.member == Some(member.id))
        })
    }

    /// The server hands out `epochs`: each must exceed every epoch of its shard handed out
    /// before, whatever a restart rolled back.
    fn hand_out(&mut self, epochs: &[(Shard, u64)]) {
        for (shard, epoch) in epochs {
            if let Some(granted) = self.s.history.granted.get_mut(shard.get() as usize) {
                if *epoch <= *granted {
                    self.s.broken = Some(Broken::EpochNotIncreasing);
                }
                *granted = (*granted).max(*epoch);
            }
        }
    }

    /// Commits `rows`, durably unless the server is sabotaged
    /// ([`Sabotage::NonDurableLeaseWrite`]).
    fn write(&mut self, rows: Rows) {
        let durable = self.model.sabotage != Sabotage::NonDurableLeaseWrite;
        self.s.server.locks.rows.write(rows, durable);
    }

    /// The server runs the lease statement `action` of member `owner` now, as
    /// `shard_sql::lease` writes it; no session is needed (each runs on a pooled connection).
    fn execute_lease(
        &mut self,
        owner: Sess,
        action: &ShardAction<Cause>,
    ) -> Option<ShardEvent<Cause>> {
        let conn = owner.conn;
        let now = self.s.now;
        let mut rows = self.s.server.locks.rows.committed.clone();
        let me = rows.member_of(owner).map(|m| m.id);
        let answer = match action {
            ShardAction::RegisterMember { ttl_ms, .. } => {
                let locks = &mut self.s.server.locks;
                locks.last_member += 1;
                let id = locks.last_member;
                let others = rows.live(now).count();
                rows.members.push(Member {
                    id,
                    holder: owner,
                    expires: now + ttl(*ttl_ms),
                });
                ShardEvent::Registered {
                    conn,
                    backend: MemberId::new(id),
                    granted: true,
                    lock_capacity: u64::MAX,
                    members: u32::try_from(others + 1).unwrap_or(u32::MAX),
                }
            }
            ShardAction::RenewMember { ttl_ms, .. } => {
                // The live members as the statement's snapshot saw them, before the renewal.
                let members: Vec<MemberId> = rows.live(now).map(|m| MemberId::new(m.id)).collect();
                let mine = rows
                    .members
                    .iter_mut()
                    .find(|m| m.holder == owner && m.expires > now);
                let renewed = mine.is_some();
                if let Some(member) = mine {
                    member.expires = now + ttl(*ttl_ms);
                }
                ShardEvent::Renewed {
                    conn,
                    renewed,
                    members,
                }
            }
            ShardAction::Survey { .. } => {
                let me = me.or_else(|| self.current_member(owner)).unwrap_or(0);
                ShardEvent::Surveyed {
                    conn,
                    survey: lease_survey(&rows, self.model.mode.shards, me, now),
                }
            }
            ShardAction::TakeLeases { shards, .. } => {
                let taken = self.take(&mut rows, owner, shards);
                ShardEvent::TookLeases {
                    conn,
                    live: taken.is_some(),
                    taken: taken.unwrap_or_default(),
                }
            }
            ShardAction::Unlock { shards, .. } => {
                self.note_release(owner, shards.iter().map(|s| s.get()));
                let mut not_held = Vec::new();
                for shard in shards {
                    match rows.owners.get_mut(shard.get() as usize) {
                        Some(row) if me.is_some() && row.member == me => *row = Owner::default(),
                        _ => not_held.push(*shard),
                    }
                }
                ShardEvent::Unlocked { conn, not_held }
            }
            ShardAction::UnlockAll { .. } => {
                // The leave: every shard of the member freed, its row deleted.
                self.note_release(owner, 0..self.model.mode.shards);
                if let Some(id) = me {
                    for row in rows.owners.iter_mut().filter(|o| o.member == Some(id)) {
                        *row = Owner::default();
                    }
                    rows.members.retain(|m| m.id != id);
                }
                ShardEvent::UnlockedAll { conn }
            }
            _ => return None,
        };
        if rows != self.s.server.locks.rows.committed {
            self.write(rows);
        }
        Some(answer)
    }

    /// The take of `shards` by member `owner` on `rows`: the expired members reaped (their
    /// shards freed), then, when `owner` is live, each asked shard whose row is free owned and
    /// its epoch advanced. `None` when `owner` was not live (nothing taken).
    fn take(
        &mut self,
        rows: &mut Rows,
        owner: Sess,
        shards: &[Shard],
    ) -> Option<Vec<(Shard, u64)>> {
        let now = self.s.now;
        let expired: Vec<i32> = rows
            .members
            .iter()
            .filter(|m| m.expires <= now)
            .map(|m| m.id)
            .collect();
        rows.members.retain(|m| m.expires > now);
        for row in &mut rows.owners {
            if row.member.is_some_and(|id| expired.contains(&id)) {
                *row = Owner {
                    member: None,
                    reaped: true,
                };
            }
        }
        let me = rows.member_of(owner)?.id;
        let ignores_owners = self.model.sabotage == Sabotage::TakeIgnoresLiveMembers;
        let mut taken = Vec::new();
        for shard in shards {
            let index = shard.get() as usize;
            let (Some(row), Some(epoch)) = (rows.owners.get_mut(index), rows.epochs.get_mut(index))
            else {
                continue;
            };
            let free = row.member.is_none() || (ignores_owners && row.member != Some(me));
            if free {
                row.member = Some(me);
                *epoch += 1;
                taken.push((*shard, *epoch));
            }
        }
        self.hand_out(&taken);
        Some(taken)
    }

    /// The member id the current run of `owner`'s replica registered, as its driver names it.
    fn current_member(&self, owner: Sess) -> Option<i32> {
        self.s
            .replicas
            .get(usize::from(owner.replica))
            .filter(|r| r.run == owner.run)
            .and_then(|r| r.machine.member())
            .map(MemberId::get)
    }

    /// What the survey statement finds: the members and every shard's holder, by pid.
    fn survey(&self, pid: i32) -> Survey {
        let server = &self.s.server;
        let rows = server.sessions.iter().map(|session| {
            let shards: Vec<u32> = (0u32..)
                .zip(&server.locks.holders)
                .filter(|(_, holder)| **holder == Some(session.owner))
                .map(|(shard, _)| shard)
                .collect();
            (MemberId::new(session.pid), session.member, shards)
        });
        Survey::new(self.model.mode.shards, MemberId::new(pid), rows)
            .unwrap_or_else(|_| unreachable!("the model holds each shard once"))
    }
}

/// What the lease survey finds: a row per live member with its shards, as `me` sees it.
fn lease_survey(rows: &Rows, shards: u32, me: i32, now: Micros) -> Survey {
    let rows = rows
        .live(now)
        .map(|member| (MemberId::new(member.id), true, rows.owned_by(member.id)));
    Survey::new(shards, MemberId::new(me), rows)
        .unwrap_or_else(|_| unreachable!("the model owns each shard once"))
}

/// A TTL in milliseconds, in microseconds.
fn ttl(ttl_ms: u32) -> Micros {
    u64::from(ttl_ms) * 1_000
}
