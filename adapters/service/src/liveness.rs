//! Liveness: the probes `/livez` reports, and the elector's stuck-leader probe.
//!
//! Liveness asks "would restarting this process help?", readiness "should this replica get
//! traffic?". A leader that believes it leads but whose election is no longer driven (a blocked
//! runtime, a `run` future nobody polls) fails liveness: it keeps `is_leader()` true and its
//! loops running while its lock session may already have been ended by `idle_session_timeout`
//! and another replica leads; a restart ends that. Readiness never depends on leadership (see
//! [`Readiness`](crate::Readiness)).

use std::fmt;
use std::sync::Arc;

use crate::readiness::{
    DuplicateProbe, Probe, ProbeReport, ProbeSet, all_pass, find, write_report,
};
use plexsphere_leader::Elector;
use plexsphere_leader::sharded::ShardedElector;

/// The registry of a service's liveness probes, which `/livez` reports. Cloning gives another
/// handle on the same registry. An empty registry reports live.
#[derive(Clone, Default)]
pub struct Liveness {
    probes: ProbeSet,
}

impl Liveness {
    /// An empty registry: it reports live.
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

    /// The names of the registered probes, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.probes.names()
    }

    /// Runs every probe.
    pub fn report(&self) -> LivenessReport {
        LivenessReport {
            probes: self.probes.run(),
        }
    }
}

impl fmt::Debug for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Liveness")
            .field("probes", &self.names())
            .finish()
    }
}

/// The verdict of every liveness probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivenessReport {
    /// One entry per probe, in registration order.
    pub probes: Vec<ProbeReport>,
}

impl LivenessReport {
    /// Whether every probe passes.
    pub fn is_live(&self) -> bool {
        all_pass(&self.probes)
    }

    /// The verdict of the probe `name`, if registered.
    pub fn probe(&self, name: &str) -> Option<&Result<(), String>> {
        find(&self.probes, name)
    }
}

impl fmt::Display for LivenessReport {
    /// The `/livez` body: one line per probe, `[+]<name> ok` or `[-]<name> failed: <text>`, then
    /// `livez check passed` or `livez check failed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_report(f, &self.probes, "livez")
    }
}

/// An elector's liveness as a [`Probe`] for [`Liveness`]: the stuck-leader verdict of one
/// election ([`Elector::liveness`]) or the stuck-owner verdict of a sharded one
/// ([`ShardedElector::liveness`]). Never register it as a readiness probe.
#[derive(Clone, Debug)]
pub struct ElectorLiveness {
    elector: Driven,
}

/// The elector whose verdict the probe reads.
#[derive(Clone, Debug)]
enum Driven {
    Single(Elector),
    Sharded(ShardedElector),
}

impl ElectorLiveness {
    /// The liveness of `elector` ([`Elector::liveness`]): register it in [`Liveness`] under a
    /// name of your choice, e.g. [`ELECTION_WORKER`](crate::loops::ELECTION_WORKER).
    pub fn new(elector: Elector) -> Self {
        Self {
            elector: Driven::Single(elector),
        }
    }

    /// The liveness of a sharded `elector` ([`ShardedElector::liveness`]): failing while it
    /// owns a shard whose locks no survey proved for two check intervals.
    pub fn sharded(elector: ShardedElector) -> Self {
        Self {
            elector: Driven::Sharded(elector),
        }
    }
}

impl Probe for ElectorLiveness {
    fn check(&self) -> Result<(), String> {
        let verdict = match &self.elector {
            Driven::Single(elector) => elector.liveness(),
            Driven::Sharded(elector) => elector.liveness(),
        };
        verdict.map_err(|stuck| stuck.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<(), String>);

    impl Probe for Fixed {
        fn check(&self) -> Result<(), String> {
            self.0.clone()
        }
    }

    #[test]
    fn an_empty_registry_is_live() {
        let report = Liveness::new().report();
        assert!(report.is_live());
        assert_eq!(report.to_string(), "livez check passed\n");
    }

    #[test]
    fn the_report_names_each_probe_and_fails_when_one_fails() {
        let liveness = Liveness::new();
        liveness.register("a", Arc::new(Fixed(Ok(())))).unwrap();
        liveness
            .register("b", Arc::new(Fixed(Err("stuck".into()))))
            .unwrap();
        assert_eq!(
            liveness.register("a", Arc::new(Fixed(Ok(())))),
            Err(DuplicateProbe("a".into()))
        );
        let report = liveness.report();
        assert!(!report.is_live());
        assert_eq!(report.probe("b"), Some(&Err("stuck".into())));
        assert_eq!(
            report.to_string(),
            "[+]a ok\n[-]b failed: stuck\nlivez check failed\n"
        );
    }
}
