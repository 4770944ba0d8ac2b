//! `bench single`: The scale table: many electors in one database at a short interval, and a cold start.

use super::*;

/// One elector, its pool, its sessions (for their counts) and its `run` task.
type Member = (
    Elector,
    Pool,
    PoolSessions,
    tokio::task::JoinHandle<Result<(), plexsphere_leader::RunError>>,
);

/// Electors running in this process on one cluster.
struct Electors {
    members: Vec<Member>,
    shutdown: CancellationToken,
    /// When the first elector was started.
    started: Instant,
}

impl Electors {
    /// Starts `n` electors, each with its own pool of 2. With `warm`, each pool opens its
    /// connection (without a time limit) before its elector starts.
    async fn start(
        config: &tokio_postgres::Config,
        n: usize,
        interval: Duration,
        counters: &Arc<PoolCounters>,
        warm: bool,
    ) -> Result<Self, BoxError> {
        let shutdown = CancellationToken::new();
        let mut members = Vec::new();
        let mut started = None;
        for i in 0..n {
            let mut config = config.clone();
            config.application_name(format!("{REPLICA_APP_PREFIX}{i}"));
            let pool = counted_pool(config, 2, counters)?;
            if warm {
                drop(pool.get().await?);
            }
            let sessions = PoolSessions::new(pool.clone());
            let elector = Elector::new(
                Config::with_sessions(sessions.clone())
                    .check_interval(interval)
                    .identity(format!("{REPLICA_APP_PREFIX}{i}")),
            )?;
            started.get_or_insert_with(Instant::now);
            let task = tokio::spawn({
                let (elector, shutdown) = (elector.clone(), shutdown.clone());
                async move { elector.run(shutdown).await }
            });
            members.push((elector, pool, sessions, task));
        }
        Ok(Self {
            members,
            shutdown,
            started: started.unwrap_or_else(Instant::now),
        })
    }

    fn leaders(&self) -> usize {
        self.members.iter().filter(|(e, ..)| e.is_leader()).count()
    }

    /// Electors that lead or whose pool holds a connection.
    fn connected(&self) -> usize {
        self.members
            .iter()
            .filter(|(e, pool, ..)| e.is_leader() || pool.status().size > 0)
            .count()
    }

    /// The connection setups a check gave up on, summed over the electors.
    fn late_setups(&self) -> LateSetups {
        self.members
            .iter()
            .fold(LateSetups::default(), |mut sum, (_, _, sessions, _)| {
                let late = sessions.late_setups();
                sum.finished += late.finished;
                sum.given_up += late.given_up;
                sum
            })
    }

    async fn stop(self) -> Result<(), BoxError> {
        self.shutdown.cancel();
        for (.., task) in self.members {
            task.await??;
        }
        Ok(())
    }
}

pub(super) async fn scale(options: &Options) -> Result<(), BoxError> {
    let (n, interval, window) = (
        options.scale_electors,
        options.scale_interval,
        options.scale_window,
    );
    let cluster = Cluster::start().await?;
    let admin = cluster.connect("postgres").await?;
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET max_connections = {}",
            n * 2 + 20
        ))
        .await?;
    drop(admin);
    cluster.restart(StopMode::Fast).await?;
    let config = cluster.config("postgres");
    let observer = LockObserver::start(&config).await?;
    let counters = Arc::new(PoolCounters::default());
    WarnCounter::global();

    // Steady state: every pool holds its connection before its elector starts.
    let fleet = Electors::start(&config, n, interval, &counters, true).await?;
    tokio::time::sleep(2 * interval).await;
    let steady = observe(&fleet, &cluster, &counters, window, interval).await;
    fleet.stop().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Cold start: all at once, every pool empty: each first check must connect within one
    // interval, or a later check finishes the connection that check gave up on.
    let fleet = Electors::start(&config, n, interval, &counters, false).await?;
    let cold = observe(&fleet, &cluster, &counters, COLD_WINDOW, interval).await;
    fleet.stop().await?;

    println!("\n## Scale: {n} electors in one database, I = {interval:?}\n");
    println!(
        "| figure | steady state: pools connected before start, {:.1} s | cold start: all at once, empty pools, first {:.1} s |",
        steady.secs, cold.secs
    );
    println!("|---|---|---|");
    for (figure, steady, cold) in [
        (
            "electors with a connection at the end",
            steady.connected(n),
            cold.connected(n),
        ),
        (
            "leaders at every instant (is_leader summed, sampled every 5 ms)",
            steady.leaders(),
            cold.leaders(),
        ),
        (
            "first sample with a leader / with every elector connected, from the first elector's start",
            "— (connected before)".into(),
            cold.convergence(),
        ),
        (
            "granted rows per observer poll (server)",
            format!("max {}", observer.max_granted()),
            "(same observer)".into(),
        ),
        (
            "checks per second (ideal {ideal})",
            steady.rate(),
            cold.rate(),
        ),
        (
            "failed checks (WARN lines) / connections opened",
            steady.failures(),
            cold.failures(),
        ),
        (
            "connection setups a check gave up on: finished for a later check / cancelled",
            steady.late(),
            cold.late(),
        ),
        (
            "server CPU (the cluster's postmaster and all its backends)",
            steady.server(),
            cold.server(),
        ),
        (
            "client CPU (all electors in this process)",
            steady.client(),
            cold.client(),
        ),
    ] {
        let ideal = format!("{:.0}", n as f64 / interval.as_secs_f64());
        println!(
            "| {} | {steady} | {cold} |",
            figure.replace("{ideal}", &ideal)
        );
    }
    if let Some(first) = WarnCounter::global().first() {
        println!("\nFirst WARN line: `{first}`");
    }
    Ok(())
}

/// How long the cold start is observed.
const COLD_WINDOW: Duration = Duration::from_secs(5);

/// What [`observe`] saw over its window.
struct Observation {
    secs: f64,
    connected: usize,
    min: usize,
    max: usize,
    off: u64,
    samples: u64,
    standby_checks: u64,
    leader_checks: u64,
    opened: u64,
    warned: u64,
    server: Duration,
    client: Duration,
    /// From the fleet's start to the first sample with a leader.
    first_leader: Option<Duration>,
    /// From the fleet's start to the first sample with every elector connected.
    all_connected: Option<Duration>,
    late: LateSetups,
}

impl Observation {
    fn checks(&self) -> f64 {
        (self.standby_checks + self.leader_checks).max(1) as f64
    }

    fn connected(&self, n: usize) -> String {
        format!("{} of {n}", self.connected)
    }

    fn leaders(&self) -> String {
        format!(
            "min {}, max {}; {} of {} samples not exactly 1",
            self.min, self.max, self.off, self.samples
        )
    }

    fn rate(&self) -> String {
        format!(
            "{:.0} ({:.0} standby, {:.0} leader)",
            (self.standby_checks + self.leader_checks) as f64 / self.secs,
            self.standby_checks as f64 / self.secs,
            self.leader_checks as f64 / self.secs
        )
    }

    fn failures(&self) -> String {
        format!("{} / {}", self.warned, self.opened)
    }

    fn convergence(&self) -> String {
        let at = |t: Option<Duration>| t.map_or("never".into(), |t| format!("{t:.0?}"));
        format!("{} / {}", at(self.first_leader), at(self.all_connected))
    }

    fn late(&self) -> String {
        format!("{} / {}", self.late.finished, self.late.given_up)
    }

    fn server(&self) -> String {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let share = self.server.as_secs_f64() / self.secs;
        format!(
            "{:.1} % of one core ({:.1} % of the machine's {cores} cores); {:.1} µs per check",
            share * 100.0,
            share / cores * 100.0,
            self.server.as_secs_f64() * 1e6 / self.checks()
        )
    }

    fn client(&self) -> String {
        format!(
            "{:.1} % of one core; {:.1} µs per check",
            self.client.as_secs_f64() / self.secs * 100.0,
            self.client.as_secs_f64() * 1e6 / self.checks()
        )
    }
}

/// Samples the number of leaders every 5 ms for `window` and counts checks, failures,
/// connections and CPU.
async fn observe(
    fleet: &Electors,
    cluster: &Cluster,
    counters: &PoolCounters,
    window: Duration,
    interval: Duration,
) -> Observation {
    let warnings = WarnCounter::global();
    let (server, client) = (cluster_cpu(cluster), process_cpu());
    let handed_out = counters.handed_out.load(Ordering::Relaxed);
    let (opened, warned) = (counters.opened.load(Ordering::Relaxed), warnings.count());
    let late = fleet.late_setups();
    let start = Instant::now();
    let (mut min, mut max, mut off, mut samples, mut with_leader) = (usize::MAX, 0, 0, 0, 0);
    let (mut first_leader, mut all_connected) = (None, None);
    while start.elapsed() < window {
        let leaders = fleet.leaders();
        if leaders > 0 {
            first_leader.get_or_insert_with(|| fleet.started.elapsed());
        }
        if all_connected.is_none() && fleet.connected() == fleet.members.len() {
            all_connected = Some(fleet.started.elapsed());
        }
        (min, max) = (min.min(leaders), max.max(leaders));
        off += u64::from(leaders != 1);
        with_leader += u64::from(leaders > 0);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    Observation {
        secs,
        connected: fleet.connected(),
        min,
        max,
        off,
        samples,
        standby_checks: counters.handed_out.load(Ordering::Relaxed) - handed_out,
        // One `SELECT 1` per interval while some elector leads.
        leader_checks: (secs / interval.as_secs_f64() * with_leader as f64 / samples.max(1) as f64)
            as u64,
        opened: counters.opened.load(Ordering::Relaxed) - opened,
        warned: warnings.count() - warned,
        server: cluster_cpu(cluster).saturating_sub(server),
        client: process_cpu() - client,
        first_leader,
        all_connected,
        late: {
            let now = fleet.late_setups();
            let mut delta = LateSetups::default();
            delta.finished = now.finished - late.finished;
            delta.given_up = now.given_up - late.given_up;
            delta
        },
    }
}
