//! The replica child process: one [`Elector`] in its own OS process, so that `SIGKILL`,
//! `SIGSTOP` and `SIGCONT` are real. The `plx-replica` binary and the benchmark's hidden
//! `replica` subcommand run [`main`].
//!
//! # Output
//!
//! One JSON object per line on stdout, every one with `t` (the [`monotonic_ns`] stamp),
//! `replica` (its name, also its sessions' `application_name` and its elector's identity, so
//! the lock session shows `<name> since <grant time>`), `pid` (the OS pid) and
//! `event`:
//!
//! | `event`       | extra fields | when |
//! |---------------|--------------|------|
//! | `ready`       | `interval_ms` | the elector is built, `run` starts |
//! | `lead`        | `term` | a term began (stamped with the term's start as the elector published it) |
//! | `follow`      | `term`, `cause` (the `TermEndCause` in `Debug` form: `Lost(SessionEnded)`, `Stopped`, …) | the term ended (stamped with its end as published) |
//! | `log`         | `level`, `message`, `term`, `cause` | every event of target `plexsphere_leader` |
//! | `hogged` / `unhogged` | `n` | the `hog` / `unhog` command took or gave back pool connections |
//! | `work_start` / `work_end` / `work_result` | `term`, `ran` | the `work` command's pass |
//! | `exit`        | `run`, `pool_size`, `pool_available`, `pool_waiting`, `pool_ok` | `run` returned; the pool's state, then whether it still serves a connection |
//!
//! # Input
//!
//! Commands, one per line on stdin: `stop` (graceful: cancel `run`), `hog N` (take `N`
//! connections out of the elector's pool and hold them: the pool is exhausted by other work),
//! `unhog`, `work MS` (run one pass of `MS` milliseconds through `run_if_leader` that ignores
//! the term's cancellation). `SIGTERM`, `SIGINT` and the end of stdin also stop gracefully, so a
//! child never outlives its harness.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plexsphere_leader::{
    Elector, Leadership,
    leadership::{TermEvent, TermEvents},
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::clock::monotonic_ns;
use crate::{Backend, BackendPool};

/// How long the exit probe waits for a pooled connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `hog` waits for each connection.
const HOG_TIMEOUT: Duration = Duration::from_secs(5);

/// What one replica process runs: its name, where, how often, with how large a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildArgs {
    /// The replica's name, set as `application_name` on every session of its pool.
    pub name: String,
    /// A `tokio_postgres` key/value DSN (several hosts allowed).
    pub dsn: String,
    /// The elector's check interval.
    pub interval: Duration,
    /// The pool's `max_size`.
    pub pool_size: usize,
    /// Whether the elector waits in the server's lock queue (`AcquireMode::Queue`).
    pub queued: bool,
    /// Where the elector's lock sessions come from.
    pub backend: Backend,
}

impl ChildArgs {
    /// The command line for these arguments:
    /// `--name N --dsn D --interval-ms I --pool-size P --acquire poll|queue
    /// --backend deadpool|sqlx`.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--name".into(),
            self.name.clone(),
            "--dsn".into(),
            self.dsn.clone(),
            "--interval-ms".into(),
            self.interval.as_millis().to_string(),
            "--pool-size".into(),
            self.pool_size.to_string(),
            "--acquire".into(),
            if self.queued { "queue" } else { "poll" }.into(),
            "--backend".into(),
            self.backend.name().into(),
        ]
    }

    /// Parses [`Self::to_args`]'s output.
    ///
    /// # Errors
    /// A message naming the missing or malformed argument.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let (mut name, mut dsn, mut interval, mut pool_size) = (None, None, None, 2usize);
        let mut queued = false;
        let mut backend = Backend::Deadpool;
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--name" => name = Some(value),
                "--dsn" => dsn = Some(value),
                "--interval-ms" => interval = Some(Duration::from_millis(number(&flag, &value)?)),
                "--pool-size" => pool_size = number(&flag, &value)?,
                "--acquire" => {
                    queued = match value.as_str() {
                        "poll" => false,
                        "queue" => true,
                        other => return Err(format!("--acquire: poll or queue, not {other}")),
                    }
                }
                "--backend" => {
                    backend = Backend::from_name(&value)
                        .ok_or_else(|| format!("--backend: deadpool or sqlx, not {value}"))?;
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(Self {
            name: name.ok_or("--name is required")?,
            dsn: dsn.ok_or("--dsn is required")?,
            interval: interval.ok_or("--interval-ms is required")?,
            pool_size,
            queued,
            backend,
        })
    }
}

fn number<T: FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag}: not a number: {value}"))
}

/// Runs a replica process to completion: parses `args`, runs the elector on a current-thread
/// runtime until stopped, prints the `exit` record. Exit code 2 for bad arguments, 1 when the
/// elector could not be built.
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let args = match ChildArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("plx-replica: {message}");
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
            eprintln!("plx-replica: runtime: {e}");
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
}

async fn run(args: ChildArgs) -> ExitCode {
    let out = Arc::new(Out {
        replica: args.name.clone(),
        pid: std::process::id(),
    });
    let (elector, pool) = match build(&args) {
        Ok(built) => built,
        Err(message) => {
            eprintln!("plx-replica {}: {message}", args.name);
            return ExitCode::from(1);
        }
    };
    let subscriber = tracing_subscriber::registry().with(ElectorEvents {
        out: Arc::clone(&out),
    });
    let _guard = tracing::subscriber::set_default(subscriber);

    let shutdown = CancellationToken::new();
    let terms = Arc::new(Mutex::new(TermEvents::new()));
    tokio::spawn(follow_terms(
        elector.clone(),
        Arc::clone(&out),
        Arc::clone(&terms),
    ));
    tokio::spawn(stop_on_signal(shutdown.clone()));
    tokio::spawn(commands(
        elector.clone(),
        pool.clone(),
        Arc::clone(&out),
        shutdown.clone(),
    ));
    out.emit(
        "ready",
        json!({ "interval_ms": args.interval.as_millis() as u64 }),
    );
    let result = elector.run(shutdown).await;
    // The end of the last term before the exit record, whether or not the watcher woke yet.
    emit_terms(&out, &terms, &elector.leadership());
    report_exit(&out, &pool, result.map_err(|e| e.to_string())).await;
    ExitCode::SUCCESS
}

fn build(args: &ChildArgs) -> Result<(Elector, BackendPool), String> {
    let mut config = tokio_postgres::Config::from_str(&args.dsn).map_err(|e| e.to_string())?;
    config.application_name(&args.name);
    let pool = args
        .backend
        .pool(&config, args.pool_size)
        .map_err(|e| e.to_string())?;
    let mode = if args.queued {
        plexsphere_leader::config::AcquireMode::Queue
    } else {
        plexsphere_leader::config::AcquireMode::Poll
    };
    let elector = Elector::new(
        pool.config()
            .check_interval(args.interval)
            .acquire_mode(mode)
            .identity(&args.name),
    )
    .map_err(|e| e.to_string())?;
    Ok((elector, pool))
}

/// The pool's state once `run` returned, then a probe that it still serves a connection.
async fn report_exit(out: &Out, pool: &BackendPool, run: Result<(), String>) {
    let (size, available, waiting) = (pool.size(), pool.idle(), pool.waiting());
    let probe = tokio::time::timeout(PROBE_TIMEOUT, pool.probe())
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    out.emit(
        "exit",
        json!({
            "run": run.err(),
            "pool_size": size,
            "pool_available": available,
            "pool_waiting": waiting,
            "pool_ok": probe.is_ok(),
            "pool_error": probe.err(),
        }),
    );
}

/// Prints `lead` and `follow` for every term the elector publishes, stamped with the instants
/// it published: no log parsing, no polling.
async fn follow_terms(elector: Elector, out: Arc<Out>, terms: Arc<Mutex<TermEvents>>) {
    let mut published = elector.subscribe();
    loop {
        let leadership = *published.borrow_and_update();
        emit_terms(&out, &terms, &leadership);
        if published.changed().await.is_err() {
            return;
        }
    }
}

/// Emits what `leadership` shows that was not emitted yet, oldest first.
fn emit_terms(out: &Out, terms: &Mutex<TermEvents>, leadership: &Leadership) {
    let events = terms
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .read(leadership);
    for event in events {
        match event {
            TermEvent::Began(term) => {
                out.emit_at(
                    stamp_of(term.since),
                    "lead",
                    json!({ "term": term.id.get() }),
                );
            }
            TermEvent::Ended(end) => out.emit_at(
                stamp_of(end.at),
                "follow",
                json!({ "term": end.id.get(), "cause": format!("{:?}", end.cause) }),
            ),
            TermEvent::EndMissed(id) => out.emit(
                "follow",
                json!({ "term": id.get(), "cause": "EndedBeforeObserved" }),
            ),
            other => eprintln!("plx-replica: a term event this child does not know: {other:?}"),
        }
    }
}

/// The [`monotonic_ns`] stamp of `instant` (the same clock on Linux).
fn stamp_of(instant: std::time::Instant) -> u64 {
    let ago = u64::try_from(instant.elapsed().as_nanos()).unwrap_or(u64::MAX);
    monotonic_ns().saturating_sub(ago)
}

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

/// Reads commands from stdin until it ends (then stops the election).
async fn commands(elector: Elector, pool: BackendPool, out: Arc<Out>, shutdown: CancellationToken) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut hogged: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|n| n.parse::<u64>().ok()),
        ) {
            (Some("stop"), _) => shutdown.cancel(),
            (Some("hog"), Some(n)) => {
                hog(&pool, n, &mut hogged).await;
                out.emit("hogged", json!({ "n": hogged.len() }));
            }
            (Some("unhog"), _) => {
                let n = hogged.len();
                hogged.clear();
                out.emit("unhogged", json!({ "n": n }));
            }
            (Some("work"), Some(ms)) => {
                tokio::spawn(work(elector.clone(), Arc::clone(&out), ms));
            }
            _ => eprintln!("plx-replica: unknown command {line:?}"),
        }
    }
    shutdown.cancel();
}

async fn hog(pool: &BackendPool, n: u64, hogged: &mut Vec<Box<dyn std::any::Any + Send>>) {
    for _ in 0..n {
        match tokio::time::timeout(HOG_TIMEOUT, pool.hold()).await {
            Ok(Ok(object)) => hogged.push(object),
            Ok(Err(e)) => eprintln!("plx-replica: hog: {e}"),
            Err(_) => eprintln!("plx-replica: hog: no connection within {HOG_TIMEOUT:?}"),
        }
    }
}

/// One pass through `run_if_leader` that sleeps `ms` and ignores the term's cancellation.
async fn work(elector: Elector, out: Arc<Out>, ms: u64) {
    let parent = CancellationToken::new();
    let ran = elector
        .run_if_leader(&parent, |_ignored| {
            let out = Arc::clone(&out);
            let term = elector.leadership().term().map(|t| t.id.get());
            async move {
                out.emit("work_start", json!({ "term": term }));
                tokio::time::sleep(Duration::from_millis(ms)).await;
                out.emit("work_end", json!({ "term": term }));
                Ok::<_, Infallible>(())
            }
        })
        .await;
    let ran = match ran {
        Ok(ran) => ran,
        Err(never) => match never {},
    };
    out.emit("work_result", json!({ "ran": ran }));
}

/// Turns the elector's tracing events into `log` records.
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

    #[test]
    fn arguments_round_trip() {
        let args = ChildArgs {
            name: "plx-r-a".into(),
            dsn: "host=127.0.0.1 port=5432 dbname=x".into(),
            interval: Duration::from_millis(250),
            pool_size: 3,
            queued: true,
            backend: Backend::Sqlx,
        };
        assert_eq!(ChildArgs::parse(args.to_args()), Ok(args));
        assert!(ChildArgs::parse(["--name".to_owned()]).is_err());
        assert!(ChildArgs::parse(["--bogus".to_owned(), "1".to_owned()]).is_err());
    }
}
