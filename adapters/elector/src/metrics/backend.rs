//! The seam between the modes' metrics and the exporters: a [`Backend`] makes the series of a
//! family of the table ([`families`](super::families)) for given label values, created at zero
//! when new; the handles ([`Gauge`], [`Counter`], [`Histogram`]) write one series on every
//! configured backend. A mode's metrics are a struct of handles, and know no backend.

use std::sync::Arc;
use std::time::Duration;

use super::families::Family;
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
