//! The HTTP handlers of a replica's health and metrics (feature `http`, on by default): axum
//! routes for `/readyz`, `/livez` and `/metrics`.
//!
//! - `GET /readyz`: `200` when every probe of the [`Readiness`] passes, else `503`; the body
//!   names each probe and its state (`[+]<name> ok` or `[-]<name> failed: <text>`), then
//!   `readyz check passed` or `readyz check failed`.
//! - `GET /livez`: `200` `ok` while the process answers. A failing loop never fails liveness:
//!   restarting the process would not fix it.
//! - `GET /metrics`: the Prometheus text format of the registry (the
//!   `plexsphere_background_leader` gauge and whatever else is registered there).

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::readiness::Readiness;

#[derive(Clone)]
struct Health {
    readiness: Readiness,
    registry: Registry,
}

/// The routes `/readyz`, `/livez` and `/metrics` over `readiness` and `registry`. Merge more
/// routes into it, then serve it with `axum::serve`.
pub fn router(readiness: Readiness, registry: Registry) -> Router {
    Router::new()
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .with_state(Health {
            readiness,
            registry,
        })
}

async fn readyz(State(health): State<Health>) -> Response {
    let report = health.readiness.report();
    let status = if report.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text(), report.to_string()).into_response()
}

async fn livez() -> Response {
    (StatusCode::OK, text(), "ok\n").into_response()
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
