//! The background plane of a service: its loops, their boot passes and probes, and the
//! supervisor that runs them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::join_all;
use plexsphere_leader_core::supervision::RestartPolicy;
use tokio_util::sync::CancellationToken;

use super::{BoxError, EveryReplica, LeaderSource, LeaderTicker, WhileLeader};
use crate::readiness::{DuplicateProbe, LoopProbe, Readiness};
use crate::supervisor::{DuplicateWorker, RunningWorkers, Supervisor, WORKERS_PROBE};
use plexsphere_leader::Elector;

/// The worker name of the election itself.
pub const ELECTION_WORKER: &str = "background-leader";

/// Why a loop could not be wired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WiringError {
    /// Two workers under one name.
    #[error(transparent)]
    Worker(#[from] DuplicateWorker),
    /// Two probes under one name.
    #[error(transparent)]
    Probe(#[from] DuplicateProbe),
}

type BootFn = Box<dyn FnOnce(CancellationToken) -> super::BoxFuture<BootOutcome> + Send>;

/// Where a wired worker runs: which launcher placed it (the spec's three loop tables, and
/// the workers such as the election itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Placement {
    /// Ticked on the leader only ([`Background::ticker`], the spec's `runLeaderTicker`): a
    /// standby's tick asks and skips.
    LeaderTicked,
    /// Run for the length of each term ([`Background::while_leader`], the spec's
    /// `runWhileLeader`): nothing runs on a standby.
    WhileLeader,
    /// Ticked on every replica, ungated ([`Background::every_replica`]); only its gated parts
    /// ask the leader.
    EveryReplica,
    /// A worker of its own on every replica ([`Background::worker`]: the election, or a loop
    /// that paces itself).
    Worker,
}

impl Placement {
    /// The placement's name in reports: `leader-ticked`, `while-leader`, `every-replica`,
    /// `worker`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::LeaderTicked => "leader-ticked",
            Self::WhileLeader => "while-leader",
            Self::EveryReplica => "every-replica",
            Self::Worker => "worker",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The outcome of one boot pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootOutcome {
    /// The loop's name.
    pub name: String,
    /// `Ok(())`, or the pass's error or panic as text.
    pub result: Result<(), String>,
}

/// The outcomes of every boot pass, in wiring order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BootReport {
    /// One entry per boot pass.
    pub passes: Vec<BootOutcome>,
}

impl BootReport {
    /// The passes that failed.
    pub fn failures(&self) -> impl Iterator<Item = &BootOutcome> {
        self.passes.iter().filter(|pass| pass.result.is_err())
    }
}

/// The background loops of a service, before they start: a [`Supervisor`], the service's
/// [`Readiness`] (which gets the loops' probes and the `workers` probe), and the boot passes.
///
/// 1. Wire: [`ticker`](Self::ticker), [`while_leader`](Self::while_leader),
///    [`every_replica`](Self::every_replica) and [`worker`](Self::worker) (every-replica loops),
///    usually inside [`wire_background`].
/// 2. [`boot`](Self::boot): every boot pass, on every replica, ungated, concurrently. A failed
///    one is reported by its probe until the first tick; the service serves anyway.
/// 3. [`start`](Self::start): every worker at once, just before the service serves.
pub struct Background {
    supervisor: Supervisor,
    readiness: Readiness,
    boot: Vec<BootFn>,
    placements: Vec<(String, Placement)>,
}

impl Background {
    /// A plane with the default restart budget that registers its probes on `readiness`,
    /// starting with the supervisor's `workers` probe.
    ///
    /// # Errors
    /// [`WiringError::Probe`] when `readiness` already has a `workers` probe.
    pub fn new(readiness: &Readiness) -> Result<Self, WiringError> {
        Self::with_policy(readiness, RestartPolicy::default())
    }

    /// A plane with the restart budget `policy`.
    ///
    /// # Errors
    /// [`WiringError::Probe`] when `readiness` already has a `workers` probe.
    pub fn with_policy(readiness: &Readiness, policy: RestartPolicy) -> Result<Self, WiringError> {
        let supervisor = Supervisor::new(policy);
        readiness.register(WORKERS_PROBE, Arc::new(supervisor.probe()))?;
        Ok(Self {
            supervisor,
            readiness: readiness.clone(),
            boot: Vec::new(),
            placements: Vec::new(),
        })
    }

    /// Wires a ticked loop: its worker, its probe (when it has a probe name) and its boot pass
    /// (when it runs at boot).
    ///
    /// # Errors
    /// A worker or probe name already taken.
    pub fn ticker<L: LeaderSource>(
        &mut self,
        mut ticker: LeaderTicker<L>,
    ) -> Result<(), WiringError> {
        if self.supervisor.contains(ticker.name()) {
            return Err(DuplicateWorker(ticker.name().to_owned()).into());
        }
        if let Some(probe_name) = ticker.probe_name() {
            let probe = self.readiness.loop_probe(probe_name, ticker.name())?;
            ticker.set_probe(probe);
        }
        if let (false, Some(probe)) = (ticker.runs_at_boot(), ticker.loop_probe()) {
            probe.record_boot(Ok(()));
        }
        if ticker.runs_at_boot() {
            let boot = ticker.clone();
            self.boot.push(Box::new(move |shutdown| {
                Box::pin(async move {
                    let result = boot.boot_pass(&shutdown).await;
                    BootOutcome {
                        name: boot.name().to_owned(),
                        result,
                    }
                })
            }));
        }
        let name = ticker.name().to_owned();
        self.supervisor
            .add(name.clone(), move |shutdown| ticker.clone().run(shutdown))?;
        self.placements.push((name, Placement::LeaderTicked));
        Ok(())
    }

    /// Every wired worker with its [`Placement`], in wiring order: what a service reports so
    /// that an operator (and a test) can see which loops run on the leader only.
    pub fn placements(&self) -> &[(String, Placement)] {
        &self.placements
    }

    /// Wires a while-leader loop. When its worker stops for good (its restart budget
    /// exhausted, or a [`Permanent`](crate::Permanent) error), a replica that leads then steps
    /// down once ([`LeaderSource::step_down`]): leadership goes to a replica that still runs the
    /// loop instead of staying, silently, with one that does not (the `workers` probe fails
    /// too).
    ///
    /// # Errors
    /// The worker name is taken.
    pub fn while_leader<L: LeaderSource>(
        &mut self,
        runner: WhileLeader<L>,
    ) -> Result<(), WiringError> {
        let name = runner.name().to_owned();
        let leadership = runner.leadership().clone();
        self.supervisor
            .add(name.clone(), move |shutdown| runner.clone().run(shutdown))?;
        let stopped = name.clone();
        self.supervisor.on_stopped_for_good(
            &name,
            Arc::new(move |cause: &str| {
                leadership.step_down(&format!(
                    "background worker {stopped:?} stopped for good: {cause}"
                ));
            }),
        );
        self.placements.push((name, Placement::WhileLeader));
        Ok(())
    }

    /// Wires a ticked loop that runs on every replica, ungated.
    ///
    /// # Errors
    /// The worker name is taken.
    pub fn every_replica(&mut self, ticker: EveryReplica) -> Result<(), WiringError> {
        let name = ticker.name().to_owned();
        self.supervisor
            .add(name.clone(), move |shutdown| ticker.clone().run(shutdown))?;
        self.placements.push((name, Placement::EveryReplica));
        Ok(())
    }

    /// Wires a worker that runs on every replica (an every-replica loop, or the election).
    ///
    /// # Errors
    /// The worker name is taken.
    pub fn worker<F, Fut, E>(&mut self, name: &str, start: F) -> Result<(), WiringError>
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.supervisor.add(name, start)?;
        self.placements.push((name.to_owned(), Placement::Worker));
        Ok(())
    }

    /// Registers a probe of a loop this plane does not tick itself.
    ///
    /// # Errors
    /// The probe name is taken.
    pub fn loop_probe(&self, probe_name: &str, loop_name: &str) -> Result<LoopProbe, WiringError> {
        Ok(self.readiness.loop_probe(probe_name, loop_name)?)
    }

    /// The supervisor, for what the helpers above do not cover.
    pub fn supervisor(&mut self) -> &mut Supervisor {
        &mut self.supervisor
    }

    /// The readiness registry.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The names of the wired workers, in order.
    pub fn worker_names(&self) -> Vec<String> {
        self.supervisor.names()
    }

    /// How many boot passes are wired.
    pub fn boot_passes(&self) -> usize {
        self.boot.len()
    }

    /// Runs every boot pass once, concurrently, ungated, and records each outcome in its loop's
    /// probe. Runs each pass only once: a second call runs nothing.
    pub async fn boot(&mut self, shutdown: &CancellationToken) -> BootReport {
        let passes = std::mem::take(&mut self.boot);
        let passes = passes.into_iter().map(|pass| pass(shutdown.clone()));
        BootReport {
            passes: join_all(passes).await,
        }
    }

    /// Starts every worker. Boot passes not run yet are dropped: call [`boot`](Self::boot)
    /// first.
    pub fn start(self, shutdown: &CancellationToken) -> RunningWorkers {
        self.supervisor.start(shutdown)
    }
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("supervisor", &self.supervisor)
            .field("readiness", &self.readiness)
            .field("boot_passes", &self.boot.len())
            .finish()
    }
}

/// What [`wire_background`] wired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wired {
    /// No Elector: no election and no background loop at all.
    Nothing,
    /// The election (worker `background-leader`) and the loops `wire` added: every worker name.
    Loops(Vec<String>),
}

/// The boot step of the background plane (the spec's surface registry, index 0).
///
/// With an Elector it registers the election as the worker [`ELECTION_WORKER`]
/// (`background-leader`), then calls `wire` to add every loop, each gated on that Elector. With
/// none (a boot without a database) it wires no background loop at all, so nothing is left
/// ungated by accident, and logs that at INFO.
///
/// # Errors
/// What `wire` returned, or a name already taken.
pub fn wire_background<F>(
    elector: Option<Elector>,
    background: &mut Background,
    wire: F,
) -> Result<Wired, WiringError>
where
    F: FnOnce(&Elector, &mut Background) -> Result<(), WiringError>,
{
    let Some(elector) = elector else {
        tracing::info!(
            target: "plexsphere_leader",
            "no database configured: no background leader and no background loop wired"
        );
        return Ok(Wired::Nothing);
    };
    let runner = elector.clone();
    background.worker(ELECTION_WORKER, move |shutdown| {
        let elector = runner.clone();
        // A run that ended with a permanent error is not restarted: no later run could lead
        // through this pool (or hold this shard space).
        async move {
            elector.run(shutdown).await.map_err(|error| {
                if error.is_permanent() {
                    crate::failure::Permanent::boxed(error)
                } else {
                    BoxError::from(error)
                }
            })
        }
    })?;
    wire(&elector, background)?;
    Ok(Wired::Loops(background.worker_names()))
}
