//! `bench single`: The failover table: one row per fault, each round two replica processes on one merged
//! timeline.

use super::*;

/// The faults of the failover table; `--faults` names them in kebab case (`silent-death`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Fault {
    Graceful,
    Sigkill,
    SilentDeath,
    Partition,
    Terminate,
    /// `pg_terminate_backend` with the leader connected straight to the server (no harness
    /// proxy on its path): the detection figure without the proxy's forwarding hop.
    TerminateDirect,
    DropServerToClient,
    DropClientToServer,
    RestartFast,
    RestartImmediate,
    Failover,
}

impl Fault {
    pub(super) const ALL: [Self; 11] = [
        Self::Graceful,
        Self::Sigkill,
        Self::SilentDeath,
        Self::Partition,
        Self::Terminate,
        Self::TerminateDirect,
        Self::DropServerToClient,
        Self::DropClientToServer,
        Self::RestartFast,
        Self::RestartImmediate,
        Self::Failover,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Graceful => "graceful stop (SIGTERM)",
            Self::Sigkill => "SIGKILL of the leader",
            Self::SilentDeath => "silent death (blackhole, SIGKILL)",
            Self::Partition => "partition of the leader (blackhole)",
            Self::Terminate => "pg_terminate_backend of the lock session",
            Self::TerminateDirect => "pg_terminate_backend, leader without the proxy",
            Self::DropServerToClient => "server→client drop",
            Self::DropClientToServer => "client→server drop",
            Self::RestartFast => "server restart -m fast",
            Self::RestartImmediate => "server restart -m immediate",
            Self::Failover => "failover to a promoted standby",
        }
    }

    /// The design's bounds (section 6) for (a) no leader, (b) detection, (c) overlap, in
    /// intervals, as text; in the queued mode, the handover target of issue 7 where the server
    /// releases the lock at once (a graceful release, a closed or terminated session).
    fn bounds(self, held: Held) -> [&'static str; 3] {
        let queued = held == Held::Queue;
        if held == Held::Lease {
            return self.lease_bounds();
        }
        match self {
            Self::Graceful if queued => ["10 ms p99 (target)", "0 (ends its term first)", "0"],
            Self::Sigkill if queued => ["10 ms p99 (target)", "— (dead)", "0"],
            Self::Terminate | Self::TerminateDirect if queued => {
                ["10 ms p99 (target)", "2·I", "2·I"]
            }
            Self::Graceful => ["I", "0 (ends its term first)", "0"],
            Self::Sigkill => ["I", "— (dead)", "0"],
            Self::SilentDeath => ["5·I (4·I idle timeout + I)", "— (dead)", "0"],
            Self::Partition => ["5·I", "2·I", "2·I"],
            Self::Terminate | Self::TerminateDirect => ["I", "2·I", "2·I"],
            Self::DropServerToClient => ["3·I (2·I + I)", "2·I", "2·I"],
            Self::DropClientToServer => ["5·I", "2·I", "2·I"],
            Self::RestartFast | Self::RestartImmediate => ["restart + I", "2·I", "2·I"],
            Self::Failover => ["promotion + 2·I", "2·I", "2·I"],
        }
    }
}

impl Fault {
    /// The lease mechanism's bounds (reference.md, Lease mechanism), TTL = 3·I: nothing frees
    /// a lease but its release or its expiry, and the leader stops trusting it 0.9·TTL after
    /// sending its last successful renewal, which is at most I before the fault.
    fn lease_bounds(self) -> [&'static str; 3] {
        match self {
            Self::Graceful => ["I", "0 (ends its term first)", "0"],
            Self::Sigkill | Self::SilentDeath => ["TTL + I (4·I)", "— (dead)", "0"],
            Self::Partition | Self::DropClientToServer => {
                ["TTL + I (4·I)", "I + 0.9·TTL (3.7·I)", "0"]
            }
            // Its renewals still reach the server: the lease lives on until it demotes and its
            // unanswered claim holds it off.
            Self::DropServerToClient => ["2·TTL + 2·I (8·I)", "I + 0.9·TTL (3.7·I)", "0"],
            Self::Terminate | Self::TerminateDirect => ["— (no lock session)", "—", "—"],
            Self::RestartFast | Self::RestartImmediate => {
                ["restart + TTL + I", "I + 0.9·TTL (3.7·I)", "0"]
            }
            Self::Failover => ["promotion + TTL + I", "I + 0.9·TTL (3.7·I)", "0"],
        }
    }

    /// Whether the fault applies to `held`: a lease has no lock session to terminate.
    fn applies(self, held: Held) -> bool {
        held != Held::Lease || !matches!(self, Self::Terminate | Self::TerminateDirect)
    }
}

/// One round's measurements.
#[derive(Debug, Clone, Copy)]
struct Sample {
    no_leader: Duration,
    detection: Option<Duration>,
    overlap: Duration,
    /// The restart or promotion time, for the faults whose bound includes it.
    server: Option<Duration>,
}

pub(super) async fn failover_table(options: &Options) -> Result<(), BoxError> {
    for held in options.modes() {
        let setup = Setup {
            interval: options.interval,
            held,
            explain_over: options.explain_over,
        };
        failover_mode(options, setup).await?;
    }
    Ok(())
}

async fn failover_mode(options: &Options, setup: Setup) -> Result<(), BoxError> {
    let mode = setup.held.name();
    println!(
        "\n## Failover ({mode}, I = {:?}, {} rounds)\n",
        options.interval, options.rounds
    );
    println!(
        "| fault | (a) no leader: bound | median | p99 | max | (b) old leader knows: bound | median | p99 | max | (c) overlap: bound | median | p99 | max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for fault in options.faults() {
        if !fault.applies(setup.held) {
            let [gap, detect, overlap] = fault.bounds(setup.held);
            println!(
                "| {} | {gap} | — | — | — | {detect} | — | — | — | {overlap} | — | — | — |",
                fault.name()
            );
            continue;
        }
        let mut samples = Vec::new();
        let mut failures = Vec::new();
        for _ in 0..options.rounds {
            match fault_round(fault, setup).await {
                Ok(sample) => samples.push(sample),
                Err(e) => failures.push(e.to_string()),
            }
        }
        print_row(fault, setup.held, &samples);
        for failure in failures {
            eprintln!("  {}: a round failed: {failure}", fault.name());
        }
    }
    println!(
        "\n(a) the longest span, from the fault to the first term that began after it, in which \
         no replica believed it led; (b) from the fault to the old leader's term end; (c) the \
         longest span two replicas believed they led at once. p99 is nearest-rank: with fewer \
         than 100 rounds it is the maximum."
    );
    Ok(())
}

fn print_row(fault: Fault, held: Held, samples: &[Sample]) {
    let [gap_bound, detect_bound, overlap_bound] = fault.bounds(held);
    let server: Vec<Duration> = samples.iter().filter_map(|s| s.server).collect();
    // Per round: how far (a) went beyond that round's restart or promotion time.
    let beyond: Vec<Duration> = samples
        .iter()
        .filter_map(|s| s.server.map(|t| s.no_leader.saturating_sub(t)))
        .collect();
    let gap_bound = match server.is_empty() {
        true => gap_bound.to_owned(),
        false => format!(
            "{gap_bound} (median {}; (a) minus it: max {})",
            ms(percentile(&server, 50)),
            ms(percentile(&beyond, 100))
        ),
    };
    let gaps: Vec<Duration> = samples.iter().map(|s| s.no_leader).collect();
    let detections: Vec<Duration> = samples.iter().filter_map(|s| s.detection).collect();
    let overlaps: Vec<Duration> = samples.iter().map(|s| s.overlap).collect();
    println!(
        "| {} ({} rounds) | {gap_bound} | {} | {detect_bound} | {} | {overlap_bound} | {} |",
        fault.name(),
        samples.len(),
        stats(&gaps),
        stats(&detections),
        stats(&overlaps)
    );
}

/// `median | p99 | max` in milliseconds, or dashes when there is nothing.
fn stats(values: &[Duration]) -> String {
    if values.is_empty() {
        return "— | — | —".into();
    }
    format!(
        "{} | {} | {}",
        ms(percentile(values, 50)),
        ms(percentile(values, 99)),
        ms(percentile(values, 100))
    )
}

/// Two replica processes, `a` (the leader, possibly behind a proxy) and `b` (a standby).
struct Pair {
    timeline: Timeline,
    /// Explain rounds whose time without a leader exceeds this.
    explain_over: Option<Duration>,
    interval: Duration,
    a: ReplicaProcess,
    b: ReplicaProcess,
}

/// How long after a fault (and the server's restart or promotion) a leader that is still in
/// its term, with nobody else leading, counts as having kept it: ten intervals.
const KEPT_AFTER_INTERVALS: u32 = 10;

impl Pair {
    async fn start(a_dsn: String, b_dsn: String, setup: Setup) -> Result<Self, BoxError> {
        let Setup {
            interval,
            held,
            explain_over,
        } = setup;
        let launcher = replica_launcher()?;
        let timeline = Timeline::new();
        let args = |name: &str, dsn: String| ChildArgs {
            queued: held == Held::Queue,
            mechanism: held.mechanism(),
            ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn, interval)
        };
        let a = launcher
            .spawn_with_timeline(args("a", a_dsn), &timeline)
            .await?;
        a.wait_for(ROUND_TIMEOUT, |r| r.event == LEAD)
            .await
            .ok_or("a never led")?;
        let b = launcher
            .spawn_with_timeline(args("b", b_dsn), &timeline)
            .await?;
        // b's first refused check leaves a pooled session; a pings at least once more. Then a
        // pseudo-random part of an interval, so that the fault falls at any phase of the
        // leader's checks.
        tokio::time::sleep(2 * interval).await;
        random_phase(interval).await;
        Ok(Self {
            timeline,
            explain_over,
            interval,
            a,
            b,
        })
    }

    /// Measures the round whose fault began at `fault`; `server` is the restart or promotion
    /// time when the fault has one.
    async fn measure(
        &self,
        fault: Instant,
        a_alive: bool,
        server: Option<Duration>,
    ) -> Result<Sample, BoxError> {
        let deadline = Instant::now() + ROUND_TIMEOUT;
        let kept_at = fault + server.unwrap_or_default() + self.interval * KEPT_AFTER_INTERVALS;
        let first_lead = loop {
            let leads: Vec<Instant> = [&self.a, &self.b]
                .iter()
                .flat_map(|r| r.events(LEAD))
                .map(|r| r.at)
                .filter(|at| *at >= fault)
                .collect();
            if let Some(first) = leads.iter().min() {
                break *first;
            }
            // The old leader never lost its term (a lease that outlived a short restart).
            let demoted = self.a.events(FOLLOW).iter().any(|r| r.at >= fault);
            if a_alive && !demoted && Instant::now() >= kept_at {
                let intervals = self.timeline.intervals(LEAD, FOLLOW, Instant::now());
                return Ok(Sample {
                    no_leader: Duration::ZERO,
                    detection: None,
                    overlap: timeline::max_overlap(&intervals),
                    server,
                });
            }
            if Instant::now() >= deadline {
                return Err("no replica led after the fault".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let detection = match a_alive {
            true => Some(
                self.a
                    .wait_for_since(fault, ROUND_TIMEOUT, |r| r.event == FOLLOW)
                    .await
                    .ok_or("the old leader never demoted")?
                    .at
                    - fault,
            ),
            false => None,
        };
        let intervals = self.timeline.intervals(LEAD, FOLLOW, Instant::now());
        let window = Span {
            start: fault,
            end: first_lead,
        };
        let gap = timeline::max_gap(&intervals, window);
        if self.explain_over.is_some_and(|over| gap > over) {
            self.explain(fault, gap);
        }
        Ok(Sample {
            no_leader: gap,
            detection,
            overlap: timeline::max_overlap(&intervals),
            server,
        })
    }

    /// Prints, to stderr, every record of both replicas relative to the fault.
    fn explain(&self, fault: Instant, gap: Duration) {
        let mut records: Vec<_> = self
            .a
            .records()
            .into_iter()
            .chain(self.b.records())
            .collect();
        records.sort_by_key(|r| r.at);
        eprintln!("--- a round without a leader for {gap:?}; times from the fault:");
        for r in records {
            let at = match r.at.checked_duration_since(fault) {
                Some(after) => format!("+{after:?}"),
                None => format!("-{:?}", fault - r.at),
            };
            eprintln!("{at} {} {} {}", r.replica, r.event, r.fields);
        }
    }

    async fn stop(mut self) -> Result<(), BoxError> {
        self.a.stop().await.ok();
        self.b.stop().await?;
        Ok(())
    }
}

pub(super) fn replica_launcher() -> Result<Launcher, BoxError> {
    let me = std::env::current_exe()?;
    Ok(Launcher::with_prefix(me, &["replica"]))
}

async fn fault_round(fault: Fault, setup: Setup) -> Result<Sample, BoxError> {
    match fault {
        Fault::RestartFast => restart_round(StopMode::Fast, setup).await,
        Fault::RestartImmediate => restart_round(StopMode::Immediate, setup).await,
        Fault::Failover => failover_round(setup).await,
        _ => local_round(fault, setup).await,
    }
}

/// A round on its own database of the local server, `a` behind a fault proxy.
async fn local_round(fault: Fault, setup: Setup) -> Result<Sample, BoxError> {
    let db = TestDb::create("bench").await?;
    if setup.held == Held::Lease {
        plexsphere_leader::lease::setup(db.admin()).await?;
    }
    let proxy = FaultProxy::in_front_of(&db.config()).await?;
    let a_config = match fault {
        Fault::TerminateDirect => db.config(),
        _ => proxy.pg_config(&db.config()),
    };
    let mut pair = Pair::start(dsn(&a_config), dsn(&db.config()), setup).await?;
    let holder = lock_holders(db.admin()).await?;
    let at = Instant::now();
    let alive = match fault {
        Fault::Graceful => {
            pair.a.stop().await?;
            true
        }
        Fault::Sigkill => {
            pair.a.kill().await?;
            false
        }
        Fault::SilentDeath => {
            proxy.set_both(Mode::Blackhole);
            pair.a.kill().await?;
            false
        }
        Fault::Partition => {
            proxy.set_both(Mode::Blackhole);
            true
        }
        Fault::Terminate | Fault::TerminateDirect => {
            let (pid, _) = holder.first().ok_or("no lock holder")?;
            db.terminate(*pid).await?;
            true
        }
        Fault::DropServerToClient => {
            proxy.set_mode(
                plexsphere_leader_tests::Direction::ServerToClient,
                Mode::Blackhole,
            );
            true
        }
        Fault::DropClientToServer => {
            proxy.set_mode(
                plexsphere_leader_tests::Direction::ClientToServer,
                Mode::Blackhole,
            );
            true
        }
        Fault::RestartFast | Fault::RestartImmediate | Fault::Failover => {
            return Err("not a local fault".into());
        }
    };
    let sample = pair.measure(at, alive, None).await;
    proxy.set_both(Mode::Forward);
    pair.stop().await?;
    wait_clean(db.admin(), REPLICA_APP_PREFIX, ROUND_TIMEOUT).await?;
    db.cleanup().await?;
    sample
}

async fn restart_round(mode: StopMode, setup: Setup) -> Result<Sample, BoxError> {
    let cluster = Cluster::start().await?;
    let config = cluster.config("postgres");
    if setup.held == Held::Lease {
        lease_setup(&config).await?;
    }
    let pair = Pair::start(dsn(&config), dsn(&config), setup).await?;
    let at = Instant::now();
    cluster.restart(mode).await?;
    let restart = at.elapsed();
    let sample = pair.measure(at, true, Some(restart)).await;
    pair.stop().await?;
    sample
}

async fn failover_round(setup: Setup) -> Result<Sample, BoxError> {
    let primary = Cluster::start().await?;
    if setup.held == Held::Lease {
        // On the primary before the standby is made from it: the tables replicate.
        lease_setup(&primary.config("postgres")).await?;
    }
    let standby = Cluster::start_standby_of(&primary).await?;
    let proxy = FaultProxy::in_front_of(&primary.config("postgres")).await?;
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write connect_timeout=2",
        proxy.addr().port(),
        standby.port()
    );
    let pair = Pair::start(dsn.clone(), dsn, setup).await?;
    let at = Instant::now();
    proxy.set_refuse_new(true);
    proxy.set_both(Mode::Blackhole);
    standby.promote().await?;
    let promotion = at.elapsed();
    let sample = pair.measure(at, true, Some(promotion)).await;
    primary.stop(StopMode::Immediate).await?;
    pair.stop().await?;
    sample
}

/// The lease tables on the server of `config`.
async fn lease_setup(config: &tokio_postgres::Config) -> Result<(), BoxError> {
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    plexsphere_leader::lease::setup(&client).await?;
    drop(client);
    let _ = driver.await;
    Ok(())
}
