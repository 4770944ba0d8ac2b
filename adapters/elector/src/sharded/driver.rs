//! The thin async driver of the core's sharded election: performs the actions the core queues
//! on the one lock session, reports what happened, and sleeps until the core's next deadline.
//! It makes no decision of its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use plexsphere_leader_core::failures::FailureReport;
use plexsphere_leader_core::shards::{
    LockTableTooSmall, ShardAction, ShardEvent, ShardLog, ShardLogKind, Survey,
};
use plexsphere_leader_core::{ConnId, Level, TermId};
use tokio_util::sync::CancellationToken;

use super::shared::ShardShared;
use super::view::{Holder, SpaceView};
use crate::clock::now;
use crate::driver::{in_flight, start_on, take_held, watch_session};
use crate::error::{CheckError, RunError};
use crate::failure::CheckFailures;
use crate::session::{LockSession, QueryError, Row, SessionSource};
use crate::shard_sql::{self, ShardSqlError, SurveyRows};
use crate::term::TermShared;

use crate::connection::Held;

/// What an operation in flight produces.
struct Completion {
    event: ShardEvent<CheckError>,
    acquired: Option<Box<dyn LockSession>>,
    /// The view of an answered survey.
    view: Option<SpaceView>,
    /// How long a survey took to answer.
    survey_took: Option<Duration>,
}

impl Completion {
    fn of(event: ShardEvent<CheckError>) -> Self {
        Self {
            event,
            acquired: None,
            view: None,
            survey_took: None,
        }
    }
}

type Operation = Pin<Box<dyn Future<Output = Completion> + Send>>;
type Drain = Pin<Box<dyn Future<Output = TermId> + Send>>;

/// One run of a sharded election. Dropping it before the run finished reports
/// `Panicked`/`Dropped` to the core: every term ends and the session closes without an unlock.
pub(crate) struct ShardDriver {
    inner: Arc<ShardShared>,
    session: Option<(ConnId, Held)>,
    in_flight: Option<Operation>,
    drains: FuturesUnordered<Drain>,
    /// Ended terms whose work a handover or the stop awaits.
    ended: BTreeMap<TermId, Arc<TermShared>>,
    watch_reported: Option<ConnId>,
    finished: bool,
    failure: Option<LockTableTooSmall>,
    view: Option<SpaceView>,
    /// How the current run of failed checks is logged (the core's policy, as for one election).
    check_failures: CheckFailures,
}

enum Wake {
    Stop,
    Completed(Completion),
    Drained(TermId),
    SessionEnded(ConnId),
    Control,
    Deadline,
}

impl ShardDriver {
    pub(crate) fn start(inner: Arc<ShardShared>) -> Result<Self, RunError> {
        inner
            .election()
            .start(now())
            .map_err(|_| RunError::AlreadyRunning)?;
        let mut driver = Self {
            inner,
            session: None,
            in_flight: None,
            drains: FuturesUnordered::new(),
            ended: BTreeMap::new(),
            watch_reported: None,
            finished: false,
            failure: None,
            view: None,
            check_failures: CheckFailures::default(),
        };
        driver.perform_queued();
        Ok(driver)
    }

    /// Drives the run until the core finishes it; the error the core failed the run with.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), RunError> {
        let mut stop_reported = false;
        let sleep = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(sleep);
        let mut armed = None;
        while !self.finished {
            let deadline = self.inner.election().poll_timeout();
            if deadline != armed {
                if let Some(at) = deadline {
                    sleep.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed = deadline;
            }
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled(), if !stop_reported => Wake::Stop,
                completion = in_flight(&mut self.in_flight) => Wake::Completed(completion),
                Some(term) = self.drains.next(), if !self.drains.is_empty() => Wake::Drained(term),
                conn = watch_session(&self.session, self.watch_reported) => Wake::SessionEnded(conn),
                () = self.inner.controls().queued() => Wake::Control,
                () = &mut sleep, if armed.is_some() => Wake::Deadline,
            };
            match wake {
                Wake::Stop => {
                    stop_reported = true;
                    self.handle(ShardEvent::Cancelled);
                }
                Wake::Completed(completion) => {
                    self.in_flight = None;
                    self.complete(completion);
                }
                Wake::Drained(term) => {
                    self.ended.remove(&term);
                    self.handle(ShardEvent::WorkDrained { term });
                }
                Wake::SessionEnded(conn) => {
                    self.watch_reported = Some(conn);
                    self.handle(ShardEvent::SessionEnded { conn });
                }
                Wake::Control => self.apply_controls(),
                Wake::Deadline => self.fire_due_timers(),
            }
        }
        // Requests queued as the run finished: an eligibility setting still applies (the
        // election keeps it while not running); a resign finds nothing to do.
        self.apply_controls();
        match self.failure.take() {
            Some(too_small) => Err(RunError::LockTableTooSmall(too_small)),
            None => Ok(()),
        }
    }

    /// Hands the queued operator requests (resign, eligibility) to the election, in order.
    fn apply_controls(&mut self) {
        for request in self.inner.controls().take() {
            self.handle(request);
        }
    }

    fn complete(&mut self, completion: Completion) {
        let Completion {
            event,
            acquired,
            view,
            survey_took,
        } = completion;
        if let (Some(session), Some(conn)) = (acquired, event.conn()) {
            self.session = Some((conn, Arc::new(session)));
        }
        if let (Some(took), Some(metrics)) = (survey_took, self.inner.metrics()) {
            metrics.survey_took(took);
        }
        if view.is_some() {
            self.view = view;
        }
        let worked = matches!(
            event,
            ShardEvent::Registered { .. } | ShardEvent::Surveyed { .. }
        );
        if worked && self.check_failures.succeeded() {
            self.inner.check_failed(None);
        }
        // A deadline that passed while the answer was on its way fires first.
        self.handle(event);
    }

    /// For a failed acquire of the lock session: how the core's policy reports it, after
    /// recording it for [`ShardedElector::check_failure`](super::ShardedElector::check_failure).
    fn failure_report(&mut self, record: &ShardLog<CheckError>) -> Option<FailureReport> {
        let (ShardLogKind::AcquireFailed, Some(cause)) = (record.kind, &record.cause) else {
            return None;
        };
        let (report, failure) = self.check_failures.failed(cause);
        self.inner.check_failed(Some(failure));
        Some(report)
    }

    fn handle(&mut self, event: ShardEvent<CheckError>) {
        self.fire_due_timers();
        let _handled = self.inner.election().handle_event(now(), event);
        self.perform_queued();
    }

    fn fire_due_timers(&mut self) {
        self.inner.election().handle_timeout(now());
        self.perform_queued();
    }

    fn perform_queued(&mut self) {
        loop {
            let next = self.inner.election().poll_action();
            let Some(action) = next else { break };
            self.perform(action);
        }
        let (member, handing) = {
            let election = self.inner.election();
            (
                election.member().map(|m| m.get()),
                election
                    .handing_over()
                    .into_iter()
                    .map(|s| s.get())
                    .collect(),
            )
        };
        self.inner.publish(member, handing, self.view.take());
    }

    fn perform(&mut self, action: ShardAction<CheckError>) {
        let class = self.inner.class();
        let count = self.inner.options().count();
        match action {
            ShardAction::AcquireSession { conn } => {
                self.in_flight = Some(acquire(self.inner.sessions(), conn));
            }
            ShardAction::Register {
                conn,
                idle_session_timeout_ms,
            } => {
                let sql =
                    shard_sql::register(class, self.inner.identity(), idle_session_timeout_ms);
                self.start_on(conn, move |held| {
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
            ShardAction::Detach { conn, backend } => {
                if let Some(session) = self.take(conn) {
                    self.session = Some((conn, Arc::new(session.detach(backend.get()))));
                }
            }
            ShardAction::Survey { conn } => {
                let sql = shard_sql::survey(class, count);
                self.start_on(conn, move |held| survey(held, conn, sql, count));
            }
            ShardAction::Take { conn, shards } => {
                let sql = shard_sql::take(class, &shards);
                self.start_on(conn, move |held| {
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
                self.start_on(conn, move |held| {
                    statement(held, conn, sql, "advance epochs", move |rows| {
                        let epochs = shard_sql::parse_epochs(rows)?;
                        Ok(Ok(ShardEvent::EpochsAdvanced { conn, epochs }))
                    })
                });
            }
            ShardAction::Unlock { conn, shards } => {
                let sql = shard_sql::unlock(class, &shards);
                self.start_on(conn, move |held| {
                    statement(held, conn, sql, "unlock", move |rows| {
                        let not_held = shard_sql::parse_unlocked(rows)?;
                        Ok(Ok(ShardEvent::Unlocked { conn, not_held }))
                    })
                });
            }
            ShardAction::UnlockAll { conn } => {
                let sql = shard_sql::unlock_all();
                self.start_on(conn, move |held| {
                    statement(held, conn, sql, "unlock all", move |_| {
                        Ok(Ok(ShardEvent::UnlockedAll { conn }))
                    })
                });
            }
            ShardAction::CloseSession { conn } => {
                self.in_flight = None;
                self.inner.sessions().cancel_kept();
                if let Some(session) = self.take(conn) {
                    session.close();
                }
            }
            ShardAction::BeginTerm { shard, term, epoch } => {
                self.inner.begin(shard.get(), term, epoch);
            }
            ShardAction::EndTerm { shard, term, cause } => {
                if let Some(shared) = self.inner.end(shard.get(), term, cause) {
                    self.ended.insert(term, shared);
                }
            }
            ShardAction::AwaitWork { term } => {
                let ended = self.ended.get(&term).cloned();
                self.drains.push(Box::pin(async move {
                    if let Some(shared) = ended {
                        shared.drained().await;
                    }
                    term
                }));
            }
            ShardAction::Log(record) => {
                let report = self.failure_report(&record);
                emit(
                    &record,
                    self.inner.options().interval().get(),
                    report.as_ref(),
                );
            }
            ShardAction::Fail(too_small) => self.failure = Some(too_small),
            ShardAction::Finish => {
                self.finished = true;
                self.ended.clear();
            }
        }
    }

    fn start_on(&mut self, conn: ConnId, operation: impl FnOnce(Held) -> Operation) {
        start_on(&self.session, &mut self.in_flight, conn, operation);
    }

    fn take(&mut self, conn: ConnId) -> Option<Box<dyn LockSession>> {
        take_held(&mut self.session, &mut self.in_flight, conn)
    }
}

impl Drop for ShardDriver {
    fn drop(&mut self) {
        if !self.finished {
            let event = if std::thread::panicking() {
                ShardEvent::Panicked
            } else {
                ShardEvent::Dropped
            };
            self.handle(event);
        }
        self.in_flight = None;
        if let Some((_, held)) = self.session.take()
            && let Ok(session) = Arc::try_unwrap(held)
        {
            session.close();
        }
    }
}

fn acquire(source: Arc<dyn SessionSource>, conn: ConnId) -> Operation {
    Box::pin(async move {
        match source.acquire().await {
            Ok(session) => Completion {
                acquired: Some(session),
                ..Completion::of(ShardEvent::Acquired { conn })
            },
            Err(cause) => Completion::of(ShardEvent::AcquireFailed { conn, cause }),
        }
    })
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

fn survey(held: Held, conn: ConnId, sql: String, count: u32) -> Operation {
    Box::pin(async move {
        let started = now();
        let answer = held.query(&sql).await;
        let took = now().saturating_duration_since(started);
        match answer {
            Ok(rows) => match shard_sql::parse_survey(count, &rows) {
                Ok(SurveyRows { survey, names }) => Completion {
                    view: Some(view_of(&survey, &names)),
                    survey_took: Some(took),
                    ..Completion::of(ShardEvent::Surveyed { conn, survey })
                },
                Err(error) => Completion::of(failed(conn, unexpected("survey", &error), false)),
            },
            Err(error) => Completion::of(query_failed(conn, error)),
        }
    })
}

fn view_of(
    survey: &Survey,
    names: &BTreeMap<plexsphere_leader_core::shards::MemberId, String>,
) -> SpaceView {
    let mut holders: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
    let mut unowned = Vec::new();
    for (shard, holder) in survey.holders() {
        match holder {
            Some(pid) => holders.entry(pid.get()).or_default().push(shard.get()),
            None => unowned.push(shard.get()),
        }
    }
    let holder = |pid: plexsphere_leader_core::shards::MemberId| Holder {
        pid: pid.get(),
        name: names.get(&pid).cloned(),
        shards: holders.get(&pid.get()).cloned().unwrap_or_default(),
    };
    let members: Vec<Holder> = survey.members().iter().map(|&m| holder(m)).collect();
    let foreign = holders
        .keys()
        .filter(|pid| !survey.members().iter().any(|m| m.get() == **pid))
        .map(|&pid| holder(plexsphere_leader_core::shards::MemberId::new(pid)))
        .collect();
    SpaceView {
        surveyed_at: SystemTime::now(),
        me: survey.backend().get(),
        members,
        foreign,
        unowned,
    }
}

fn failed(conn: ConnId, cause: CheckError, session_ended: bool) -> ShardEvent<CheckError> {
    ShardEvent::StatementFailed {
        conn,
        cause,
        session_ended,
    }
}

fn query_failed(conn: ConnId, error: QueryError) -> ShardEvent<CheckError> {
    let ended = matches!(error, QueryError::SessionEnded(_));
    failed(conn, error.into_cause(), ended)
}

fn unexpected(statement: &'static str, error: &ShardSqlError) -> CheckError {
    CheckError::UnexpectedReply {
        statement,
        detail: error.to_string(),
    }
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
