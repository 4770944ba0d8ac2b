//! The sharded driver performs the election's actions; the server runs its statements
//! against the lock table of members and shards.

use plexsphere_leader_core::TermEndCause;
use plexsphere_leader_core::shards::{MemberId, ShardAction, ShardEvent, Survey};

use super::{Sharded, owned};
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
            ShardAction::AcquireSession { conn } if w.s.replicas[r].partitioned => {
                Some(ShardEvent::AcquireFailed {
                    conn,
                    cause: "server unreachable",
                })
            }
            ShardAction::AcquireSession { conn } => {
                w.open(r, conn);
                w.s.replicas[r].lock_conn = Some(conn);
                Some(ShardEvent::Acquired { conn })
            }
            ShardAction::Register { conn, .. }
            | ShardAction::Survey { conn }
            | ShardAction::Take { conn, .. }
            | ShardAction::AdvanceEpochs { conn, .. }
            | ShardAction::Unlock { conn, .. }
            | ShardAction::UnlockAll { conn } => {
                w.send(r, conn, action);
                None
            }
            // The model's spaces are held with advisory locks.
            ShardAction::RegisterMember { .. }
            | ShardAction::RenewMember { .. }
            | ShardAction::TakeLeases { .. } => None,
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
                let mut epochs = Vec::new();
                for shard in shards {
                    if let Some(epoch) = server.locks.epochs.get_mut(shard.get() as usize) {
                        *epoch += 1;
                        epochs.push((*shard, *epoch));
                    }
                }
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
        let locks = &self.s.server.locks;
        if shards.any(|shard| owned.contains(&shard) && locks.holder(shard) == Some(owner)) {
            self.s.broken = Some(Broken::ReleasedWhileLeading);
        }
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
