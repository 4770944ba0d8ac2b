//! The metrics of a sharded elector, on a Prometheus registry and/or the `metrics` facade (the
//! same names and labels on both): counts and histograms, never a series per shard, so their
//! cardinality does not grow with the space.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `plexsphere_shards_owned` | gauge: shards this replica owns | `class` |
//! | `plexsphere_shards_members` | gauge: members the last survey saw | `class` |
//! | `plexsphere_shards_unowned` | gauge: shards nobody held at the last survey | `class` |
//! | `plexsphere_shards_eligible` | gauge: 1 while this replica may own shards, 0 while it is kept out ([`ShardedElector::set_eligible`](super::ShardedElector::set_eligible)) | `class` |
//! | `plexsphere_shard_terms_total` | counter: shard terms begun and ended | `class`, `event` (`began`, `ended`), `cause` (the end cause's label, empty for `began`) |
//! | `plexsphere_shards_survey_seconds` | histogram: time to answer the survey statement | `class` |
//! | `plexsphere_shards_overdue_work_total` | counter: shard work found still running a work deadline after its term ended ([`ShardConfig::work_deadline`](super::ShardConfig::work_deadline)) | `class`, `action` (`reported`, `aborted`) |

#![cfg_attr(
    not(any(feature = "prometheus", feature = "metrics")),
    allow(dead_code, reason = "the names serve the metrics features only")
)]

use std::time::Duration;

use plexsphere_leader_core::TermEndCause;

use super::view::SpaceView;

/// The metric names and help texts, the same on both sinks.
const OWNED: (&str, &str) = ("plexsphere_shards_owned", "Shards this replica owns.");
const MEMBERS: (&str, &str) = (
    "plexsphere_shards_members",
    "Members of the shard space at this replica's last survey.",
);
const UNOWNED: (&str, &str) = (
    "plexsphere_shards_unowned",
    "Shards nobody held at this replica's last survey.",
);
const ELIGIBLE: (&str, &str) = (
    "plexsphere_shards_eligible",
    "1 while this replica may own shards, 0 while the operator keeps it out.",
);
const TERMS: (&str, &str) = (
    "plexsphere_shard_terms_total",
    "Shard terms begun and ended on this replica, by end cause.",
);
const SURVEY: (&str, &str) = (
    "plexsphere_shards_survey_seconds",
    "Time for the survey statement (the space's pg_locks rows) to answer.",
);
const OVERDUE: (&str, &str) = (
    "plexsphere_shards_overdue_work_total",
    "Shard work still running a work deadline after its shard term ended, by what was done \
     about it (reported, or aborted).",
);

/// The `action` label of [`OVERDUE`]: reported, or aborted.
const fn overdue_action(aborted: bool) -> &'static str {
    if aborted { "aborted" } else { "reported" }
}

/// Every cause a shard term can end with: each has its series, at zero from the start.
fn end_causes() -> impl Iterator<Item = TermEndCause> {
    TermEndCause::ALL
        .into_iter()
        .chain([TermEndCause::HandedOver])
}

/// The sharded metrics of one elector, on a Prometheus registry, on the `metrics` facade, on
/// both or on neither (then every method does nothing).
pub(crate) struct ShardMetrics {
    #[cfg(feature = "prometheus")]
    prom: Option<prom::Inner>,
    #[cfg(feature = "metrics")]
    facade: Option<facade::Inner>,
}

impl ShardMetrics {
    /// The metrics of space `class`: registered on `registry` when one is given, and recorded
    /// through the `metrics` facade's installed recorder when `facade` is set (feature
    /// `metrics`; ignored without it). `None` when neither.
    ///
    /// # Errors
    /// The registry refused a metric (another collector uses its name).
    pub(crate) fn new(
        #[cfg(feature = "prometheus")] registry: Option<&prometheus::Registry>,
        facade: bool,
        class: i32,
    ) -> Result<Option<Self>, crate::ConfigError> {
        #[cfg(feature = "prometheus")]
        let prom = registry
            .map(|registry| prom::Inner::register(registry, class))
            .transpose()
            .map_err(crate::ConfigError::Metrics)?;
        #[cfg(feature = "metrics")]
        let facade = facade.then(|| facade::Inner::register(class));
        #[cfg(not(feature = "metrics"))]
        let _ = facade;
        #[cfg(not(any(feature = "prometheus", feature = "metrics")))]
        let _ = class;
        let metrics = Self {
            #[cfg(feature = "prometheus")]
            prom,
            #[cfg(feature = "metrics")]
            facade,
        };
        // A new elector may own shards until the operator says otherwise.
        metrics.eligible(true);
        Ok(metrics.any().then_some(metrics))
    }

    /// Whether a sink records anything.
    fn any(&self) -> bool {
        #[allow(unused_mut)]
        let mut any = false;
        #[cfg(feature = "prometheus")]
        {
            any |= self.prom.is_some();
        }
        #[cfg(feature = "metrics")]
        {
            any |= self.facade.is_some();
        }
        any
    }

    pub(crate) fn began(&self) {
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.terms.with_label_values(&["began", ""]).inc();
        }
        #[cfg(feature = "metrics")]
        if let Some(facade) = &self.facade {
            facade.began.increment(1);
        }
    }

    pub(crate) fn ended(&self, cause: TermEndCause) {
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.terms
                .with_label_values(&["ended", cause.label()])
                .inc();
        }
        #[cfg(feature = "metrics")]
        if let Some(counter) = self.facade.as_ref().and_then(|facade| facade.ended(cause)) {
            counter.increment(1);
        }
        let _ = cause;
    }

    pub(crate) fn owned(&self, count: usize) {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.owned.set(count);
        }
        #[cfg(feature = "metrics")]
        if let Some(facade) = &self.facade {
            facade.owned.set(count as f64);
        }
        let _ = count;
    }

    /// The replica was made eligible to own shards, or not.
    pub(crate) fn eligible(&self, eligible: bool) {
        let value = i64::from(eligible);
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.eligible.set(value);
        }
        #[cfg(feature = "metrics")]
        if let Some(facade) = &self.facade {
            facade.eligible.set(value as f64);
        }
        let _ = value;
    }

    pub(crate) fn surveyed(&self, view: &SpaceView) {
        let members = i64::try_from(view.members.len()).unwrap_or(i64::MAX);
        let unowned = i64::try_from(view.unowned.len()).unwrap_or(i64::MAX);
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.members.set(members);
            prom.unowned.set(unowned);
        }
        #[cfg(feature = "metrics")]
        if let Some(facade) = &self.facade {
            facade.members.set(members as f64);
            facade.unowned.set(unowned as f64);
        }
        let _ = (members, unowned);
    }

    /// Shard work was found running past the work deadline; `aborted` when it was aborted.
    pub(crate) fn overdue_work(&self, aborted: bool) {
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.overdue
                .with_label_values(&[overdue_action(aborted)])
                .inc();
        }
        #[cfg(feature = "metrics")]
        if let Some(facade) = &self.facade {
            facade.overdue(aborted).increment(1);
        }
        let _ = aborted;
    }

    pub(crate) fn survey_took(&self, took: Duration) {
        #[cfg(feature = "prometheus")]
        if let Some(prom) = &self.prom {
            prom.survey.observe(took.as_secs_f64());
        }
        #[cfg(feature = "metrics")]
        if let Some(facade) = &self.facade {
            facade.survey.record(took.as_secs_f64());
        }
        let _ = took;
    }
}

#[cfg(feature = "metrics")]
mod facade {
    use ::metrics::{Counter, Gauge, Histogram};
    use plexsphere_leader_core::TermEndCause;

    use super::{
        ELIGIBLE, MEMBERS, OVERDUE, OWNED, SURVEY, TERMS, UNOWNED, end_causes, overdue_action,
    };

    /// The facade's handles of one space's series, taken from the recorder installed when the
    /// elector is built.
    pub(super) struct Inner {
        pub(super) began: Counter,
        /// One counter per end cause, by the cause.
        ended: Vec<(TermEndCause, Counter)>,
        pub(super) owned: Gauge,
        pub(super) eligible: Gauge,
        pub(super) members: Gauge,
        pub(super) unowned: Gauge,
        pub(super) survey: Histogram,
        /// Overdue work reported, then aborted.
        overdue: [Counter; 2],
    }

    impl Inner {
        pub(super) fn register(class: i32) -> Self {
            let class = class.to_string();
            for (name, help) in [OWNED, ELIGIBLE, MEMBERS, UNOWNED] {
                ::metrics::describe_gauge!(name, help);
            }
            ::metrics::describe_counter!(TERMS.0, TERMS.1);
            ::metrics::describe_counter!(OVERDUE.0, OVERDUE.1);
            ::metrics::describe_histogram!(SURVEY.0, ::metrics::Unit::Seconds, SURVEY.1);
            let gauge =
                |(name, _): (&'static str, &str)| ::metrics::gauge!(name, "class" => class.clone());
            let terms = |event: &'static str, cause: &'static str| {
                ::metrics::counter!(
                    TERMS.0,
                    "class" => class.clone(),
                    "event" => event,
                    "cause" => cause
                )
            };
            let inner = Self {
                began: terms("began", ""),
                ended: end_causes()
                    .map(|cause| (cause, terms("ended", cause.label())))
                    .collect(),
                owned: gauge(OWNED),
                eligible: gauge(ELIGIBLE),
                members: gauge(MEMBERS),
                unowned: gauge(UNOWNED),
                survey: ::metrics::histogram!(SURVEY.0, "class" => class.clone()),
                overdue: [false, true].map(|aborted| {
                    ::metrics::counter!(
                        OVERDUE.0,
                        "class" => class.clone(),
                        "action" => overdue_action(aborted)
                    )
                }),
            };
            // Every series at zero from the start, as on the registry.
            inner.began.absolute(0);
            for (_, counter) in &inner.ended {
                counter.absolute(0);
            }
            for counter in &inner.overdue {
                counter.absolute(0);
            }
            inner
        }

        /// The counter of overdue work reported, or aborted.
        pub(super) fn overdue(&self, aborted: bool) -> &Counter {
            &self.overdue[usize::from(aborted)]
        }

        /// The counter of terms ended for `cause` (every cause has one).
        pub(super) fn ended(&self, cause: TermEndCause) -> Option<&Counter> {
            self.ended
                .iter()
                .find_map(|(c, counter)| (*c == cause).then_some(counter))
        }
    }
}

#[cfg(feature = "prometheus")]
mod prom {
    use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};

    use super::{
        ELIGIBLE, MEMBERS, OVERDUE, OWNED, SURVEY, TERMS, UNOWNED, end_causes, overdue_action,
    };

    pub(super) struct Inner {
        pub(super) owned: IntGauge,
        pub(super) eligible: IntGauge,
        pub(super) members: IntGauge,
        pub(super) unowned: IntGauge,
        pub(super) terms: IntCounterVec,
        pub(super) survey: Histogram,
        pub(super) overdue: IntCounterVec,
    }

    impl Inner {
        pub(super) fn register(registry: &Registry, class: i32) -> Result<Self, prometheus::Error> {
            let class = class.to_string();
            let gauge = |(name, help): (&str, &str)| {
                IntGauge::with_opts(Opts::new(name, help).const_label("class", &class))
            };
            let inner = Self {
                owned: gauge(OWNED)?,
                eligible: gauge(ELIGIBLE)?,
                members: gauge(MEMBERS)?,
                unowned: gauge(UNOWNED)?,
                terms: IntCounterVec::new(
                    Opts::new(TERMS.0, TERMS.1).const_label("class", &class),
                    &["event", "cause"],
                )?,
                survey: Histogram::with_opts(
                    HistogramOpts::new(SURVEY.0, SURVEY.1)
                        .const_label("class", &class)
                        .buckets(vec![
                            0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
                        ]),
                )?,
                overdue: IntCounterVec::new(
                    Opts::new(OVERDUE.0, OVERDUE.1).const_label("class", &class),
                    &["action"],
                )?,
            };
            // Every series at zero from the start, so `rate()` and `increase()` are defined.
            inner.terms.with_label_values(&["began", ""]);
            for cause in end_causes() {
                inner.terms.with_label_values(&["ended", cause.label()]);
            }
            for aborted in [false, true] {
                inner.overdue.with_label_values(&[overdue_action(aborted)]);
            }
            registry.register(Box::new(inner.owned.clone()))?;
            registry.register(Box::new(inner.eligible.clone()))?;
            registry.register(Box::new(inner.members.clone()))?;
            registry.register(Box::new(inner.unowned.clone()))?;
            registry.register(Box::new(inner.terms.clone()))?;
            registry.register(Box::new(inner.survey.clone()))?;
            registry.register(Box::new(inner.overdue.clone()))?;
            Ok(inner)
        }
    }
}
