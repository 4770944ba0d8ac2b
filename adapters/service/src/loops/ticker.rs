//! The leader ticker: the spec's `runLeaderTicker`.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plexsphere_leader_core::readiness::Tick;
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::unfit::{Seen, UnfitStreak};
use super::{BoxError, LeaderSource, PassFn};
use crate::panic::CatchPanic;
use crate::readiness::LoopProbe;

/// The ticks counter's name.
pub const TICKS_METRIC: &str = "plexsphere_background_loop_ticks_total";

/// Ticks a pass on a fixed cadence, and asks the election's Do before each tick: the leader runs
/// the pass with the term's token, a standby runs nothing.
///
/// - The first tick comes one period after [`run`](Self::run) starts; the boot pass
///   ([`boot_pass`](Self::boot_pass)) is the one that runs at boot, on every replica, ungated.
/// - Missed ticks are skipped (no burst after a long pass or a pause).
/// - Each tick's outcome goes to the loop's probe when it has one (the spec's readiness table):
///   standby, a pass that succeeded, or a pass whose term ended under it record a pass; a pass
///   that returned an error or panicked records a failed tick.
/// - Every failed tick writes WARN `background loop tick failed: <cause>` (fields `loop`,
///   `cause`); a panic also writes ERROR `background loop tick panicked` (fields `loop`,
///   `panic`, `stack`), and the loop keeps ticking.
/// - A pass that fails with an error that says it cannot succeed on this replica
///   ([`is_permanent`](crate::is_permanent): a [`Permanent`](crate::Permanent) error, SQLSTATE
///   `42501` or `25006`) makes the leader step down ([`LeaderSource::step_down`]) once the loop
///   has failed so on every tick of its term for its patience: 10 tick periods
///   ([`UNFIT_PATIENCE_PERIODS`](super::UNFIT_PATIENCE_PERIODS)), doubling with each step-down
///   of this replica for this loop until the loop passes here again. Leadership so moves at most
///   once per 10 periods when no replica can do the work, and ends on a replica that can when
///   one exists; [`stay_when_unfit`](Self::stay_when_unfit) turns the step-down off.
pub struct LeaderTicker<L> {
    name: Arc<str>,
    leadership: L,
    period: Duration,
    pass: PassFn,
    probe_name: Option<Arc<str>>,
    probe: Option<LoopProbe>,
    at_boot: bool,
    metrics: Option<TickMetrics>,
    step_down_when_unfit: bool,
    /// Shared by the clones, so that a restarted worker keeps the step-down state.
    unfit: Arc<Mutex<UnfitStreak>>,
}

impl<L: Clone> Clone for LeaderTicker<L> {
    fn clone(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            leadership: self.leadership.clone(),
            period: self.period,
            pass: Arc::clone(&self.pass),
            probe_name: self.probe_name.clone(),
            probe: self.probe.clone(),
            at_boot: self.at_boot,
            metrics: self.metrics.clone(),
            step_down_when_unfit: self.step_down_when_unfit,
            unfit: Arc::clone(&self.unfit),
        }
    }
}

impl<L: LeaderSource> LeaderTicker<L> {
    /// A ticker of the loop `name` that runs `pass` every `period` on the leader. The period is
    /// at least 1 ms.
    pub fn new(name: &str, leadership: L, period: Duration, pass: PassFn) -> Self {
        let period = period.max(Duration::from_millis(1));
        Self {
            name: name.into(),
            leadership,
            period,
            pass,
            probe_name: None,
            probe: None,
            at_boot: false,
            metrics: None,
            step_down_when_unfit: true,
            unfit: Arc::new(Mutex::new(UnfitStreak::new(period))),
        }
    }

    /// Never steps down for this loop's failures (the spec's behaviour): a leader whose pass
    /// cannot succeed keeps leadership, and the loop's probe reports the failure.
    #[must_use]
    pub fn stay_when_unfit(mut self) -> Self {
        self.step_down_when_unfit = false;
        self
    }

    /// Gives the loop a readiness probe named `probe_name`, registered when the ticker is wired
    /// into a [`Background`](super::Background). Implies [`at_boot`](Self::at_boot): the boot
    /// pass is what the probe reports before the first tick.
    #[must_use]
    pub fn probe(mut self, probe_name: &str) -> Self {
        self.probe_name = Some(probe_name.into());
        self.at_boot = true;
        self
    }

    /// Uses `probe` as the loop's probe (already registered by the caller).
    #[must_use]
    pub fn with_probe(mut self, probe: LoopProbe) -> Self {
        self.probe = Some(probe);
        self.at_boot = true;
        self
    }

    /// Runs the pass once at boot, on every replica, ungated (a sweep that drains what fell due
    /// while the process was offline).
    #[must_use]
    pub fn at_boot(mut self) -> Self {
        self.at_boot = true;
        self
    }

    /// Counts the ticks in [`TickMetrics`].
    #[must_use]
    pub fn metrics(mut self, metrics: &TickMetrics) -> Self {
        self.metrics = Some(metrics.clone());
        self
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tick period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The probe name given to [`probe`](Self::probe), if any.
    pub fn probe_name(&self) -> Option<&str> {
        self.probe_name.as_deref()
    }

    /// Whether the ticker runs a boot pass.
    pub fn runs_at_boot(&self) -> bool {
        self.at_boot
    }

    /// The loop's probe, once it has one.
    pub fn loop_probe(&self) -> Option<&LoopProbe> {
        self.probe.as_ref()
    }

    pub(crate) fn set_probe(&mut self, probe: LoopProbe) {
        self.probe = Some(probe);
    }

    /// Runs the boot pass: ungated, with `shutdown` as its token, catching a panic. Records the
    /// outcome in the probe (a failure is logged at WARN and does not stop the service).
    ///
    /// # Errors
    /// The pass's error or panic, rendered as text.
    pub async fn boot_pass(&self, shutdown: &CancellationToken) -> Result<(), String> {
        let outcome = match CatchPanic::new((self.pass)(shutdown.clone())).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(crate::failure::report(error.as_ref()).text),
            Err(caught) => {
                caught.log(&self.name);
                Err(format!("panicked: {}", caught.value))
            }
        };
        if let Err(cause) = &outcome {
            tracing::warn!(
                target: "plexsphere_leader",
                r#loop = %self.name,
                cause = %cause,
                "background loop boot pass failed: {cause}"
            );
        }
        if let Some(probe) = &self.probe {
            probe.record_boot(outcome.clone());
        }
        outcome
    }

    /// Runs one tick: Do, then the outcome to the probe, the metrics and the log.
    pub async fn tick(&self, shutdown: &CancellationToken) -> Tick<String> {
        let called = Arc::new(AtomicBool::new(false));
        let work: PassFn = {
            let (called, pass) = (Arc::clone(&called), Arc::clone(&self.pass));
            Arc::new(move |token: CancellationToken| {
                called.store(true, Ordering::SeqCst);
                pass(token)
            })
        };
        let pass = plexsphere_leader::leadership::named_work(
            &self.name,
            self.leadership.run_if_leader(shutdown, work),
        );
        let ran = match CatchPanic::new(pass).await {
            Ok(ran) => Ok(ran),
            Err(caught) => {
                caught.log(&self.name);
                Err(caught.value)
            }
        };
        let reported = match &ran {
            Ok(Err(error)) => Some((
                crate::failure::report(error.as_ref()),
                crate::failure::is_permanent(error.as_ref()),
            )),
            _ => None,
        };
        let tick = settle(ran, called.load(Ordering::SeqCst), shutdown.is_cancelled());
        let sqlstate = reported.as_ref().and_then(|(r, _)| r.sqlstate.clone());
        self.record(&tick, sqlstate.as_deref());
        let seen = match (&tick, &reported) {
            (Tick::Passed, _) => Seen::Passed,
            (Tick::Failed(_), Some((_, true))) => Seen::Unfit,
            _ => Seen::Other,
        };
        self.weigh_unfit(&tick, seen);
        tick
    }

    /// Feeds the step-down rule and steps down when it says so.
    fn weigh_unfit(&self, tick: &Tick<String>, seen: Seen) {
        let (down, step_downs) = {
            let mut unfit = self.unfit.lock().unwrap_or_else(PoisonError::into_inner);
            let down = unfit.on_tick(tokio::time::Instant::now(), seen);
            (down, unfit.step_downs())
        };
        if let (Some(patience), true, Tick::Failed(cause)) = (down, self.step_down_when_unfit, tick)
        {
            self.leadership.step_down(&format!(
                "background loop {:?}: {cause} (on every tick for {patience:?}; step-down \
                 {step_downs} of this replica for this loop)",
                self.name,
            ));
        }
    }

    /// Ticks until `shutdown` is cancelled, then returns `Ok(())`. It never fails by itself: a
    /// failed or panicking pass is a failed tick, and the loop keeps ticking.
    ///
    /// # Errors
    /// None of its own; the signature fits [`Supervisor::add`](crate::Supervisor::add).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BoxError> {
        let start = tokio::time::Instant::now() + self.period;
        let mut every = tokio::time::interval_at(start, self.period);
        every.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                _ = every.tick() => {}
            }
            self.tick(&shutdown).await;
        }
    }

    fn record(&self, tick: &Tick<String>, sqlstate: Option<&str>) {
        match tick {
            Tick::Failed(cause) => self.log_failure(cause, sqlstate),
            Tick::Panicked(value) => self.log_failure(&format!("tick panicked: {value}"), None),
            Tick::Interrupted => tracing::debug!(
                target: "plexsphere_leader",
                r#loop = %self.name,
                "background loop tick interrupted by the end of its term"
            ),
            Tick::Standby | Tick::Passed | Tick::Cancelled => {}
        }
        if let Some(metrics) = &self.metrics {
            metrics.count(&self.name, tick);
        }
        if let Some(probe) = &self.probe {
            probe.record_tick(tick.clone());
        }
    }

    fn log_failure(&self, cause: &str, sqlstate: Option<&str>) {
        tracing::warn!(
            target: "plexsphere_leader",
            r#loop = %self.name,
            cause = %cause,
            sqlstate,
            "background loop tick failed: {cause}"
        );
    }
}

/// Maps Do's result to the tick: `called` tells a standby from a term that ended under the pass,
/// `cancelled` tells the service's own shutdown from a demotion.
fn settle(
    ran: Result<Result<bool, BoxError>, String>,
    called: bool,
    cancelled: bool,
) -> Tick<String> {
    match ran {
        Ok(Ok(true)) => Tick::Passed,
        Ok(Ok(false)) if !called => Tick::Standby,
        Ok(Ok(false)) if cancelled => Tick::Cancelled,
        Ok(Ok(false)) => Tick::Interrupted,
        // The pass saw the service's own shutdown while its term held: not a failed tick.
        Ok(Err(_)) if cancelled => Tick::Cancelled,
        Ok(Err(error)) => Tick::Failed(crate::failure::report(error.as_ref()).text),
        Err(value) => Tick::Panicked(value),
    }
}

impl<L> fmt::Debug for LeaderTicker<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderTicker")
            .field("name", &self.name)
            .field("period", &self.period)
            .field("probe", &self.probe_name)
            .field("at_boot", &self.at_boot)
            .finish_non_exhaustive()
    }
}

/// The `plexsphere_background_loop_ticks_total{loop, outcome}` counter; outcomes are `standby`,
/// `passed`, `interrupted`, `failed`, `panicked` and `cancelled`.
#[derive(Clone, Debug)]
pub struct TickMetrics {
    ticks: IntCounterVec,
}

impl TickMetrics {
    /// Registers the counter on `registry`.
    ///
    /// # Errors
    /// The registry refused it (for example, it is already registered there).
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let ticks = IntCounterVec::new(
            Opts::new(
                TICKS_METRIC,
                "Ticks of the leader-ticked background loops, by outcome",
            ),
            &["loop", "outcome"],
        )?;
        registry.register(Box::new(ticks.clone()))?;
        Ok(Self { ticks })
    }

    fn count(&self, name: &str, tick: &Tick<String>) {
        let outcome = match tick {
            Tick::Standby => "standby",
            Tick::Passed => "passed",
            Tick::Interrupted => "interrupted",
            Tick::Failed(_) => "failed",
            Tick::Panicked(_) => "panicked",
            Tick::Cancelled => "cancelled",
        };
        self.ticks.with_label_values(&[name, outcome]).inc();
    }
}
