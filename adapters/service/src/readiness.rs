//! The service's readiness probes: a registry of named probes that `/readyz` reports.
//!
//! A ticked loop's probe ([`LoopProbe`]) reports the outcome of the last tick its loop ran on
//! this replica, per the spec's table (implemented in
//! [`plexsphere_leader_core::readiness`]); the supervisor's `workers` probe reports the workers
//! that exhausted their restart budget. `/readyz` passes when every probe does.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use plexsphere_leader_core::readiness::{LoopReadiness, Tick};

/// A readiness or liveness probe: `Ok(())` when it passes, else the text `/readyz` (or
/// `/livez`) shows for it.
pub trait Probe: Send + Sync + 'static {
    /// The probe's verdict now. Must be cheap: it runs on every `/readyz` (`/livez`) request.
    fn check(&self) -> Result<(), String>;
}

/// Two probes of one registry ([`Readiness`] or [`Liveness`](crate::Liveness)) may not share a
/// name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a probe named {0:?} is already registered")]
pub struct DuplicateProbe(pub String);

/// A probe and the name it was registered under.
type NamedProbe = (String, Arc<dyn Probe>);

/// Named probes in registration order, shared by clones: the body of [`Readiness`] and
/// [`Liveness`](crate::Liveness).
#[derive(Clone, Default)]
pub(crate) struct ProbeSet {
    probes: Arc<Mutex<Vec<NamedProbe>>>,
}

impl ProbeSet {
    pub(crate) fn register(
        &self,
        name: impl Into<String>,
        probe: Arc<dyn Probe>,
    ) -> Result<(), DuplicateProbe> {
        let name = name.into();
        let mut probes = self.lock();
        if probes.iter().any(|(taken, _)| *taken == name) {
            return Err(DuplicateProbe(name));
        }
        probes.push((name, probe));
        Ok(())
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.lock().iter().map(|(name, _)| name.clone()).collect()
    }

    /// Runs every probe, outside the lock (a probe may take locks of its own).
    pub(crate) fn run(&self) -> Vec<ProbeReport> {
        let probes: Vec<_> = self.lock().clone();
        probes
            .into_iter()
            .map(|(name, probe)| ProbeReport {
                result: probe.check(),
                name,
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<NamedProbe>> {
        self.probes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The registry of a service's readiness probes. Cloning gives another handle on the same
/// registry.
///
/// Readiness never depends on leadership: a standby is as ready as the leader. A readiness tied
/// to leadership would deadlock a rolling update (the new replicas could not become ready until
/// they lead, and cannot lead while the old leader stays).
#[derive(Clone, Default)]
pub struct Readiness {
    probes: ProbeSet,
}

impl Readiness {
    /// An empty registry: it reports ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `probe` under `name`, in order.
    ///
    /// # Errors
    /// [`DuplicateProbe`] when the name is taken.
    pub fn register(
        &self,
        name: impl Into<String>,
        probe: Arc<dyn Probe>,
    ) -> Result<(), DuplicateProbe> {
        self.probes.register(name, probe)
    }

    /// Creates and registers the probe `probe_name` of the ticked loop `loop_name` (they differ
    /// only for `access-session-sweeper`, the probe of `access-session-sweep`).
    ///
    /// # Errors
    /// [`DuplicateProbe`] when the probe name is taken.
    pub fn loop_probe(
        &self,
        probe_name: &str,
        loop_name: &str,
    ) -> Result<LoopProbe, DuplicateProbe> {
        let probe = LoopProbe::new(loop_name);
        self.register(probe_name, Arc::new(probe.clone()))?;
        Ok(probe)
    }

    /// The names of the registered probes, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.probes.names()
    }

    /// Runs every probe.
    pub fn report(&self) -> ReadinessReport {
        ReadinessReport {
            probes: self.probes.run(),
        }
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("probes", &self.names())
            .finish()
    }
}

/// The verdict of every probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessReport {
    /// One entry per probe, in registration order.
    pub probes: Vec<ProbeReport>,
}

/// The verdict of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    /// The probe's name.
    pub name: String,
    /// `Ok(())`, or the probe's text.
    pub result: Result<(), String>,
}

impl ReadinessReport {
    /// Whether every probe passes.
    pub fn is_ready(&self) -> bool {
        all_pass(&self.probes)
    }

    /// The verdict of the probe `name`, if registered.
    pub fn probe(&self, name: &str) -> Option<&Result<(), String>> {
        find(&self.probes, name)
    }
}

impl fmt::Display for ReadinessReport {
    /// The `/readyz` body: one line per probe, `[+]<name> ok` or `[-]<name> failed: <text>`, then
    /// `readyz check passed` or `readyz check failed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_report(f, &self.probes, "readyz")
    }
}

pub(crate) fn all_pass(probes: &[ProbeReport]) -> bool {
    probes.iter().all(|probe| probe.result.is_ok())
}

pub(crate) fn find<'a>(probes: &'a [ProbeReport], name: &str) -> Option<&'a Result<(), String>> {
    probes
        .iter()
        .find(|probe| probe.name == name)
        .map(|probe| &probe.result)
}

/// One line per probe, `[+]<name> ok` or `[-]<name> failed: <text>`, then
/// `<endpoint> check passed` or `<endpoint> check failed`.
pub(crate) fn write_report(
    f: &mut fmt::Formatter<'_>,
    probes: &[ProbeReport],
    endpoint: &str,
) -> fmt::Result {
    for probe in probes {
        match &probe.result {
            Ok(()) => writeln!(f, "[+]{} ok", probe.name)?,
            Err(text) => writeln!(f, "[-]{} failed: {text}", probe.name)?,
        }
    }
    let verdict = if all_pass(probes) { "passed" } else { "failed" };
    writeln!(f, "{endpoint} check {verdict}")
}

/// The readiness probe of one ticked loop: a handle shared by the loop, which records its boot
/// pass and its ticks, and the registry, which reads it.
#[derive(Clone)]
pub struct LoopProbe {
    state: Arc<Mutex<LoopReadiness<String>>>,
}

impl LoopProbe {
    /// A probe of `loop_name` whose boot pass has not run yet (not ready).
    pub fn new(loop_name: &str) -> Self {
        Self {
            state: Arc::new(Mutex::new(LoopReadiness::new(loop_name))),
        }
    }

    /// Records the boot pass's outcome (its error rendered as text).
    pub fn record_boot(&self, outcome: Result<(), String>) {
        self.lock().boot(outcome);
    }

    /// Records one tick.
    pub fn record_tick(&self, tick: Tick<String>) {
        self.lock().tick(tick);
    }

    /// The loop's name, as the probe texts quote it.
    pub fn loop_name(&self) -> String {
        self.lock().loop_name().to_owned()
    }

    fn lock(&self) -> MutexGuard<'_, LoopReadiness<String>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Probe for LoopProbe {
    fn check(&self) -> Result<(), String> {
        self.lock().report()
    }
}

impl fmt::Debug for LoopProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LoopProbe").field(&*self.lock()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_registry_is_ready() {
        let report = Readiness::new().report();
        assert!(report.is_ready());
        assert_eq!(report.to_string(), "readyz check passed\n");
    }

    #[test]
    fn the_report_names_each_probe_and_fails_when_one_fails() {
        let readiness = Readiness::new();
        let a = readiness
            .loop_probe("invitations-expire", "invitations-expire")
            .unwrap();
        let b = readiness
            .loop_probe("access-session-sweeper", "access-session-sweep")
            .unwrap();
        a.record_boot(Ok(()));
        b.record_boot(Ok(()));
        b.record_tick(Tick::Panicked("boom".into()));
        let report = readiness.report();
        assert!(!report.is_ready());
        assert_eq!(
            report.to_string(),
            "[+]invitations-expire ok\n\
             [-]access-session-sweeper failed: plexsphere: background loop \"access-session-sweep\": tick panicked: boom\n\
             readyz check failed\n"
        );
        b.record_tick(Tick::Standby);
        assert!(readiness.report().is_ready());
    }

    #[test]
    fn probe_names_are_unique() {
        let readiness = Readiness::new();
        readiness.loop_probe("x", "x").unwrap();
        assert_eq!(
            readiness.loop_probe("x", "y").unwrap_err(),
            DuplicateProbe("x".into())
        );
        assert_eq!(readiness.names(), ["x"]);
    }
}
