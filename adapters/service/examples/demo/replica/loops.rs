//! The demo's loops: every loop of the spec's three tables wired under its name and
//! placement, and the passes they run.

use super::*;

/// Wires every loop of the spec's three tables under its own name and placement. Every ticked
/// loop ticks once per check interval, except `sse-nonce-sweep`: once per nonce TTL.
pub(super) fn wire_loops(
    elector: &Elector,
    background: &mut Background,
    pool: &Pool,
    me: &Me,
    metrics: &TickMetrics,
    sharded: bool,
) -> Result<(), plexsphere_leader_service::loops::WiringError> {
    for (name, probe) in TICKED {
        let period = if name == passes::SSE_NONCE_SWEEP {
            me.nonce_ttl
        } else {
            me.interval
        };
        let pass = ticked_pass(pool.clone(), name, me.actor.clone(), period, sharded);
        let mut ticker = LeaderTicker::new(name, elector.clone(), period, pass)
            .at_boot()
            .metrics(metrics);
        if let Some(probe) = probe {
            ticker = ticker.probe(probe);
        }
        background.ticker(ticker)?;
    }

    background.while_leader(WhileLeader::new(
        "audit-archiver",
        elector.clone(),
        self_paced(pool.clone(), me.interval, |client| {
            Box::pin(async move { passes::archive_audit(&**client).await })
        }),
    ))?;
    background.while_leader(WhileLeader::new(
        "authz-outbox-consumer",
        elector.clone(),
        self_paced(pool.clone(), me.interval / 2, |client| {
            Box::pin(async move { passes::mirror_outbox(&**client).await })
        }),
    ))?;

    let period = me.interval;
    background.every_replica(EveryReplica::new(
        "capacity-collector",
        period,
        capacity_collector(pool.clone(), me.actor.clone(), Gate::leader(elector)),
    ))?;
    let deletion_gate = Gate::leader(elector);
    for durable in DURABLES {
        let name = format!("observability-routing-consume/{durable}");
        let pass = consume_loop(pool.clone(), durable, deletion_gate.clone());
        background.every_replica(EveryReplica::new(&name, period, pass))?;
    }
    // Each step also spends from this replica's rate budget (its bucket is its
    // application_name, so a restarted replica leaves its old bucket to `rate-budget-sweep`).
    let relay = {
        let pool = pool.clone();
        let bucket: Arc<str> = me.application_name.as_str().into();
        pass_fn(move |_shutdown: CancellationToken| {
            let (pool, bucket) = (pool.clone(), Arc::clone(&bucket));
            async move {
                let mut client = pool.get().await?;
                passes::spend_rate_budget(&**client, &bucket).await?;
                passes::relay(&mut client).await?;
                Ok::<(), BoxError>(())
            }
        })
    };
    background.every_replica(EveryReplica::new("sse-relay", period, relay))?;
    background.every_replica(EveryReplica::new(
        "sse-signing-key-rotation-watcher",
        period,
        key_watcher(pool.clone()),
    ))?;
    let ready = Arc::new(AtomicBool::new(false));
    let heartbeat = pass_fn(move |_shutdown: CancellationToken| {
        // It re-flips a local readiness flag and takes no write.
        ready.store(true, Ordering::Relaxed);
        async { Ok::<(), BoxError>(()) }
    });
    background.every_replica(EveryReplica::new("peers-relay-assigner", period, heartbeat))?;
    Ok(())
}

/// The pass of a ticked loop: seed, sweep (compare-and-set), prune; stops with its term. With
/// `--shards` the shard owners sweep instead ([`crate::shards`]).
fn ticked_pass(
    pool: Pool,
    name: &'static str,
    actor: String,
    period: Duration,
    sharded: bool,
) -> plexsphere_leader_service::loops::PassFn {
    pass_fn(move |token: CancellationToken| {
        let (pool, actor) = (pool.clone(), actor.clone());
        async move {
            let work = async {
                let client = pool.get().await?;
                if sharded {
                    passes::ticked_pass_sharded(&**client, name, period).await?;
                } else {
                    passes::ticked_pass(&**client, name, &actor, period).await?;
                }
                Ok::<(), BoxError>(())
            };
            tokio::select! {
                () = token.cancelled() => Ok(()),
                result = work => result,
            }
        }
    })
}

type Step =
    fn(
        deadpool_postgres::Object,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send>>;

/// A self-paced while-leader loop: runs `step` until it moves nothing, then waits `pause`; ends
/// when the term's token is cancelled.
fn self_paced(pool: Pool, pause: Duration, step: Step) -> plexsphere_leader_service::loops::PassFn {
    pass_fn(move |token: CancellationToken| {
        let pool = pool.clone();
        async move {
            loop {
                let client = tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    client = pool.get() => client?,
                };
                let moved = tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    moved = step(client) => moved?,
                };
                if moved == 0 {
                    tokio::select! {
                        () = token.cancelled() => return Ok::<(), BoxError>(()),
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    })
}

/// Every replica samples and tracks the same hysteresis; only the audit row of a crossing is
/// gated. One pass per tick of its [`EveryReplica`].
fn capacity_collector(pool: Pool, actor: String, gate: Gate) -> PassFn {
    const HIGH: i64 = 30;
    const LOW: i64 = 15;
    let above = Arc::new(Mutex::new(false));
    pass_fn(move |_shutdown: CancellationToken| {
        let (pool, actor, gate, above) = (
            pool.clone(),
            actor.clone(),
            gate.clone(),
            Arc::clone(&above),
        );
        async move {
            let client = pool.get().await?;
            let pending = passes::pending(&**client).await?;
            let crossed = {
                let mut above = above.lock().unwrap_or_else(PoisonError::into_inner);
                let next = if *above {
                    pending > LOW
                } else {
                    pending >= HIGH
                };
                let crossed = next != *above;
                *above = next;
                crossed.then_some(next)
            };
            if let Some(now_above) = crossed
                && gate.allows()
            {
                passes::record_crossing(&**client, &actor, now_above, pending).await?;
            }
            Ok::<(), BoxError>(())
        }
    })
}

/// Each replica drains its share of a durable; only the durable removals are gated.
fn consume_loop(pool: Pool, durable: &'static str, gate: Gate) -> PassFn {
    pass_fn(move |_shutdown: CancellationToken| {
        let (pool, gate) = (pool.clone(), gate.clone());
        async move {
            let client = pool.get().await?;
            passes::consume(&**client, durable).await?;
            if gate.allows() {
                passes::remove_orphaned_durables(&**client).await?;
            }
            Ok::<(), BoxError>(())
        }
    })
}

/// Every replica keeps its own in-memory key cache and invalidates it when the key generation
/// (here: the relay cursor's row, read only) changes.
fn key_watcher(pool: Pool) -> PassFn {
    let cached = Arc::new(Mutex::new(None::<i64>));
    pass_fn(move |_shutdown: CancellationToken| {
        let (pool, cached) = (pool.clone(), Arc::clone(&cached));
        async move {
            let client = pool.get().await?;
            let row = client
                .query_typed_one(
                    "SELECT position FROM plexsphere_demo.cursors WHERE name = 'sse-relay'",
                    &[],
                )
                .await?;
            let generation: i64 = row.try_get(0)?;
            let mut cached = cached.lock().unwrap_or_else(PoisonError::into_inner);
            if *cached != Some(generation) {
                *cached = Some(generation);
            }
            Ok::<(), BoxError>(())
        }
    })
}
