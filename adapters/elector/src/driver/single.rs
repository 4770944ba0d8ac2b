//! The single election as a [`Mode`] of the driver: one advisory lock, its grant, check,
//! fencing epoch and release statements, the published leadership and the check metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};

use plexsphere_leader_core::{Action, Election, Event, LogKind, LogRecord, TermEndCause, TermId};

use super::{Io, Mode};
use crate::connection::{self, Completion};
use crate::error::CheckError;
use crate::leadership::CheckFailure;
use crate::log;
use crate::observe::Observer;
use crate::operator::OperatorQueue;
use crate::shared::{OneLeader, Shared};
use crate::sql;
use crate::term::TermShared;

/// The single election's side of a run.
pub(crate) struct Single {
    inner: Arc<Shared<OneLeader>>,
    /// The term a graceful stop ended, whose work it awaits.
    stopped_term: Option<Arc<TermShared>>,
    /// Ended terms whose work deadline the election may still report
    /// ([`Action::ReportOverdueWork`]); forgotten when reported or when their work drained.
    ended_terms: BTreeMap<TermId, Arc<TermShared>>,
    /// The database the last answered grant statement ran in: named in the log lines.
    database: Option<String>,
    observer: Observer,
    /// The finding that failed the run ([`Action::Fail`]).
    failure: Option<plexsphere_leader_core::LockFinding>,
    /// This run's lease holder: the identity and a nonce of the run, so that a restarted
    /// replica never mistakes its former run's lease for its own.
    holder: String,
}

impl Single {
    pub(crate) fn new(inner: Arc<Shared<OneLeader>>) -> Self {
        let inner_identity = inner.identity().to_owned();
        Self {
            observer: Observer::new(Arc::clone(&inner)),
            inner,
            stopped_term: None,
            ended_terms: BTreeMap::new(),
            database: None,
            holder: crate::identity::lease_holder(&inner_identity),
            failure: None,
        }
    }

    fn end_term(&mut self, term: TermId, cause: TermEndCause) {
        self.stopped_term = self.inner.end_term(cause);
        if let (Some(shared), true) = (&self.stopped_term, self.inner.has_work_deadline()) {
            self.ended_terms.insert(term, Arc::clone(shared));
        }
    }

    fn log(&mut self, record: &LogRecord<CheckError>, io: &mut Io<Self>) {
        let work = (record.kind == LogKind::WorkOutlivedStop)
            .then(|| {
                self.stopped_term
                    .as_ref()
                    .map(|t| t.running_work().join(", "))
            })
            .flatten();
        let report = match (record.kind, &record.cause) {
            // A lease leader's failed renewal is a failed check too: its term goes on while the
            // lease is trusted, and `check_failure` says why the renewals fail.
            (
                LogKind::AcquireFailed
                | LogKind::LeaseRenewalFailed
                | LogKind::Unfit
                | LogKind::ProbeFailed,
                Some(cause),
            ) => Some(io.check_failed(cause, |failure| self.inner.check_failed(failure))),
            _ => None,
        };
        log::emit(
            record,
            self.inner.interval().get(),
            work.as_deref(),
            self.database.as_deref(),
            report.as_ref(),
            self.inner.holds_a_lease(),
        );
        if let Some(release) = record.release() {
            self.inner.released(release);
        }
    }
}

impl Mode for Single {
    type Machine = Election<CheckError>;
    /// The database a grant statement ran in (`current_database()`), for the log lines.
    type Extra = Option<String>;

    fn machine(&self) -> MutexGuard<'_, Election<CheckError>> {
        self.inner.election()
    }

    fn controls(&self) -> &OperatorQueue<Event<CheckError>> {
        self.inner.controls()
    }

    fn publish_check_failure(&self, failure: Option<CheckFailure>) {
        self.inner.check_failed(failure);
    }

    fn arrived(&mut self, event: &Event<CheckError>, database: Self::Extra) {
        if database.is_some() {
            self.database = database;
        }
        if let Event::WorkDrained { term } = event {
            self.ended_terms.remove(term);
        }
    }

    fn clock(&self) -> &dyn crate::clock::Clock {
        self.inner.clock()
    }

    /// The core's trust deadline after every input: a renewal extends it, the end of a term
    /// clears it.
    fn performed(&mut self) {
        let deadline = self.inner.election().trust_deadline();
        self.inner.set_trust(deadline);
        if let Some(metrics) = self.inner.metrics() {
            let election = self.inner.election();
            let deferring = election.deferring_to(self.inner.clock().now()).is_some();
            metrics.preference(deferring, election.is_below_floor());
        }
    }

    fn outcome(&mut self) -> Result<(), crate::error::RunError> {
        match self.failure.take() {
            Some(finding) => Err(crate::error::RunError::of_finding(finding)),
            None => Ok(()),
        }
    }

    fn answered(&mut self, event: &Event<CheckError>) {
        self.observer.completion(event);
    }

    fn perform(&mut self, action: Action<CheckError>, io: &mut Io<Self>) {
        self.observer.action(&action);
        let (key, identity) = (self.inner.key(), self.inner.identity());
        let idle_ms = self.inner.interval().idle_session_timeout_millis();
        match action {
            Action::AcquireConnection { conn } => io.run(crate::operation::acquire(
                self.inner.sessions(),
                Event::ConnectionAcquired { conn },
                move |cause| Event::AcquireFailed { conn, cause },
            )),
            Action::ProbePool {
                conn,
                second_within,
            } => {
                io.run(connection::pool::probe(
                    self.inner.sessions(),
                    second_within,
                    move |proof| Event::PoolProbed { conn, proof },
                    move |cause| Event::AcquireFailed { conn, cause },
                ));
            }
            Action::ProbeFitness { conn } => {
                // The core asks only when the configuration names a probe.
                let probe = self
                    .inner
                    .fitness_probe()
                    .cloned()
                    .unwrap_or_else(|| Arc::from(""));
                if self.inner.holds_a_lease() {
                    io.run(connection::fitness::pooled(
                        self.inner.sessions(),
                        conn,
                        probe,
                    ));
                } else {
                    io.start_on(conn, |held| {
                        connection::fitness::on_session(held, conn, probe)
                    });
                }
            }
            Action::SurveyCandidates {
                conn,
                publish,
                floor,
            } => {
                let reading = connection::survey::Reading {
                    key,
                    live: self.inner.interval().get() * sql::candidacy::LIVE_INTERVALS,
                };
                if self.inner.holds_a_lease() {
                    let schema = self.inner.lease_schema();
                    let table = sql::candidacy::candidate_table(schema);
                    let floors = format!("{schema}.{}", sql::candidacy::FLOOR_TABLE);
                    let statement = sql::candidacy::survey_rows(
                        &table,
                        key,
                        &self.holder,
                        publish,
                        (&floors, floor),
                    );
                    io.run(connection::survey::pooled(
                        self.inner.sessions(),
                        conn,
                        statement,
                        reading,
                    ));
                } else {
                    let mine = publish.map(|candidate| (candidate, identity));
                    let floors = (sql::candidacy::FLOOR_TABLE, floor);
                    let statement = sql::candidacy::survey_sessions(key, mine, floors);
                    io.start_on(conn, |held| {
                        connection::survey::on_session(held, conn, statement, reading)
                    });
                }
            }
            Action::TryLock { conn } => {
                let statement = sql::try_lock(key, identity, idle_ms);
                io.start_on(conn, |held| connection::try_lock(held, conn, statement));
            }
            Action::WaitForLock {
                conn,
                lock_timeout_ms,
            } => {
                let statement = sql::wait_for_lock(key, identity, lock_timeout_ms, idle_ms);
                let bound = sql::bound_idle_before_wait(idle_ms);
                io.start_on(conn, |held| {
                    connection::wait_for_lock(held, conn, bound, statement)
                });
            }
            Action::ReleaseIfHeld { conn } => {
                io.start_on(conn, |held| connection::release_if_held(held, conn, key));
            }
            Action::AdvanceEpoch {
                conn,
                lock_timeout_ms,
            } => {
                let statement = sql::advance_epoch_within(key, lock_timeout_ms);
                io.start_on(conn, |held| {
                    connection::advance_epoch(held, conn, statement)
                });
            }
            Action::AwaitWork { term } => {
                let stopped = self.stopped_term.clone().filter(|t| t.id() == term);
                io.run(match stopped {
                    Some(shared) => connection::await_work(shared),
                    None => Box::pin(std::future::ready(Completion::of(Event::WorkDrained {
                        term,
                    }))),
                });
            }
            Action::ClaimLease { conn, ttl_ms } => {
                let half = self.inner.interval().half_millis();
                let schema = self.inner.lease_schema();
                let statement = sql::lease::claim(schema, key, &self.holder, ttl_ms, half);
                io.run(connection::lease::claim(
                    self.inner.sessions(),
                    conn,
                    statement,
                    schema.to_owned(),
                    key,
                ));
            }
            Action::RenewLease { conn, ttl_ms, .. } => {
                let schema = self.inner.lease_schema();
                let statement = sql::lease::renew(schema, key, &self.holder, ttl_ms);
                io.run(connection::lease::renew(
                    self.inner.sessions(),
                    conn,
                    statement,
                ));
            }
            Action::ReleaseLease { conn, .. } => {
                let statement = sql::lease::release(self.inner.lease_schema(), key, &self.holder);
                io.run(connection::lease::release(
                    self.inner.sessions(),
                    conn,
                    statement,
                ));
            }
            Action::Ping { conn, .. } => {
                io.start_on(conn, |held| connection::verify(held, conn, key));
            }
            Action::Unlock { conn } => {
                io.start_on(conn, |held| connection::unlock(held, conn, key));
            }
            // Gives up an acquire still in flight (the source may keep a connection being set
            // up for the next check); a session already borrowed goes back.
            Action::ReturnToPool { conn } => io.return_to_pool(conn),
            Action::Hijack { conn, backend_pid } => io.detach(conn, backend_pid),
            // A connection still being set up goes too (`ReturnToPool` keeps it for the next
            // check).
            Action::CloseConnection { conn } => io.close(conn, &*self.inner.sessions()),
            Action::BeginTerm { term, epoch } => {
                // The term's trust first, so that it is never published without it.
                self.inner.set_trust(self.inner.election().trust_deadline());
                self.inner.begin_term(term, epoch);
            }
            Action::EndTerm { term, cause } => self.end_term(term, cause),
            Action::ReportOverdueWork {
                term,
                abort,
                run_finished,
            } => {
                if let Some(shared) = self.ended_terms.remove(&term) {
                    self.inner.report_overdue(&shared, abort, run_finished);
                }
            }
            Action::Log(record) => self.log(&record, io),
            Action::Fail(finding) => self.failure = Some(finding),
            Action::Finish => io.finish(),
        }
    }
}
