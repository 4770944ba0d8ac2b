//! The metrics of a sharded elector, on a Prometheus registry: counts and histograms, never a
//! series per shard, so their cardinality does not grow with the space.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `plexsphere_shards_owned` | gauge: shards this replica owns | `class` |
//! | `plexsphere_shards_members` | gauge: members the last survey saw | `class` |
//! | `plexsphere_shards_unowned` | gauge: shards nobody held at the last survey | `class` |
//! | `plexsphere_shard_terms_total` | counter: shard terms begun and ended | `class`, `event` (`began`, `ended`), `cause` (the end cause's label, empty for `began`) |
//! | `plexsphere_shards_survey_seconds` | histogram: time to answer the survey statement | `class` |

use std::time::Duration;

use plexsphere_leader_core::TermEndCause;

use super::view::SpaceView;

/// The sharded metrics of one elector; without a registry (or the `prometheus` feature) every
/// method does nothing.
pub(crate) struct ShardMetrics {
    #[cfg(feature = "prometheus")]
    inner: prom::Inner,
}

impl ShardMetrics {
    /// Registers the metrics of space `class` on `registry`.
    #[cfg(feature = "prometheus")]
    pub(crate) fn register(
        registry: &prometheus::Registry,
        class: i32,
    ) -> Result<Self, prometheus::Error> {
        Ok(Self {
            inner: prom::Inner::register(registry, class)?,
        })
    }

    pub(crate) fn began(&self) {
        #[cfg(feature = "prometheus")]
        self.inner.terms.with_label_values(&["began", ""]).inc();
    }

    pub(crate) fn ended(&self, cause: TermEndCause) {
        #[cfg(feature = "prometheus")]
        self.inner
            .terms
            .with_label_values(&["ended", cause.label()])
            .inc();
        #[cfg(not(feature = "prometheus"))]
        let _ = cause;
    }

    pub(crate) fn owned(&self, count: usize) {
        #[cfg(feature = "prometheus")]
        self.inner
            .owned
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        #[cfg(not(feature = "prometheus"))]
        let _ = count;
    }

    pub(crate) fn surveyed(&self, view: &SpaceView) {
        #[cfg(feature = "prometheus")]
        {
            self.inner
                .members
                .set(i64::try_from(view.members.len()).unwrap_or(i64::MAX));
            self.inner
                .unowned
                .set(i64::try_from(view.unowned.len()).unwrap_or(i64::MAX));
        }
        #[cfg(not(feature = "prometheus"))]
        let _ = view;
    }

    pub(crate) fn survey_took(&self, took: Duration) {
        #[cfg(feature = "prometheus")]
        self.inner.survey.observe(took.as_secs_f64());
        #[cfg(not(feature = "prometheus"))]
        let _ = took;
    }
}

#[cfg(feature = "prometheus")]
mod prom {
    use plexsphere_leader_core::TermEndCause;
    use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};

    pub(super) struct Inner {
        pub(super) owned: IntGauge,
        pub(super) members: IntGauge,
        pub(super) unowned: IntGauge,
        pub(super) terms: IntCounterVec,
        pub(super) survey: Histogram,
    }

    impl Inner {
        pub(super) fn register(registry: &Registry, class: i32) -> Result<Self, prometheus::Error> {
            let class = class.to_string();
            let gauge = |name: &str, help: &str| {
                IntGauge::with_opts(Opts::new(name, help).const_label("class", &class))
            };
            let inner = Self {
                owned: gauge("plexsphere_shards_owned", "Shards this replica owns.")?,
                members: gauge(
                    "plexsphere_shards_members",
                    "Members of the shard space at this replica's last survey.",
                )?,
                unowned: gauge(
                    "plexsphere_shards_unowned",
                    "Shards nobody held at this replica's last survey.",
                )?,
                terms: IntCounterVec::new(
                    Opts::new(
                        "plexsphere_shard_terms_total",
                        "Shard terms begun and ended on this replica, by end cause.",
                    )
                    .const_label("class", &class),
                    &["event", "cause"],
                )?,
                survey: Histogram::with_opts(
                    HistogramOpts::new(
                        "plexsphere_shards_survey_seconds",
                        "Time for the survey statement (the space's pg_locks rows) to answer.",
                    )
                    .const_label("class", &class)
                    .buckets(vec![
                        0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
                    ]),
                )?,
            };
            // Every series at zero from the start, so `rate()` and `increase()` are defined.
            inner.terms.with_label_values(&["began", ""]);
            for cause in TermEndCause::ALL
                .into_iter()
                .chain([TermEndCause::HandedOver])
            {
                inner.terms.with_label_values(&["ended", cause.label()]);
            }
            registry.register(Box::new(inner.owned.clone()))?;
            registry.register(Box::new(inner.members.clone()))?;
            registry.register(Box::new(inner.unowned.clone()))?;
            registry.register(Box::new(inner.terms.clone()))?;
            registry.register(Box::new(inner.survey.clone()))?;
            Ok(inner)
        }
    }
}
