//! The replica child process: electors in their own OS process, so that `SIGKILL`, `SIGSTOP`,
//! `SIGCONT` and a cut-off session are real. The `plx-replica` binary and the benchmark's
//! hidden `replica` subcommand run [`main`]; [`crate::replica_process`] starts such processes
//! and reads what they print.
//!
//! # Modes
//!
//! [`ChildArgs`] chooses what the process runs:
//!
//! - the **election** (no `--shards`): one [`Elector`] on the leader lock;
//! - **sharded** (`--shards K`): one [`ShardedElector`](plexsphere_leader::sharded::ShardedElector)
//!   for the space of `K` shards of class `--class`;
//!
//! both holding advisory locks, or lease rows with `--mechanism lease` (whose tables the
//! harness creates first);
//! - **singles** (`--shards K --singles FIRST..END`, for the benchmark's comparison): one
//!   single [`Elector`] per shard key `(class, s)` for `s` in the range, each with its own
//!   pool, connected before the electors start on the `go` command.
//!
//! # Output
//!
//! One JSON object per line on stdout, every one with `t` (the [`monotonic_ns`] stamp),
//! `replica` (its name, also its sessions' `application_name` and its electors' identity, so
//! a lock session shows `<name> since <grant time>`), `pid` (the OS pid) and `event`:
//!
//! | `event` | mode | extra fields | when |
//! |---|---|---|---|
//! | `ready` | election | `interval_ms` | the elector is built, `run` starts |
//! | `ready` | sharded, singles | `interval_ms`, `shards`, `mode` (`sharded` or `single`) | sharded: the elector is built and `run` starts; singles: every pool tried to connect, the electors wait for `go` |
//! | `warmed` | singles | `pools`, `connected` | the pools tried to connect (before `ready`) |
//! | `started` | singles | `electors` | `go` came; key `s`'s `run` starts `s/K` of an interval later |
//! | `lead` | election | `term` | a term began (stamped with the term's start as the elector published it) |
//! | `follow` | election | `term`, `cause` (the `TermEndCause` in `Debug` form: `Lost(SessionEnded)`, `Stopped`, …) | the term ended (stamped with its end as published) |
//! | `member` | sharded | `member` (the lock session's backend pid, with the lease the member row's id; or `null`) | the sharded elector joined the space or lost its session |
//! | `begin` | sharded, singles | `shard`, `term` | a shard's term began (stamped with its start as published) |
//! | `end` | sharded, singles | `shard`, `term`, `cause` (`HandedOver`, `Stopped`, `Lost(SessionEnded)`, …) | a shard's term ended (stamped with its end as published) |
//! | `log` | all | `level`, `message`, `term`, `cause` | every event of target `plexsphere_leader` |
//! | `hogged` / `unhogged` | election | `n` | the `hog` / `unhog` command took or gave back pool connections |
//! | `work_start` / `work_end` / `work_result` | election | `term`, `ran` | the `work` command's pass |
//! | `believes` | election | `leader` | the `believe` sampler's `is_leader()` changed (and its first answer) |
//! | `resumed` | election | `leader`, `gap_ms` | the sampler's first answer after a pause of the process (no sample for over 50 ms) |
//! | `stalled` / `unstalled` | election | `ms` | the `stall` command blocked the runtime, and let it go |
//! | `cpu` | all | `cpu_ns` (`CLOCK_PROCESS_CPUTIME_ID`, every thread, exited ones too), `rss_kb`, `hwm_kb` | the `cpu` command |
//! | `exit` | election | `run`, `pool_size`, `pool_available`, `pool_waiting`, `pool_ok`, `pool_error` | `run` returned; the pool's state, then whether it still serves a connection |
//! | `exit` | sharded, singles | `run` (the errors `run` returned, joined, or `null`) | every `run` returned |
//!
//! Terms come from what the electors publish ([`Elector::subscribe`] through [`TermEvents`];
//! for a sharded elector its ownership and transitions), never from log parsing. Their
//! `std::time::Instant`s and wall-clock instants are turned into `CLOCK_MONOTONIC` stamps by
//! their distance from now, so the stamps of every process share one clock.
//!
//! # Input
//!
//! Commands, one per line on stdin: `stop` (graceful: cancel `run`) and `cpu` (print a `cpu`
//! record) in every mode; in the election, `hog N` (take `N` connections out of the elector's
//! pool and hold them: the pool is exhausted by other work), `unhog` and `work MS` (run one
//! pass of `MS` milliseconds through `run_if_leader` that ignores the term's cancellation),
//! `believe` (sample `is_leader()` every millisecond from a thread of its own) and `stall MS`
//! (block the runtime, on which the election runs, for `MS` milliseconds);
//! with singles, `go` (start the electors, so that the harness starts every process's electors
//! at once, after every pool connected). `SIGTERM`, `SIGINT` and the end of stdin also stop
//! gracefully, so a child never outlives its harness.

mod election;
mod sharded;
mod singles;

use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::Range;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Parser;
use plexsphere_leader::leadership::{TermEvent, TermEvents};
use plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
use plexsphere_leader::{Elector, Leadership};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::clock::{monotonic_ns, process_cpu};
use crate::{Backend, BackendPool};

/// What one replica process runs: its name, where, how often, with how large pools, and which
/// [mode](self#modes).
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
pub struct ChildArgs {
    /// The replica's name, set as `application_name` on every session of its pools and as its
    /// electors' identity.
    #[arg(long)]
    pub name: String,
    /// A `tokio_postgres` key/value DSN (several hosts allowed).
    #[arg(long)]
    pub dsn: String,
    /// The electors' check interval.
    #[arg(long = "interval-ms", value_name = "MS", value_parser = millis)]
    pub interval: Duration,
    /// The `max_size` of each pool (one per process, or one per key with singles).
    #[arg(long = "pool-size", default_value_t = DEFAULT_POOL_SIZE)]
    pub pool_size: usize,
    /// Whether the elector waits in the server's lock queue (`queue`: `AcquireMode::Queue`) or
    /// tries once per check (`poll`); the election only.
    #[arg(long = "acquire", value_name = "poll|queue", default_value = "poll")]
    #[arg(value_parser = acquire, action = clap::ArgAction::Set, conflicts_with = "shards")]
    pub queued: bool,
    /// What the election or the sharded elector holds: session advisory locks (`advisory`) or
    /// lease rows (`lease`: `Config::lease` or `ShardConfig::lease` with the default TTL of
    /// three intervals); not the singles.
    #[arg(
        long,
        value_enum,
        value_name = "advisory|lease",
        default_value = "advisory"
    )]
    #[arg(conflicts_with = "singles")]
    pub mechanism: Mechanism,
    /// Where the electors' lock sessions come from.
    #[arg(long, value_name = "deadpool|sqlx", default_value = "deadpool", value_parser = backend)]
    pub backend: Backend,
    /// The number of shards K of the space: run a sharded elector (or, with `--singles`, the
    /// singles) instead of the election.
    #[arg(long, value_name = "K")]
    pub shards: Option<u32>,
    /// The advisory-lock class id: of the space, or of the singles' keys `(class, s)`.
    #[arg(long, default_value_t = DEFAULT_SHARD_CLASS, requires = "shards")]
    pub class: i32,
    /// Instead of a sharded elector, one single elector per shard key `(class, s)` for `s` in
    /// FIRST..END.
    #[arg(long, value_name = "FIRST..END", value_parser = key_range, requires = "shards")]
    pub singles: Option<Range<u32>>,
    /// The election's rank: its release number (`Config::version`, e.g. `1.4.2`); unset, the
    /// replica is unranked unless `--priority` is given. The election only.
    #[arg(long, value_name = "V", conflicts_with = "shards")]
    pub version: Option<String>,
    /// The election's rank: the operator's priority (`Config::priority`). The election only.
    #[arg(long, value_name = "N", conflicts_with = "shards")]
    pub priority: Option<u32>,
    /// The version floor (`Config::version_floor`): a replica older than the newest version
    /// that has led does not lead. Needs `--version`; the election only.
    #[arg(long, requires = "version", conflicts_with = "shards")]
    pub version_floor: bool,
    /// A deliberate rollback (`Config::below_version_floor`): leads below the floor, and
    /// lowers it. Needs `--version-floor`.
    #[arg(long, requires = "version_floor")]
    pub below_version_floor: bool,
}

/// The `max_size` of each pool unless `--pool-size` says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 2;

/// How a replica holds what it leads ([`ChildArgs::mechanism`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mechanism {
    /// Session advisory locks: the leader lock, or a member lock and one lock per shard.
    #[default]
    Advisory,
    /// Lease rows renewed every interval, TTL three intervals (`Duration::ZERO`).
    Lease,
}

impl Mechanism {
    /// The flag's value: `advisory` or `lease`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Advisory => "advisory",
            Self::Lease => "lease",
        }
    }
}

/// What a process runs, by its [`ChildArgs`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// One elector on the leader lock.
    Election,
    /// One sharded elector for a space of `shards`.
    Sharded { shards: u32 },
    /// One elector per key `(class, s)`, `s` in `keys`, of a space of `shards`.
    Singles { shards: u32, keys: Range<u32> },
}

impl ChildArgs {
    /// The election on `dsn`, named `name`: a deadpool pool of two, polling.
    pub fn new(name: impl Into<String>, dsn: impl Into<String>, interval: Duration) -> Self {
        Self {
            name: name.into(),
            dsn: dsn.into(),
            interval,
            pool_size: DEFAULT_POOL_SIZE,
            queued: false,
            mechanism: Mechanism::Advisory,
            backend: Backend::Deadpool,
            shards: None,
            class: DEFAULT_SHARD_CLASS,
            singles: None,
            version: None,
            priority: None,
            version_floor: false,
            below_version_floor: false,
        }
    }

    /// [`Self::new`]'s election ranked by `version` (`Config::version`).
    #[must_use]
    pub fn ranked(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// A sharded elector for `shards` shards of class [`DEFAULT_SHARD_CLASS`], otherwise as
    /// [`Self::new`].
    pub fn sharded(
        name: impl Into<String>,
        dsn: impl Into<String>,
        interval: Duration,
        shards: u32,
    ) -> Self {
        Self {
            shards: Some(shards),
            ..Self::new(name, dsn, interval)
        }
    }

    /// The command line for these arguments: `--name N --dsn D --interval-ms I --pool-size P
    /// [--acquire poll|queue] [--mechanism lease] --backend deadpool|sqlx [--shards K --class C
    /// [--singles FIRST..END]] [--version V] [--priority N] [--version-floor
    /// [--below-version-floor]]` (`--acquire` only where it applies
    /// or was asked for, `--mechanism` only when not the default, the rank only when set).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--name".into(),
            self.name.clone(),
            "--dsn".into(),
            self.dsn.clone(),
            "--interval-ms".into(),
            self.interval.as_millis().to_string(),
            "--pool-size".into(),
            self.pool_size.to_string(),
        ];
        if self.shards.is_none() || self.queued {
            args.extend([
                "--acquire".into(),
                if self.queued { "queue" } else { "poll" }.into(),
            ]);
        }
        if self.mechanism != Mechanism::Advisory {
            args.extend(["--mechanism".into(), self.mechanism.name().into()]);
        }
        args.extend(["--backend".into(), self.backend.name().into()]);
        if let Some(shards) = self.shards {
            args.extend([
                "--shards".into(),
                shards.to_string(),
                "--class".into(),
                self.class.to_string(),
            ]);
        }
        if let Some(range) = &self.singles {
            args.extend([
                "--singles".into(),
                format!("{}..{}", range.start, range.end),
            ]);
        }
        if let Some(version) = &self.version {
            args.extend(["--version".into(), version.clone()]);
        }
        if self.version_floor {
            args.push("--version-floor".into());
        }
        if self.below_version_floor {
            args.push("--below-version-floor".into());
        }
        if let Some(priority) = self.priority {
            args.extend(["--priority".into(), priority.to_string()]);
        }
        args
    }

    /// Parses [`Self::to_args`]'s output (`--help` prints the flags).
    ///
    /// # Errors
    /// clap's error naming the missing, malformed or conflicting argument (or the help text).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, clap::Error> {
        Self::try_parse_from(std::iter::once("plx-replica".to_owned()).chain(args))
    }

    fn mode(&self) -> Mode {
        match (self.shards, &self.singles) {
            (None, _) => Mode::Election,
            (Some(shards), None) => Mode::Sharded { shards },
            (Some(shards), Some(keys)) => Mode::Singles {
                shards,
                keys: keys.clone(),
            },
        }
    }

    /// The sessions' configuration: the DSN with this replica's `application_name`.
    fn session_config(&self) -> Result<tokio_postgres::Config, String> {
        let mut config = tokio_postgres::Config::from_str(&self.dsn).map_err(|e| e.to_string())?;
        config.application_name(&self.name);
        Ok(config)
    }

    /// A pool of this replica's backend and size.
    fn pool(&self, config: &tokio_postgres::Config) -> Result<BackendPool, String> {
        self.backend
            .pool(config, self.pool_size)
            .map_err(|e| e.to_string())
    }
}

fn millis(value: &str) -> Result<Duration, String> {
    Ok(Duration::from_millis(number(value)?))
}

fn acquire(value: &str) -> Result<bool, String> {
    match value {
        "poll" => Ok(false),
        "queue" => Ok(true),
        other => Err(format!("poll or queue, not {other}")),
    }
}

fn backend(value: &str) -> Result<Backend, String> {
    Backend::from_name(value).ok_or_else(|| format!("deadpool or sqlx, not {value}"))
}

fn key_range(value: &str) -> Result<Range<u32>, String> {
    let (start, end) = value
        .split_once("..")
        .ok_or_else(|| format!("FIRST..END, not {value}"))?;
    Ok(number(start)?..number(end)?)
}

fn number<T: FromStr>(value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("not a number: {value}"))
}

/// Parses `args` (the command line after the program's name) and runs the replica process
/// ([`run_process`]). Exit code 2 for bad arguments (0 for `--help`).
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    match ChildArgs::parse(args) {
        Ok(args) => run_process(args),
        Err(e) => {
            // Nothing more to say when stderr is gone.
            let _ = e.print();
            ExitCode::from(if e.use_stderr() { 2 } else { 0 })
        }
    }
}

/// Runs a replica process to completion on a current-thread runtime: runs until stopped,
/// prints the `exit` record. Exit code 1 when no elector could be built.
pub fn run_process(args: ChildArgs) -> ExitCode {
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
            eprintln!("plx-replica: runtime: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: ChildArgs) -> ExitCode {
    let out = Arc::new(Out {
        replica: args.name.clone(),
        pid: std::process::id(),
    });
    let subscriber = tracing_subscriber::registry().with(ElectorEvents {
        out: Arc::clone(&out),
    });
    let _guard = tracing::subscriber::set_default(subscriber);
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let ran = match args.mode() {
        Mode::Election => election::run(&args, &out, shutdown).await,
        Mode::Sharded { shards } => sharded::run(&args, shards, &out, shutdown).await,
        Mode::Singles { shards, keys } => singles::run(&args, shards, keys, &out, shutdown).await,
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("plx-replica {}: {message}", args.name);
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

    /// [`emit`](Self::emit) stamped `stamp_ns` instead of now.
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

    /// The `ready` record of the sharded modes (`mode`: `sharded` or `single`).
    fn ready_of_space(&self, args: &ChildArgs, shards: u32, mode: &str) {
        self.emit(
            "ready",
            json!({
                "interval_ms": args.interval.as_millis() as u64,
                "shards": shards,
                "mode": mode,
            }),
        );
    }

    /// The `exit` record of the sharded modes: the errors every `run` returned.
    fn exit_of_runs(&self, errors: &[String]) {
        self.emit(
            "exit",
            json!({ "run": (!errors.is_empty()).then(|| errors.join("; ")) }),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Terms of single electors

/// Which records a single elector's terms are printed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermRecords {
    /// `lead` and `follow` (the election).
    Election,
    /// `begin` and `end` with `shard` (one elector per shard key).
    Shard(u32),
}

impl TermRecords {
    fn emit(self, out: &Out, stamp_ns: u64, began: bool, mut fields: Value) {
        let event = match (self, began) {
            (Self::Election, true) => "lead",
            (Self::Election, false) => "follow",
            (Self::Shard(_), true) => "begin",
            (Self::Shard(_), false) => "end",
        };
        if let (Self::Shard(shard), Some(fields)) = (self, fields.as_object_mut()) {
            fields.insert("shard".into(), shard.into());
        }
        out.emit_at(stamp_ns, event, fields);
    }
}

/// Prints the records of every term `elector` publishes, stamped with the instants it
/// published: no log parsing, no polling.
async fn follow_terms(
    elector: Elector,
    records: TermRecords,
    out: Arc<Out>,
    terms: Arc<Mutex<TermEvents>>,
) {
    let mut published = elector.subscribe();
    loop {
        let leadership = *published.borrow_and_update();
        emit_terms(&out, records, &terms, &leadership);
        if published.changed().await.is_err() {
            return;
        }
    }
}

/// Emits what `leadership` shows that was not emitted yet, oldest first.
fn emit_terms(out: &Out, records: TermRecords, terms: &Mutex<TermEvents>, leadership: &Leadership) {
    let events = terms
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .read(leadership);
    for event in events {
        let (stamp, began, fields) = match event {
            TermEvent::Began(term) => {
                (stamp_of(term.since), true, json!({ "term": term.id.get() }))
            }
            TermEvent::Ended(end) => (
                stamp_of(end.at),
                false,
                json!({ "term": end.id.get(), "cause": format!("{:?}", end.cause) }),
            ),
            TermEvent::EndMissed(id) => (
                monotonic_ns(),
                false,
                json!({ "term": id.get(), "cause": "EndedBeforeObserved" }),
            ),
            other => {
                eprintln!("plx-replica: a term event this child does not know: {other:?}");
                continue;
            }
        };
        records.emit(out, stamp, began, fields);
    }
}

/// The [`monotonic_ns`] stamp of a `std::time::Instant` (the same clock on Linux).
fn stamp_of(instant: std::time::Instant) -> u64 {
    let ago = u64::try_from(instant.elapsed().as_nanos()).unwrap_or(u64::MAX);
    monotonic_ns().saturating_sub(ago)
}

// ---------------------------------------------------------------------------------------------
// Signals and commands

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

/// What the stdin commands act on besides `stop` and `cpu`.
enum Controls {
    /// `hog N`, `unhog`, `work MS`: the election's elector and pool.
    Election { elector: Elector, pool: BackendPool },
    /// `go`: cancelled to start the singles.
    Singles { go: CancellationToken },
    /// Nothing more (the sharded elector).
    Sharded,
}

/// Reads commands from stdin until it ends (then stops).
async fn commands(out: Arc<Out>, shutdown: CancellationToken, controls: Controls) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut hogged = election::Hogged::default();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        let (command, number) = (
            words.next(),
            words.next().and_then(|n| n.parse::<u64>().ok()),
        );
        match (command, number, &controls) {
            (Some("stop"), _, _) => shutdown.cancel(),
            (Some("cpu"), _, _) => emit_cpu(&out),
            (Some("go"), _, Controls::Singles { go }) => go.cancel(),
            (Some("hog"), Some(n), Controls::Election { pool, .. }) => {
                hogged.take(pool, n).await;
                out.emit("hogged", json!({ "n": hogged.len() }));
            }
            (Some("unhog"), _, Controls::Election { .. }) => {
                let n = hogged.release();
                out.emit("unhogged", json!({ "n": n }));
            }
            (Some("work"), Some(ms), Controls::Election { elector, .. }) => {
                tokio::spawn(election::work(elector.clone(), Arc::clone(&out), ms));
            }
            (Some("believe"), _, Controls::Election { elector, .. }) => {
                election::believe(elector.clone(), Arc::clone(&out));
            }
            (Some("stall"), Some(ms), Controls::Election { .. }) => election::stall(&out, ms),
            _ => eprintln!("plx-replica: unknown command {line:?}"),
        }
    }
    shutdown.cancel();
}

fn emit_cpu(out: &Out) {
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

// ---------------------------------------------------------------------------------------------
// Logs

/// Turns the electors' tracing events into `log` records.
struct ElectorEvents {
    out: Arc<Out>,
}

impl<S: tracing::Subscriber> Layer<S> for ElectorEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "plexsphere_leader" {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.out.emit(
            "log",
            json!({
                "level": event.metadata().level().to_string(),
                "message": fields.message,
                "term": fields.term,
                "cause": fields.cause,
            }),
        );
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    term: Option<u64>,
    cause: Option<String>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "term" {
            self.term = Some(value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_text(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        self.record_text(field, text);
    }
}

impl Fields {
    fn record_text(&mut self, field: &Field, text: String) {
        match field.name() {
            "message" => self.message = text,
            "cause" => self.cause = Some(text),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ChildArgs, clap::Error> {
        ChildArgs::parse(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments_round_trip_in_every_mode() {
        let mut args = ChildArgs {
            pool_size: 3,
            queued: true,
            backend: Backend::Sqlx,
            ..ChildArgs::new("plx-r-a", "host=127.0.0.1 port=5432 dbname=x", MS_250)
        };
        assert_eq!(ChildArgs::parse(args.to_args()).ok(), Some(args.clone()));
        assert_eq!(args.mode(), Mode::Election);
        args.mechanism = Mechanism::Lease;
        assert_eq!(ChildArgs::parse(args.to_args()).ok(), Some(args.clone()));
        args = args.ranked("1.4.2");
        args.priority = Some(3);
        assert_eq!(ChildArgs::parse(args.to_args()).ok(), Some(args.clone()));
        args.version_floor = true;
        args.below_version_floor = true;
        assert_eq!(ChildArgs::parse(args.to_args()).ok(), Some(args.clone()));
        assert_eq!(args.mode(), Mode::Election);
        args = ChildArgs {
            class: 7,
            ..ChildArgs::sharded("plx-shard-a", "host=127.0.0.1 dbname=x", MS_250, 1024)
        };
        assert_eq!(ChildArgs::parse(args.to_args()).ok(), Some(args.clone()));
        assert_eq!(args.mode(), Mode::Sharded { shards: 1024 });
        let leased = ChildArgs {
            mechanism: Mechanism::Lease,
            ..args.clone()
        };
        assert!(leased.to_args().ends_with(&[
            "--mechanism".into(),
            "lease".into(),
            "--backend".into(),
            "deadpool".into(),
            "--shards".into(),
            "1024".into(),
            "--class".into(),
            "7".into(),
        ]));
        assert_eq!(
            ChildArgs::parse(leased.to_args()).ok(),
            Some(leased.clone())
        );
        assert_eq!(leased.mode(), Mode::Sharded { shards: 1024 });
        args.singles = Some(128..256);
        assert_eq!(ChildArgs::parse(args.to_args()).ok(), Some(args.clone()));
        assert_eq!(
            args.mode(),
            Mode::Singles {
                shards: 1024,
                keys: 128..256
            }
        );
    }

    #[test]
    fn arguments_keep_their_defaults_and_refuse_what_does_not_apply() {
        let base = ["--name", "r", "--dsn", "host=h", "--interval-ms", "200"];
        let args = parse(&base).expect("the required flags suffice");
        assert_eq!(
            args,
            ChildArgs::new("r", "host=h", Duration::from_millis(200))
        );
        let with = |extra: &[&str]| parse(&[&base[..], extra].concat());
        assert!(with(&["--shards", "8", "--singles", "0..4"]).is_ok());
        assert!(with(&["--class", "7"]).is_err(), "--class needs --shards");
        assert!(
            with(&["--singles", "0..4"]).is_err(),
            "--singles needs --shards"
        );
        assert!(with(&["--shards", "8", "--acquire", "queue"]).is_err());
        assert_eq!(
            with(&["--shards", "8", "--mechanism", "lease"])
                .ok()
                .map(|a| a.mechanism),
            Some(Mechanism::Lease),
            "the sharded elector takes the lease"
        );
        assert!(
            with(&["--shards", "8", "--singles", "0..4", "--mechanism", "lease"]).is_err(),
            "the singles hold advisory locks only"
        );
        assert!(with(&["--mechanism", "rows"]).is_err());
        assert!(
            with(&["--shards", "8", "--version", "1.0.0"]).is_err(),
            "ranks are the election's"
        );
        assert!(
            with(&["--version-floor"]).is_err(),
            "a floor needs a version"
        );
        assert!(
            with(&["--version", "1.0.0", "--below-version-floor"]).is_err(),
            "an override needs the floor"
        );
        assert!(with(&["--acquire", "wait"]).is_err());
        assert!(with(&["--backend", "odbc"]).is_err());
        assert!(with(&["--shards", "8", "--singles", "4"]).is_err());
        assert!(with(&["--bogus", "1"]).is_err());
        assert!(parse(&["--name", "r"]).is_err());
    }

    const MS_250: Duration = Duration::from_millis(250);
}
