//! The Prometheus sink (feature `prometheus`, on by default): the spec's unlabeled gauge and the
//! per-key metrics on the registry of [`Config::registry`](crate::Config::registry).
//!
//! Electors that share a registry share the collectors: the second one finds the collectors the
//! first registered and writes its own label values (its `key`); two electors of the same key
//! write the same series.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use super::{
    AttemptOutcome, CHECK_DURATION, CHECK_DURATION_BUCKETS, CheckRole, ELIGIBLE, IS_LEADER,
    LAST_CHECK_SUCCESS, LEADER_GAUGE_HELP, LEADER_GAUGE_NAME, LOCK_ATTEMPTS, OVERDUE_WORK,
    TERM_EPOCH, TERM_START, TRANSITIONS, Transition, help, index_of, unix_seconds,
};

/// The trust deadlines of the electors that write a collector's series, by their `key` label:
/// at scrape time a leader gauge of 1 whose every elector's trust has run out reads 0 (a lease
/// leader paused past its trust, whose driver has not run since).
#[derive(Clone, Default)]
pub(crate) struct Trusts(Arc<Mutex<Vec<KeyedTrust>>>);

/// An elector's `key` label and its trust deadline, which dies with the elector.
type KeyedTrust = (String, Weak<crate::trust::Trust>);

impl Trusts {
    fn add(&self, key: &str, trust: &Arc<crate::trust::Trust>) {
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

    /// `families` as a scrape now sees them: every series of `name` (labeled `key`, or not)
    /// that reads 1 whose electors' trust ran out reads 0.
    fn at_scrape(&self, name: &str, mut families: Vec<MetricFamily>) -> Vec<MetricFamily> {
        for family in families.iter_mut().filter(|family| family.name() == name) {
            for metric in family.mut_metric() {
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
        families
    }
}

/// The Prometheus sink of one elector: the spec's gauge and the shared collectors' children for
/// its `key`. Every observation is a few atomic operations.
#[derive(Clone)]
pub(crate) struct ElectorMetrics {
    /// The spec's unlabeled gauge, shared by every elector on the registry.
    gauge: IntGauge,
    /// This elector's `key` label.
    key: String,
    /// The trust deadlines the spec's gauge and the per-key collectors read at scrape time.
    gauge_trusts: Trusts,
    trusts: Trusts,
    is_leader: IntGauge,
    term_start: Gauge,
    term_epoch: IntGauge,
    last_check: Gauge,
    /// Indexed like [`Transition::ALL`].
    transitions: Vec<IntCounter>,
    /// Indexed like [`AttemptOutcome::ALL`].
    attempts: Vec<IntCounter>,
    /// Indexed like [`CheckRole::ALL`].
    check_duration: Vec<Histogram>,
    overdue_reported: IntCounter,
    overdue_aborted: IntCounter,
    eligible: IntGauge,
}

impl ElectorMetrics {
    /// Registers the spec's gauge and the collectors on `registry`, or finds the ones an earlier
    /// elector registered, and creates every series of `key` (at zero, so rates are defined
    /// from the start).
    ///
    /// # Errors
    /// The registry refused them, or another kind of collector uses one of the names.
    pub(crate) fn register(registry: &Registry, key: &str) -> Result<Self, prometheus::Error> {
        let (gauge, gauge_trusts) = leader_gauge(registry)?;
        let collectors = ElectorCollectors::new()?;
        let collectors = match registry.register(Box::new(collectors.clone())) {
            Ok(()) => collectors,
            Err(prometheus::Error::AlreadyReg) => {
                registered_collectors(registry).ok_or(prometheus::Error::AlreadyReg)?
            }
            Err(error) => return Err(error),
        };
        collectors.children(key, gauge, gauge_trusts)
    }
}

impl super::Sink for ElectorMetrics {
    fn leading(&self, leading: bool) {
        self.gauge.set(i64::from(leading));
    }

    /// A term began with fencing `epoch`: is-leader 1, its start time and epoch.
    fn term_began(&self, epoch: Option<u64>) {
        self.term_start.set(unix_seconds(SystemTime::now()));
        self.term_epoch
            .set(epoch.map_or(0, |epoch| i64::try_from(epoch).unwrap_or(i64::MAX)));
        self.is_leader.set(1);
        self.transition(Transition::Acquired);
    }

    /// The term ended: is-leader, its start time and epoch go to 0. The transition is counted
    /// apart, once its cause is known (`transition`).
    fn term_ended(&self) {
        self.is_leader.set(0);
        self.term_start.set(0.0);
        self.term_epoch.set(0);
    }

    /// Counts one leadership transition.
    fn transition(&self, transition: Transition) {
        if let Some(counter) =
            index_of(&Transition::ALL, transition).and_then(|index| self.transitions.get(index))
        {
            counter.inc();
        }
    }

    /// Counts one lock attempt.
    fn attempt(&self, outcome: AttemptOutcome) {
        if let Some(counter) =
            index_of(&AttemptOutcome::ALL, outcome).and_then(|index| self.attempts.get(index))
        {
            counter.inc();
        }
    }

    /// Observes how long a check's statement took.
    fn check_latency(&self, role: CheckRole, took: Duration) {
        if let Some(histogram) =
            index_of(&CheckRole::ALL, role).and_then(|index| self.check_duration.get(index))
        {
            histogram.observe(took.as_secs_f64());
        }
    }

    /// A check answered: its wall-clock time.
    fn check_succeeded(&self) {
        self.last_check.set(unix_seconds(SystemTime::now()));
    }

    /// The replica was made eligible to lead, or not.
    fn set_eligible(&self, eligible: bool) {
        self.eligible.set(i64::from(eligible));
    }

    /// The elector's trust deadline: the gauges read it at scrape time.
    fn watch_trust(&self, trust: &Arc<crate::trust::Trust>) {
        self.gauge_trusts.add(&self.key, trust);
        self.trusts.add(&self.key, trust);
    }

    /// Work was found running past the work deadline; `aborted` when it was aborted.
    fn overdue_work(&self, aborted: bool) {
        if aborted {
            self.overdue_aborted.inc();
        } else {
            self.overdue_reported.inc();
        }
    }
}

/// Every per-key collector, registered as one collector so that a second elector finds them
/// all at once.
#[derive(Clone)]
struct ElectorCollectors {
    is_leader: IntGaugeVec,
    term_start: GaugeVec,
    term_epoch: IntGaugeVec,
    last_check: GaugeVec,
    transitions: IntCounterVec,
    attempts: IntCounterVec,
    check_duration: HistogramVec,
    overdue: IntCounterVec,
    eligible: IntGaugeVec,
    trusts: Trusts,
}

impl ElectorCollectors {
    fn new() -> Result<Self, prometheus::Error> {
        let histogram = HistogramOpts::new(CHECK_DURATION, help(CHECK_DURATION))
            .buckets(CHECK_DURATION_BUCKETS.to_vec());
        Ok(Self {
            is_leader: IntGaugeVec::new(Opts::new(IS_LEADER, help(IS_LEADER)), &["key"])?,
            term_start: GaugeVec::new(Opts::new(TERM_START, help(TERM_START)), &["key"])?,
            term_epoch: IntGaugeVec::new(Opts::new(TERM_EPOCH, help(TERM_EPOCH)), &["key"])?,
            last_check: GaugeVec::new(
                Opts::new(LAST_CHECK_SUCCESS, help(LAST_CHECK_SUCCESS)),
                &["key"],
            )?,
            transitions: IntCounterVec::new(
                Opts::new(TRANSITIONS, help(TRANSITIONS)),
                &["key", "to", "cause"],
            )?,
            attempts: IntCounterVec::new(
                Opts::new(LOCK_ATTEMPTS, help(LOCK_ATTEMPTS)),
                &["key", "outcome"],
            )?,
            check_duration: HistogramVec::new(histogram, &["key", "role"])?,
            overdue: IntCounterVec::new(
                Opts::new(OVERDUE_WORK, help(OVERDUE_WORK)),
                &["key", "action"],
            )?,
            eligible: IntGaugeVec::new(Opts::new(ELIGIBLE, help(ELIGIBLE)), &["key"])?,
            trusts: Trusts::default(),
        })
    }

    /// The children of `key`, every series created.
    fn children(
        &self,
        key: &str,
        gauge: IntGauge,
        gauge_trusts: Trusts,
    ) -> Result<ElectorMetrics, prometheus::Error> {
        let transitions = Transition::ALL
            .iter()
            .map(|t| {
                self.transitions
                    .get_metric_with_label_values(&[key, t.to(), t.cause()])
            })
            .collect::<Result<_, _>>()?;
        let attempts = AttemptOutcome::ALL
            .iter()
            .map(|o| {
                self.attempts
                    .get_metric_with_label_values(&[key, o.label()])
            })
            .collect::<Result<_, _>>()?;
        let check_duration = CheckRole::ALL
            .iter()
            .map(|r| {
                self.check_duration
                    .get_metric_with_label_values(&[key, r.label()])
            })
            .collect::<Result<_, _>>()?;
        Ok(ElectorMetrics {
            gauge,
            key: key.to_owned(),
            gauge_trusts,
            trusts: self.trusts.clone(),
            is_leader: self.is_leader.get_metric_with_label_values(&[key])?,
            term_start: self.term_start.get_metric_with_label_values(&[key])?,
            term_epoch: self.term_epoch.get_metric_with_label_values(&[key])?,
            last_check: self.last_check.get_metric_with_label_values(&[key])?,
            transitions,
            attempts,
            check_duration,
            overdue_reported: self
                .overdue
                .get_metric_with_label_values(&[key, "reported"])?,
            overdue_aborted: self
                .overdue
                .get_metric_with_label_values(&[key, "aborted"])?,
            eligible: self.eligible.get_metric_with_label_values(&[key])?,
        })
    }

    fn collectors(&self) -> [&dyn Collector; 9] {
        [
            &self.is_leader,
            &self.term_start,
            &self.term_epoch,
            &self.last_check,
            &self.transitions,
            &self.attempts,
            &self.check_duration,
            &self.overdue,
            &self.eligible,
        ]
    }
}

impl Collector for ElectorCollectors {
    fn desc(&self) -> Vec<&Desc> {
        self.collectors()
            .into_iter()
            .flat_map(|collector| collector.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        FOUND.with(|found| {
            if let Some(found) = found.borrow_mut().as_mut() {
                found.push(Found::Elector(self.clone()));
            }
        });
        let families = self
            .collectors()
            .into_iter()
            .flat_map(|collector| collector.collect())
            .collect();
        self.trusts.at_scrape(IS_LEADER, families)
    }
}

/// What a `gather()` on this thread found of our collectors.
enum Found {
    Gauge(IntGauge, Trusts),
    Elector(ElectorCollectors),
}

thread_local! {
    /// While a lookup runs on this thread, the collectors of ours that a `gather()` collects.
    static FOUND: RefCell<Option<Vec<Found>>> = const { RefCell::new(None) };
}

/// Our collectors registered on `registry`, found by gathering on this thread: each one's
/// `collect` reports itself while the lookup runs.
fn find_registered(registry: &Registry) -> Vec<Found> {
    FOUND.with(|found| *found.borrow_mut() = Some(Vec::new()));
    let _ = registry.gather();
    FOUND
        .with(|found| found.borrow_mut().take())
        .unwrap_or_default()
}

/// The registered collector of the spec's gauge: owns the gauge, and makes itself found again
/// through `gather()`.
struct LeaderGauge {
    gauge: IntGauge,
    trusts: Trusts,
}

impl Collector for LeaderGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        FOUND.with(|found| {
            if let Some(found) = found.borrow_mut().as_mut() {
                found.push(Found::Gauge(self.gauge.clone(), self.trusts.clone()));
            }
        });
        self.trusts
            .at_scrape(LEADER_GAUGE_NAME, self.gauge.collect())
    }
}

/// Registers the leader gauge on `registry`, or returns the one an earlier elector registered
/// there, so that electors sharing a registry write one series (last write wins).
///
/// # Errors
/// The registry refused the gauge, or another kind of collector already uses the name.
pub(crate) fn leader_gauge(registry: &Registry) -> Result<(IntGauge, Trusts), prometheus::Error> {
    let gauge = IntGauge::new(LEADER_GAUGE_NAME, LEADER_GAUGE_HELP)?;
    let trusts = Trusts::default();
    match registry.register(Box::new(LeaderGauge {
        gauge: gauge.clone(),
        trusts: trusts.clone(),
    })) {
        Ok(()) => Ok((gauge, trusts)),
        Err(prometheus::Error::AlreadyReg) => {
            registered_gauge(registry).ok_or(prometheus::Error::AlreadyReg)
        }
        Err(error) => Err(error),
    }
}

/// The gauge of the `LeaderGauge` registered on `registry`.
fn registered_gauge(registry: &Registry) -> Option<(IntGauge, Trusts)> {
    find_registered(registry)
        .into_iter()
        .find_map(|found| match found {
            Found::Gauge(gauge, trusts) => Some((gauge, trusts)),
            Found::Elector(_) => None,
        })
}

/// The `ElectorCollectors` registered on `registry`.
fn registered_collectors(registry: &Registry) -> Option<ElectorCollectors> {
    find_registered(registry)
        .into_iter()
        .find_map(|found| match found {
            Found::Elector(collectors) => Some(collectors),
            Found::Gauge(..) => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKey;
    use crate::metrics::{Sink as _, key_label};

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

    #[test]
    fn a_second_elector_on_the_same_registry_writes_the_same_series() {
        let registry = Registry::new();
        let first = leader_gauge(&registry).unwrap().0;
        let second = leader_gauge(&registry).unwrap().0;
        first.set(1);
        assert_eq!(second.get(), 1);
        second.set(0);
        assert_eq!(value(&registry), Some(0));
        assert_eq!(registry.gather().len(), 1);
    }

    #[test]
    fn separate_registries_keep_separate_series() {
        let (a, b) = (Registry::new(), Registry::new());
        leader_gauge(&a).unwrap().0.set(1);
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

    #[test]
    fn the_key_label_is_the_two_halves_of_the_lock_key() {
        assert_eq!(key_label(LockKey::DEFAULT), "1886156915:1");
        assert_eq!(key_label(LockKey::new(-7, 0)), "-7:0");
    }

    #[test]
    fn every_series_of_a_key_exists_at_zero_once_registered() {
        let registry = Registry::new();
        let _metrics = ElectorMetrics::register(&registry, "1:1").unwrap();
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
        let gauge = leader_gauge(&registry).unwrap().0;
        let a = ElectorMetrics::register(&registry, "1:1").unwrap();
        let a_again = ElectorMetrics::register(&registry, "1:1").unwrap();
        let b = ElectorMetrics::register(&registry, "1:2").unwrap();
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
        // The spec's gauge is still found apart from the per-key collectors.
        assert_eq!(leader_gauge(&registry).unwrap().0.get(), gauge.get());
        a.term_ended();
        assert_eq!(is_leader("1:1"), Some(0.0));
        assert_eq!(sample(&registry, TERM_START, &[("key", "1:1")]), Some(0.0));
    }

    #[test]
    fn a_foreign_collector_under_a_per_key_name_is_an_error() {
        let registry = Registry::new();
        let foreign = IntGauge::new(IS_LEADER, "someone else's").unwrap();
        registry.register(Box::new(foreign)).unwrap();
        assert!(ElectorMetrics::register(&registry, "1:1").is_err());
    }

    #[test]
    fn a_check_latency_lands_in_its_role() {
        let registry = Registry::new();
        let metrics = ElectorMetrics::register(&registry, "1:1").unwrap();
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
        let metrics = ElectorMetrics::register(&registry, &key).unwrap();
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
