//! Sharded leadership as a [`Mode`] of the driver: the one lock session's registration,
//! survey, take, epochs and unlock statements, the published ownership and view, and the survey
//! metric.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use plexsphere_leader_core::rank::FloorStep;
use plexsphere_leader_core::shards::{
    ShardAction, ShardEvent, ShardFailure, ShardLog, ShardLogKind, ShardedElection,
};
use plexsphere_leader_core::{ConnId, Level, TermId};

use super::lease::{LeaseMember, Statements};
use super::shared::ShardSpace;
use super::statement::{Completion, Operation, Surveyed, failed, surveyed, unexpected};
use super::view::SpaceView;
use crate::clock::now;
use crate::connection::Held;
use crate::driver::{Io, Mode};
use crate::error::{CheckError, RunError};
use crate::leadership::CheckFailure;
use crate::operation;
use crate::operator::OperatorQueue;
use crate::session::{QueryError, Row};
use crate::shard_sql::{self, ShardSqlError, SurveyRows};
use crate::shared::Shared;
use crate::term::TermShared;
use plexsphere_leader_core::failures::FailureReport;

/// Sharded leadership's side of a run.
pub(crate) struct Sharded {
    inner: Arc<Shared<ShardSpace>>,
    /// Ended terms whose work a handover or the stop awaits, or whose work deadline the
    /// election may still report; forgotten once their work drained.
    ended: BTreeMap<TermId, Arc<TermShared>>,
    failure: Option<ShardFailure>,
    view: Option<SpaceView>,
    /// With a lease: how the member's statements are named.
    lease: Option<LeaseMember>,
}

impl Sharded {
    pub(crate) fn new(inner: Arc<Shared<ShardSpace>>) -> Self {
        let lease = inner.options().mechanism_of().lease().map(|_| LeaseMember {
            schema: inner.lease_schema().to_owned(),
            holder: shard_sql::standing::published(
                &crate::identity::lease_holder(inner.identity()),
                inner.options().standing(),
            ),
            member: None,
        });
        Self {
            inner,
            ended: BTreeMap::new(),
            failure: None,
            view: None,
            lease,
        }
    }

    /// The lease member's statements, with a lease.
    fn lease_statements(&self) -> Option<Statements<'_>> {
        self.lease.as_ref().map(|naming| Statements {
            sessions: self.inner.sessions(),
            class: self.inner.class(),
            count: self.inner.options().count(),
            naming,
        })
    }

    fn log(&mut self, record: &ShardLog<CheckError>, io: &mut Io<Self>) {
        let report = match (record.kind, &record.cause) {
            (ShardLogKind::AcquireFailed, Some(cause)) => {
                Some(io.check_failed(cause, |failure| self.inner.check_failed(failure)))
            }
            _ => None,
        };
        emit(
            record,
            self.inner.options().interval().get(),
            report.as_ref(),
        );
    }
}

impl Mode for Sharded {
    type Machine = ShardedElection<CheckError>;
    type Extra = Surveyed;

    fn machine(&self) -> MutexGuard<'_, ShardedElection<CheckError>> {
        self.inner.election()
    }

    fn controls(&self) -> &OperatorQueue<ShardEvent<CheckError>> {
        self.inner.controls()
    }

    fn publish_check_failure(&self, failure: Option<CheckFailure>) {
        self.inner.check_failed(failure);
    }

    fn arrived(&mut self, event: &ShardEvent<CheckError>, surveyed: Self::Extra) {
        match event {
            ShardEvent::WorkDrained { term } => {
                self.ended.remove(term);
            }
            ShardEvent::Registered { backend, .. } => {
                if let Some(lease) = &mut self.lease {
                    lease.member = Some(*backend);
                }
            }
            _ => {}
        }
        if let Some((view, took)) = surveyed {
            if let Some(metrics) = self.inner.metrics() {
                metrics.survey_took(took);
            }
            self.view = Some(view);
        }
    }

    fn performed(&mut self) {
        let (member, handing, trust) = {
            let election = self.inner.election();
            (
                election.member().map(|m| m.get()),
                election
                    .handing_over()
                    .into_iter()
                    .map(|s| s.get())
                    .collect(),
                election.trust_deadline(),
            )
        };
        // The trust first, so that no shard is published without it.
        self.inner.set_trust(trust);
        self.inner.publish(member, handing, self.view.take());
    }

    fn outcome(&mut self) -> Result<(), RunError> {
        match self.failure.take() {
            Some(ShardFailure::LockTableTooSmall(too_small)) => {
                Err(RunError::LockTableTooSmall(too_small))
            }
            Some(ShardFailure::Refuted(finding)) => Err(RunError::of_finding(finding)),
            None => Ok(()),
        }
    }

    fn perform(&mut self, action: ShardAction<CheckError>, io: &mut Io<Self>) {
        let class = self.inner.class();
        let count = self.inner.options().count();
        if let Some(lease) = self.lease_statements() {
            // A lease member's statements, each on a pooled connection of its own.
            let operation = match &action {
                ShardAction::RegisterMember {
                    conn,
                    ttl_ms,
                    floor,
                } => Some(lease.register(*conn, *ttl_ms, *floor)),
                ShardAction::RenewMember { conn, ttl_ms } => Some(lease.renew(*conn, *ttl_ms)),
                ShardAction::TakeLeases {
                    conn,
                    shards,
                    lock_timeout_ms,
                } => Some(lease.take(*conn, shards, *lock_timeout_ms)),
                ShardAction::Survey { conn, floor } => Some(lease.survey(*conn, *floor)),
                ShardAction::Unlock { conn, shards } => Some(lease.release(*conn, shards.clone())),
                ShardAction::UnlockAll { conn } => Some(lease.leave(*conn)),
                _ => None,
            };
            if let Some(operation) = operation {
                io.run(operation);
                return;
            }
        }
        match action {
            ShardAction::ProbePool {
                conn,
                second_within,
            } => io.run(crate::connection::pool::probe(
                self.inner.sessions(),
                second_within,
                move |proof| ShardEvent::PoolProbed { conn, proof },
                move |cause| ShardEvent::AcquireFailed { conn, cause },
            )),
            ShardAction::AcquireSession { conn } => io.run(operation::acquire(
                self.inner.sessions(),
                ShardEvent::Acquired { conn },
                move |cause| ShardEvent::AcquireFailed { conn, cause },
            )),
            ShardAction::Register {
                conn,
                idle_session_timeout_ms,
            } => {
                let name = shard_sql::standing::published(
                    self.inner.identity(),
                    self.inner.options().standing(),
                );
                let sql = shard_sql::register(class, &name, idle_session_timeout_ms);
                io.start_on(conn, move |held| {
                    statement(held, conn, sql, "register", move |rows| {
                        let registered = shard_sql::parse_registered(rows)?;
                        if registered.in_recovery {
                            return Ok(Err(CheckError::InRecovery));
                        }
                        Ok(Ok(ShardEvent::Registered {
                            conn,
                            backend: registered.backend,
                            granted: registered.granted,
                            lock_capacity: registered.lock_capacity,
                            members: registered.members,
                        }))
                    })
                });
            }
            ShardAction::Detach { conn, backend } => io.detach(conn, backend.get()),
            // Issued for a lease space only, and run above.
            ShardAction::RegisterMember { .. }
            | ShardAction::RenewMember { .. }
            | ShardAction::TakeLeases { .. } => {}
            ShardAction::Survey { conn, floor } => {
                let sql = shard_sql::survey(class, count, floor);
                let reads_floor = floor != FloorStep::Off;
                io.start_on(conn, move |held| {
                    survey(held, conn, sql, count, reads_floor)
                });
            }
            ShardAction::Take { conn, shards } => {
                let sql = shard_sql::take(class, &shards);
                io.start_on(conn, move |held| {
                    statement(held, conn, sql, "take", move |rows| {
                        let granted = shard_sql::parse_taken(rows)?;
                        Ok(Ok(ShardEvent::Took { conn, granted }))
                    })
                });
            }
            ShardAction::AdvanceEpochs {
                conn,
                shards,
                lock_timeout_ms,
            } => {
                let sql = shard_sql::advance_epochs(class, &shards, lock_timeout_ms);
                io.start_on(conn, move |held| {
                    statement(held, conn, sql, "advance epochs", move |rows| {
                        let epochs = shard_sql::parse_epochs(rows)?;
                        Ok(Ok(ShardEvent::EpochsAdvanced { conn, epochs }))
                    })
                });
            }
            ShardAction::Unlock { conn, shards } => {
                let sql = shard_sql::unlock(class, &shards);
                io.start_on(conn, move |held| {
                    statement(held, conn, sql, "unlock", move |rows| {
                        let not_held = shard_sql::parse_unlocked(rows)?;
                        Ok(Ok(ShardEvent::Unlocked { conn, not_held }))
                    })
                });
            }
            ShardAction::UnlockAll { conn } => {
                let sql = shard_sql::unlock_all();
                io.start_on(conn, move |held| {
                    statement(held, conn, sql, "unlock all", move |_| {
                        Ok(Ok(ShardEvent::UnlockedAll { conn }))
                    })
                });
            }
            ShardAction::CloseSession { conn } => io.close(conn, &*self.inner.sessions()),
            ShardAction::BeginTerm { shard, term, epoch } => {
                self.inner.begin(shard.get(), term, epoch);
            }
            ShardAction::EndTerm { shard, term, cause } => {
                // A term whose handles are all gone has nothing left to await or report.
                self.ended.retain(|_, shared| shared.live_handles() > 0);
                if let Some(shared) = self.inner.end(shard.get(), term, cause) {
                    self.ended.insert(term, shared);
                }
            }
            ShardAction::ReportOverdueWork {
                term,
                abort,
                run_finished,
            } => {
                if let Some(shared) = self.ended.remove(&term) {
                    self.inner.report_overdue(&shared, abort, run_finished);
                }
            }
            ShardAction::AwaitWork { term } => {
                let ended = self.ended.get(&term).cloned();
                io.drain(Box::pin(async move {
                    if let Some(shared) = ended {
                        shared.drained().await;
                    }
                    Completion::of(ShardEvent::WorkDrained { term })
                }));
            }
            ShardAction::Log(record) => self.log(&record, io),
            ShardAction::Fail(failure) => self.failure = Some(failure),
            ShardAction::Finish => {
                io.finish();
                self.ended.clear();
            }
        }
    }
}

/// Runs `sql` on the session and reads its rows with `read`: the event to report, or a failure
/// the server's answer itself says (a standby).
fn statement<R>(held: Held, conn: ConnId, sql: String, name: &'static str, read: R) -> Operation
where
    R: FnOnce(&[Row]) -> Result<Result<ShardEvent<CheckError>, CheckError>, ShardSqlError>
        + Send
        + 'static,
{
    Box::pin(async move {
        let answer = held.query(&sql).await;
        Completion::of(match answer {
            Ok(rows) => match read(&rows) {
                Ok(Ok(event)) => event,
                Ok(Err(cause)) => failed(conn, cause, false),
                Err(error) => failed(conn, unexpected(name, &error), false),
            },
            Err(error) => query_failed(conn, error),
        })
    })
}

fn survey(held: Held, conn: ConnId, sql: String, count: u32, reads_floor: bool) -> Operation {
    Box::pin(async move {
        let started = now();
        let answer = held.query(&sql).await;
        let took = now().saturating_duration_since(started);
        match answer {
            Ok(rows) => match shard_sql::parse_survey(count, &rows, reads_floor) {
                Ok(SurveyRows {
                    survey,
                    names,
                    floor,
                }) => surveyed(conn, survey, &names, floor, took),
                Err(error) => Completion::of(failed(conn, unexpected("survey", &error), false)),
            },
            Err(error) => Completion::of(query_failed(conn, error)),
        }
    })
}

fn query_failed(conn: ConnId, error: QueryError) -> ShardEvent<CheckError> {
    let ended = matches!(error, QueryError::SessionEnded(_));
    failed(conn, error.into_cause(), ended)
}

/// Emits a record of the sharded election as a `tracing` event (target `plexsphere_leader`)
/// with the fields `shards`, `reason`, `cause` and `interval`; the run's span adds `class`,
/// `identity` and `pid`. A failed acquire's `report` sets the level as for one election (ERROR
/// once for a permanent failure, then quiet but for a WARN a minute) and appends its advice and
/// the count of the repeats kept quiet, with the single election's texts (`failure::suffix`).
fn emit(record: &ShardLog<CheckError>, interval: Duration, report: Option<&FailureReport>) {
    let Some(level) = crate::failure::level(report, record.kind.level()) else {
        return;
    };
    let shards = record.shards;
    let reason = record.reason.map(|r| r.label());
    let cause = record.cause.as_ref().map(tracing::field::display);
    let interval = tracing::field::debug(interval);
    let suffix = crate::failure::suffix(record.cause.as_ref(), report);
    match level {
        Level::Info => tracing::info!(
            target: "plexsphere_leader", shards, reason, cause, interval, "{record}{suffix}"
        ),
        Level::Warn => tracing::warn!(
            target: "plexsphere_leader", shards, reason, cause, interval, "{record}{suffix}"
        ),
        Level::Error => tracing::error!(
            target: "plexsphere_leader", shards, reason, cause, interval, "{record}{suffix}"
        ),
    }
}
