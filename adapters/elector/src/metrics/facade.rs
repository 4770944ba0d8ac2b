//! The `metrics` facade backend (feature `metrics`): the same families, names and labels as
//! the Prometheus backend, through whatever recorder the service installed
//! (`metrics-exporter-prometheus`, an OpenTelemetry bridge, …), so a service on the facade
//! needs no second registry.
//!
//! The handles are taken from the recorder installed when the elector is built: install the
//! recorder first. Several electors write the spec's unlabeled gauge like the Prometheus
//! backend does (the last write wins).

use ::metrics::{Label, Unit};

use super::backend::{Backend, Series};
use super::families::{Family, Kind};
use crate::error::ConfigError;

/// The installed recorder, for the families of one table.
pub(crate) struct Facade;

impl Facade {
    /// Describes every family of `table` to the installed recorder.
    pub(crate) fn new(table: &'static [&'static Family]) -> Self {
        for family in table {
            match family.kind {
                Kind::Gauge | Kind::Leading => ::metrics::describe_gauge!(family.name, family.help),
                Kind::Counter => ::metrics::describe_counter!(family.name, family.help),
                Kind::Histogram(_) => {
                    ::metrics::describe_histogram!(family.name, Unit::Seconds, family.help);
                }
            }
        }
        Self
    }
}

impl Backend for Facade {
    /// The handle of the series on the installed recorder, touched (a counter by 0, a gauge
    /// by 0.0) so that it exists from the start; a histogram exists once registered.
    fn series(
        &self,
        family: &'static Family,
        values: &[&str],
    ) -> Result<Box<dyn Series>, ConfigError> {
        let labels: Vec<Label> = (family.labels.iter())
            .zip(values)
            .map(|(name, value)| Label::new(*name, (*value).to_owned()))
            .collect();
        Ok(match family.kind {
            Kind::Gauge | Kind::Leading => {
                let gauge = ::metrics::gauge!(family.name, labels);
                gauge.increment(0.0);
                Box::new(gauge)
            }
            Kind::Counter => {
                let counter = ::metrics::counter!(family.name, labels);
                counter.increment(0);
                Box::new(counter)
            }
            Kind::Histogram(_) => Box::new(::metrics::histogram!(family.name, labels)),
        })
    }
}

impl Series for ::metrics::Gauge {
    fn set(&self, value: f64) {
        ::metrics::Gauge::set(self, value);
    }
}

impl Series for ::metrics::Counter {
    fn add(&self, count: u64) {
        self.increment(count);
    }
}

impl Series for ::metrics::Histogram {
    fn observe(&self, value: f64) {
        self.record(value);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    use crate::metrics::backends::Backends;
    use crate::metrics::families::{election, space};
    use crate::metrics::{AttemptOutcome, CheckRole, ElectionMetrics};
    use crate::sharded::metrics::ShardMetrics;

    /// What the recorder holds since the last snapshot, a line a series: `name{k=v,…} value`
    /// with the labels in their order (a histogram's value is its count of samples).
    fn lines(snapshotter: &Snapshotter) -> Vec<String> {
        let snapshot = snapshotter.snapshot().into_vec();
        let line = |(key, _, _, value): (metrics_util::CompositeKey, _, _, DebugValue)| {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Counter(count) => count.to_string(),
                DebugValue::Gauge(gauge) => gauge.into_inner().to_string(),
                DebugValue::Histogram(samples) => samples.len().to_string(),
            };
            format!("{}{{{}}} {value}", key.name(), labels.join(","))
        };
        snapshot.into_iter().map(line).collect()
    }

    fn assert_has(lines: &[String], expected: &[&str]) {
        for line in expected {
            assert!(lines.iter().any(|l| l == line), "{line} in {lines:#?}");
        }
    }

    #[test]
    fn the_facade_writes_the_same_series_as_the_registry() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let metrics = ::metrics::with_local_recorder(&recorder, || {
            ElectionMetrics::new(Backends::facade(election::ALL), "1886156915:1").unwrap()
        });
        // Every series of the key exists at zero from the start.
        assert_has(
            &lines(&snapshotter),
            &[
                "plexsphere_background_leader{} 0",
                "plexsphere_leader_is_leader{key=1886156915:1} 0",
                "plexsphere_leader_transitions_total{key=1886156915:1,to=leader,cause=acquired} 0",
                "plexsphere_leader_transitions_total{key=1886156915:1,to=standby,cause=stopped} 0",
                "plexsphere_leader_lock_attempts_total{key=1886156915:1,outcome=refused} 0",
                "plexsphere_leader_check_duration_seconds{key=1886156915:1,role=standby} 0",
                "plexsphere_leader_overdue_work_total{key=1886156915:1,action=reported} 0",
            ],
        );

        metrics.attempt(AttemptOutcome::Refused);
        metrics.term_began(Some(3));
        metrics.leading(true);
        metrics.check_latency(CheckRole::Leader, Duration::from_millis(4));
        metrics.overdue_work(true);
        assert_has(
            &lines(&snapshotter),
            &[
                "plexsphere_background_leader{} 1",
                "plexsphere_leader_is_leader{key=1886156915:1} 1",
                "plexsphere_leader_term_epoch{key=1886156915:1} 3",
                "plexsphere_leader_transitions_total{key=1886156915:1,to=leader,cause=acquired} 1",
                "plexsphere_leader_lock_attempts_total{key=1886156915:1,outcome=refused} 1",
                "plexsphere_leader_check_duration_seconds{key=1886156915:1,role=leader} 1",
                "plexsphere_leader_overdue_work_total{key=1886156915:1,action=aborted} 1",
            ],
        );
    }

    #[test]
    fn a_space_on_the_facade_has_every_series_from_the_start() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let metrics = ::metrics::with_local_recorder(&recorder, || {
            ShardMetrics::new(&Backends::facade(space::ALL), 7).unwrap()
        });
        assert_has(
            &lines(&snapshotter),
            &[
                "plexsphere_shards_owned{class=7} 0",
                "plexsphere_shards_eligible{class=7} 1",
                "plexsphere_shard_terms_total{class=7,event=began,cause=} 0",
                "plexsphere_shard_terms_total{class=7,event=ended,cause=handed_over} 0",
                "plexsphere_shards_survey_seconds{class=7} 0",
                "plexsphere_shards_overdue_work_total{class=7,action=aborted} 0",
            ],
        );
        metrics.owned(2);
        metrics.survey_took(Duration::from_millis(1));
        assert_has(
            &lines(&snapshotter),
            &[
                "plexsphere_shards_owned{class=7} 2",
                "plexsphere_shards_survey_seconds{class=7} 1",
            ],
        );
    }
}
