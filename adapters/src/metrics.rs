//! The `plexsphere_background_leader` gauge.

use std::cell::RefCell;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Registry};

/// The gauge's name.
pub const LEADER_GAUGE_NAME: &str = "plexsphere_background_leader";

/// The gauge's help text.
pub const LEADER_GAUGE_HELP: &str =
    "1 while this replica holds the background leader lock, 0 otherwise";

thread_local! {
    /// While a lookup runs on this thread, the gauges of every `LeaderGauge` that a `gather()`
    /// collects.
    static FOUND: RefCell<Option<Vec<IntGauge>>> = const { RefCell::new(None) };
}

/// The registered collector: owns the gauge, and makes itself found again through `gather()`.
struct LeaderGauge {
    gauge: IntGauge,
}

impl Collector for LeaderGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        FOUND.with(|found| {
            if let Some(found) = found.borrow_mut().as_mut() {
                found.push(self.gauge.clone());
            }
        });
        self.gauge.collect()
    }
}

/// Registers the leader gauge on `registry`, or returns the one an earlier elector registered
/// there, so that electors sharing a registry write one series (last write wins).
///
/// # Errors
/// The registry refused the gauge, or another kind of collector already uses the name.
pub(crate) fn leader_gauge(registry: &Registry) -> Result<IntGauge, prometheus::Error> {
    let gauge = IntGauge::new(LEADER_GAUGE_NAME, LEADER_GAUGE_HELP)?;
    match registry.register(Box::new(LeaderGauge {
        gauge: gauge.clone(),
    })) {
        Ok(()) => Ok(gauge),
        Err(prometheus::Error::AlreadyReg) => {
            registered_gauge(registry).ok_or(prometheus::Error::AlreadyReg)
        }
        Err(error) => Err(error),
    }
}

/// The gauge of the `LeaderGauge` registered on `registry`, found by gathering on this thread.
fn registered_gauge(registry: &Registry) -> Option<IntGauge> {
    FOUND.with(|found| *found.borrow_mut() = Some(Vec::new()));
    let _ = registry.gather();
    let found = FOUND
        .with(|found| found.borrow_mut().take())
        .unwrap_or_default();
    found.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(registry: &Registry) -> Option<i64> {
        let families = registry.gather();
        let family = families.iter().find(|f| f.name() == LEADER_GAUGE_NAME)?;
        Some(family.get_metric()[0].get_gauge().get_value() as i64)
    }

    #[test]
    fn a_second_elector_on_the_same_registry_writes_the_same_series() {
        let registry = Registry::new();
        let first = leader_gauge(&registry).unwrap();
        let second = leader_gauge(&registry).unwrap();
        first.set(1);
        assert_eq!(second.get(), 1);
        second.set(0);
        assert_eq!(value(&registry), Some(0));
        assert_eq!(registry.gather().len(), 1);
    }

    #[test]
    fn separate_registries_keep_separate_series() {
        let (a, b) = (Registry::new(), Registry::new());
        leader_gauge(&a).unwrap().set(1);
        let _ = leader_gauge(&b).unwrap();
        assert_eq!(value(&a), Some(1));
        assert_eq!(value(&b), Some(0));
    }

    #[test]
    fn a_foreign_collector_under_the_name_is_an_error() {
        let registry = Registry::new();
        let foreign = IntGauge::new(LEADER_GAUGE_NAME, LEADER_GAUGE_HELP).unwrap();
        registry.register(Box::new(foreign)).unwrap();
        assert!(leader_gauge(&registry).is_err());
    }
}
