//! The demo's HTTP routes: health, `/status`, and the operator's resign and eligibility.

use super::events::line;
use super::*;

#[derive(Clone)]
struct StatusState {
    me: Me,
    elector: Option<Elector>,
    readiness: Readiness,
    workers: Arc<[(String, Placement)]>,
}

/// What `/readyz`, `/livez` and `/metrics` report, and the workers `/status` lists.
pub(super) struct Probes {
    pub(super) readiness: Readiness,
    pub(super) liveness: Liveness,
    pub(super) registry: Registry,
    /// The supervisor's workers with where each runs, in registration order (empty without a
    /// database).
    pub(super) workers: Arc<[(String, Placement)]>,
}

pub(super) async fn serve(
    args: &Args,
    me: &Me,
    probes: Probes,
    elector: Option<Elector>,
    sharded: Option<plexsphere_leader::sharded::ShardedElector>,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let port = args
        .http_port
        .checked_add(me.index)
        .ok_or("--http-port plus the replica index exceeds 65535")?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    let status = Router::new()
        .route("/status", get(status))
        .route("/resign", post(resign))
        .route("/eligible", post(eligible))
        .route("/ineligible", post(ineligible))
        .with_state(StatusState {
            me: me.clone(),
            elector,
            readiness: probes.readiness.clone(),
            workers: probes.workers,
        });
    let app =
        plexsphere_leader_service::http::router(probes.readiness, probes.liveness, probes.registry)
            .merge(status)
            .merge(crate::shards::router(sharded, me.application_name.clone()));
    let stop = shutdown.clone();
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "HTTP server failed");
        }
    }))
}

async fn status(State(state): State<StatusState>) -> impl IntoResponse {
    let is_leader = state.elector.as_ref().is_some_and(Elector::is_leader);
    let term = state
        .elector
        .as_ref()
        .and_then(|elector| elector.leadership().term())
        .map(|t| t.id)
        .map(|t| t.get());
    // Who leads, asked of the server from whichever replica answers (any replica can tell).
    let leader = match &state.elector {
        Some(elector) => tokio::time::timeout(Duration::from_secs(2), elector.who_leads())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        None => None,
    };
    let lock_backend_pid = leader
        .as_ref()
        .filter(|leader| {
            is_leader && leader.identity.as_deref() == Some(&state.me.application_name)
        })
        .map(|leader| leader.pid);
    let leader = leader.map(|leader| {
        json!({
            "identity": leader.identity,
            "pid": leader.pid,
            "since": leader.since.at().map(plexsphere_leader_cli::format_utc),
            "leading_for_seconds": leader.leading_for().map(|d| d.as_secs()),
            "client_addr": leader.client_addr,
            "client_port": leader.client_port,
        })
    });
    // Who holds the lease, and until when (the lease mechanism: pg_locks shows no lock).
    let lease = match &state.elector {
        Some(elector) if elector.holds_a_lease() => {
            tokio::time::timeout(Duration::from_secs(2), elector.lease_holder())
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        }
        _ => None,
    };
    let lease = lease.map(|lease| {
        json!({
            "holder": lease.holder,
            "identity": lease.identity,
            "epoch": lease.epoch,
            "expires_at": plexsphere_leader_cli::format_utc(lease.expires_at),
            "held": lease.held,
        })
    });
    let live = state
        .elector
        .as_ref()
        .map(|elector| elector.liveness().map_err(|stuck| stuck.to_string()));
    let body = json!({
        "replica": state.me.index,
        "pid": state.me.pid,
        "key": state.elector.as_ref().map(|elector| elector.key().to_string()),
        "is_leader": is_leader,
        "eligible": state.elector.as_ref().map(Elector::is_eligible),
        "fit": state.elector.as_ref().map(Elector::is_fit),
        "term": term,
        "epoch": state
            .elector
            .as_ref()
            .and_then(|elector| elector.leadership().term())
            .and_then(|term| term.epoch),
        "lock_backend_pid": lock_backend_pid,
        "leader": leader,
        "lease": lease,
        "live": live.as_ref().map(Result::is_ok),
        "stuck": live.and_then(Result::err),
        "check_failure": state.elector.as_ref().and_then(Elector::check_failure).map(|failure| {
            json!({
                "class": failure.class.label(),
                "failures": failure.failures,
                "failing_for_seconds": failure.since.elapsed().as_secs(),
                "error": failure.error,
                "advice": failure.advice,
            })
        }),
        // What the replica waits for before its election starts (`null` once it runs).
        "waiting_for": state
            .me
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        "application_name": state.me.application_name,
        "check_interval_ms": u64::try_from(state.me.interval.as_millis()).unwrap_or(u64::MAX),
        "ready": state.readiness.report().is_ready(),
        "database": state.elector.is_some(),
        "workers": state.workers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
        "placement": state
            .workers
            .iter()
            .map(|(name, placement)| (name.clone(), json!(placement.label())))
            .collect::<serde_json::Map<_, _>>(),
        "probes": state.readiness.names(),
        "sse_nonce_ttl_ms": u64::try_from(state.me.nonce_ttl.as_millis()).unwrap_or(u64::MAX),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
}

/// `POST /resign`: the operator control; the leader releases the lock and sits its hold-off out.
async fn resign(State(state): State<StatusState>) -> impl IntoResponse {
    let outcome = state.elector.as_ref().map(Elector::resign);
    let text = match outcome {
        Some(Resignation::Requested) => "resign requested\n",
        Some(Resignation::NotRunning) => "the election is not running\n",
        Some(_) => "resign: an outcome this demo does not know\n",
        None => "no elector: no database\n",
    };
    line(
        &state.me,
        &format!("event=resign-requested outcome={:?}", text.trim_end()),
    );
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text)
}

/// `POST /eligible`: this replica may lead again.
async fn eligible(State(state): State<StatusState>) -> impl IntoResponse {
    set_eligibility(&state, true)
}

/// `POST /ineligible`: this replica never leads (a leader resigns) until made eligible.
async fn ineligible(State(state): State<StatusState>) -> impl IntoResponse {
    set_eligibility(&state, false)
}

fn set_eligibility(state: &StatusState, eligible: bool) -> impl IntoResponse + use<> {
    if let Some(elector) = &state.elector {
        elector.set_eligible(eligible);
    }
    line(&state.me, &format!("event=eligibility eligible={eligible}"));
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("eligible={eligible}\n"),
    )
}
