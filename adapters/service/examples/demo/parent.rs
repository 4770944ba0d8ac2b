//! The demo's parent process: resolves the database, starts one process per replica, and stops
//! them cleanly (SIGTERM, so each releases the lock) on Ctrl-C, SIGTERM or `--duration`.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStdin, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::cli::{Args, DSN_ENV, REPLICA_ENV, VERSION_ENV};
use crate::database;
use crate::rollout::{self, Rollout, Step};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long a replica may take to stop after SIGTERM before it is killed: its workers' bound
/// (5 s, which covers the 2 s unlock budget) plus slack.
const STOP_BOUND: Duration = Duration::from_secs(10);

struct Running {
    index: u16,
    pid: u32,
    /// Held open: a replica stops when its standard input closes (the parent is gone).
    stdin: Option<ChildStdin>,
    exited: Option<ExitStatus>,
}

pub(crate) async fn run(args: Args) -> Result<(), Error> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    // Refused here once, rather than by every replica at its start.
    crate::cli::sse_nonce_ttl_from_env()?;
    let database = database::resolve(args.dsn.clone()).await?;
    // `--rollout` surges: a new replica runs beside the old ones, in one more slot.
    let slots = u32::from(args.replicas) + u32::from(args.rollout);
    let last_port = u32::from(args.http_port) + slots - 1;
    if last_port > u32::from(u16::MAX) {
        return Err("--http-port plus --replicas exceeds 65535".into());
    }
    say(&(format!(
        "event=start replicas={} check_interval={:?} key={} acquire={} fencing={} database={:?} \
         http=127.0.0.1:{}..{} mechanism={}",
        args.replicas,
        args.check_interval,
        args.key,
        args.acquire,
        args.fencing,
        database.source,
        args.http_port,
        last_port,
        args.mechanism
    ) + &args
        .shards
        .map(|count| format!(" shards={count}"))
        .unwrap_or_default()
        + if args.rollout {
            " rollout=1.0.0->1.1.0"
        } else {
            ""
        }));

    let (exits, mut exited) = mpsc::unbounded_channel();
    // `--rollout`: the replicas' lines come through the parent, which reads who leads.
    let (lines, mut relayed) = mpsc::unbounded_channel();
    let mut rollout = args.rollout.then(|| Rollout::new(args.check_interval));
    let mut replicas = Vec::new();
    for index in 0..args.replicas {
        let version = args.rollout.then_some(rollout::FROM);
        let running = start(&args, index, &database.dsn, version, &exits, &lines)?;
        if let Some(rollout) = &mut rollout {
            rollout.started(index, running.pid, rollout::FROM);
        }
        replicas.push(running);
    }
    say(&hint(&args));

    let deadline = async {
        match args.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut every_replica_failed = false;
    loop {
        tokio::select! {
            _ = interrupt.recv() => { say("event=stopping reason=SIGINT"); break; }
            _ = terminate.recv() => { say("event=stopping reason=SIGTERM"); break; }
            () = &mut deadline => { say("event=stopping reason=duration"); break; }
            () = settled(rollout.as_ref()) => {
                if let Some(rollout) = &mut rollout {
                    let free = free_slot(&replicas);
                    match rollout.step(tokio::time::Instant::now(), free) {
                        Step::StartNew { index } => {
                            let version = Some(rollout::TO);
                            let running =
                                start(&args, index, &database.dsn, version, &exits, &lines)?;
                            rollout.started(index, running.pid, rollout::TO);
                            replicas.push(running);
                        }
                        Step::StopOld { pid } => stop_old(&replicas, pid),
                        Step::Done => say(&rollout.done()),
                        Step::Wait => {}
                    }
                }
            }
            Some(line) = relayed.recv() => {
                if let Some(rollout) = &mut rollout {
                    for text in rollout.line(&line) {
                        say(&text);
                    }
                }
            }
            exit = exited.recv() => match exit {
                Some((_, pid, status)) => {
                    // A replica killed from outside is the user's doing, not a failed stop.
                    record_exit(&mut replicas, pid, status);
                    if let Some(rollout) = &mut rollout {
                        for text in rollout.moves.exited(pid) {
                            say(&text);
                        }
                        rollout.exited(pid, tokio::time::Instant::now());
                    }
                    if replicas.iter().all(|r| r.exited.is_some()) {
                        say("event=stopping reason=\"every replica exited\"");
                        every_replica_failed = replicas
                            .iter()
                            .all(|r| r.exited.is_some_and(|status| !status.success()));
                        break;
                    }
                }
                None => break,
            },
        }
    }

    let clean = stop_all(&mut replicas, &mut exited).await;
    if let Some(cluster) = database.cluster {
        cluster.stop().await;
    }
    say("event=stopped");
    if every_replica_failed {
        Err("every replica exited with an error (its own lines above say why)".into())
    } else if clean {
        Ok(())
    } else {
        Err("a replica did not exit cleanly".into())
    }
}

/// What to try once the replicas run: one line, so that scripts can skip it (`event=hint`).
fn hint(args: &Args) -> String {
    let shards = match args.shards {
        Some(_) => format!(
            "; open http://127.0.0.1:{}/ for who owns which shards",
            args.http_port
        ),
        None => String::new(),
    };
    let held = match args.mechanism {
        crate::cli::Mechanism::Advisory => "lock",
        crate::cli::Mechanism::Lease => "lease",
    };
    format!(
        "event=hint text=\"kill -9 the pid of the replica that acquired the {held} and \
         another takes over within about {}; curl http://127.0.0.1:{}/status shows who leads; \
         Ctrl-C stops every replica{shards}\"",
        args.takeover_bound(),
        args.http_port
    )
}

/// Starts replica `index` (ranked by `version` with `--rollout`), says so, and watches it: its
/// exit goes to `exits`, and with `--rollout` its lines to `lines` (and on to standard output).
fn start(
    args: &Args,
    index: u16,
    dsn: &str,
    version: Option<&str>,
    exits: &mpsc::UnboundedSender<(u16, u32, ExitStatus)>,
    lines: &mpsc::UnboundedSender<String>,
) -> Result<Running, Error> {
    let mut child = spawn(args, index, dsn, version)?;
    let pid = child.id().unwrap_or_default();
    let shown = version.map(|v| format!(" version={v}")).unwrap_or_default();
    say(&format!(
        "replica={index} pid={pid} event=started http=http://127.0.0.1:{}{shown}",
        args.http_port + index
    ));
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(relay(stdout, lines.clone()));
    }
    Ok(watch(child, index, pid, exits.clone()))
}

/// Passes a replica's lines on to standard output, and to `lines`.
async fn relay(stdout: tokio::process::ChildStdout, lines: mpsc::UnboundedSender<String>) {
    use tokio::io::AsyncBufReadExt as _;
    let mut reader = tokio::io::BufReader::new(stdout).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        write_line(&line);
        let _ = lines.send(line);
    }
}

/// Waits until the rollout's current step settled (forever when there is none).
async fn settled(rollout: Option<&Rollout>) {
    match rollout.and_then(Rollout::settled_at) {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The lowest slot (replica index, port offset) no running replica uses: where the rollout
/// starts a new replica.
fn free_slot(replicas: &[Running]) -> u16 {
    (0..=u16::MAX)
        .find(|slot| {
            !replicas
                .iter()
                .any(|r| r.index == *slot && r.exited.is_none())
        })
        .unwrap_or(u16::MAX)
}

/// Stops the old replica of pid `pid` (SIGTERM: it releases what it holds), once its successor
/// runs beside it.
fn stop_old(replicas: &[Running], pid: u32) {
    if let Some(replica) = replicas.iter().find(|r| r.pid == pid) {
        say(&format!(
            "replica={} pid={pid} event=rollout-stop to={}",
            replica.index,
            rollout::TO
        ));
    }
    signal_pid(pid, Signal::SIGTERM);
}

fn spawn(args: &Args, index: u16, dsn: &str, version: Option<&str>) -> Result<Child, Error> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .arg("--replicas")
        .arg(args.replicas.to_string())
        .arg("--check-interval")
        .arg(format!("{}us", args.check_interval.as_micros()))
        .arg("--http-port")
        .arg(args.http_port.to_string())
        .arg("--key")
        .arg(args.key.to_string())
        .arg("--acquire")
        .arg(args.acquire.to_string())
        .args(args.fencing.then_some("--fencing"))
        .arg("--mechanism")
        .arg(args.mechanism.to_string())
        .args(args.shards.map(|count| format!("--shards={count}")))
        .env(REPLICA_ENV, index.to_string())
        .env(DSN_ENV, dsn)
        .env(VERSION_ENV, version.unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(if version.is_some() {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .stderr(Stdio::inherit())
        // Its own process group: the parent decides when a replica stops, so that a Ctrl-C in
        // the terminal stops the replicas before a throwaway server.
        .process_group(0)
        .kill_on_drop(true);
    Ok(command
        .spawn()
        .map_err(|e| format!("start replica {index}: {e}"))?)
}

/// Waits for the child in a task; reports its exit on `exits`.
fn watch(
    mut child: Child,
    index: u16,
    pid: u32,
    exits: mpsc::UnboundedSender<(u16, u32, ExitStatus)>,
) -> Running {
    let stdin = child.stdin.take();
    tokio::spawn(async move {
        if let Ok(status) = child.wait().await {
            let _ = exits.send((index, pid, status));
        }
    });
    Running {
        index,
        pid,
        stdin,
        exited: None,
    }
}

fn record_exit(replicas: &mut [Running], pid: u32, status: ExitStatus) {
    if let Some(replica) = replicas.iter_mut().find(|r| r.pid == pid) {
        replica.exited = Some(status);
        replica.stdin = None;
        say(&format!(
            "replica={} pid={pid} event=exited status={:?}",
            replica.index,
            status.to_string()
        ));
    }
}

/// SIGTERM to every running replica, then waits for them (SIGKILL at the bound). Whether all
/// exited cleanly.
async fn stop_all(
    replicas: &mut [Running],
    exited: &mut mpsc::UnboundedReceiver<(u16, u32, ExitStatus)>,
) -> bool {
    for replica in replicas.iter().filter(|r| r.exited.is_none()) {
        signal_pid(replica.pid, Signal::SIGTERM);
    }
    let mut clean = true;
    let wait = async {
        while replicas.iter().any(|r| r.exited.is_none()) {
            let Some((_, pid, status)) = exited.recv().await else {
                break;
            };
            record_exit(replicas, pid, status);
            clean &= status.success();
        }
    };
    if tokio::time::timeout(STOP_BOUND, wait).await.is_err() {
        for replica in replicas.iter().filter(|r| r.exited.is_none()) {
            say(&format!(
                "replica={} pid={} event=killed reason=\"no exit within {STOP_BOUND:?}\"",
                replica.index, replica.pid
            ));
            signal_pid(replica.pid, Signal::SIGKILL);
        }
        clean = false;
    }
    clean
}

fn signal_pid(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

fn say(text: &str) {
    write_line(&format!("[demo] {text}"));
}

/// One line on standard output, one `write`.
fn write_line(text: &str) {
    use std::io::Write as _;
    let line = format!("{text}\n");
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}
