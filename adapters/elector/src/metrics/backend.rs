//! The seam between the modes' metrics and the exporters: a [`Backend`] makes the series of a
//! family of the table ([`families`](super::families)) for given label values, created at zero
//! when new; the handles ([`Gauge`], [`Counter`], [`Histogram`]) write one series on every
//! configured backend. A mode's metrics are a struct of handles, and know no backend.

use std::sync::Arc;
use std::time::Duration;

use super::families::Family;
use crate::config::Common;
use crate::error::ConfigError;
use crate::trust::Trust;

/// One series on one backend. A series answers to its kind's method; the others do nothing.
pub(crate) trait Series: Send + Sync {
    /// A gauge's new value.
    fn set(&self, _value: f64) {}
    /// A counter's increment.
    fn add(&self, _count: u64) {}
    /// A histogram's observation.
    fn observe(&self, _value: f64) {}
}

/// One exporter, for the families of one table.
pub(crate) trait Backend: Send + Sync {
    /// The series of `family` with `values` for its labels, created at zero when new; an
    /// existing series (another elector's of the same labels) is shared, not reset.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when a registry refuses the series.
    fn series(
        &self,
        family: &'static Family,
        values: &[&str],
    ) -> Result<Box<dyn Series>, ConfigError>;

    /// An elector's trust deadline, for a backend read at scrape time: a [`Leading`] gauge of
    /// the elector's `key` (and the unlabeled one) whose every elector's trust has run out
    /// then reads 0. A backend whose values are pushed keeps the driver's.
    ///
    /// [`Leading`]: super::families::Kind::Leading
    fn watch_trust(&self, _key: &str, _trust: &Arc<Trust>) {}
}

/// Every backend a config asks for.
pub(crate) struct Backends(Vec<Box<dyn Backend>>);

impl Backends {
    /// The backends `common` asks for, for the families of `table`; `None` when it asks for
    /// none.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when the registry refuses the families.
    #[cfg_attr(
        not(any(feature = "prometheus", feature = "metrics")),
        allow(unused_mut, reason = "stays empty without a metrics feature")
    )]
    pub(crate) fn of(
        common: &Common,
        table: &'static [&'static Family],
    ) -> Result<Option<Self>, ConfigError> {
        let mut backends: Vec<Box<dyn Backend>> = Vec::new();
        #[cfg(feature = "prometheus")]
        if let Some(registry) = &common.registry {
            let registered = super::registry::Prometheus::register(registry, table);
            backends.push(Box::new(registered.map_err(ConfigError::Metrics)?));
        }
        #[cfg(feature = "metrics")]
        if common.metrics_facade {
            backends.push(Box::new(super::facade::Facade::new(table)));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (common.metrics_facade, table);
        Ok((!backends.is_empty()).then_some(Self(backends)))
    }

    /// Only the Prometheus backend on `registry`.
    #[cfg(all(test, feature = "prometheus"))]
    pub(crate) fn registry(
        registry: &prometheus::Registry,
        table: &'static [&'static Family],
    ) -> Result<Self, ConfigError> {
        let backend = super::registry::Prometheus::register(registry, table);
        Ok(Self(vec![Box::new(backend.map_err(ConfigError::Metrics)?)]))
    }

    /// Only the facade on the installed recorder.
    #[cfg(all(test, feature = "metrics"))]
    pub(crate) fn facade(table: &'static [&'static Family]) -> Self {
        Self(vec![Box::new(super::facade::Facade::new(table))])
    }

    /// The handle (a [`Gauge`], [`Counter`] or [`Histogram`]) of the series of `family` with
    /// `values`, on every backend.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when a registry refuses the series.
    pub(crate) fn handle<H: From<Vec<Box<dyn Series>>>>(
        &self,
        family: &'static Family,
        values: &[&str],
    ) -> Result<H, ConfigError> {
        self.0
            .iter()
            .map(|backend| backend.series(family, values))
            .collect::<Result<_, _>>()
            .map(H::from)
    }

    /// An elector's trust deadline, for the backends read at scrape time.
    pub(crate) fn watch_trust(&self, key: &str, trust: &Arc<Trust>) {
        self.0
            .iter()
            .for_each(|backend| backend.watch_trust(key, trust));
    }
}

/// A gauge: one series on every backend.
pub(crate) struct Gauge(Vec<Box<dyn Series>>);

impl From<Vec<Box<dyn Series>>> for Gauge {
    fn from(series: Vec<Box<dyn Series>>) -> Self {
        Self(series)
    }
}

impl Gauge {
    pub(crate) fn set(&self, value: f64) {
        self.0.iter().for_each(|series| series.set(value));
    }

    /// 1 for `true`, 0 for `false`.
    pub(crate) fn flag(&self, on: bool) {
        self.set(f64::from(u8::from(on)));
    }

    /// A count (exact below 2^53, as on any exporter).
    pub(crate) fn count(&self, count: usize) {
        #[allow(clippy::cast_precision_loss, reason = "a metric value")]
        self.set(count as f64);
    }
}

/// A counter: one series on every backend.
pub(crate) struct Counter(Vec<Box<dyn Series>>);

impl From<Vec<Box<dyn Series>>> for Counter {
    fn from(series: Vec<Box<dyn Series>>) -> Self {
        Self(series)
    }
}

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.iter().for_each(|series| series.add(1));
    }
}

/// A histogram of seconds: one series on every backend.
pub(crate) struct Histogram(Vec<Box<dyn Series>>);

impl From<Vec<Box<dyn Series>>> for Histogram {
    fn from(series: Vec<Box<dyn Series>>) -> Self {
        Self(series)
    }
}

impl Histogram {
    pub(crate) fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        self.0.iter().for_each(|series| series.observe(seconds));
    }
}

/// A handle per value of a closed label (a cause, an outcome, a role).
pub(crate) struct By<T, H>(Vec<(T, H)>);

impl<T: PartialEq + Copy, H> By<T, H> {
    /// The handle `handle` makes for each of `values`.
    ///
    /// # Errors
    /// The first error of `handle`.
    pub(crate) fn new(
        values: impl IntoIterator<Item = T>,
        mut handle: impl FnMut(T) -> Result<H, ConfigError>,
    ) -> Result<Self, ConfigError> {
        values
            .into_iter()
            .map(|value| handle(value).map(|made| (value, made)))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// The handle of `value`.
    pub(crate) fn of(&self, value: T) -> Option<&H> {
        self.0
            .iter()
            .find_map(|(of, handle)| (*of == value).then_some(handle))
    }
}

impl<T: PartialEq + Copy> By<T, Counter> {
    /// Counts one of `value`.
    pub(crate) fn inc(&self, value: T) {
        if let Some(counter) = self.of(value) {
            counter.inc();
        }
    }
}
