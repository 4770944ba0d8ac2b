//! The elector's Prometheus metrics: the spec's unlabeled `plexsphere_background_leader` gauge,
//! and the per-key metrics beyond the spec (transitions, lock attempts, check latency, the last
//! successful check, the current term). All of them go on the registry of
//! [`Config::registry`](crate::Config::registry); without one, none is kept. `docs/metrics.md`
//! describes each metric and gives alert rules.
//!
//! Electors that share a registry share the collectors: the second one finds the collectors the
//! first registered and writes its own label values (its `key`); two electors of the same key
//! write the same series.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::core::{Collector, Desc};

use crate::key::LockKey;
use plexsphere_leader_core::TermEndCause;
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// The spec's gauge's name.
pub const LEADER_GAUGE_NAME: &str = "plexsphere_background_leader";

/// The spec's gauge's help text.
pub const LEADER_GAUGE_HELP: &str =
    "1 while this replica holds the background leader lock, 0 otherwise";

/// Gauge `{key}`: 1 while this replica leads the election of `key`, 0 otherwise.
pub const IS_LEADER: &str = "plexsphere_leader_is_leader";

/// Counter `{key, to, cause}`: leadership transitions, by the state entered and why.
pub const TRANSITIONS: &str = "plexsphere_leader_transitions_total";

/// Counter `{key, outcome}`: a standby's lock attempts (its checks), by outcome.
pub const LOCK_ATTEMPTS: &str = "plexsphere_leader_lock_attempts_total";

/// Histogram `{key, role}`: how long a check's statement took to answer.
pub const CHECK_DURATION: &str = "plexsphere_leader_check_duration_seconds";

/// Gauge `{key}`: unix time of the last check that answered (leader or standby).
pub const LAST_CHECK_SUCCESS: &str = "plexsphere_leader_last_check_success_timestamp_seconds";

/// Gauge `{key}`: unix time the current term began; 0 while not leading.
pub const TERM_START: &str = "plexsphere_leader_term_start_timestamp_seconds";

/// Gauge `{key}`: the current term's fencing epoch; 0 while not leading or without fencing.
pub const TERM_EPOCH: &str = "plexsphere_leader_term_epoch";

/// The buckets of [`CHECK_DURATION`], in seconds: 1 ms to 10 s, about three per decade.
pub const CHECK_DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Gauge `{key}`: 1 while this replica may lead ([`Elector::set_eligible`]), 0 while it is kept
/// out (a canary): an ineligible replica makes no checks.
///
/// [`Elector::set_eligible`]: crate::Elector::set_eligible
pub const ELIGIBLE: &str = "plexsphere_leader_eligible";

/// Counter `{key, action}`: leader work found still running a work deadline after its term
/// ended ([`Config::work_deadline`](crate::Config::work_deadline)); `action` is `reported` or
/// `aborted`.
pub const OVERDUE_WORK: &str = "plexsphere_leader_overdue_work_total";

/// The `key` label value of the election of `key`: `"1886156915:1"` for the default key (the
/// key's `CLASSID:OBJID` form). Every per-key metric takes its `key` label from here.
pub fn key_label(key: LockKey) -> String {
    key.to_string()
}

/// Why leadership changed: the `to` and `cause` labels of [`TRANSITIONS`]. Closed: a term
/// began, or ended with the core's [`TermEndCause`], whose label is the `cause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Transition {
    /// A term began (the lock was granted, and the epoch advanced with fencing).
    Acquired,
    /// A term ended, for this cause.
    Ended(TermEndCause),
}

impl Transition {
    const ALL: [Self; 1 + TermEndCause::ALL.len()] = {
        let mut all = [Self::Acquired; 1 + TermEndCause::ALL.len()];
        let mut index = 0;
        while index < TermEndCause::ALL.len() {
            all[index + 1] = Self::Ended(TermEndCause::ALL[index]);
            index += 1;
        }
        all
    };

    /// The `to` label: the state entered.
    const fn to(self) -> &'static str {
        match self {
            Self::Acquired => "leader",
            Self::Ended(_) => "standby",
        }
    }

    /// The `cause` label.
    const fn cause(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Ended(cause) => cause.label(),
        }
    }
}

/// How a standby's lock attempt ended: the `outcome` label of [`LOCK_ATTEMPTS`]. Closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AttemptOutcome {
    /// The lock was granted.
    Granted,
    /// Another session holds the lock.
    Refused,
    /// The server is a hot standby.
    InRecovery,
    /// The session already held the lock: a transaction-mode pooler shares it.
    SharedSession,
    /// The grant statement did not answer in time.
    TimedOut,
    /// The grant statement failed.
    Error,
    /// No connection: the pool failed or did not hand one out in time.
    NoConnection,
}

impl AttemptOutcome {
    const ALL: [Self; 7] = [
        Self::Granted,
        Self::Refused,
        Self::InRecovery,
        Self::SharedSession,
        Self::TimedOut,
        Self::Error,
        Self::NoConnection,
    ];

    const fn label(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Refused => "refused",
            Self::InRecovery => "in_recovery",
            Self::SharedSession => "shared_session",
            Self::TimedOut => "timed_out",
            Self::Error => "error",
            Self::NoConnection => "no_connection",
        }
    }
}

/// Which check a latency belongs to: the `role` label of [`CHECK_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CheckRole {
    /// The leader's lock-verifying check.
    Leader,
    /// The standby's polling grant statement (a queued wait is not observed).
    Standby,
}

impl CheckRole {
    const ALL: [Self; 2] = [Self::Leader, Self::Standby];

    const fn label(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Standby => "standby",
        }
    }
}

/// The metrics of one elector: the shared collectors' children for its `key`, one method per
/// observation. Every method is a few atomic operations.
#[derive(Clone)]
pub(crate) struct ElectorMetrics {
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
    /// Registers the collectors on `registry`, or finds the ones an earlier elector registered,
    /// and creates every series of `key` (at zero, so rates are defined from the start).
    ///
    /// # Errors
    /// The registry refused the collectors, or another kind of collector uses one of the names.
    pub(crate) fn register(registry: &Registry, key: &str) -> Result<Self, prometheus::Error> {
        let collectors = ElectorCollectors::new()?;
        let collectors = match registry.register(Box::new(collectors.clone())) {
            Ok(()) => collectors,
            Err(prometheus::Error::AlreadyReg) => {
                registered_collectors(registry).ok_or(prometheus::Error::AlreadyReg)?
            }
            Err(error) => return Err(error),
        };
        collectors.children(key)
    }

    /// A term began with fencing `epoch`: is-leader 1, its start time and epoch.
    pub(crate) fn term_began(&self, epoch: Option<u64>) {
        self.term_start.set(unix_seconds(SystemTime::now()));
        self.term_epoch
            .set(epoch.map_or(0, |epoch| i64::try_from(epoch).unwrap_or(i64::MAX)));
        self.is_leader.set(1);
        self.transition(Transition::Acquired);
    }

    /// The term ended: is-leader, its start time and epoch go to 0. The transition is counted
    /// apart, once its cause is known ([`transition`](Self::transition)).
    pub(crate) fn term_ended(&self) {
        self.is_leader.set(0);
        self.term_start.set(0.0);
        self.term_epoch.set(0);
    }

    /// Counts one leadership transition.
    pub(crate) fn transition(&self, transition: Transition) {
        if let Some(counter) =
            index_of(&Transition::ALL, transition).and_then(|index| self.transitions.get(index))
        {
            counter.inc();
        }
    }

    /// Counts one lock attempt.
    pub(crate) fn attempt(&self, outcome: AttemptOutcome) {
        if let Some(counter) =
            index_of(&AttemptOutcome::ALL, outcome).and_then(|index| self.attempts.get(index))
        {
            counter.inc();
        }
    }

    /// Observes how long a check's statement took.
    pub(crate) fn check_latency(&self, role: CheckRole, took: Duration) {
        if let Some(histogram) =
            index_of(&CheckRole::ALL, role).and_then(|index| self.check_duration.get(index))
        {
            histogram.observe(took.as_secs_f64());
        }
    }

    /// A check answered: its wall-clock time.
    pub(crate) fn check_succeeded(&self) {
        self.last_check.set(unix_seconds(SystemTime::now()));
    }

    /// The replica was made eligible to lead, or not.
    pub(crate) fn set_eligible(&self, eligible: bool) {
        self.eligible.set(i64::from(eligible));
    }

    /// Work was found running past the work deadline; `aborted` when it was aborted.
    pub(crate) fn overdue_work(&self, aborted: bool) {
        if aborted {
            self.overdue_aborted.inc();
        } else {
            self.overdue_reported.inc();
        }
    }
}

fn index_of<T: PartialEq>(all: &[T], item: T) -> Option<usize> {
    all.iter().position(|candidate| *candidate == item)
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
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
}

impl ElectorCollectors {
    fn new() -> Result<Self, prometheus::Error> {
        let histogram = HistogramOpts::new(
            CHECK_DURATION,
            "How long a check's statement took to answer, or to time out: the leader's \
             lock-verifying check and the standby's polling grant statement",
        )
        .buckets(CHECK_DURATION_BUCKETS.to_vec());
        Ok(Self {
            is_leader: IntGaugeVec::new(
                Opts::new(IS_LEADER, "1 while this replica leads the election of key"),
                &["key"],
            )?,
            term_start: GaugeVec::new(
                Opts::new(
                    TERM_START,
                    "Unix time the current term began; 0 while not leading",
                ),
                &["key"],
            )?,
            term_epoch: IntGaugeVec::new(
                Opts::new(
                    TERM_EPOCH,
                    "Fencing epoch of the current term; 0 while not leading or without fencing",
                ),
                &["key"],
            )?,
            last_check: GaugeVec::new(
                Opts::new(
                    LAST_CHECK_SUCCESS,
                    "Unix time of the last check that answered: a leader's passed check, or a \
                     standby's grant statement that granted or refused",
                ),
                &["key"],
            )?,
            transitions: IntCounterVec::new(
                Opts::new(
                    TRANSITIONS,
                    "Leadership transitions of this replica, by the state entered and the cause",
                ),
                &["key", "to", "cause"],
            )?,
            attempts: IntCounterVec::new(
                Opts::new(LOCK_ATTEMPTS, "A standby's lock attempts, by outcome"),
                &["key", "outcome"],
            )?,
            check_duration: HistogramVec::new(histogram, &["key", "role"])?,
            overdue: IntCounterVec::new(
                Opts::new(
                    OVERDUE_WORK,
                    "Leader work still running a work deadline after its term ended, by what \
                     was done about it (reported, or aborted)",
                ),
                &["key", "action"],
            )?,
            eligible: IntGaugeVec::new(
                Opts::new(
                    ELIGIBLE,
                    "1 while this replica may lead the election of key, 0 while it is kept out \
                     (it makes no checks then)",
                ),
                &["key"],
            )?,
        })
    }

    /// The children of `key`, every series created.
    fn children(&self, key: &str) -> Result<ElectorMetrics, prometheus::Error> {
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
        self.collectors()
            .into_iter()
            .flat_map(|collector| collector.collect())
            .collect()
    }
}

/// What a `gather()` on this thread found of our collectors.
enum Found {
    Gauge(IntGauge),
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
}

impl Collector for LeaderGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        FOUND.with(|found| {
            if let Some(found) = found.borrow_mut().as_mut() {
                found.push(Found::Gauge(self.gauge.clone()));
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

/// The gauge of the `LeaderGauge` registered on `registry`.
fn registered_gauge(registry: &Registry) -> Option<IntGauge> {
    find_registered(registry)
        .into_iter()
        .find_map(|found| match found {
            Found::Gauge(gauge) => Some(gauge),
            Found::Elector(_) => None,
        })
}

/// The `ElectorCollectors` registered on `registry`.
fn registered_collectors(registry: &Registry) -> Option<ElectorCollectors> {
    find_registered(registry)
        .into_iter()
        .find_map(|found| match found {
            Found::Elector(collectors) => Some(collectors),
            Found::Gauge(_) => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let gauge = leader_gauge(&registry).unwrap();
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
        assert_eq!(leader_gauge(&registry).unwrap().get(), gauge.get());
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
}
