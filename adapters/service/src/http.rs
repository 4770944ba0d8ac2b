//! The HTTP handlers of a replica's health and metrics (feature `http`, on by default): axum
//! routes for `/readyz`, `/livez` and `/metrics`.
//!
//! - `GET /readyz`: `200` when every probe of the [`Readiness`] passes, else `503`; the body
//!   names each probe and its state (`[+]<name> ok` or `[-]<name> failed: <text>`), then
//!   `readyz check passed` or `readyz check failed`.
//! - `GET /livez`: `200` when every probe of the [`Liveness`] passes, else `503`; the body is in
//!   the same form, ending in `livez check passed` or `livez check failed`. Register the
//!   elector's [`ElectorLiveness`](crate::ElectorLiveness) there: it fails while the
//!   replica believes it leads but has not checked its lock for over two check intervals (a
//!   blocked runtime, a `run` future no longer polled), which a restart fixes. A failing loop
//!   never fails liveness: restarting the process would not fix it.
//! - `GET /metrics`: the Prometheus text format of the registry (the
//!   `plexsphere_background_leader` gauge, the `plexsphere_leader_*` metrics of
//!   `docs/metrics.md`, and whatever else is registered there).
//!
//! Readiness never depends on leadership, and must not: a standby is as ready as the leader. A
//! readiness that required leading would keep every new replica of a rolling update unready
//! while the old leader holds the lock, and the update would never finish.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::liveness::Liveness;
use crate::readiness::Readiness;

#[derive(Clone)]
struct Health {
    readiness: Readiness,
    liveness: Liveness,
    registry: Registry,
}

/// The routes `/readyz` over `readiness`, `/livez` over `liveness` and `/metrics` over
/// `registry`. Merge more routes into it, then serve it with `axum::serve`.
pub fn router(readiness: Readiness, liveness: Liveness, registry: Registry) -> Router {
    Router::new()
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .with_state(Health {
            readiness,
            liveness,
            registry,
        })
}

async fn readyz(State(health): State<Health>) -> Response {
    let report = health.readiness.report();
    probe_response(report.is_ready(), report.to_string())
}

async fn livez(State(health): State<Health>) -> Response {
    let report = health.liveness.report();
    probe_response(report.is_live(), report.to_string())
}

/// A probe route's answer: 200 when every probe passed, else 503, with the report as text.
fn probe_response(passed: bool, report: String) -> Response {
    let status = if passed {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text(), report).into_response()
}

async fn metrics(State(health): State<Health>) -> Response {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&health.registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            text(),
            format!("encode metrics: {error}\n"),
        )
            .into_response(),
    }
}

fn text() -> [(header::HeaderName, &'static str); 1] {
    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")]
}
