//! `demo --shards K`: the ticked loops' sweeps spread over the replicas.
//!
//! Every replica runs a [`ShardedElector`] of `K` shards beside its Elector. The leader's ticked
//! passes still seed, prune and apply each loop's rule; the sweep of due items moves to the shard
//! owners: item `id` belongs to shard `id mod K`, and the `shard-sweeper` worker of each replica
//! sweeps, once per interval, the items of the shards it owns while holding their terms (so a
//! handover waits for the sweep in flight). Each replica's `/` serves a page of who owns which
//! shards and the last transitions, refreshed live from `/shards/events` (server-sent events,
//! one per survey or ownership change); `/shards` is the same snapshot as JSON.

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use deadpool_postgres::Pool;
use futures_util::Stream;
use plexsphere_leader::sharded::{Ownership, ShardConfig, ShardedElector};
use plexsphere_leader_service::Background;
use plexsphere_leader_service::loops::{BoxError, WiringError};
use prometheus::Registry;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::passes;

/// The page `/` serves.
const PAGE: &str = include_str!("shards.html");

/// How many of this replica's last transitions the page shows, newest first.
const TRANSITIONS_SHOWN: usize = 24;

/// Builds the replica's sharded elector of `count` shards on `pool`.
/// With `--mechanism lease` the space is held by leases, as the Elector's leadership is.
pub(crate) fn build(
    pool: &Pool,
    count: u32,
    identity: &str,
    interval: Duration,
    registry: &Registry,
    mechanism: crate::cli::Mechanism,
) -> Result<ShardedElector, plexsphere_leader::ConfigError> {
    let config = ShardConfig::new(pool.clone(), count)
        .check_interval(interval)
        .identity(identity)
        .registry(registry);
    ShardedElector::new(match mechanism {
        crate::cli::Mechanism::Advisory => config,
        crate::cli::Mechanism::Lease => config.lease(Duration::ZERO),
    })
}

/// Wires `shard-elector` (the sharded election's run) and `shard-sweeper` (the owners' sweep).
pub(crate) fn wire(
    background: &mut Background,
    sharded: &ShardedElector,
    pool: &Pool,
    actor: &str,
    interval: Duration,
) -> Result<(), WiringError> {
    background.worker("shard-elector", {
        let sharded = sharded.clone();
        move |shutdown| {
            let sharded = sharded.clone();
            // A space too large for the server's lock table is permanent: not restarted.
            async move {
                sharded.run(shutdown).await.map_err(|error| {
                    if error.is_permanent() {
                        plexsphere_leader_service::Permanent::boxed(error)
                    } else {
                        error.into()
                    }
                })
            }
        }
    })?;
    background.worker("shard-sweeper", {
        let (sharded, pool, actor) = (sharded.clone(), pool.clone(), actor.to_owned());
        move |token| {
            sweeper(
                sharded.clone(),
                pool.clone(),
                actor.clone(),
                interval,
                token,
            )
        }
    })?;
    Ok(())
}

/// Once per interval, sweeps the items of the shards this replica owns, holding their terms.
async fn sweeper(
    sharded: ShardedElector,
    pool: Pool,
    actor: String,
    interval: Duration,
    token: CancellationToken,
) -> Result<(), BoxError> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
        }
        let owned: Vec<u32> = sharded.ownership().shards.keys().copied().collect();
        // The terms held for the pass: a handover of one of these shards waits for it.
        let terms: Vec<_> = owned
            .iter()
            .filter_map(|&shard| sharded.term(shard, &token).map(|term| (shard, term)))
            .collect();
        if terms.is_empty() {
            continue;
        }
        let shards: Vec<i32> = terms
            .iter()
            .filter_map(|(shard, _)| i32::try_from(*shard).ok())
            .collect();
        let pass = async {
            let client = pool.get().await?;
            passes::sweep_shards(&**client, &shards, sharded.shard_count(), &actor).await?;
            Ok::<(), BoxError>(())
        };
        let result = tokio::select! {
            () = token.cancelled() => return Ok(()),
            result = pass => result,
        };
        drop(terms);
        if let Err(error) = result {
            tracing::warn!(%error, "shard sweep failed");
        }
    }
}

/// Prints one line per change of the shards this replica owns:
/// `[demo] replica=1 pid=4242 event=shards owned=128 took=3 gave=1`.
pub(crate) async fn print_changes(
    sharded: ShardedElector,
    line: impl Fn(&str),
    watch: CancellationToken,
) {
    let mut ownership = sharded.subscribe();
    let mut before = ownership.borrow_and_update().clone();
    loop {
        tokio::select! {
            () = watch.cancelled() => return,
            changed = ownership.changed() => if changed.is_err() { return },
        }
        let now = ownership.borrow_and_update().clone();
        let took = now
            .shards
            .keys()
            .filter(|s| !before.shards.contains_key(s))
            .count();
        let gave = before
            .shards
            .keys()
            .filter(|s| !now.shards.contains_key(s))
            .count();
        if took + gave > 0 {
            line(&format!(
                "event=shards owned={} took={took} gave={gave}",
                now.shards.len()
            ));
        }
        before = now;
    }
}

/// `/`, `/shards` and `/shards/events`; without `--shards` the page says how to turn it on.
pub(crate) fn router(sharded: Option<ShardedElector>, me: String) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/shards", get(snapshot_json))
        .route("/shards/events", get(events))
        .with_state(PageState { sharded, me })
}

#[derive(Clone)]
struct PageState {
    sharded: Option<ShardedElector>,
    me: String,
}

async fn page() -> impl IntoResponse {
    Html(PAGE)
}

async fn snapshot_json(State(state): State<PageState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{}\n", snapshot(&state)),
    )
}

/// The snapshot at once, then one per survey or ownership change.
async fn events(
    State(state): State<PageState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receivers = state
        .sharded
        .as_ref()
        .map(|s| (s.subscribe(), s.subscribe_view()));
    let stream = futures_util::stream::unfold(
        (state, receivers, true),
        |(state, mut receivers, first)| async move {
            if !first {
                match &mut receivers {
                    Some((ownership, view)) => {
                        tokio::select! {
                            changed = ownership.changed() => changed.ok()?,
                            changed = view.changed() => changed.ok()?,
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            let event = Event::default().data(snapshot(&state).to_string());
            Some((Ok(event), (state, receivers, false)))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

fn at(time: SystemTime) -> String {
    plexsphere_leader_cli::format_utc(time)
}

/// Who owns what (this replica's last survey), what this replica owns, and its last
/// transitions, newest first.
fn snapshot(state: &PageState) -> Value {
    let Some(sharded) = &state.sharded else {
        return json!({ "me": state.me, "enabled": false });
    };
    let Ownership {
        member,
        shards,
        handing_over,
        ..
    } = sharded.ownership();
    let view = sharded.view();
    let members: Vec<Value> = view
        .as_ref()
        .map(|view| {
            view.members
                .iter()
                .chain(&view.foreign)
                .map(|holder| {
                    json!({
                        "pid": holder.pid,
                        "name": holder.name,
                        "count": holder.shards.len(),
                        "ranges": plexsphere_leader_cli::shards::ranges(&holder.shards),
                        "me": Some(holder.pid) == member,
                        "member": view.members.iter().any(|m| m.pid == holder.pid),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let transitions: Vec<Value> = sharded
        .transitions()
        .iter()
        .rev()
        .take(TRANSITIONS_SHOWN)
        .map(|t| {
            json!({
                "at": at(t.at),
                "shard": t.shard,
                "term": t.term.get(),
                "event": if t.ended.is_some() { "ended" } else { "began" },
                "cause": t.ended.map(|c| c.to_string()),
            })
        })
        .collect();
    json!({
        "me": state.me,
        "enabled": true,
        "member": member,
        "shards": sharded.shard_count(),
        "owned": shards.len(),
        "handing_over": handing_over,
        "surveyed_at": view.as_ref().map(|v| at(v.surveyed_at)),
        "members": members,
        "unowned": view.as_ref().map(|v| v.unowned.len()),
        "transitions": transitions,
    })
}
