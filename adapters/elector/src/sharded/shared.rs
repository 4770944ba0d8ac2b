//! What a [`ShardedElector`](super::ShardedElector)'s handles and its running driver share: the
//! core election behind a mutex, the open terms by shard, and the published ownership, view and
//! transitions.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use plexsphere_leader_core::shards::{ShardEvent, ShardOptions, ShardedElection};
use plexsphere_leader_core::{TermEndCause, TermId};
use tokio::sync::watch;

use super::metrics::ShardMetrics;
use super::view::{OwnedShard, Ownership, SpaceView, TRANSITIONS_KEPT, Transition};
use crate::error::CheckError;
use crate::leadership::CheckFailure;
use crate::operator::OperatorQueue;
use crate::session::SessionSource;
use crate::term::TermShared;

pub(crate) struct ShardShared {
    sessions: Arc<dyn SessionSource>,
    class: i32,
    identity: String,
    options: ShardOptions,
    election: Mutex<ShardedElection<CheckError>>,
    terms: Mutex<BTreeMap<u32, Arc<TermShared>>>,
    ownership: watch::Sender<Ownership>,
    view: watch::Sender<Option<SpaceView>>,
    transitions: Mutex<VecDeque<Transition>>,
    metrics: Option<ShardMetrics>,
    /// The current run of failed checks, in full.
    check_failure: Mutex<Option<CheckFailure>>,
    /// Operator requests (resign, eligibility) for the running driver, in order.
    controls: OperatorQueue<ShardEvent<CheckError>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ShardShared {
    pub(crate) fn new(
        sessions: Arc<dyn SessionSource>,
        class: i32,
        identity: String,
        options: ShardOptions,
        metrics: Option<ShardMetrics>,
    ) -> Self {
        Self {
            sessions,
            class,
            identity,
            options,
            election: Mutex::new(ShardedElection::new(options)),
            terms: Mutex::new(BTreeMap::new()),
            ownership: watch::Sender::new(Ownership::default()),
            view: watch::Sender::new(None),
            transitions: Mutex::new(VecDeque::new()),
            metrics,
            check_failure: Mutex::new(None),
            controls: OperatorQueue::new(),
        }
    }

    /// Performs the election's `ReportOverdueWork`: reports (and, when `abort`, aborts) the
    /// work of the ended shard `term` still running, and counts it, as for one election.
    pub(crate) fn report_overdue(&self, term: &TermShared, abort: bool, run_finished: bool) {
        let deadline = self.options.work_deadline_of();
        if let (Some(aborted), Some(metrics)) = (
            crate::overdue::report(term, deadline, abort, run_finished),
            &self.metrics,
        ) {
            metrics.overdue_work(aborted);
        }
    }

    /// The operator's requests for the running driver.
    pub(crate) fn controls(&self) -> &OperatorQueue<ShardEvent<CheckError>> {
        &self.controls
    }

    /// Records the latest failed check; `None`: a check worked.
    pub(crate) fn check_failed(&self, failure: Option<CheckFailure>) {
        *lock(&self.check_failure) = failure;
    }

    /// The latest failed check of the current run of failures.
    pub(crate) fn check_failure(&self) -> Option<CheckFailure> {
        lock(&self.check_failure).clone()
    }

    pub(crate) fn election(&self) -> MutexGuard<'_, ShardedElection<CheckError>> {
        lock(&self.election)
    }

    pub(crate) fn sessions(&self) -> Arc<dyn SessionSource> {
        Arc::clone(&self.sessions)
    }

    pub(crate) fn class(&self) -> i32 {
        self.class
    }

    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    pub(crate) fn options(&self) -> ShardOptions {
        self.options
    }

    pub(crate) fn metrics(&self) -> Option<&ShardMetrics> {
        self.metrics.as_ref()
    }

    pub(crate) fn ownership(&self) -> Ownership {
        self.ownership.borrow().clone()
    }

    pub(crate) fn is_owner(&self, shard: u32) -> bool {
        self.ownership.borrow().is_owner(shard)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Ownership> {
        self.ownership.subscribe()
    }

    pub(crate) fn view(&self) -> Option<SpaceView> {
        self.view.borrow().clone()
    }

    pub(crate) fn subscribe_view(&self) -> watch::Receiver<Option<SpaceView>> {
        self.view.subscribe()
    }

    pub(crate) fn transitions(&self) -> Vec<Transition> {
        lock(&self.transitions).iter().copied().collect()
    }

    pub(crate) fn term_of(&self, shard: u32) -> Option<Arc<TermShared>> {
        lock(&self.terms).get(&shard).cloned()
    }

    fn record(&self, transition: Transition) {
        let mut transitions = lock(&self.transitions);
        if transitions.len() == TRANSITIONS_KEPT {
            transitions.pop_front();
        }
        transitions.push_back(transition);
    }

    /// A term of `shard` begins: its handles can be taken, then the ownership says so.
    pub(crate) fn begin(&self, shard: u32, term: TermId, epoch: Option<u64>) {
        lock(&self.terms).insert(shard, TermShared::new(term, epoch));
        let since = SystemTime::now();
        self.ownership.send_modify(|o| {
            o.shards.insert(shard, OwnedShard { term, since, epoch });
        });
        self.record(Transition {
            at: since,
            shard,
            term,
            ended: None,
        });
        if let Some(metrics) = &self.metrics {
            metrics.began();
        }
    }

    /// The term of `shard` ends: the ownership says so, then every handle's token is cancelled.
    /// Returns the ended term, whose work a handover or a stop awaits.
    pub(crate) fn end(
        &self,
        shard: u32,
        term: TermId,
        cause: TermEndCause,
    ) -> Option<Arc<TermShared>> {
        let handover = cause == TermEndCause::HandedOver;
        self.ownership.send_modify(|o| {
            o.shards.remove(&shard);
            if handover {
                o.handing_over.insert(shard);
            }
        });
        let ended = lock(&self.terms).remove(&shard);
        if let Some(shared) = &ended {
            shared.end(cause);
        }
        self.record(Transition {
            at: SystemTime::now(),
            shard,
            term,
            ended: Some(cause),
        });
        if let Some(metrics) = &self.metrics {
            metrics.ended(cause);
        }
        ended
    }

    /// The member this replica is and the shards it is handing over, after each batch of
    /// actions; the view of the last survey.
    pub(crate) fn publish(
        &self,
        member: Option<i32>,
        handing_over: Vec<u32>,
        view: Option<SpaceView>,
    ) {
        self.ownership.send_if_modified(|o| {
            let handing: std::collections::BTreeSet<u32> = handing_over.into_iter().collect();
            let changed = o.member != member || o.handing_over != handing;
            o.member = member;
            o.handing_over = handing;
            changed
        });
        if let Some(view) = view {
            if let Some(metrics) = &self.metrics {
                metrics.surveyed(&view);
            }
            self.view.send_replace(Some(view));
        }
        if let Some(metrics) = &self.metrics {
            metrics.owned(self.ownership.borrow().count());
        }
    }
}
