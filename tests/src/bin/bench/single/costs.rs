//! `bench single`: The cost per check: client CPU time, allocations, backends, WAL and wakeups.

use super::*;

/// CPU time and allocations over a window of `checks` checks.
struct Cost {
    checks: u64,
    cpu: Duration,
    bytes: usize,
    allocations: usize,
    net_bytes: i128,
}

impl Cost {
    fn row(&self, what: &str) -> String {
        let n = self.checks.max(1);
        format!(
            "| {what} | {} | {:.1} µs | {} B | {:.1} | {} B |",
            self.checks,
            self.cpu.as_secs_f64() * 1e6 / n as f64,
            self.bytes as u64 / n,
            self.allocations as f64 / n as f64,
            self.net_bytes
        )
    }
}

/// Measures from now until `done` says the window is over, on this process's counters.
/// Measures over a window of `target` checks counted by `checks`, expected one per `interval`.
/// The harness sleeps through the expected window at once, so its own wake-ups cost little.
async fn measure_window(mut checks: impl FnMut() -> u64, target: u64, interval: Duration) -> Cost {
    let region = Region::new(crate::GLOBAL);
    let cpu = process_cpu();
    let start = checks();
    tokio::time::sleep(interval * u32::try_from(target).unwrap_or(u32::MAX)).await;
    while checks() - start < target {
        tokio::time::sleep(interval).await;
    }
    let change = region.change();
    Cost {
        checks: checks() - start,
        cpu: process_cpu() - cpu,
        bytes: change.bytes_allocated,
        allocations: change.allocations,
        net_bytes: change.bytes_allocated as i128 - change.bytes_deallocated as i128,
    }
}

async fn sessions_started(db: &TestDb) -> Result<i64, BoxError> {
    // Backends report their statistics at most once a second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    db.admin()
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    Ok(db
        .admin()
        .query_one(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?
        .get(0))
}

pub(super) async fn costs(_options: &Options) -> Result<(), BoxError> {
    let interval = Duration::from_millis(50);
    let checks = 1_000;
    let warnings = WarnCounter::global();
    let db = TestDb::create("bench_costs").await?;
    let blocker = db.connect("plx-harness-blocker").await?;
    blocker
        .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
        .await?;
    // The harness and an idle runtime alone, over as many intervals.
    let idle_start = Instant::now();
    let idle = measure_window(
        || (idle_start.elapsed().as_nanos() / interval.as_nanos()) as u64,
        checks,
        interval,
    )
    .await;
    let counters = Arc::new(PoolCounters::default());
    let pool = counted_pool(
        db.config_with_app_name(&format!("{REPLICA_APP_PREFIX}bench")),
        2,
        &counters,
    )?;
    let elector = Elector::new(
        Config::new(pool)
            .check_interval(interval)
            .identity(format!("{REPLICA_APP_PREFIX}bench")),
    )?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let sessions_before = sessions_started(&db).await?;
    let opened_before = counters.opened.load(Ordering::Relaxed);
    let warned = warnings.count();
    let standby = measure_window(
        || counters.handed_out.load(Ordering::Relaxed),
        checks,
        interval,
    )
    .await;
    let standby_failed = warnings.count() - warned;
    let opened = counters.opened.load(Ordering::Relaxed) - opened_before;
    let sessions = sessions_started(&db).await? - sessions_before;

    blocker
        .simple_query("SELECT pg_advisory_unlock(1886156915, 1)")
        .await?;
    let _ = tokio::time::timeout(
        ROUND_TIMEOUT,
        elector
            .subscribe()
            .wait_for(|leadership| leadership.is_leader()),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The leader's checks run on the grid: one per interval.
    let grid = Instant::now();
    let warned = warnings.count();
    let leader = measure_window(
        || (grid.elapsed().as_nanos() / interval.as_nanos()) as u64,
        checks,
        interval,
    )
    .await;
    let leader_failed = warnings.count() - warned;
    shutdown.cancel();
    run.await??;
    let lease = lease_cost(&db, interval, checks).await?;

    println!("\n## Cost per check (I = {interval:?}, one elector in this process)\n");
    println!(
        "| check | checks | client CPU per check | bytes allocated per check | allocations per check | net bytes over the window |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "{}",
        idle.row("no elector: harness and idle runtime, per interval")
    );
    println!("{}", standby.row("standby (lock refused)"));
    println!("{}", leader.row("leader (the lock-verifying check)"));
    println!(
        "{}",
        lease
            .cost
            .row("lease leader (the renewal, one pooled statement)")
    );
    println!(
        "\nFailed checks (WARN lines) in the windows: standby {standby_failed}, leader {leader_failed}."
    );
    println!(
        "\nBackends opened over {} refused checks: {opened} by the pool, {sessions} sessions \
         started on the server (`pg_stat_database.sessions`); per 1,000: {}.",
        standby.checks,
        (sessions.max(0) as u64 * 1_000).div_ceil(standby.checks.max(1))
    );
    println!(
        "\nThe lease renewal on the server: {} WAL bytes per renewal ({} bytes over {} \
         renewals, `pg_wal_lsn_diff` of `pg_current_wal_lsn()`; one row update of \
         `plexsphere_leader_lease`, HOT when the fillfactor leaves room), {} failed renewals.",
        lease.wal_bytes / i128::from(u32::try_from(lease.cost.checks.max(1)).unwrap_or(u32::MAX)),
        lease.wal_bytes,
        lease.cost.checks,
        lease.failed
    );
    drop(blocker);
    db.cleanup().await?;
    wakeups().await
}

/// The server's WAL position in bytes.
async fn wal_position(db: &TestDb) -> Result<i128, BoxError> {
    let row = db
        .admin()
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::text",
            &[],
        )
        .await?;
    let text: String = row.get(0);
    Ok(text.split('.').next().unwrap_or("0").parse()?)
}

/// What a lease leader's renewals cost: the client per check, and the server's WAL.
struct LeaseCost {
    cost: Cost,
    wal_bytes: i128,
    failed: u64,
}

/// A lease elector leading alone on `db` at `interval`, over `checks` renewals (the check grid).
async fn lease_cost(db: &TestDb, interval: Duration, checks: u64) -> Result<LeaseCost, BoxError> {
    plexsphere_leader::lease::setup(db.admin()).await?;
    let pool = db.pool_with_app_name(&format!("{REPLICA_APP_PREFIX}lease"), 2)?;
    let elector = Elector::new(
        Config::new(pool)
            .check_interval(interval)
            .lease(Duration::ZERO)
            .identity(format!("{REPLICA_APP_PREFIX}lease")),
    )?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    tokio::time::timeout(
        ROUND_TIMEOUT,
        elector
            .subscribe()
            .wait_for(|leadership| leadership.is_leader()),
    )
    .await??;
    let warnings = WarnCounter::global();
    let warned = warnings.count();
    let wal_before = wal_position(db).await?;
    let grid = Instant::now();
    let cost = measure_window(
        || (grid.elapsed().as_nanos() / interval.as_nanos()) as u64,
        checks,
        interval,
    )
    .await;
    let wal_bytes = wal_position(db).await? - wal_before;
    let failed = warnings.count() - warned;
    shutdown.cancel();
    run.await??;
    Ok(LeaseCost {
        cost,
        wal_bytes,
        failed,
    })
}

/// How often an idle process wakes up (voluntary context switches of all its threads, from
/// `/proc/self/task/*/status`) over `intervals` check intervals while `leader` (if any) leads.
async fn wakeups_per_interval(interval: Duration, intervals: u32) -> f64 {
    let before = voluntary_switches();
    tokio::time::sleep(interval * intervals).await;
    (voluntary_switches() - before) as f64 / f64::from(intervals)
}

fn voluntary_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .filter_map(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("voluntary_ctxt_switches:")
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
        })
        .sum()
}

/// Timer wake-ups of an idle leader: one elector leading at I = 1 s, its pool built with
/// `ObservedConnect` (the session's end is awaited) or with deadpool's default connector (the
/// closed flag is looked at every 5 ms), against the same process with no elector.
async fn wakeups() -> Result<(), BoxError> {
    let interval = Duration::from_secs(1);
    let intervals = 10;
    let idle = wakeups_per_interval(interval, intervals).await;
    let mut rows = Vec::new();
    for observed in [true, false] {
        let db = TestDb::create(if observed {
            "bench_wake_observed"
        } else {
            "bench_wake_plain"
        })
        .await?;
        let config = db.config_with_app_name(&format!("{REPLICA_APP_PREFIX}bench"));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = if observed {
            Manager::from_connect(
                config,
                plexsphere_leader::session::ObservedConnect::new(NoTls),
                manager_config,
            )
        } else {
            Manager::from_config(config, NoTls, manager_config)
        };
        let pool = Pool::builder(manager)
            .max_size(2)
            .runtime(Runtime::Tokio1)
            .build()?;
        let elector = Elector::new(Config::new(pool).check_interval(interval))?;
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        tokio::time::timeout(
            ROUND_TIMEOUT,
            elector
                .subscribe()
                .wait_for(|leadership| leadership.is_leader()),
        )
        .await??;
        tokio::time::sleep(interval).await;
        let leading = wakeups_per_interval(interval, intervals).await;
        let led = elector.is_leader();
        shutdown.cancel();
        run.await??;
        db.cleanup().await?;
        rows.push((observed, leading, led));
    }
    println!("\n## Wake-ups of an idle leader (I = {interval:?}, {intervals} intervals)\n");
    println!("| process | voluntary context switches per interval, all threads | led throughout |");
    println!("|---|---|---|");
    println!("| no elector (harness and idle runtime) | {idle:.1} | — |");
    for (observed, leading, led) in rows {
        let pool = if observed {
            "pool with `ObservedConnect` (session end awaited)"
        } else {
            "pool with deadpool's default connector (closed flag every 5 ms)"
        };
        println!("| leader, {pool} | {leading:.1} | {led} |");
    }
    Ok(())
}
