//! The `metrics` facade sink (feature `metrics`): the same metrics, names and labels as the
//! Prometheus sink, through whatever recorder the service installed (`metrics-exporter-
//! prometheus`, an OpenTelemetry bridge, …), so a service on the facade needs no second registry.
//!
//! The handles are taken from the recorder installed when the elector is built: install the
//! recorder first. Several electors write the spec's unlabeled gauge like the Prometheus sink
//! does (the last write wins).

use std::sync::Once;
use std::time::{Duration, SystemTime};

use ::metrics::{Counter, Gauge, Histogram, Unit};

use super::{
    AttemptOutcome, CHECK_DURATION, CheckRole, ELIGIBLE, IS_LEADER, LAST_CHECK_SUCCESS,
    LEADER_GAUGE_NAME, LOCK_ATTEMPTS, OVERDUE_WORK, TERM_EPOCH, TERM_START, TRANSITIONS,
    Transition, help, index_of, unix_seconds,
};

/// The handles of one elector's series.
pub(super) struct FacadeMetrics {
    leader: Gauge,
    is_leader: Gauge,
    term_start: Gauge,
    term_epoch: Gauge,
    last_check: Gauge,
    /// Indexed like [`Transition::ALL`].
    transitions: Vec<Counter>,
    /// Indexed like [`AttemptOutcome::ALL`].
    attempts: Vec<Counter>,
    /// Indexed like [`CheckRole::ALL`].
    check_duration: Vec<Histogram>,
    overdue_reported: Counter,
    overdue_aborted: Counter,
    eligible: Gauge,
}

impl FacadeMetrics {
    /// The handles of every series of `key` on the installed recorder, each created at zero.
    pub(super) fn register(key: &str) -> Self {
        describe();
        let key = key.to_owned();
        let gauge = |name: &'static str| ::metrics::gauge!(name, "key" => key.clone());
        let metrics = Self {
            leader: ::metrics::gauge!(LEADER_GAUGE_NAME),
            is_leader: gauge(IS_LEADER),
            term_start: gauge(TERM_START),
            term_epoch: gauge(TERM_EPOCH),
            last_check: gauge(LAST_CHECK_SUCCESS),
            transitions: Transition::ALL
                .iter()
                .map(|t| {
                    ::metrics::counter!(
                        TRANSITIONS,
                        "key" => key.clone(),
                        "to" => t.to(),
                        "cause" => t.cause()
                    )
                })
                .collect(),
            attempts: AttemptOutcome::ALL
                .iter()
                .map(|o| ::metrics::counter!(LOCK_ATTEMPTS, "key" => key.clone(), "outcome" => o.label()))
                .collect(),
            check_duration: CheckRole::ALL
                .iter()
                .map(|r| ::metrics::histogram!(CHECK_DURATION, "key" => key.clone(), "role" => r.label()))
                .collect(),
            overdue_reported: ::metrics::counter!(OVERDUE_WORK, "key" => key.clone(), "action" => "reported"),
            overdue_aborted: ::metrics::counter!(OVERDUE_WORK, "key" => key.clone(), "action" => "aborted"),
            eligible: gauge(ELIGIBLE),
        };
        // Every series exists from the start, so rates are defined.
        for counter in metrics
            .transitions
            .iter()
            .chain(&metrics.attempts)
            .chain([&metrics.overdue_reported, &metrics.overdue_aborted])
        {
            counter.increment(0);
        }
        for gauge in [
            &metrics.is_leader,
            &metrics.term_start,
            &metrics.term_epoch,
            &metrics.last_check,
        ] {
            gauge.set(0.0);
        }
        metrics
    }
}

/// Describes every metric to the recorder, once per process.
fn describe() {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
        for name in [
            LEADER_GAUGE_NAME,
            IS_LEADER,
            TERM_START,
            TERM_EPOCH,
            LAST_CHECK_SUCCESS,
            ELIGIBLE,
        ] {
            ::metrics::describe_gauge!(name, help(name));
        }
        for name in [TRANSITIONS, LOCK_ATTEMPTS, OVERDUE_WORK] {
            ::metrics::describe_counter!(name, help(name));
        }
        ::metrics::describe_histogram!(CHECK_DURATION, Unit::Seconds, help(CHECK_DURATION));
    });
}

impl super::Sink for FacadeMetrics {
    fn leading(&self, leading: bool) {
        self.leader.set(f64::from(u8::from(leading)));
    }

    fn term_began(&self, epoch: Option<u64>) {
        self.term_start.set(unix_seconds(SystemTime::now()));
        // An epoch above 2^53 loses precision as a float, as it would on any exporter.
        #[allow(clippy::cast_precision_loss, reason = "a metric value")]
        self.term_epoch.set(epoch.map_or(0.0, |epoch| epoch as f64));
        self.is_leader.set(1.0);
        self.transition(Transition::Acquired);
    }

    fn term_ended(&self) {
        self.is_leader.set(0.0);
        self.term_start.set(0.0);
        self.term_epoch.set(0.0);
    }

    fn transition(&self, transition: Transition) {
        if let Some(counter) =
            index_of(&Transition::ALL, transition).and_then(|index| self.transitions.get(index))
        {
            counter.increment(1);
        }
    }

    fn attempt(&self, outcome: AttemptOutcome) {
        if let Some(counter) =
            index_of(&AttemptOutcome::ALL, outcome).and_then(|index| self.attempts.get(index))
        {
            counter.increment(1);
        }
    }

    fn check_latency(&self, role: CheckRole, took: Duration) {
        if let Some(histogram) =
            index_of(&CheckRole::ALL, role).and_then(|index| self.check_duration.get(index))
        {
            histogram.record(took.as_secs_f64());
        }
    }

    fn check_succeeded(&self) {
        self.last_check.set(unix_seconds(SystemTime::now()));
    }

    fn set_eligible(&self, eligible: bool) {
        self.eligible.set(f64::from(u8::from(eligible)));
    }

    fn overdue_work(&self, aborted: bool) {
        if aborted {
            self.overdue_aborted.increment(1);
        } else {
            self.overdue_reported.increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::super::Sink as _;
    use super::*;

    /// The value of the series `name` whose labels include every pair of `labels`.
    type Snapshot = Vec<(
        metrics_util::CompositeKey,
        Option<Unit>,
        Option<::metrics::SharedString>,
        DebugValue,
    )>;

    fn value(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        snapshot.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            let matches = key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v));
            matches.then(|| match value {
                DebugValue::Counter(count) => *count as f64,
                DebugValue::Gauge(gauge) => gauge.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            })
        })
    }

    #[test]
    fn the_facade_writes_the_same_series_as_the_registry() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let sink =
            ::metrics::with_local_recorder(&recorder, || FacadeMetrics::register("1886156915:1"));
        let key = ("key", "1886156915:1");
        let before = snapshotter.snapshot().into_vec();
        // Every series of the key exists at zero from the start.
        for cause in ["acquired", "stopped", "check_failed", "session_ended"] {
            assert_eq!(
                value(&before, TRANSITIONS, &[key, ("cause", cause)]),
                Some(0.0),
                "{cause}"
            );
        }
        assert_eq!(
            value(&before, LOCK_ATTEMPTS, &[key, ("outcome", "refused")]),
            Some(0.0)
        );

        sink.attempt(AttemptOutcome::Refused);
        sink.term_began(Some(3));
        sink.leading(true);
        sink.check_latency(CheckRole::Leader, Duration::from_millis(4));
        sink.overdue_work(true);
        let after = snapshotter.snapshot().into_vec();
        assert_eq!(value(&after, LEADER_GAUGE_NAME, &[]), Some(1.0));
        assert_eq!(value(&after, IS_LEADER, &[key]), Some(1.0));
        assert_eq!(value(&after, TERM_EPOCH, &[key]), Some(3.0));
        assert_eq!(
            value(
                &after,
                TRANSITIONS,
                &[key, ("to", "leader"), ("cause", "acquired")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&after, LOCK_ATTEMPTS, &[key, ("outcome", "refused")]),
            Some(1.0)
        );
        assert_eq!(
            value(&after, CHECK_DURATION, &[key, ("role", "leader")]),
            Some(1.0)
        );
        assert_eq!(
            value(&after, OVERDUE_WORK, &[key, ("action", "aborted")]),
            Some(1.0)
        );
    }
}
