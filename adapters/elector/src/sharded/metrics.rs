//! The metrics of a sharded elector, on a Prometheus registry and/or the `metrics` facade: the
//! families of [`space`] (the same names and labels on both; `docs/metrics.md` describes them),
//! each labeled by the space's `class`.

use std::time::Duration;

use plexsphere_leader_core::TermEndCause;

use super::view::SpaceView;
use crate::config::Common;
use crate::error::ConfigError;
use crate::metrics::backend::{By, Counter, Gauge, Histogram};
use crate::metrics::backends::Backends;
use crate::metrics::families::{overdue_action, space};

/// The sharded metrics of one elector, on every configured backend.
pub(crate) struct ShardMetrics {
    began: Counter,
    /// By end cause: every cause a shard term can end with.
    ended: By<TermEndCause, Counter>,
    owned: Gauge,
    eligible: Gauge,
    below_floor: Gauge,
    members: Gauge,
    unowned: Gauge,
    survey: Histogram,
    /// By whether the work was aborted.
    overdue: By<bool, Counter>,
}

impl ShardMetrics {
    /// The metrics of space `class` that `common` asks for, every series created; `None` when
    /// it asks for none.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when the registry refuses the collectors.
    pub(crate) fn for_config(common: &Common, class: i32) -> Result<Option<Self>, ConfigError> {
        Backends::of(common, space::ALL)?
            .map(|backends| Self::new(&backends, class))
            .transpose()
    }

    /// The metrics of space `class` on `backends`, every series created; eligible.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when a registry refuses a series.
    pub(crate) fn new(backends: &Backends, class: i32) -> Result<Self, ConfigError> {
        let class = class.to_string();
        let class = class.as_str();
        let terms = |event, cause| backends.handle(&space::TERMS, &[class, event, cause]);
        let gauge = |family| backends.handle(family, &[class]);
        let causes = TermEndCause::ALL
            .into_iter()
            .chain([TermEndCause::HandedOver]);
        let metrics = Self {
            began: terms("began", "")?,
            ended: By::new(causes, |cause| terms("ended", cause.label()))?,
            owned: gauge(&space::OWNED)?,
            eligible: gauge(&space::ELIGIBLE)?,
            below_floor: gauge(&space::BELOW_FLOOR)?,
            members: gauge(&space::MEMBERS)?,
            unowned: gauge(&space::UNOWNED)?,
            survey: backends.handle(&space::SURVEY, &[class])?,
            overdue: By::new([false, true], |aborted| {
                backends.handle(&space::OVERDUE, &[class, overdue_action(aborted)])
            })?,
        };
        // A new elector may own shards until the operator says otherwise.
        metrics.eligible(true);
        Ok(metrics)
    }

    pub(crate) fn began(&self) {
        self.began.inc();
    }

    pub(crate) fn ended(&self, cause: TermEndCause) {
        self.ended.inc(cause);
    }

    pub(crate) fn owned(&self, count: usize) {
        self.owned.count(count);
    }

    /// The replica was made eligible to own shards, or not.
    pub(crate) fn eligible(&self, eligible: bool) {
        self.eligible.flag(eligible);
    }

    pub(crate) fn surveyed(&self, view: &SpaceView) {
        self.members.count(view.members.len());
        self.unowned.count(view.unowned.len());
        let me = view.members.iter().find(|holder| holder.pid == view.me);
        self.below_floor
            .flag(me.is_some_and(|holder| holder.below_floor));
    }

    /// Shard work was found running past the work deadline; `aborted` when it was aborted.
    pub(crate) fn overdue_work(&self, aborted: bool) {
        self.overdue.inc(aborted);
    }

    pub(crate) fn survey_took(&self, took: Duration) {
        self.survey.observe(took);
    }
}

#[cfg(test)]
#[cfg(feature = "prometheus")]
mod tests {
    use super::*;

    /// The metrics of space `class` on `registry`.
    fn space_on(registry: &prometheus::Registry, class: i32) -> Result<ShardMetrics, ConfigError> {
        ShardMetrics::new(&Backends::registry(registry, space::ALL)?, class)
    }

    #[test]
    fn spaces_of_two_classes_on_one_registry_write_their_own_class() {
        let registry = prometheus::Registry::new();
        let seven = space_on(&registry, 7).unwrap();
        let _eight = space_on(&registry, 8).unwrap();
        seven.owned(3);
        seven.ended(TermEndCause::HandedOver);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        for line in [
            "# HELP plexsphere_shards_owned Shards this replica owns\n",
            "# TYPE plexsphere_shards_owned gauge\n",
            "plexsphere_shards_owned{class=\"7\"} 3\n",
            "plexsphere_shards_owned{class=\"8\"} 0\n",
            "plexsphere_shards_eligible{class=\"8\"} 1\n",
            "plexsphere_shard_terms_total{cause=\"handed_over\",class=\"7\",event=\"ended\"} 1\n",
            "plexsphere_shard_terms_total{cause=\"\",class=\"8\",event=\"began\"} 0\n",
            "plexsphere_shards_survey_seconds_bucket{class=\"8\",le=\"0.0005\"} 0\n",
            "plexsphere_shards_overdue_work_total{action=\"aborted\",class=\"7\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn a_survey_below_the_floor_sets_the_gauge_and_one_above_clears_it() {
        let registry = prometheus::Registry::new();
        let space = space_on(&registry, 7).unwrap();
        let value = || {
            let text = prometheus::TextEncoder::new()
                .encode_to_string(&registry.gather())
                .unwrap();
            ["0", "1"]
                .into_iter()
                .find(|v| {
                    text.contains(&format!(
                        "plexsphere_shards_below_version_floor{{class=\"7\"}} {v}\n"
                    ))
                })
                .map(str::to_owned)
        };
        assert_eq!(value().as_deref(), Some("0"));
        let holder = |pid, below_floor| super::super::view::Holder {
            pid,
            name: None,
            shards: Vec::new(),
            rank: None,
            below_floor,
        };
        let view = |below| SpaceView {
            surveyed_at: std::time::SystemTime::UNIX_EPOCH,
            me: 11,
            members: vec![holder(11, below), holder(12, !below)],
            foreign: Vec::new(),
            unowned: Vec::new(),
            floor: None,
        };
        space.surveyed(&view(true));
        assert_eq!(value().as_deref(), Some("1"));
        space.surveyed(&view(false));
        assert_eq!(value().as_deref(), Some("0"));
    }

    #[test]
    fn a_foreign_collector_under_a_shard_name_is_an_error() {
        let registry = prometheus::Registry::new();
        let foreign = prometheus::IntGauge::new(space::OWNED.name, "someone else's").unwrap();
        registry.register(Box::new(foreign)).unwrap();
        assert!(matches!(
            space_on(&registry, 7),
            Err(ConfigError::Metrics(_))
        ));
    }

    #[test]
    fn two_spaces_of_one_class_on_one_registry_write_the_same_series() {
        let registry = prometheus::Registry::new();
        let first = space_on(&registry, 7).unwrap();
        let second = space_on(&registry, 7).unwrap();
        first.began();
        second.began();
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        let began = "plexsphere_shard_terms_total{cause=\"\",class=\"7\",event=\"began\"} 2\n";
        assert!(text.contains(began), "{text}");
    }
}
