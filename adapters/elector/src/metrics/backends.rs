//! Every backend a config asks for ([`Backends`]): the concrete exporters compiled in (the
//! Prometheus registry, the `metrics` facade), each built for the families of one table, and
//! the handles a mode's metrics take from all of them at once.

use std::sync::Arc;

use super::backend::{Backend, Series};
use super::families::Family;
use crate::config::Common;
use crate::error::ConfigError;
use crate::trust::Trust;

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
