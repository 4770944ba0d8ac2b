//! The singles mode, the benchmark's comparison: one single [`Elector`] per shard key
//! `(class, s)` of a range, each with its own pool, connected before the electors start (on the
//! `go` command), printing each key's terms as `begin` and `end` of shard `s`.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plexsphere_leader::leadership::TermEvents;
use plexsphere_leader::{Elector, LockKey};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{ChildArgs, Controls, Out, TermRecords, commands, emit_terms, follow_terms};
use crate::BackendPool;

/// How long a process of single electors tries to connect its pools before it reports `ready`
/// anyway (the electors then connect their own).
const WARM_TIMEOUT: Duration = Duration::from_secs(120);
/// How many pools of one process connect at once.
const WARM_BATCH: usize = 4;

/// Connects one pool per key `(class, s)`, `s` in `keys`, prints `ready`, and once `go` runs
/// one single elector per key until `shutdown`, the start of key `s` delayed by `s/shards` of
/// an interval; then prints the `exit` record with the errors their runs returned.
pub(super) async fn run(
    args: &ChildArgs,
    shards: u32,
    keys: Range<u32>,
    out: &Arc<Out>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let go = CancellationToken::new();
    tokio::spawn(commands(
        Arc::clone(out),
        shutdown.clone(),
        Controls::Singles { go: go.clone() },
    ));
    let (pools, warmed) = warm_pools(args, keys.clone()).await?;
    out.emit(
        "warmed",
        json!({ "pools": pools.len(), "connected": warmed }),
    );
    out.ready_of_space(args, shards, "single");
    tokio::select! {
        () = go.cancelled() => {}
        () = shutdown.cancelled() => {
            out.exit_of_runs(&[]);
            return Ok(());
        }
    }
    let go_at = tokio::time::Instant::now();
    let mut runs = Vec::new();
    let mut followers = Vec::new();
    for (shard, pool) in keys.zip(pools) {
        let obj = i32::try_from(shard).map_err(|_| format!("shard {shard} above i32::MAX"))?;
        let elector = Elector::new(
            pool.config()
                .key(LockKey::new(args.class, obj))
                .check_interval(args.interval)
                .identity(&args.name),
        )
        .map_err(|e| e.to_string())?;
        let terms = Arc::new(Mutex::new(TermEvents::new()));
        followers.push((shard, elector.clone(), Arc::clone(&terms)));
        tokio::spawn(follow_terms(
            elector.clone(),
            TermRecords::Shard(shard),
            Arc::clone(out),
            Arc::clone(&terms),
        ));
        // Spread over one interval by key, as electors started at different times would be,
        // so that the first checks of all processes do not come at one instant.
        let at = go_at
            + args
                .interval
                .mul_f64(f64::from(shard) / f64::from(shards.max(1)));
        runs.push(tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                tokio::time::sleep_until(at).await;
                elector.run(shutdown).await
            }
        }));
    }
    out.emit("started", json!({ "electors": runs.len() }));
    let mut errors = Vec::new();
    for run in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    for (shard, elector, terms) in followers {
        emit_terms(
            out,
            TermRecords::Shard(shard),
            &terms,
            &elector.leadership(),
        );
    }
    out.exit_of_runs(&errors);
    Ok(())
}

/// One pool per key of `keys`, each connected before its elector starts (so that many
/// electors starting at once do not measure a cold start), `WARM_BATCH` at a time, and how
/// many connected. A pool that cannot connect within `WARM_TIMEOUT` is left to its elector.
async fn warm_pools(
    args: &ChildArgs,
    keys: Range<u32>,
) -> Result<(Vec<BackendPool>, usize), String> {
    let config = args.session_config()?;
    let pools = keys
        .map(|_| args.pool(&config))
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = tokio::time::Instant::now() + WARM_TIMEOUT;
    let mut warmed = 0;
    for batch in pools.chunks(WARM_BATCH) {
        let mut set = tokio::task::JoinSet::new();
        for pool in batch {
            let pool = pool.clone();
            set.spawn(async move {
                // A connect that times out on a busy server is tried again.
                while tokio::time::Instant::now() < deadline {
                    if let Ok(Ok(_connected)) = tokio::time::timeout_at(deadline, pool.hold()).await
                    {
                        return true;
                    }
                }
                false
            });
        }
        while let Some(joined) = set.join_next().await {
            warmed += usize::from(joined.unwrap_or(false));
        }
    }
    Ok((pools, warmed))
}
