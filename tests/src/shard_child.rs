//! The sharded replica child process: one [`ShardedElector`] in its own OS process (or, for the
//! benchmark's comparison, a range of single [`Elector`]s, one per shard key), so that
//! `SIGKILL` and a cut-off session are real. The `bench` binary runs [`main`] as its
//! hidden `shard-replica` subcommand; [`fleet`] starts such processes and reads what they print.
//!
//! # Output
//!
//! One JSON object per line on stdout, every one with `t` (the
//! [`monotonic_ns`](crate::clock::monotonic_ns) stamp), `replica` (its name: the lock
//! sessions' `application_name` and the elector's identity), `pid` and `event`:
//!
//! | `event` | extra fields | when |
//! |---|---|---|
//! | `ready` | `interval_ms`, `shards`, `mode` (`sharded` or `single`) | the sharded elector is built and `run` starts; single electors: every pool is connected, the electors wait for `go` |
//! | `warmed` | `pools`, `connected` | single electors: the pools tried to connect (before `ready`) |
//! | `started` | `electors` | single electors: `go` came; key `s`'s `run` starts `s/K` of an interval later |
//! | `member` | `member` (the lock session's backend pid, or `null`) | the sharded elector joined the space or lost its session |
//! | `begin` | `shard`, `term` | a shard's term began (stamped with its start as published) |
//! | `end` | `shard`, `term`, `cause` (`HandedOver`, `Stopped`, `Lost(SessionEnded)`, …) | a shard's term ended (stamped with its end as published) |
//! | `log` | `level`, `message` | every event of target `plexsphere_leader` |
//! | `cpu` | `cpu_ns` (`CLOCK_PROCESS_CPUTIME_ID`, every thread, exited ones too), `rss_kb`, `hwm_kb` | the `cpu` command |
//! | `exit` | `run` (the error `run` returned, or `null`) | every `run` returned |
//!
//! A sharded replica reads its terms from [`ShardedElector::subscribe`] (the published
//! ownership, with each term's start) and [`ShardedElector::transitions`] (each end's instant
//! and cause); a single elector's from [`Elector::subscribe`] through [`TermEvents`]. Both
//! publish wall-clock instants or `std::time::Instant`s; they are turned into `CLOCK_MONOTONIC`
//! stamps by their distance from now, so the stamps of every process share one clock.
//!
//! # Input
//!
//! Commands, one per line on stdin: `stop` (graceful: cancel `run`), `cpu` (print a `cpu`
//! record) and `go` (single electors: start them, so that the harness starts every process's
//! electors at once, after every pool connected). `SIGTERM`, `SIGINT` and the end of stdin also stop gracefully, so a child never
//! outlives its harness.

pub mod fleet;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::Range;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use plexsphere_leader::sharded::{ShardConfig, ShardedElector};
use plexsphere_leader::{
    Config, Elector, LockKey,
    leadership::{TermEvent, TermEvents, TermId},
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::clock::{monotonic_ns, process_cpu};
use crate::pool_for;

/// How long a process of single electors tries to connect its pools before it reports `ready`
/// anyway (the electors then connect their own).
const WARM_TIMEOUT: Duration = Duration::from_secs(120);
/// How many pools of one process connect at once.
const WARM_BATCH: usize = 4;

/// What one replica process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardChildArgs {
    /// The replica's name: `application_name` of its sessions and its electors' identity.
    pub name: String,
    /// A `tokio_postgres` key/value DSN.
    pub dsn: String,
    /// The check interval.
    pub interval: Duration,
    /// The number of shards of the space (`K`).
    pub shards: u32,
    /// The advisory-lock class id: of the space, or of the single elections' keys
    /// `(class, s)`.
    pub class: i32,
    /// `None`: one sharded elector for the whole space. `Some(range)`: one single elector per
    /// shard key `(class, s)` for `s` in `range`, each with its own pool of two connections
    /// (connected before the electors start, on the `go` command).
    pub singles: Option<Range<u32>>,
}

impl ShardChildArgs {
    /// The command line: `--name N --dsn D --interval-ms I --shards K --class C
    /// [--singles FIRST..END]`.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--name".into(),
            self.name.clone(),
            "--dsn".into(),
            self.dsn.clone(),
            "--interval-ms".into(),
            self.interval.as_millis().to_string(),
            "--shards".into(),
            self.shards.to_string(),
            "--class".into(),
            self.class.to_string(),
        ];
        if let Some(range) = &self.singles {
            args.extend([
                "--singles".into(),
                format!("{}..{}", range.start, range.end),
            ]);
        }
        args
    }

    /// Parses [`Self::to_args`]'s output.
    ///
    /// # Errors
    /// A message naming the missing or malformed argument.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let (mut name, mut dsn, mut interval, mut shards) = (None, None, None, None);
        let mut class = plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
        let mut singles = None;
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--name" => name = Some(value),
                "--dsn" => dsn = Some(value),
                "--interval-ms" => interval = Some(Duration::from_millis(number(&flag, &value)?)),
                "--shards" => shards = Some(number(&flag, &value)?),
                "--class" => class = number(&flag, &value)?,
                "--singles" => {
                    let (start, end) = value
                        .split_once("..")
                        .ok_or_else(|| format!("--singles: FIRST..END, not {value}"))?;
                    singles = Some(number(&flag, start)?..number(&flag, end)?);
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(Self {
            name: name.ok_or("--name is required")?,
            dsn: dsn.ok_or("--dsn is required")?,
            interval: interval.ok_or("--interval-ms is required")?,
            shards: shards.ok_or("--shards is required")?,
            class,
            singles,
        })
    }
}

fn number<T: FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag}: not a number: {value}"))
}

/// Runs a replica process to completion on a current-thread runtime: parses `args`, runs until
/// stopped, prints the `exit` record. Exit code 2 for bad arguments, 1 when no elector could be
/// built.
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let args = match ShardChildArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("shard replica: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => {
            let code = runtime.block_on(run(args));
            // The stdin reader blocks a thread of the blocking pool: do not wait for it.
            runtime.shutdown_background();
            code
        }
        Err(e) => {
            eprintln!("shard replica: runtime: {e}");
            ExitCode::from(1)
        }
    }
}

/// Writes the JSON lines.
#[derive(Debug)]
struct Out {
    replica: String,
    pid: u32,
}

impl Out {
    fn emit(&self, event: &str, fields: Value) {
        self.emit_at(monotonic_ns(), event, fields);
    }

    fn emit_at(&self, stamp_ns: u64, event: &str, fields: Value) {
        let mut record = json!({
            "t": stamp_ns,
            "replica": self.replica,
            "pid": self.pid,
            "event": event,
        });
        if let (Some(record), Value::Object(fields)) = (record.as_object_mut(), fields) {
            record.extend(fields);
        }
        let mut stdout = std::io::stdout().lock();
        // The harness may be gone; then nobody reads, and nothing is lost that matters.
        let _ = writeln!(stdout, "{record}");
        let _ = stdout.flush();
    }
}

async fn run(args: ShardChildArgs) -> ExitCode {
    let out = Arc::new(Out {
        replica: args.name.clone(),
        pid: std::process::id(),
    });
    let subscriber = tracing_subscriber::registry().with(ElectorEvents {
        out: Arc::clone(&out),
    });
    let _guard = tracing::subscriber::set_default(subscriber);
    let shutdown = CancellationToken::new();
    let go = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    tokio::spawn(commands(Arc::clone(&out), shutdown.clone(), go.clone()));
    let errors = match &args.singles {
        None => run_sharded(&args, &out, shutdown).await,
        Some(range) => run_singles(&args, range.clone(), &out, shutdown, go).await,
    };
    match errors {
        Ok(errors) => {
            out.emit(
                "exit",
                json!({ "run": (!errors.is_empty()).then(|| errors.join("; ")) }),
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("shard replica {}: {message}", args.name);
            ExitCode::from(1)
        }
    }
}

fn session_config(args: &ShardChildArgs) -> Result<tokio_postgres::Config, String> {
    let mut config = tokio_postgres::Config::from_str(&args.dsn).map_err(|e| e.to_string())?;
    config.application_name(&args.name);
    Ok(config)
}

// ---------------------------------------------------------------------------------------------
// One sharded elector

/// Runs the sharded elector until `shutdown`; the error `run` returned, if any.
async fn run_sharded(
    args: &ShardChildArgs,
    out: &Arc<Out>,
    shutdown: CancellationToken,
) -> Result<Vec<String>, String> {
    let pool = pool_for(session_config(args)?, 2).map_err(|e| e.to_string())?;
    let elector = ShardedElector::new(
        ShardConfig::new(pool, args.shards)
            .class(args.class)
            .check_interval(args.interval)
            .identity(&args.name),
    )
    .map_err(|e| e.to_string())?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    tokio::spawn(follow_ownership(
        elector.clone(),
        Arc::clone(out),
        Arc::clone(&seen),
    ));
    emit_ready(out, args, "sharded");
    let result = elector.run(shutdown).await;
    // The last terms' ends before the exit record, whether or not the follower woke yet.
    emit_ownership(out, &seen, &elector);
    Ok(result.err().map(|e| e.to_string()).into_iter().collect())
}

fn emit_ready(out: &Out, args: &ShardChildArgs, mode: &str) {
    out.emit(
        "ready",
        json!({
            "interval_ms": args.interval.as_millis() as u64,
            "shards": args.shards,
            "mode": mode,
        }),
    );
}

/// What the follower already printed: the open terms by shard, and the member.
#[derive(Debug, Default)]
struct Seen {
    terms: BTreeMap<u32, TermId>,
    member: Option<i32>,
}

/// Prints `member`, `begin` and `end` for every change of the published ownership.
async fn follow_ownership(elector: ShardedElector, out: Arc<Out>, seen: Arc<Mutex<Seen>>) {
    let mut published = elector.subscribe();
    loop {
        published.borrow_and_update();
        emit_ownership(&out, &seen, &elector);
        if published.changed().await.is_err() {
            return;
        }
    }
}

/// Emits what the elector's ownership shows that was not emitted yet: ends first (stamped and
/// explained by the transitions), then the member, then begins.
fn emit_ownership(out: &Out, seen: &Mutex<Seen>, elector: &ShardedElector) {
    let ownership = elector.ownership();
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let ended: Vec<(u32, TermId)> = seen
        .terms
        .iter()
        .filter(|(shard, term)| ownership.shards.get(shard).map(|o| o.term) != Some(**term))
        .map(|(s, t)| (*s, *t))
        .collect();
    if !ended.is_empty() {
        let transitions = elector.transitions();
        for (shard, term) in ended {
            seen.terms.remove(&shard);
            let transition = transitions
                .iter()
                .rev()
                .find(|t| t.shard == shard && t.term == term && t.ended.is_some());
            let (stamp, cause) = match transition.and_then(|t| Some((t.at, t.ended?))) {
                Some((at, cause)) => (stamp_of_wall(at), format!("{cause:?}")),
                None => (monotonic_ns(), "EndedBeforeObserved".to_owned()),
            };
            out.emit_at(
                stamp,
                "end",
                json!({ "shard": shard, "term": term.get(), "cause": cause }),
            );
        }
    }
    if ownership.member != seen.member {
        seen.member = ownership.member;
        out.emit("member", json!({ "member": ownership.member }));
    }
    for (shard, owned) in &ownership.shards {
        if seen.terms.get(shard) != Some(&owned.term) {
            seen.terms.insert(*shard, owned.term);
            out.emit_at(
                stamp_of_wall(owned.since),
                "begin",
                json!({ "shard": shard, "term": owned.term.get() }),
            );
        }
    }
}

/// The `CLOCK_MONOTONIC` stamp of a wall-clock instant, by its distance from now (a wall-clock
/// step in between would shift it; none is expected within milliseconds).
fn stamp_of_wall(at: SystemTime) -> u64 {
    let now = monotonic_ns();
    match SystemTime::now().duration_since(at) {
        Ok(ago) => now.saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX)),
        Err(_) => now,
    }
}

/// The `CLOCK_MONOTONIC` stamp of a `std::time::Instant` (the same clock on Linux).
fn stamp_of(instant: std::time::Instant) -> u64 {
    let ago = u64::try_from(instant.elapsed().as_nanos()).unwrap_or(u64::MAX);
    monotonic_ns().saturating_sub(ago)
}

// ---------------------------------------------------------------------------------------------
// Single electors, one per shard key

/// Connects one pool per key `(class, s)`, `s` in `range`, prints `ready`, and once `go` (the
/// `go` command) runs one single elector per key until `shutdown`, the start of key `s` delayed
/// by `s/K` of an interval; the errors their runs returned.
async fn run_singles(
    args: &ShardChildArgs,
    range: Range<u32>,
    out: &Arc<Out>,
    shutdown: CancellationToken,
    go: CancellationToken,
) -> Result<Vec<String>, String> {
    let config = session_config(args)?;
    let (pools, warmed) = warm_pools(&config, range.clone()).await?;
    out.emit(
        "warmed",
        json!({ "pools": pools.len(), "connected": warmed }),
    );
    emit_ready(out, args, "single");
    tokio::select! {
        () = go.cancelled() => {}
        () = shutdown.cancelled() => return Ok(Vec::new()),
    }
    let go_at = tokio::time::Instant::now();
    let mut runs = Vec::new();
    let mut followers = Vec::new();
    for (shard, pool) in range.zip(pools) {
        let obj = i32::try_from(shard).map_err(|_| format!("shard {shard} above i32::MAX"))?;
        let elector = Elector::new(
            Config::new(pool)
                .key(LockKey::new(args.class, obj))
                .check_interval(args.interval)
                .identity(&args.name),
        )
        .map_err(|e| e.to_string())?;
        let terms = Arc::new(Mutex::new(TermEvents::new()));
        followers.push((shard, elector.clone(), Arc::clone(&terms)));
        tokio::spawn(follow_terms(
            shard,
            elector.clone(),
            Arc::clone(out),
            Arc::clone(&terms),
        ));
        // Spread over one interval by key, as electors started at different times would be,
        // so that the first checks of all processes do not come at one instant.
        let at = go_at
            + args
                .interval
                .mul_f64(f64::from(shard) / f64::from(args.shards.max(1)));
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
        emit_terms(out, shard, &terms, &elector.leadership());
    }
    Ok(errors)
}

/// One pool of two per shard of `range`, each connected before its elector starts (so that
/// many electors starting at once do not measure a cold start), `WARM_BATCH` at a time, and how
/// many connected. A pool that cannot connect within `WARM_TIMEOUT` is left to its elector.
async fn warm_pools(
    config: &tokio_postgres::Config,
    range: Range<u32>,
) -> Result<(Vec<deadpool_postgres::Pool>, usize), String> {
    let pools = range
        .map(|_| pool_for(config.clone(), 2).map_err(|e| e.to_string()))
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
                    if let Ok(Ok(_connected)) = tokio::time::timeout_at(deadline, pool.get()).await
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

/// Prints `begin` and `end` of shard `shard` for every term its elector publishes.
async fn follow_terms(shard: u32, elector: Elector, out: Arc<Out>, terms: Arc<Mutex<TermEvents>>) {
    let mut published = elector.subscribe();
    loop {
        let leadership = *published.borrow_and_update();
        emit_terms(&out, shard, &terms, &leadership);
        if published.changed().await.is_err() {
            return;
        }
    }
}

fn emit_terms(
    out: &Out,
    shard: u32,
    terms: &Mutex<TermEvents>,
    leadership: &plexsphere_leader::Leadership,
) {
    let events = terms
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .read(leadership);
    for event in events {
        match event {
            TermEvent::Began(term) => out.emit_at(
                stamp_of(term.since),
                "begin",
                json!({ "shard": shard, "term": term.id.get() }),
            ),
            TermEvent::Ended(end) => out.emit_at(
                stamp_of(end.at),
                "end",
                json!({ "shard": shard, "term": end.id.get(), "cause": format!("{:?}", end.cause) }),
            ),
            TermEvent::EndMissed(id) => out.emit(
                "end",
                json!({ "shard": shard, "term": id.get(), "cause": "EndedBeforeObserved" }),
            ),
            other => eprintln!("shard replica: a term event this child does not know: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Signals, commands, logs

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    shutdown.cancel();
}

/// Reads commands from stdin until it ends (then stops).
async fn commands(out: Arc<Out>, shutdown: CancellationToken, go: CancellationToken) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match line.trim() {
            "stop" => shutdown.cancel(),
            "go" => go.cancel(),
            "cpu" => {
                let (rss_kb, hwm_kb) = memory();
                out.emit(
                    "cpu",
                    json!({
                        "cpu_ns": u64::try_from(process_cpu().as_nanos()).unwrap_or(u64::MAX),
                        "rss_kb": rss_kb,
                        "hwm_kb": hwm_kb,
                    }),
                );
            }
            _ => eprintln!("shard replica: unknown command {line:?}"),
        }
    }
    shutdown.cancel();
}

/// `VmRSS` and `VmHWM` of this process, in kB (0 when unreadable).
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Turns the electors' tracing events into `log` records.
struct ElectorEvents {
    out: Arc<Out>,
}

impl<S: tracing::Subscriber> Layer<S> for ElectorEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "plexsphere_leader" {
            return;
        }
        let mut message = Message::default();
        event.record(&mut message);
        self.out.emit(
            "log",
            json!({
                "level": event.metadata().level().to_string(),
                "message": message.0,
            }),
        );
    }
}

#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        let mut args = ShardChildArgs {
            name: "plx-shard-a".into(),
            dsn: "host=127.0.0.1 port=5432 dbname=x".into(),
            interval: Duration::from_millis(250),
            shards: 1024,
            class: 7,
            singles: None,
        };
        assert_eq!(ShardChildArgs::parse(args.to_args()), Ok(args.clone()));
        args.singles = Some(128..256);
        assert_eq!(ShardChildArgs::parse(args.to_args()), Ok(args));
        assert!(ShardChildArgs::parse(["--name".to_owned()]).is_err());
        assert!(ShardChildArgs::parse(["--bogus".to_owned(), "1".to_owned()]).is_err());
    }

    #[test]
    fn a_wall_clock_instant_converts_to_a_monotonic_stamp_of_the_same_age() {
        let ago = Duration::from_millis(300);
        let stamp = stamp_of_wall(SystemTime::now() - ago);
        let age = monotonic_ns() - stamp;
        assert!(
            (299_000_000..400_000_000).contains(&age),
            "{age} ns instead of about 300 ms"
        );
    }
}
