//! A shard space's own part of the shared state ([`ShardSpace`]): the open terms by shard,
//! and the published ownership, view and transitions. The common part (the machine, the
//! operator's queue, the failed checks, the metrics) is every mode's, in `shared.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use plexsphere_leader_core::shards::{ShardOptions, ShardedElection};
use plexsphere_leader_core::{TermEndCause, TermId, WorkDeadline};
use tokio::sync::watch;

use super::metrics::ShardMetrics;
use super::view::{OwnedShard, Ownership, SpaceView, TRANSITIONS_KEPT, Transition};
use crate::clock::TokioClock;
use crate::error::CheckError;
use crate::leadership::CheckFailing;
use crate::session::SessionSource;
use crate::shared::{CountsOverdue, Mode, Shared, lock};
use crate::term::TermShared;
use crate::trust::Trust;

/// A shard space's own shared state (see the module docs).
pub(crate) struct ShardSpace {
    class: i32,
    /// The schema of the lease's tables, with a lease.
    lease_schema: String,
    terms: Mutex<BTreeMap<u32, Arc<TermShared>>>,
    ownership: watch::Sender<Ownership>,
    view: watch::Sender<Option<SpaceView>>,
    transitions: Mutex<VecDeque<Transition>>,
}

impl Mode for ShardSpace {
    type Machine = ShardedElection<CheckError>;
    type Options = ShardOptions;
    type Metrics = ShardMetrics;

    fn work_deadline_of(options: &ShardOptions) -> Option<WorkDeadline> {
        options.work_deadline_of()
    }

    fn publish_failing(&self, failing: Option<CheckFailing>) {
        self.ownership.send_if_modified(|ownership| {
            let changed = ownership.check_failing != failing;
            ownership.check_failing = failing;
            changed
        });
    }
}

impl CountsOverdue for ShardMetrics {
    fn overdue_work(&self, aborted: bool) {
        ShardMetrics::overdue_work(self, aborted);
    }
}

impl Shared<ShardSpace> {
    /// The shared state of a new sharded elector: no shard owned, not running.
    pub(crate) fn new(
        sessions: Arc<dyn SessionSource>,
        class: i32,
        identity: String,
        lease_schema: String,
        options: ShardOptions,
        metrics: Option<ShardMetrics>,
    ) -> Self {
        let space = ShardSpace {
            class,
            lease_schema,
            terms: Mutex::new(BTreeMap::new()),
            ownership: watch::Sender::new(Ownership::default()),
            view: watch::Sender::new(None),
            transitions: Mutex::new(VecDeque::new()),
        };
        let election = ShardedElection::new(options);
        let trust = Arc::new(Trust::new(Arc::new(TokioClock)));
        Self::with_mode(sessions, identity, options, election, metrics, trust, space)
    }

    pub(crate) fn class(&self) -> i32 {
        self.mode().class
    }

    /// The schema of the lease's tables ([`ShardConfig::lease_schema`](super::ShardConfig::lease_schema)).
    pub(crate) fn lease_schema(&self) -> &str {
        &self.mode().lease_schema
    }

    /// The published ownership; none of its shards once a lease's trust ran out (whether or
    /// not the driver has run since).
    pub(crate) fn ownership(&self) -> Ownership {
        let mut ownership = self.mode().ownership.borrow().clone();
        if !self.trusted_now() {
            ownership.shards.clear();
        }
        ownership
    }

    /// Whether this replica owns `shard` and, with a lease, trusts it at this moment.
    pub(crate) fn is_owner(&self, shard: u32) -> bool {
        self.trusted_now() && self.mode().ownership.borrow().is_owner(shard)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Ownership> {
        self.mode().ownership.subscribe()
    }

    pub(crate) fn view(&self) -> Option<SpaceView> {
        self.mode().view.borrow().clone()
    }

    pub(crate) fn subscribe_view(&self) -> watch::Receiver<Option<SpaceView>> {
        self.mode().view.subscribe()
    }

    pub(crate) fn transitions(&self) -> Vec<Transition> {
        lock(&self.mode().transitions).iter().copied().collect()
    }

    /// The open term of `shard`, while trusted ([`is_owner`](Self::is_owner)).
    pub(crate) fn term_of(&self, shard: u32) -> Option<Arc<TermShared>> {
        if !self.trusted_now() {
            return None;
        }
        lock(&self.mode().terms).get(&shard).cloned()
    }

    fn record(&self, transition: Transition) {
        let mut transitions = lock(&self.mode().transitions);
        if transitions.len() == TRANSITIONS_KEPT {
            transitions.pop_front();
        }
        transitions.push_back(transition);
    }

    /// A term of `shard` begins: its handles can be taken, then the ownership says so.
    pub(crate) fn begin(&self, shard: u32, term: TermId, epoch: Option<u64>) {
        lock(&self.mode().terms).insert(shard, TermShared::new(term, epoch));
        let since = crate::clock::wall_now();
        self.mode().ownership.send_modify(|o| {
            o.shards.insert(shard, OwnedShard { term, since, epoch });
        });
        self.record(Transition {
            at: since,
            shard,
            term,
            ended: None,
        });
        if let Some(metrics) = self.metrics() {
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
        self.mode().ownership.send_modify(|o| {
            o.shards.remove(&shard);
            if handover {
                o.handing_over.insert(shard);
            }
        });
        let ended = lock(&self.mode().terms).remove(&shard);
        if let Some(shared) = &ended {
            shared.end(cause);
        }
        self.record(Transition {
            at: crate::clock::wall_now(),
            shard,
            term,
            ended: Some(cause),
        });
        if let Some(metrics) = self.metrics() {
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
        self.mode().ownership.send_if_modified(|o| {
            let handing: BTreeSet<u32> = handing_over.into_iter().collect();
            let changed = o.member != member || o.handing_over != handing;
            o.member = member;
            o.handing_over = handing;
            changed
        });
        if let Some(view) = view {
            if let Some(metrics) = self.metrics() {
                metrics.surveyed(&view);
            }
            self.mode().view.send_replace(Some(view));
        }
        if let Some(metrics) = self.metrics() {
            metrics.owned(self.mode().ownership.borrow().count());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use plexsphere_leader_core::{CheckInterval, Lease, Mechanism};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_leased_shard_past_the_trust_deadline_is_not_owned_at_the_moment_of_the_call() {
        let interval = CheckInterval::new(Duration::from_secs(1)).unwrap();
        let options = ShardOptions::new(interval, 8)
            .unwrap()
            .mechanism(Mechanism::Lease(Lease::default_for(interval)));
        let shared = Shared::<ShardSpace>::new(
            Arc::new(crate::session::NoSessions),
            7,
            "test".into(),
            "public".into(),
            options,
            None,
        );
        let t0 = crate::clock::now();
        shared.set_trust(Some(t0 + Duration::from_millis(2700)));
        shared.begin(3, TermId::new(1), Some(9));
        assert!(shared.is_owner(3));
        assert!(shared.term_of(3).is_some());
        assert_eq!(shared.ownership().count(), 1);
        // Past the trust, with the driver not run since (a paused process): nothing owned.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!shared.is_owner(3));
        assert!(shared.term_of(3).is_none());
        assert_eq!(shared.ownership().count(), 0);
        // A renewal extended it; advisory locks (no deadline) are never overridden.
        shared.set_trust(Some(crate::clock::now() + Duration::from_secs(2)));
        assert!(shared.is_owner(3));
        shared.set_trust(None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(shared.is_owner(3));
    }
}
