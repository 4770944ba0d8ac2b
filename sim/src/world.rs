//! The simulated world: two server hosts, K replica hosts, the primary routing, and the fault
//! primitives the nemesis uses. Every primitive records itself in the history.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use plexsphere_leader::sharded::Ownership;
use plexsphere_leader::{Leadership, TermEndCause};
use plexsphere_leader_pgsim::{LockMode, Primary, ServerConfig, ServerHandle, SimPostgres};
use tokio::sync::watch;
use turmoil::{Builder, Sim};

use crate::capture;
use crate::clock::ClockRate;
use crate::record::{
    Handing, HeldOut, History, LinkFault, Recorder, SharedRecorder, Span, TermEnd, TermRecord,
    UpSpan,
};
use crate::replica::{self, Live, ReplicaEnv, Slot};
use crate::setup::{
    DriverSabotage, FaultKind, Params, RunKind, RunOptions, SERVERS, Sabotage, application_name,
    parse_application_name,
};

/// The terms an incarnation published as open: lock of the space → (term id, fencing epoch).
type OpenTerms = BTreeMap<u32, (u64, Option<u64>)>;

/// The harness's view of one replica host.
pub(crate) struct ReplicaHost {
    pub(crate) name: String,
    pub(crate) slot: Rc<RefCell<Slot>>,
    /// The rate of the replica's clock, which times its hold-offs.
    clock: ClockRate,
    /// The incarnation the harness saw last.
    seen_incarnation: u32,
    /// Whether the replica led when its current pause began.
    paused_leading: bool,
    seen_finished: bool,
    /// The terms open on this replica: lock of the space → index in `history.terms` (the
    /// single election's lock 0, or each shard it owns).
    open_terms: BTreeMap<u32, usize>,
    /// The index in `history.up` of the current up span.
    up: Option<usize>,
    /// The published leadership of the incarnation it belongs to.
    leadership: Option<(u32, watch::Receiver<Leadership>)>,
    /// Sharded runs: the shards being handed over, shard → index in `history.handing`.
    open_handing: BTreeMap<u32, usize>,
    /// Sharded runs: the published ownership of the incarnation it belongs to.
    ownership: Option<(u32, watch::Receiver<Ownership>)>,
}

/// The world of one run.
pub(crate) struct World<'a> {
    pub(crate) sim: Sim<'a>,
    pub(crate) params: Params,
    pub(crate) servers: Vec<ServerHandle>,
    pub(crate) primary: Primary,
    pub(crate) replicas: Vec<ReplicaHost>,
    pub(crate) recorder: SharedRecorder,
    pub(crate) history: History,
    /// The run's deliberately broken behaviour, if any.
    sabotage: Option<Sabotage>,
    /// Whether the replicas run sharded electors.
    sharded: bool,
    /// A fitness run's unfit replica ([`RunOptions::unfit_replica`]).
    unfit: Option<usize>,
}

impl World<'_> {
    /// The world of `options`: its seed's network, its replicas with their acquire mode and
    /// fencing, and at most one deliberately broken behaviour.
    pub(crate) fn new(options: &RunOptions) -> Self {
        let RunOptions {
            seed,
            replicas,
            params,
            fencing,
            mode,
            sabotage,
            sharding,
            mechanism,
            ..
        } = *options;
        let mut sim = Builder::new()
            .rng_seed(seed)
            .simulation_duration(params.total() * 4)
            .tick_duration(params.tick)
            .min_message_latency(params.tick)
            .max_message_latency(params.max_latency)
            .build();
        let mut servers = Vec::new();
        let row_locks = sabotage != Some(Sabotage::FenceWithoutRowLock);
        for (index, name) in SERVERS.iter().enumerate() {
            let first_pid = 1000 + 100_000 * i32::try_from(index).unwrap_or(0);
            let config = ServerConfig::default()
                .with_first_pid(first_pid)
                .with_row_locks(row_locks)
                .with_shard_lease_flaw(sabotage.and_then(Sabotage::server_flaw));
            let (server, handle) = SimPostgres::new(config);
            sim.host(*name, move || server.clone().serve(replica::PORT));
            servers.push(handle);
        }
        // The second server is the first one's synchronous standby for committed data (the
        // fence table); advisory locks and sessions are never replicated.
        servers[0].replicate_to(&servers[1]);
        let primary = Primary::new(SERVERS[0]);
        let recorder: SharedRecorder = Rc::new(RefCell::new(Recorder::default()));
        let mut history = History::default();
        history.primaries.push((Duration::ZERO, 0));
        let mut hosts = Vec::new();
        // One registry of connection ends per run: parallel seeds reuse simulated pids.
        let session_ends = plexsphere_leader::session::SessionEnds::new();
        for index in 0..replicas {
            let name = format!("r{index}");
            let slot = Rc::new(RefCell::new(Slot {
                version: options.rollout.then_some(crate::setup::OLD_VERSION),
                ..Slot::default()
            }));
            let clock = options.clock_rate(index);
            let env = Rc::new(ReplicaEnv {
                index,
                seed,
                params,
                primary: primary.clone(),
                sabotage: sabotage.and_then(Sabotage::driver),
                sharding,
                shard_sabotage: sabotage.and_then(Sabotage::shard),
                fencing,
                mode,
                mechanism,
                clock,
                fitness_probe: options.fitness_probe(index),
                sample_beliefs: options.kind == RunKind::Only(FaultKind::Pause),
                slot: Rc::clone(&slot),
                recorder: Rc::clone(&recorder),
                session_ends: session_ends.clone(),
            });
            // The whole software behind the host's gate (its service is gated on its own).
            sim.host(name.as_str(), move || {
                let gate = Rc::clone(&env.slot.borrow().gate);
                gate.gated(replica::software(Rc::clone(&env)))
            });
            history.up.push(UpSpan {
                replica: index,
                span: Span::open(Duration::ZERO),
            });
            hosts.push(ReplicaHost {
                name,
                slot,
                clock,
                paused_leading: false,
                seen_incarnation: 0,
                seen_finished: false,
                open_terms: BTreeMap::new(),
                up: Some(history.up.len() - 1),
                leadership: None,
                open_handing: BTreeMap::new(),
                ownership: None,
            });
        }
        Self {
            sim,
            params,
            servers,
            primary,
            replicas: hosts,
            recorder,
            history,
            sabotage,
            sharded: sharding.is_some(),
            unfit: options.unfit_replica(),
        }
    }

    pub(crate) fn now(&self) -> Duration {
        self.sim.elapsed()
    }

    /// The index of the current primary.
    pub(crate) fn primary_index(&self) -> usize {
        self.history.primary_at(self.now())
    }

    /// Runs one step, then observes the replicas.
    ///
    /// # Errors
    /// A host's software failed (returned an error or panicked); also recorded in the history.
    pub(crate) fn step(&mut self) -> Result<(), ()> {
        let before = self.now();
        self.set_now(before);
        let stepped = self.sim.step();
        let now = self.now();
        self.set_now(now);
        for event in capture::drain() {
            let who = event
                .replica
                .map_or_else(|| "?".to_owned(), |r| self.incarnation_name(r));
            let what = format!("{} {}", event.level, event.text);
            self.history.note(event.at, who, what);
            // The unfit replica's refused probe is its one expected ERROR (a permanent
            // failure, said once).
            let expected =
                event.replica.is_some() && event.replica == self.unfit && is_unfit(&event.text);
            if expected {
                self.history.unfit_refusals += 1;
            }
            if event.level == tracing::Level::ERROR && !expected {
                let what = format!("ERROR event from the adapter: {}", event.text);
                self.history.errors.push((event.at, what));
            }
        }
        if let Err(error) = stepped {
            self.history.host_failure = Some((now, format!("a host's software failed: {error}")));
            return Err(());
        }
        self.observe();
        Ok(())
    }

    fn set_now(&self, now: Duration) {
        capture::set_now(now);
        self.recorder.borrow_mut().now = now;
    }

    pub(crate) fn incarnation_name(&self, replica: usize) -> String {
        let incarnation = self.replicas[replica].slot.borrow().incarnation;
        application_name(replica, incarnation)
    }

    /// Observes every replica: incarnations starting and finishing, terms beginning and ending.
    pub(crate) fn observe(&mut self) {
        let now = self.now();
        for index in 0..self.replicas.len() {
            let (incarnation, finished, live, version) = {
                let slot = self.replicas[index].slot.borrow();
                let version = slot.started_version;
                (slot.incarnation, slot.finished, slot.live.clone(), version)
            };
            let host = &mut self.replicas[index];
            if incarnation != host.seen_incarnation {
                host.seen_incarnation = incarnation;
                host.seen_finished = false;
                let who = application_name(index, incarnation);
                match version {
                    Some(version) => {
                        self.history
                            .note(now, who, format!("starts, version {version}"));
                        self.history.versions.push((index, incarnation, version));
                    }
                    None => self.history.note(now, who, "starts"),
                }
                self.history.incarnations.push((index, incarnation, now));
            }
            if finished && !self.replicas[index].seen_finished {
                self.replicas[index].seen_finished = true;
                self.history
                    .note(now, self.incarnation_name(index), "run returned; stopped");
            }
            if self.sharded {
                self.observe_shards(index, incarnation, live.as_ref(), now);
                continue;
            }
            let published = self.published(index, incarnation, live.as_ref());
            let single = live.as_ref().and_then(|live| live.elector.single());
            // What the replica believes is what `is_leader()` answers now: the published term
            // while its trust lasts. A lease term whose trust ran out while the driver could
            // not run (a paused process) is no belief any more, though still published; the
            // sabotage `published-belief` reads the published flag instead, as `is_leader()`
            // did before it compared the trust deadline with the clock.
            let believes = match (self.sabotage, single) {
                (Some(Sabotage::Driver(DriverSabotage::PublishedBelief)), _) | (_, None) => None,
                (_, Some(_)) => self.replicas[index].slot.borrow().believes,
            };
            if let (Some(leadership), Some(elector)) = (&published, single)
                && !leadership.is_leader()
                && elector.is_leader()
            {
                let what = format!("r{index}: is_leader() says yes without a published term");
                self.history.errors.push((now, what));
            }
            let (term, last_end) = match (&live, published) {
                (Some(_), Some(leadership)) => (
                    leadership.term().filter(|_| believes != Some(false)),
                    leadership.last_end(),
                ),
                // The incarnation no longer runs: whatever it published, its term is over.
                (None, Some(leadership)) => (None, leadership.last_end()),
                (_, None) => (None, None),
            };
            let open = term
                .map(|term| (0, (term.id.get(), term.epoch)))
                .into_iter()
                .collect();
            // A published term the replica no longer believes in (its lease's trust ran out,
            // its driver has not run yet) is lost to the lease's expiry, as it will publish.
            let distrusted = believes == Some(false)
                && live.is_some()
                && published
                    .as_ref()
                    .is_some_and(|leadership| leadership.term().is_some());
            let cause_of = |_, id| {
                last_end
                    .filter(|end| end.id.get() == id)
                    .map(|end| end.cause)
                    .or_else(|| {
                        distrusted.then_some(TermEndCause::Lost(
                            plexsphere_leader::LossReason::LeaseExpired,
                        ))
                    })
            };
            self.sync_terms(index, incarnation, &open, cause_of, now);
        }
    }

    /// The latest leadership the running incarnation of replica `index` published, read from
    /// a receiver subscribed when the harness first saw that incarnation run; `None` before
    /// it ran.
    fn published(
        &mut self,
        index: usize,
        incarnation: u32,
        live: Option<&Live>,
    ) -> Option<Leadership> {
        let host = &mut self.replicas[index];
        if let Some(elector) = live.and_then(|live| live.elector.single())
            && host.leadership.as_ref().map(|(seen, _)| *seen) != Some(incarnation)
        {
            host.leadership = Some((incarnation, elector.subscribe()));
        }
        match &mut host.leadership {
            Some((seen, receiver)) if *seen == incarnation => Some(*receiver.borrow_and_update()),
            _ => None,
        }
    }

    /// Brings the recorded terms of replica `index` in line with what its incarnation
    /// `incarnation` published: `open` maps each lock it holds a term on to that term's id
    /// and epoch. A recorded open term that is no longer open ends, with the cause
    /// `cause_of(lock, id)` gives; a newly published one begins.
    fn sync_terms(
        &mut self,
        index: usize,
        incarnation: u32,
        open: &OpenTerms,
        mut cause_of: impl FnMut(u32, u64) -> Option<TermEndCause>,
        now: Duration,
    ) {
        let ended: Vec<(u32, usize)> = self.replicas[index]
            .open_terms
            .iter()
            .filter(|&(lock, &record)| {
                let record = &self.history.terms[record];
                record.incarnation != incarnation
                    || open.get(lock).map(|(id, _)| *id) != Some(record.id)
            })
            .map(|(lock, record)| (*lock, *record))
            .collect();
        for (lock, record) in ended {
            let cause = cause_of(lock, self.history.terms[record].id);
            self.end_term(index, lock, record, cause, now);
        }
        for (&lock, &(id, epoch)) in open {
            if self.replicas[index].open_terms.contains_key(&lock) {
                continue;
            }
            self.history.terms.push(TermRecord {
                replica: index,
                incarnation,
                lock,
                id,
                epoch,
                span: Span::open(now),
                end: TermEnd::Open,
            });
            let record = self.history.terms.len() - 1;
            self.replicas[index].open_terms.insert(lock, record);
            let who = application_name(index, incarnation);
            let what = match epoch {
                Some(epoch) => format!("{}term {id} begins (epoch {epoch})", self.lock_name(lock)),
                None => format!("{}term {id} begins", self.lock_name(lock)),
            };
            self.history.note(now, who, what);
        }
    }

    /// How the trace names a term's lock: nothing for the single election's, `shard 3 `.
    fn lock_name(&self, lock: u32) -> String {
        if self.sharded {
            format!("shard {lock} ")
        } else {
            String::new()
        }
    }

    /// The recorded term `open` on `lock` of replica `index` ended, for `cause` as published
    /// (`None`: the incarnation stopped running before it published the end, which counts as
    /// lost).
    fn end_term(
        &mut self,
        index: usize,
        lock: u32,
        open: usize,
        cause: Option<TermEndCause>,
        now: Duration,
    ) {
        self.replicas[index].open_terms.remove(&lock);
        let name = self.lock_name(lock);
        let term = &mut self.history.terms[open];
        term.span.end = Some(now);
        term.end = match cause {
            Some(TermEndCause::Stopped) => TermEnd::Stopped,
            Some(TermEndCause::Resigned) => TermEnd::Resigned,
            Some(TermEndCause::HandedOver) => TermEnd::HandedOver,
            Some(TermEndCause::Yielded) => TermEnd::Yielded,
            // A cause added later counts as lost until the checker learns it.
            Some(_) | None => TermEnd::Lost,
        };
        let why = match cause {
            Some(TermEndCause::Stopped) => "stopped".to_owned(),
            Some(TermEndCause::Resigned) => "resigned".to_owned(),
            Some(TermEndCause::HandedOver) => "handed over".to_owned(),
            Some(TermEndCause::Yielded) => "yielded to a better candidate".to_owned(),
            Some(other) => other.to_string(),
            None => "leadership lost: the incarnation stopped".to_owned(),
        };
        let what = format!("{name}term {} ends: {why}", term.id);
        let who = application_name(index, term.incarnation);
        self.history.note(now, who, what);
    }

    /// Sharded runs: brings the recorded shard terms and handovers of replica `index` in
    /// line with the ownership its running incarnation published: a recorded term that is no
    /// longer owned ends (with the cause its elector's transitions give), a newly owned one
    /// begins; likewise the shards being handed over.
    fn observe_shards(
        &mut self,
        index: usize,
        incarnation: u32,
        live: Option<&Live>,
        now: Duration,
    ) {
        let published = self.published_ownership(index, incarnation, live);
        // In pause runs what the replica believes is what `ownership()` (and `is_owner()`)
        // answers now, sampled on the host: a published shard whose trust ran out while the
        // driver could not run is no belief any more. The sabotage `published-belief` reads
        // the published ownership instead, as `ownership()` answered before it looked at the
        // trust deadline.
        let owns = match self.sabotage {
            Some(Sabotage::Driver(DriverSabotage::PublishedBelief)) => None,
            _ => self.replicas[index].slot.borrow().owns.clone(),
        };
        let believed = |shard: &u32| owns.as_ref().is_none_or(|owns| owns.contains(shard));
        // Each owned shard's open term, with its epoch (a lease space's take's; none for
        // advisory shard terms, which run without fencing).
        let (open, handing): (OpenTerms, BTreeSet<u32>) = match (live, published) {
            (Some(_), Some(ownership)) => (
                ownership
                    .shards
                    .iter()
                    .filter(|(shard, _)| believed(shard))
                    .map(|(shard, owned)| (*shard, (owned.term.get(), owned.epoch)))
                    .collect(),
                ownership.handing_over,
            ),
            // The incarnation no longer runs: whatever it published is over.
            _ => (BTreeMap::new(), BTreeSet::new()),
        };
        let mut transitions = None;
        let cause_of = |shard, id| {
            let transitions = transitions.get_or_insert_with(|| {
                live.and_then(|live| live.elector.sharded())
                    .map(|elector| elector.transitions())
                    .unwrap_or_default()
            });
            transitions
                .iter()
                .rev()
                .find(|t| t.shard == shard && t.term.get() == id)
                .and_then(|t| t.ended)
                // A published term no longer believed (its trust ran out, the driver has not
                // run yet) is lost to the lease's expiry, as it will publish.
                .or_else(|| {
                    (!believed(&shard)).then_some(TermEndCause::Lost(
                        plexsphere_leader::LossReason::LeaseExpired,
                    ))
                })
        };
        self.sync_terms(index, incarnation, &open, cause_of, now);
        self.sync_handing(index, incarnation, &handing, now);
    }

    /// The shards replica `index` is handing over: a span per shard from the moment its
    /// ownership shows it handing over to the moment it no longer does.
    fn sync_handing(
        &mut self,
        index: usize,
        incarnation: u32,
        handing: &BTreeSet<u32>,
        now: Duration,
    ) {
        let over: Vec<(u32, usize)> = self.replicas[index]
            .open_handing
            .iter()
            .filter(|&(shard, &open)| {
                self.history.handing[open].incarnation != incarnation || !handing.contains(shard)
            })
            .map(|(shard, open)| (*shard, *open))
            .collect();
        for (shard, open) in over {
            self.replicas[index].open_handing.remove(&shard);
            self.history.handing[open].span.end = Some(now);
        }
        for &shard in handing {
            if self.replicas[index].open_handing.contains_key(&shard) {
                continue;
            }
            self.history.handing.push(Handing {
                replica: index,
                incarnation,
                shard,
                span: Span::open(now),
            });
            let open = self.history.handing.len() - 1;
            self.replicas[index].open_handing.insert(shard, open);
        }
    }

    /// The latest ownership the running incarnation of replica `index` published, read from
    /// a receiver subscribed when the harness first saw that incarnation run; `None` before
    /// it ran.
    fn published_ownership(
        &mut self,
        index: usize,
        incarnation: u32,
        live: Option<&Live>,
    ) -> Option<Ownership> {
        let host = &mut self.replicas[index];
        if let Some(elector) = live.and_then(|live| live.elector.sharded())
            && host.ownership.as_ref().map(|(seen, _)| *seen) != Some(incarnation)
        {
            host.ownership = Some((incarnation, elector.subscribe()));
        }
        match &mut host.ownership {
            Some((seen, receiver)) if *seen == incarnation => {
                Some(receiver.borrow_and_update().clone())
            }
            _ => None,
        }
    }

    /// The replicas that lead now, as last observed; in a sharded run the replicas that own
    /// shards, the one owning the most first.
    pub(crate) fn leaders(&self) -> Vec<usize> {
        let mut owners: Vec<usize> = (0..self.replicas.len())
            .filter(|&r| !self.replicas[r].open_terms.is_empty())
            .collect();
        owners.sort_by_key(|&r| (std::cmp::Reverse(self.replicas[r].open_terms.len()), r));
        owners
    }

    /// Whether replica `r`'s software runs and has not been asked to stop.
    pub(crate) fn is_up(&self, r: usize) -> bool {
        self.replicas[r].up.is_some()
    }

    /// Whether replica `r`'s software finished (after a graceful stop).
    pub(crate) fn has_finished(&self, r: usize) -> bool {
        self.replicas[r].slot.borrow().finished
    }

    fn end_up(&mut self, r: usize) {
        if let Some(up) = self.replicas[r].up.take() {
            self.history.up[up].span.end = Some(self.now());
        }
    }

    fn begin_up(&mut self, r: usize) {
        self.end_up(r);
        self.history.up.push(UpSpan {
            replica: r,
            span: Span::open(self.now()),
        });
        self.replicas[r].up = Some(self.history.up.len() - 1);
    }

    fn note(&mut self, who: impl Into<String>, what: impl Into<String>) {
        let now = self.now();
        self.history.note(now, who, what);
    }

    // ---- replica faults ----

    /// Crashes replica `r`'s host: turmoil drops its software, its sockets send FIN.
    pub(crate) fn crash(&mut self, r: usize) {
        self.note(self.replicas[r].name.clone(), "host crashes");
        let name = self.replicas[r].name.clone();
        self.sim.crash(name.as_str());
        self.after_software_dropped(r);
    }

    /// Restarts replica `r`'s host software (a crash first, if it runs).
    pub(crate) fn bounce(&mut self, r: usize) {
        self.note(self.replicas[r].name.clone(), "host (re)starts");
        let name = self.replicas[r].name.clone();
        self.sim.bounce(name.as_str());
        self.after_software_dropped(r);
        {
            // The new incarnation starts at the next step.
            let mut slot = self.replicas[r].slot.borrow_mut();
            slot.finished = false;
            slot.stop_requested = false;
        }
        self.begin_up(r);
    }

    fn after_software_dropped(&mut self, r: usize) {
        let now = self.now();
        self.recorder.borrow_mut().end_all_work(r, now);
        // The dropped run ended its term: observe it now, at the crash.
        self.observe();
        {
            let mut slot = self.replicas[r].slot.borrow_mut();
            slot.live = None;
        }
        self.end_up(r);
        for event in capture::drain() {
            let who = event
                .replica
                .map_or_else(|| "?".to_owned(), |r| self.incarnation_name(r));
            self.history
                .note(now, who, format!("{} {}", event.level, event.text));
        }
    }

    /// Rollout runs: replica `r`'s next incarnation runs the new version, and the rollout
    /// asks it to stop now (it starts again when it has stopped, [`World::bounce`]).
    pub(crate) fn upgrade(&mut self, r: usize) {
        self.replicas[r].slot.borrow_mut().version = Some(crate::setup::NEW_VERSION);
        self.note(
            self.replicas[r].name.clone(),
            format!("rollout: upgrades to {}", crate::setup::NEW_VERSION),
        );
        let now = self.now();
        self.history.upgrades.push((r, now));
        self.stop(r);
    }

    /// Asks replica `r` to stop gracefully (cancels its `run`).
    pub(crate) fn stop(&mut self, r: usize) {
        let live = {
            let mut slot = self.replicas[r].slot.borrow_mut();
            slot.stop_requested = true;
            slot.live.clone()
        };
        self.note(self.replicas[r].name.clone(), "asked to stop");
        if let Some(live) = live {
            live.shutdown.cancel();
        }
        let now = self.now();
        self.history.stop_requests.push((r, now));
        self.end_up(r);
    }

    /// An operator asks replica `r` to resign and keep off the lock for `hold_off`. Nothing
    /// happens (and nothing is recorded) when its run is not in progress.
    pub(crate) fn resign(&mut self, r: usize, hold_off: Duration) {
        let live = self.replicas[r].slot.borrow().live.clone();
        let Some(elector) = live.as_ref().map(|live| &live.elector) else {
            return;
        };
        // The sabotage drops the hold-off; the history keeps the one the operator asked for.
        let asked = match self.sabotage {
            Some(Sabotage::Driver(DriverSabotage::ResignWithoutHoldOff)) => Duration::ZERO,
            _ => hold_off,
        };
        let outcome = elector.resign_for(asked);
        let name = self.incarnation_name(r);
        self.note(
            name,
            format!("asked to resign for {hold_off:?}: {outcome:?}"),
        );
        if outcome == plexsphere_leader::leadership::Resignation::Requested {
            let now = self.now();
            self.history.resign_requests.push((r, now));
            let incarnation = self.replicas[r].slot.borrow().incarnation;
            // The hold-off runs on the replica's clock from when its driver takes the request.
            let hold_off = self.replicas[r].clock.real(hold_off);
            self.history.held_out.push(HeldOut {
                replica: r,
                incarnation,
                span: Span {
                    start: now,
                    end: Some(now + hold_off),
                },
            });
        }
    }

    /// An operator makes replica `r` ineligible (a leader resigns), or eligible again. Nothing
    /// happens when its run is not in progress.
    pub(crate) fn set_eligible(&mut self, r: usize, eligible: bool) {
        let live = self.replicas[r].slot.borrow().live.clone();
        let Some(elector) = live.as_ref().map(|live| &live.elector) else {
            return;
        };
        elector.set_eligible(eligible);
        let name = self.incarnation_name(r);
        self.note(
            name,
            format!("made {}", if eligible { "eligible" } else { "ineligible" }),
        );
        let now = self.now();
        if eligible {
            let open = self
                .history
                .held_out
                .iter_mut()
                .rev()
                .find(|held| held.replica == r && held.span.end.is_none());
            if let Some(held) = open {
                held.span.end = Some(now);
            }
        } else {
            let incarnation = self.replicas[r].slot.borrow().incarnation;
            self.history.resign_requests.push((r, now));
            self.history.held_out.push(HeldOut {
                replica: r,
                incarnation,
                span: Span::open(now),
            });
        }
    }

    // ---- links ----

    fn link_fault(&mut self, r: usize, server: usize, drops: bool) {
        let now = self.now();
        self.history.link_faults.push(LinkFault {
            replica: r,
            server,
            span: Span::open(now),
            drops,
        });
    }

    fn link_healed(&mut self, r: usize, server: usize) {
        let now = self.now();
        for fault in &mut self.history.link_faults {
            if fault.replica == r && fault.server == server && fault.span.end.is_none() {
                fault.span.end = Some(now);
            }
        }
    }

    /// Drops every message between replica `r` and server `s`, both ways.
    pub(crate) fn partition(&mut self, r: usize, s: usize) {
        let name = self.replicas[r].name.clone();
        self.note(name.clone(), format!("partitioned from {}", SERVERS[s]));
        self.sim.partition(name.as_str(), SERVERS[s]);
        self.link_fault(r, s, true);
    }

    /// Heals [`World::partition`].
    pub(crate) fn repair(&mut self, r: usize, s: usize) {
        let name = self.replicas[r].name.clone();
        self.note(name.clone(), format!("link to {} repaired", SERVERS[s]));
        self.sim.repair(name.as_str(), SERVERS[s]);
        self.link_healed(r, s);
    }

    /// Drops the messages of one direction between replica `r` and server `s`.
    pub(crate) fn partition_oneway(&mut self, r: usize, s: usize, to_server: bool) {
        let name = self.replicas[r].name.clone();
        let (from, to) = oneway(&name, s, to_server);
        self.note(name.clone(), format!("messages {from} -> {to} dropped"));
        self.sim.partition_oneway(from.as_str(), to.as_str());
        self.link_fault(r, s, true);
    }

    /// Heals [`World::partition_oneway`].
    pub(crate) fn repair_oneway(&mut self, r: usize, s: usize, to_server: bool) {
        let name = self.replicas[r].name.clone();
        let (from, to) = oneway(&name, s, to_server);
        self.note(name.clone(), format!("messages {from} -> {to} flow again"));
        self.sim.repair_oneway(from.as_str(), to.as_str());
        self.link_healed(r, s);
    }

    /// Holds every message between replica `r` and server `s` (delayed, not dropped).
    pub(crate) fn hold(&mut self, r: usize, s: usize) {
        let name = self.replicas[r].name.clone();
        self.note(name.clone(), format!("link to {} held", SERVERS[s]));
        self.sim.hold(name.as_str(), SERVERS[s]);
        self.link_fault(r, s, false);
    }

    /// Pauses replica `r`'s process ([`crate::pause`]): its software stops where it is, and
    /// its links hold their messages.
    pub(crate) fn pause(&mut self, r: usize) {
        let leads = self.leaders().contains(&r);
        for s in 0..SERVERS.len() {
            self.hold(r, s);
        }
        self.replicas[r].slot.borrow().gate.pause();
        let now = self.now();
        self.history.pauses.push((r, Span::open(now)));
        self.replicas[r].paused_leading = leads;
        let name = self.incarnation_name(r);
        self.note(
            name,
            format!(
                "process paused{}",
                if leads { " while leading" } else { "" }
            ),
        );
    }

    /// Resumes [`World::pause`]: first what its `is_leader()` answers, before any of its
    /// software ran again (the first call after a resume), then its software runs on and its
    /// links deliver.
    pub(crate) fn resume(&mut self, r: usize) {
        let now = self.now();
        let answer = self.replicas[r].slot.borrow().believes.unwrap_or(false);
        let leading = self.replicas[r].paused_leading;
        self.history.resumes.push((now, r, answer, leading));
        let name = self.incarnation_name(r);
        // A sharded replica's belief, per shard, as `is_owner()` answers it (sampled on the
        // host: the trust is read on its clock).
        let what = match &self.replicas[r].slot.borrow().owns {
            Some(owns) => {
                let owns: Vec<u32> = owns.iter().copied().collect();
                format!("process resumed; is_owner() answers yes for shards {owns:?}")
            }
            None => format!("process resumed; is_leader() answers {answer}"),
        };
        self.note(name, what);
        for (replica, span) in &mut self.history.pauses {
            if *replica == r && span.end.is_none() {
                span.end = Some(now);
            }
        }
        self.replicas[r].slot.borrow().gate.resume();
        for s in 0..SERVERS.len() {
            self.release(r, s);
        }
    }

    /// Releases [`World::hold`]: held messages are delivered.
    pub(crate) fn release(&mut self, r: usize, s: usize) {
        let name = self.replicas[r].name.clone();
        self.note(name.clone(), format!("link to {} released", SERVERS[s]));
        self.sim.release(name.as_str(), SERVERS[s]);
        self.link_healed(r, s);
    }

    // ---- servers ----

    /// Terminates backend `pid` of server `s` (`pg_terminate_backend`).
    pub(crate) fn terminate(&mut self, s: usize, pid: i32) {
        self.note(SERVERS[s], format!("pg_terminate_backend({pid})"));
        let current = self.servers[s]
            .session(pid)
            .map(|session| session.application_name);
        // A ranked standby's survey names its session with its candidacy (`~<tag> …`): its
        // owner is the name its startup gave, in the server's log.
        let owner = match current {
            Some(name) if name.starts_with('~') => {
                self.servers[s]
                    .log()
                    .iter()
                    .rev()
                    .find_map(|entry| match &entry.event {
                        plexsphere_leader_pgsim::Event::SessionStarted {
                            pid: started,
                            application_name,
                            ..
                        } if *started == pid => parse_application_name(application_name),
                        _ => None,
                    })
            }
            Some(name) => parse_application_name(&name),
            None => None,
        };
        if let Some((replica, _)) = owner {
            let now = self.now();
            let span = Span {
                start: now,
                end: Some(now),
            };
            self.history.disturbances.push((replica, span));
        }
        self.servers[s].terminate_backend(pid);
    }

    /// Crashes server `s`: every session and lock is gone; it refuses connections.
    pub(crate) fn server_crash(&mut self, s: usize) {
        self.note(SERVERS[s], "server crashes");
        self.servers[s].crash();
    }

    /// Restarts server `s`, empty. A server that is not the primary rejoins as the primary's
    /// synchronous standby: what it committed after it was deposed is rewound.
    pub(crate) fn server_restart(&mut self, s: usize) {
        self.note(SERVERS[s], "server restarts");
        let primary = self.primary_index();
        if primary != s {
            self.servers[primary].replicate_to(&self.servers[s]);
        }
        self.servers[s].restart();
    }

    /// Routes new connections to server `s`. The old primary keeps running (until the fault
    /// crashes it) on a timeline of its own: its later commits never reach `s`.
    pub(crate) fn fail_over_to(&mut self, s: usize) {
        self.note(SERVERS[s], "becomes the primary (failover)");
        for (other, server) in self.servers.iter().enumerate() {
            if other != s {
                server.detach_storage();
            }
        }
        self.primary.fail_over_to(SERVERS[s]);
        let now = self.now();
        self.history.primaries.push((now, s));
    }

    /// Sets the query latency of server `s`.
    pub(crate) fn set_latency(&mut self, s: usize, latency: Duration) {
        self.note(SERVERS[s], format!("query latency {latency:?}"));
        self.servers[s].set_query_latency(latency);
        let now = self.now();
        if latency.is_zero() {
            for (server, span) in &mut self.history.latency {
                if *server == s && span.end.is_none() {
                    span.end = Some(now);
                }
            }
        } else {
            self.history.latency.push((s, Span::open(now)));
        }
    }

    /// The pid of the session holding the leader lock on server `s`, if any; in a sharded
    /// run the owner of the lowest shard held.
    pub(crate) fn lock_holder(&self, s: usize) -> Option<i32> {
        let locks = self.servers[s].locks();
        locks
            .iter()
            .find(|lock| lock.mode == LockMode::Exclusive)
            .or(locks.first())
            .map(|lock| lock.pid)
    }

    /// The pids of the live sessions of server `s`.
    pub(crate) fn session_pids(&self, s: usize) -> Vec<i32> {
        self.servers[s].sessions().iter().map(|s| s.pid).collect()
    }
}

/// The (from, to) host names of one direction between a replica and a server.
fn oneway(replica: &str, s: usize, to_server: bool) -> (String, String) {
    if to_server {
        (replica.to_owned(), SERVERS[s].to_owned())
    } else {
        (SERVERS[s].to_owned(), replica.to_owned())
    }
}

/// Whether an adapter event's text is the refusal of a fitness probe.
fn is_unfit(text: &str) -> bool {
    text.contains(plexsphere_leader_core::LogKind::Unfit.message())
}
