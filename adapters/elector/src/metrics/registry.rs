//! The Prometheus backend (feature `prometheus`, on by default): the families of a table on the
//! registry of [`Config::registry`](crate::Config::registry), as one collector.
//!
//! Electors that share a registry share the collector: the second one finds the collector the
//! first registered and writes its own label values (its `key`, a space's `class`); two
//! electors of the same key, or spaces of the same class, write the same series.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::backend::{Backend, Series};
use super::families::{Family, Kind};
use crate::error::ConfigError;
use crate::trust::Trust;

/// The trust deadlines of the electors that write a collector's series, by their `key` label:
/// at scrape time a leader gauge of 1 whose every elector's trust has run out reads 0 (a lease
/// leader paused past its trust, whose driver has not run since).
#[derive(Clone, Default)]
struct Trusts(Arc<Mutex<Vec<KeyedTrust>>>);

/// An elector's `key` label and its trust deadline, which dies with the elector.
type KeyedTrust = (String, Weak<Trust>);

impl Trusts {
    fn add(&self, key: &str, trust: &Arc<Trust>) {
        let mut trusts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        trusts.retain(|(_, trust)| trust.strong_count() > 0);
        trusts.push((key.to_owned(), Arc::downgrade(trust)));
    }

    /// Whether the electors of `key` (every elector: `None`) have a trust deadline, every one
    /// of which has passed now.
    fn ran_out(&self, key: Option<&str>) -> bool {
        let trusts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut live = trusts
            .iter()
            .filter(|(of, _)| key.is_none_or(|key| of == key))
            .filter_map(|(_, trust)| trust.upgrade())
            .peekable();
        live.peek().is_some() && live.all(|trust| !trust.holds_now())
    }

    /// A leader gauge's `families` as a scrape now sees them: every series (labeled `key`, or
    /// not) that reads 1 whose electors' trust ran out reads 0.
    fn at_scrape(&self, families: &mut [MetricFamily]) {
        for metric in families.iter_mut().flat_map(|family| family.mut_metric()) {
            let key = metric
                .get_label()
                .iter()
                .find(|label| label.name() == "key")
                .map(|label| label.value().to_owned());
            if metric.get_gauge().get_value() > 0.0 && self.ran_out(key.as_deref()) {
                let mut gauge = prometheus::proto::Gauge::default();
                gauge.set_value(0.0);
                metric.set_gauge(gauge);
            }
        }
    }
}

/// The backend of one registry, for the families of one table.
pub(crate) struct Prometheus(Group);

impl Prometheus {
    /// Registers the families of `table` on `registry` as one collector, or finds the one an
    /// earlier elector registered there.
    ///
    /// # Errors
    /// The registry refused the collector, or another collector uses one of the names.
    pub(crate) fn register(
        registry: &Registry,
        table: &'static [&'static Family],
    ) -> Result<Self, prometheus::Error> {
        let group = Group::new(table)?;
        match registry.register(Box::new(group.clone())) {
            Ok(()) => Ok(Self(group)),
            Err(prometheus::Error::AlreadyReg) => registered(registry, table)
                .map(Self)
                .ok_or(prometheus::Error::AlreadyReg),
            Err(error) => Err(error),
        }
    }
}

impl Backend for Prometheus {
    fn series(
        &self,
        family: &'static Family,
        values: &[&str],
    ) -> Result<Box<dyn Series>, ConfigError> {
        self.0.series(family, values).map_err(ConfigError::Metrics)
    }

    fn watch_trust(&self, key: &str, trust: &Arc<Trust>) {
        self.0.trusts.add(key, trust);
    }
}

/// The collectors of a table's families, registered as one collector so that a later elector
/// finds them all at once.
#[derive(Clone)]
struct Group {
    families: Vec<(&'static Family, Collectors)>,
    trusts: Trusts,
}

/// The collector of one family, by its kind.
#[derive(Clone)]
enum Collectors {
    Gauge(GaugeVec),
    Counter(IntCounterVec),
    Histogram(HistogramVec),
}

impl Collectors {
    fn new(family: &Family) -> Result<Self, prometheus::Error> {
        let opts = Opts::new(family.name, family.help);
        Ok(match family.kind {
            Kind::Gauge | Kind::Leading => Self::Gauge(GaugeVec::new(opts, family.labels)?),
            Kind::Counter => Self::Counter(IntCounterVec::new(opts, family.labels)?),
            Kind::Histogram(buckets) => Self::Histogram(HistogramVec::new(
                HistogramOpts::from(opts).buckets(buckets.to_vec()),
                family.labels,
            )?),
        })
    }

    fn collector(&self) -> &dyn Collector {
        match self {
            Self::Gauge(vec) => vec,
            Self::Counter(vec) => vec,
            Self::Histogram(vec) => vec,
        }
    }
}

impl Group {
    fn new(table: &'static [&'static Family]) -> Result<Self, prometheus::Error> {
        let families = table
            .iter()
            .map(|family| Ok((*family, Collectors::new(family)?)))
            .collect::<Result<_, prometheus::Error>>()?;
        Ok(Self {
            families,
            trusts: Trusts::default(),
        })
    }

    /// Whether this is the group of `table`.
    fn is_of(&self, table: &[&Family]) -> bool {
        let names = self.families.iter().map(|(family, _)| family.name);
        names.eq(table.iter().map(|family| family.name))
    }

    /// The child of `family` with `values`, created at zero when new.
    fn series(
        &self,
        family: &Family,
        values: &[&str],
    ) -> Result<Box<dyn Series>, prometheus::Error> {
        let collectors = self
            .families
            .iter()
            .find_map(|(of, collectors)| (of.name == family.name).then_some(collectors))
            .ok_or_else(|| {
                prometheus::Error::Msg(format!("{} is not in the table", family.name))
            })?;
        Ok(match collectors {
            Collectors::Gauge(vec) => Box::new(vec.get_metric_with_label_values(values)?),
            Collectors::Counter(vec) => Box::new(vec.get_metric_with_label_values(values)?),
            Collectors::Histogram(vec) => Box::new(vec.get_metric_with_label_values(values)?),
        })
    }
}

impl Collector for Group {
    fn desc(&self) -> Vec<&Desc> {
        self.families
            .iter()
            .flat_map(|(_, collectors)| collectors.collector().desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        FOUND.with(|found| {
            if let Some(found) = found.borrow_mut().as_mut() {
                found.push(self.clone());
            }
        });
        let mut collected = Vec::new();
        for (family, collectors) in &self.families {
            let mut families = collectors.collector().collect();
            if family.kind == Kind::Leading {
                self.trusts.at_scrape(&mut families);
            }
            collected.extend(families);
        }
        collected
    }
}

thread_local! {
    /// While a lookup runs on this thread, the groups of ours that a `gather()` collects.
    static FOUND: RefCell<Option<Vec<Group>>> = const { RefCell::new(None) };
}

/// The group of `table` registered on `registry`, found by gathering on this thread: each
/// group's `collect` reports itself while the lookup runs.
fn registered(registry: &Registry, table: &[&Family]) -> Option<Group> {
    FOUND.with(|found| *found.borrow_mut() = Some(Vec::new()));
    let _ = registry.gather();
    FOUND
        .with(|found| found.borrow_mut().take())
        .unwrap_or_default()
        .into_iter()
        .find(|group| group.is_of(table))
}

impl Series for prometheus::Gauge {
    fn set(&self, value: f64) {
        prometheus::Gauge::set(self, value);
    }
}

impl Series for prometheus::IntCounter {
    fn add(&self, count: u64) {
        self.inc_by(count);
    }
}

impl Series for prometheus::Histogram {
    fn observe(&self, value: f64) {
        prometheus::Histogram::observe(self, value);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus::IntGauge;

    use super::*;
    use crate::key::LockKey;
    use crate::metrics::backend::Gauge;
    use crate::metrics::backends::Backends;
    use crate::metrics::families::election;
    use crate::metrics::{
        AttemptOutcome, CHECK_DURATION, CheckRole, ElectionMetrics, IS_LEADER, LAST_CHECK_SUCCESS,
        LEADER_GAUGE_HELP, LEADER_GAUGE_NAME, LOCK_ATTEMPTS, TERM_EPOCH, TERM_START, TRANSITIONS,
        Transition, key_label,
    };

    fn value(registry: &Registry) -> Option<i64> {
        let families = registry.gather();
        let family = families.iter().find(|f| f.name() == LEADER_GAUGE_NAME)?;
        Some(family.get_metric()[0].get_gauge().get_value() as i64)
    }

    /// The value of the series of `name` whose labels include every pair of `labels`.
    fn sample(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let families = registry.gather();
        let family = families.iter().find(|f| f.name() == name)?;
        let metric = family.get_metric().iter().find(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|pair| pair.name() == *k && pair.value() == *v)
            })
        })?;
        Some(match family.get_field_type() {
            prometheus::proto::MetricType::COUNTER => metric.get_counter().get_value(),
            prometheus::proto::MetricType::HISTOGRAM => {
                metric.get_histogram().get_sample_count() as f64
            }
            _ => metric.get_gauge().get_value(),
        })
    }

    /// The spec's gauge of an elector registered on `registry`.
    fn leader_gauge(registry: &Registry) -> Result<Gauge, ConfigError> {
        Backends::registry(registry, election::ALL)?.handle(&election::LEADER, &[])
    }

    /// The metrics of the election of `key` on `registry`.
    fn register(registry: &Registry, key: &str) -> Result<ElectionMetrics, ConfigError> {
        ElectionMetrics::new(Backends::registry(registry, election::ALL)?, key)
    }

    #[test]
    fn a_second_elector_on_the_same_registry_writes_the_same_series() {
        let registry = Registry::new();
        let first = leader_gauge(&registry).unwrap();
        let second = leader_gauge(&registry).unwrap();
        first.set(1.0);
        assert_eq!(value(&registry), Some(1));
        second.set(0.0);
        assert_eq!(value(&registry), Some(0));
        assert_eq!(registry.gather().len(), 1);
    }

    #[test]
    fn separate_registries_keep_separate_series() {
        let (a, b) = (Registry::new(), Registry::new());
        leader_gauge(&a).unwrap().set(1.0);
        let _ = leader_gauge(&b).unwrap();
        assert_eq!(value(&a), Some(1));
        assert_eq!(value(&b), Some(0));
    }

    #[test]
    fn a_foreign_collector_under_the_name_is_an_error() {
        let registry = Registry::new();
        let foreign = IntGauge::new(LEADER_GAUGE_NAME, LEADER_GAUGE_HELP).unwrap();
        registry.register(Box::new(foreign)).unwrap();
        assert!(matches!(
            leader_gauge(&registry),
            Err(ConfigError::Metrics(_))
        ));
    }

    #[test]
    fn the_key_label_is_the_two_halves_of_the_lock_key() {
        assert_eq!(key_label(LockKey::DEFAULT), "1886156915:1");
        assert_eq!(key_label(LockKey::new(-7, 0)), "-7:0");
    }

    #[test]
    fn every_series_of_a_key_exists_at_zero_once_registered() {
        let registry = Registry::new();
        let _metrics = register(&registry, "1:1").unwrap();
        for t in Transition::ALL {
            let labels = [("key", "1:1"), ("to", t.to()), ("cause", t.cause())];
            assert_eq!(sample(&registry, TRANSITIONS, &labels), Some(0.0), "{t:?}");
        }
        for o in AttemptOutcome::ALL {
            let labels = [("key", "1:1"), ("outcome", o.label())];
            assert_eq!(
                sample(&registry, LOCK_ATTEMPTS, &labels),
                Some(0.0),
                "{o:?}"
            );
        }
        for name in [IS_LEADER, TERM_START, TERM_EPOCH, LAST_CHECK_SUCCESS] {
            assert_eq!(
                sample(&registry, name, &[("key", "1:1")]),
                Some(0.0),
                "{name}"
            );
        }
        let leader = [("key", "1:1"), ("role", "leader")];
        assert_eq!(sample(&registry, CHECK_DURATION, &leader), Some(0.0));
    }

    #[test]
    fn electors_on_one_registry_share_the_collectors_and_write_their_own_keys() {
        let registry = Registry::new();
        let gauge = leader_gauge(&registry).unwrap();
        let a = register(&registry, "1:1").unwrap();
        let a_again = register(&registry, "1:1").unwrap();
        let b = register(&registry, "1:2").unwrap();
        a.term_began(Some(7));
        a_again.attempt(AttemptOutcome::Granted);
        a.attempt(AttemptOutcome::Granted);
        b.attempt(AttemptOutcome::Refused);
        let is_leader = |key| sample(&registry, IS_LEADER, &[("key", key)]);
        assert_eq!((is_leader("1:1"), is_leader("1:2")), (Some(1.0), Some(0.0)));
        let granted = [("key", "1:1"), ("outcome", "granted")];
        assert_eq!(sample(&registry, LOCK_ATTEMPTS, &granted), Some(2.0));
        let refused = [("key", "1:2"), ("outcome", "refused")];
        assert_eq!(sample(&registry, LOCK_ATTEMPTS, &refused), Some(1.0));
        assert_eq!(sample(&registry, TERM_EPOCH, &[("key", "1:1")]), Some(7.0));
        let acquired = [("key", "1:1"), ("cause", "acquired")];
        assert_eq!(sample(&registry, TRANSITIONS, &acquired), Some(1.0));
        // Every elector writes the one spec's gauge.
        gauge.set(1.0);
        b.leading(false);
        assert_eq!(value(&registry), Some(0));
        a.term_ended();
        assert_eq!(is_leader("1:1"), Some(0.0));
        assert_eq!(sample(&registry, TERM_START, &[("key", "1:1")]), Some(0.0));
    }

    #[test]
    fn a_foreign_collector_under_a_per_key_name_is_an_error() {
        let registry = Registry::new();
        let foreign = IntGauge::new(IS_LEADER, "someone else's").unwrap();
        registry.register(Box::new(foreign)).unwrap();
        assert!(matches!(
            register(&registry, "1:1"),
            Err(ConfigError::Metrics(_))
        ));
    }

    #[test]
    fn a_check_latency_lands_in_its_role() {
        let registry = Registry::new();
        let metrics = register(&registry, "1:1").unwrap();
        metrics.check_latency(CheckRole::Standby, Duration::from_millis(3));
        let standby = [("key", "1:1"), ("role", "standby")];
        let leader = [("key", "1:1"), ("role", "leader")];
        assert_eq!(sample(&registry, CHECK_DURATION, &standby), Some(1.0));
        assert_eq!(sample(&registry, CHECK_DURATION, &leader), Some(0.0));
    }

    /// A clock the test moves by hand.
    #[derive(Debug)]
    struct Manual(std::sync::Mutex<std::time::Instant>);

    impl crate::clock::Clock for Manual {
        fn now(&self) -> std::time::Instant {
            *self.0.lock().unwrap()
        }

        fn tokio_instant(&self, reading: std::time::Instant) -> tokio::time::Instant {
            tokio::time::Instant::from_std(reading)
        }
    }

    #[test]
    fn a_scrape_past_the_leaders_trust_reads_no_leader_whether_or_not_the_driver_ran() {
        let registry = Registry::new();
        let key = key_label(LockKey::DEFAULT);
        let metrics = register(&registry, &key).unwrap();
        let t0 = std::time::Instant::now();
        let clock = Arc::new(Manual(std::sync::Mutex::new(t0)));
        let trust = Arc::new(crate::trust::Trust::new(
            Arc::clone(&clock) as Arc<dyn crate::clock::Clock>
        ));
        metrics.watch_trust(&trust);
        // A lease term trusted for 2.7 s: the driver set both gauges to 1.
        metrics.leading(true);
        metrics.term_began(Some(3));
        trust.set(Some(t0 + Duration::from_millis(2700)));
        let is_leader = |registry: &Registry| sample(registry, IS_LEADER, &[("key", &key)]);
        assert_eq!(value(&registry), Some(1));
        assert_eq!(is_leader(&registry), Some(1.0));
        // Past the trust, with the driver not run (a paused process): both read 0.
        *clock.0.lock().unwrap() = t0 + Duration::from_secs(3);
        assert_eq!(value(&registry), Some(0));
        assert_eq!(is_leader(&registry), Some(0.0));
        // A renewal extended it: 1 again; the advisory lock (no deadline) is never overridden.
        trust.set(Some(t0 + Duration::from_secs(6)));
        assert_eq!(value(&registry), Some(1));
        trust.set(None);
        *clock.0.lock().unwrap() = t0 + Duration::from_secs(60);
        assert_eq!(is_leader(&registry), Some(1.0));
        // A dropped elector's trust says nothing.
        trust.set(Some(t0));
        assert_eq!(value(&registry), Some(0));
        drop(trust);
        assert_eq!(value(&registry), Some(1));
    }
}
