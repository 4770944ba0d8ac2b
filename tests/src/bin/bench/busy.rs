//! `bench busy`: what the leader's check and the shard survey cost on a server whose lock table
//! is busy with other sessions' locks (issue 25). Another session holds N advisory locks of a
//! class of its own; for each N the bench runs `SELECT 1`, the single election's lock-verifying
//! check (on a session that holds the leader lock) and a sharded election's survey (on a
//! session that is a member of its space), each `--statements` times in a row, and prints the
//! client-side latency (median, p99) and the server CPU per statement (the backend's on-CPU
//! time from `/proc/<pid>/schedstat`, over all of them). With `--pgbench-clients C`, a pgbench
//! TPC-B load of C clients runs on the same database throughout (its transactions lock their
//! tables, indexes and rows, as a service's do).

use std::time::{Duration, Instant};

use plexsphere_leader::LockKey;
use plexsphere_leader::rank::FloorStep;
use plexsphere_leader::sharded::Shard;
use plexsphere_leader::{shard_sql, sql};
use plexsphere_leader_tests::TestDb;
use tokio_postgres::Client;

use crate::common::{BoxError, median, percentile, print_machine};

/// `bench busy`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// How many advisory locks another session holds, one row of the table each.
    #[arg(long, value_delimiter = ',', default_value = "0,1000,6000")]
    others: Vec<u32>,
    /// How many times each statement runs per row.
    #[arg(long, default_value_t = 2000)]
    statements: usize,
    /// The shard count of the surveyed space.
    #[arg(long, default_value_t = 1024)]
    shards: u32,
    /// The space's members: as many sessions, each registered and holding its fair share of
    /// the shards (all of them held), one of which runs the survey.
    #[arg(long, default_value_t = 8)]
    members: u32,
    /// Clients of a pgbench TPC-B load on the same database during the rows (0: none).
    #[arg(long, default_value_t = 0)]
    pgbench_clients: u32,
}

/// The class of the other session's locks: no election's.
const OTHERS_CLASS: i32 = 4242;

/// The shard space surveyed.
const SHARD_CLASS: i32 = 0x706c_7368;

/// One statement's figures over a row.
struct Figures {
    median: Duration,
    p99: Duration,
    server_cpu: Duration,
}

pub(crate) async fn run(options: Options) -> Result<(), BoxError> {
    print_machine("plexsphere-leader on a busy server: the check and the survey").await?;
    let db = TestDb::create("bench_busy").await?;
    let holder = db.connect("plx-harness-busy-holder").await?;
    let plain = db.connect("plx-harness-busy-plain").await?;
    let leader = db.connect("plx-harness-busy-leader").await?;
    let standby = db.connect("plx-harness-busy-standby").await?;
    let key = LockKey::DEFAULT;
    let idle_ms = 3_600_000;
    granted(&leader, &sql::try_lock(key, "bench-busy", idle_ms)).await?;
    let members = hold_the_space(&db, options.members, options.shards, idle_ms).await?;
    let member = members.first().ok_or("--members must be at least 1")?;
    let load = match options.pgbench_clients {
        0 => None,
        clients => Some(Pgbench::start(db.name(), clients).await?),
    };
    println!(
        "\n{} statements of each per row{}; the leader's check is `sql::verify`, the standby's \
         refused grant `sql::try_lock` while the leader holds the lock, the survey \
         `shard_sql::survey` of {} shards held by {} members; server CPU is the backend's on-CPU \
         time per statement\n",
        options.statements,
        match options.pgbench_clients {
            0 => String::new(),
            clients => format!(", under a pgbench TPC-B load of {clients} clients"),
        },
        options.shards,
        options.members,
    );
    println!(
        "| other locks held | `SELECT 1` median / p99 | server CPU | the check median / p99 | server CPU | the refused grant median / p99 | server CPU | the survey median / p99 | server CPU | {} surveys per interval, server CPU | a ranked leader's candidate survey median / p99 | server CPU |",
        options.members
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &others in &options.others {
        holder
            .simple_query(&format!(
                "SELECT pg_advisory_unlock_all(); SELECT count(pg_advisory_lock({OTHERS_CLASS}, g)) \
                 FROM generate_series(1, {others}) AS g"
            ))
            .await?;
        let select_one = measure(&plain, "SELECT 1", options.statements).await?;
        let check = measure(&leader, &sql::verify(key), options.statements).await?;
        let refused = measure(
            &standby,
            &sql::try_lock(key, "bench-busy-standby", idle_ms),
            options.statements,
        )
        .await?;
        let survey = measure(
            member,
            &shard_sql::survey(
                SHARD_CLASS,
                options.shards,
                plexsphere_leader::rank::FloorStep::Off,
            ),
            options.statements,
        )
        .await?;
        // A ranked leader's survey after its check (`Config::version`): the candidacies read
        // from `pg_stat_activity`, never from the lock table.
        let candidates = measure(
            &leader,
            &sql::candidacy::survey_sessions(
                key,
                None,
                (sql::candidacy::FLOOR_TABLE, FloorStep::Off),
            ),
            options.statements,
        )
        .await?;
        println!(
            "| {others} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            latency(&select_one),
            micros(select_one.server_cpu),
            latency(&check),
            micros(check.server_cpu),
            latency(&refused),
            micros(refused.server_cpu),
            latency(&survey),
            micros(survey.server_cpu),
            micros(survey.server_cpu * options.members),
            latency(&candidates),
            micros(candidates.server_cpu),
        );
    }
    if let Some(load) = load {
        load.stop().await;
    }
    drop((holder, plain, leader, standby, members));
    db.cleanup().await?;
    Ok(())
}

/// A pgbench load on the test database, stopped by [`Pgbench::stop`] (or killed on drop).
struct Pgbench {
    child: tokio::process::Child,
}

impl Pgbench {
    /// Initializes pgbench's tables in `database` (scale 1) and starts `clients` clients.
    async fn start(database: &str, clients: u32) -> Result<Self, BoxError> {
        let bindir = std::process::Command::new("pg_config")
            .arg("--bindir")
            .output()?;
        let pgbench =
            std::path::Path::new(String::from_utf8_lossy(&bindir.stdout).trim()).join("pgbench");
        let base = plexsphere_leader_tests::base_config()?;
        let host = match base.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let port = base
            .get_ports()
            .first()
            .copied()
            .unwrap_or(5432)
            .to_string();
        let user = base.get_user().unwrap_or("postgres").to_owned();
        let common = ["-h", &host, "-p", &port, "-U", &user];
        let init = tokio::process::Command::new(&pgbench)
            .args(common)
            .args(["-i", "-q", "-s", "1", database])
            .output()
            .await?;
        if !init.status.success() {
            return Err(format!("pgbench -i: {}", String::from_utf8_lossy(&init.stderr)).into());
        }
        let clients = clients.to_string();
        let child = tokio::process::Command::new(&pgbench)
            .args(common)
            .args(["-n", "-c", &clients, "-j", "2", "-T", "3600", database])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        // Let its clients connect and run before the first row.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(Self { child })
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// `members` sessions of the space of `shards` shards, each registered (the member lock) and
/// holding its fair share of the shards (`s % members == i`), so that every shard is held.
async fn hold_the_space(
    db: &TestDb,
    members: u32,
    shards: u32,
    idle_ms: u32,
) -> Result<Vec<Client>, BoxError> {
    let mut sessions = Vec::new();
    for i in 0..members {
        let session = db.connect(&format!("plx-harness-busy-member-{i}")).await?;
        session
            .simple_query(&shard_sql::register(SHARD_CLASS, "bench-busy", idle_ms))
            .await?;
        let share: Vec<Shard> = (0..shards)
            .filter(|s| s % members == i)
            .map(Shard::new)
            .collect();
        let taken = session
            .simple_query(&shard_sql::take(SHARD_CLASS, &share))
            .await?
            .into_iter()
            .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
            .count();
        if taken != share.len() {
            return Err(format!("member {i} took {taken} of its {} shards", share.len()).into());
        }
        sessions.push(session);
    }
    Ok(sessions)
}

/// Runs `statement` on `client`'s session `count` times.
async fn measure(client: &Client, statement: &str, count: usize) -> Result<Figures, BoxError> {
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    // Warm up the plan caches and the connection.
    for _ in 0..10 {
        client.simple_query(statement).await?;
    }
    let cpu_before = on_cpu(pid)?;
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        client.simple_query(statement).await?;
        latencies.push(started.elapsed());
    }
    let cpu = on_cpu(pid)?.saturating_sub(cpu_before);
    latencies.sort();
    Ok(Figures {
        median: median(&latencies),
        p99: percentile(&latencies, 99),
        server_cpu: cpu / u32::try_from(count.max(1)).unwrap_or(u32::MAX),
    })
}

/// The on-CPU time of process `pid` so far (the first field of `/proc/<pid>/schedstat`).
fn on_cpu(pid: i32) -> Result<Duration, BoxError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .map_err(|e| format!("server CPU of backend {pid}: {e} (run on the server's host)"))?;
    let nanos: u64 = text
        .split_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/schedstat: {text:?}"))?;
    Ok(Duration::from_nanos(nanos))
}

/// Runs the grant statement on `client` and fails unless its outcome is `granted`.
async fn granted(client: &Client, statement: &str) -> Result<(), BoxError> {
    let outcome =
        client
            .simple_query(statement)
            .await?
            .into_iter()
            .find_map(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            });
    match outcome.as_deref() {
        Some(sql::outcome::GRANTED) => Ok(()),
        other => Err(format!("the leader lock was not granted: {other:?}").into()),
    }
}

fn latency(figures: &Figures) -> String {
    format!("{} / {}", micros(figures.median), micros(figures.p99))
}

fn micros(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}
