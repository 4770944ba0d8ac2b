//! The launchers under paused time with a hand-driven election: every row of the spec's
//! readiness table, a panicking pass, a demotion under a pass, the while-leader runner's terms,
//! and the wiring without an Elector.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plexsphere_leader_core::readiness::Tick;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use super::testing::Manual;
use super::*;
use crate::readiness::{Probe, Readiness};

const PERIOD: Duration = Duration::from_secs(1);

/// A pass whose outcome the test sets: `Ok`, an error, or a panic.
#[derive(Clone, Default)]
struct Script {
    next: Arc<Mutex<Outcome>>,
    calls: Arc<AtomicU32>,
}

#[derive(Clone, Default)]
enum Outcome {
    #[default]
    Ok,
    Err(&'static str),
    /// Fails with this error marked permanent.
    Permanent(&'static str),
    Panic(&'static str),
    /// Waits for the token, then returns this error.
    WaitThenErr(&'static str),
}

impl Script {
    fn set(&self, outcome: Outcome) {
        *self.next.lock().unwrap() = outcome;
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn pass(&self) -> PassFn {
        let script = self.clone();
        pass_fn(move |token: CancellationToken| {
            script.calls.fetch_add(1, Ordering::SeqCst);
            let outcome = script.next.lock().unwrap().clone();
            async move {
                match outcome {
                    Outcome::Ok => Ok(()),
                    Outcome::Err(e) => Err(BoxError::from(e)),
                    Outcome::Permanent(e) => Err(crate::Permanent::boxed(e)),
                    Outcome::Panic(value) => panic!("{value}"),
                    Outcome::WaitThenErr(e) => {
                        token.cancelled().await;
                        Err(BoxError::from(e))
                    }
                }
            }
        })
    }
}

fn ticker(election: &Manual, script: &Script, readiness: &Readiness) -> LeaderTicker<Manual> {
    let probe = readiness
        .loop_probe("access-session-sweeper", "access-session-sweep")
        .unwrap();
    LeaderTicker::new(
        "access-session-sweep",
        election.clone(),
        PERIOD,
        script.pass(),
    )
    .with_probe(probe)
}

fn probe_of(readiness: &Readiness) -> Result<(), String> {
    readiness
        .report()
        .probe("access-session-sweeper")
        .cloned()
        .unwrap()
}

#[tokio::test]
async fn booted_no_tick_yet_the_probe_reports_the_boot_pass() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    assert!(
        probe_of(&readiness)
            .unwrap_err()
            .ends_with("boot pass not run yet")
    );

    script.set(Outcome::Err("relation \"sessions\" does not exist"));
    let shutdown = CancellationToken::new();
    assert!(ticker.boot_pass(&shutdown).await.is_err());
    assert_eq!(
        script.calls(),
        1,
        "the boot pass runs on a standby: it is not gated"
    );
    assert_eq!(
        probe_of(&readiness),
        Err("plexsphere: background loop \"access-session-sweep\": boot pass failed: relation \"sessions\" does not exist".into())
    );
    script.set(Outcome::Ok);
    ticker.boot_pass(&shutdown).await.unwrap();
    assert_eq!(probe_of(&readiness), Ok(()));
}

#[tokio::test]
async fn leader_last_tick_succeeded_passes_and_failed_reports_the_error_until_a_later_success() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    let shutdown = CancellationToken::new();
    ticker.boot_pass(&shutdown).await.unwrap();
    election.lead();

    assert_eq!(ticker.tick(&shutdown).await, Tick::Passed);
    assert_eq!(probe_of(&readiness), Ok(()));

    script.set(Outcome::Err("deadlock detected"));
    assert_eq!(
        ticker.tick(&shutdown).await,
        Tick::Failed("deadlock detected".into())
    );
    let failed =
        "plexsphere: background loop \"access-session-sweep\": tick failed: deadlock detected";
    assert_eq!(probe_of(&readiness), Err(failed.into()));
    assert!(!readiness.report().is_ready());

    script.set(Outcome::Ok);
    assert_eq!(ticker.tick(&shutdown).await, Tick::Passed);
    assert_eq!(probe_of(&readiness), Ok(()));
}

#[tokio::test]
async fn standby_runs_no_pass_and_passes_even_after_a_failed_boot_pass() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    let shutdown = CancellationToken::new();
    script.set(Outcome::Err("boot"));
    let _ = ticker.boot_pass(&shutdown).await;
    assert_eq!(ticker.tick(&shutdown).await, Tick::Standby);
    assert_eq!(script.calls(), 1, "only the boot pass ran");
    assert_eq!(probe_of(&readiness), Ok(()));
}

#[tokio::test]
async fn a_demoted_leaders_probe_clears_on_its_first_standby_tick() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    let shutdown = CancellationToken::new();
    ticker.boot_pass(&shutdown).await.unwrap();
    election.lead();
    script.set(Outcome::Err("timeout"));
    ticker.tick(&shutdown).await;
    assert!(probe_of(&readiness).is_err());
    election.demote();
    assert_eq!(ticker.tick(&shutdown).await, Tick::Standby);
    assert_eq!(probe_of(&readiness), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_demotion_while_the_pass_runs_is_not_a_failed_tick() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    let shutdown = CancellationToken::new();
    ticker.boot_pass(&shutdown).await.unwrap();
    election.lead();
    script.set(Outcome::WaitThenErr("cancelled by the term"));
    let demoter = tokio::spawn({
        let election = election.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            election.demote();
        }
    });
    assert_eq!(ticker.tick(&shutdown).await, Tick::Interrupted);
    demoter.await.unwrap();
    assert_eq!(probe_of(&readiness), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn the_shutdown_under_a_pass_leaves_the_probe_as_it_was() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    let shutdown = CancellationToken::new();
    ticker.boot_pass(&shutdown).await.unwrap();
    election.lead();
    script.set(Outcome::WaitThenErr("stopping"));
    let canceller = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            shutdown.cancel();
        }
    });
    assert_eq!(ticker.tick(&shutdown).await, Tick::Cancelled);
    canceller.await.unwrap();
    assert_eq!(probe_of(&readiness), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_pass_is_a_failed_tick_logged_at_error_and_warn_and_the_loop_keeps_ticking() {
    crate::capture_panic_stacks();
    let logs = Logs::default();
    let _guard = logs.install();
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let ticker = ticker(&election, &script, &readiness);
    let shutdown = CancellationToken::new();
    ticker.boot_pass(&shutdown).await.unwrap();
    election.lead();
    script.set(Outcome::Panic("index out of bounds: the len is 0"));
    let running = tokio::spawn(ticker.clone().run(shutdown.clone()));

    tokio::time::sleep(PERIOD + Duration::from_millis(1)).await;
    assert_eq!(script.calls(), 2, "the boot pass and one tick");
    assert_eq!(
        probe_of(&readiness),
        Err("plexsphere: background loop \"access-session-sweep\": tick panicked: index out of bounds: the len is 0".into())
    );
    let error = logs
        .find("background loop tick panicked")
        .expect("ERROR line");
    assert_eq!(error.level, tracing::Level::ERROR);
    assert_eq!(error.fields["loop"], "access-session-sweep");
    assert_eq!(error.fields["panic"], "index out of bounds: the len is 0");
    assert!(
        error.fields["stack"].contains("panicked at"),
        "{}",
        error.fields["stack"]
    );
    let warn = logs.find("background loop tick failed").expect("WARN line");
    assert_eq!(warn.level, tracing::Level::WARN);
    assert_eq!(warn.fields["loop"], "access-session-sweep");

    script.set(Outcome::Ok);
    tokio::time::sleep(PERIOD).await;
    assert_eq!(script.calls(), 3, "the loop kept ticking");
    assert_eq!(
        probe_of(&readiness),
        Ok(()),
        "a later tick that succeeds clears it"
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn every_failed_tick_writes_a_warn_line_even_without_a_probe() {
    let logs = Logs::default();
    let _guard = logs.install();
    let (election, script) = (Manual::default(), Script::default());
    let ticker = LeaderTicker::new("rate-budget-sweep", election.clone(), PERIOD, script.pass());
    election.lead();
    script.set(Outcome::Err("disk full"));
    let shutdown = CancellationToken::new();
    ticker.tick(&shutdown).await;
    ticker.tick(&shutdown).await;
    let warns = logs.all("background loop tick failed: disk full");
    assert_eq!(warns.len(), 2);
    assert_eq!(warns[0].fields["loop"], "rate-budget-sweep");
    assert_eq!(warns[0].fields["cause"], "disk full");
}

#[tokio::test(start_paused = true)]
async fn the_ticker_ticks_on_its_cadence_only_on_the_leader() {
    let (election, script) = (Manual::default(), Script::default());
    let ticker = LeaderTicker::new(
        "invitations-expire",
        election.clone(),
        PERIOD,
        script.pass(),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(ticker.run(shutdown.clone()));
    tokio::time::sleep(PERIOD * 3 + Duration::from_millis(1)).await;
    assert_eq!(script.calls(), 0, "a standby runs no pass");
    election.lead();
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(script.calls(), 3);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_while_leader_runner_runs_the_loop_in_each_term_and_stops_it_on_demotion() {
    let election = Manual::default();
    let terms = Arc::new(Mutex::new(Vec::new()));
    let runner = WhileLeader::new(
        "audit-archiver",
        election.clone(),
        pass_fn({
            let terms = Arc::clone(&terms);
            move |token: CancellationToken| {
                let terms = Arc::clone(&terms);
                async move {
                    terms.lock().unwrap().push("started");
                    token.cancelled().await;
                    terms.lock().unwrap().push("stopped");
                    Err::<(), BoxError>("drained half a chain".into())
                }
            }
        }),
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(runner.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        terms.lock().unwrap().is_empty(),
        "nothing runs on a standby"
    );
    election.lead();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*terms.lock().unwrap(), ["started"]);
    election.demote();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*terms.lock().unwrap(), ["started", "stopped"]);
    assert!(
        !running.is_finished(),
        "an error after the term ended is not a failure"
    );
    election.lead();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*terms.lock().unwrap(), ["started", "stopped", "started"]);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_while_leader_loop_that_fails_while_its_term_holds_fails_the_worker() {
    let election = Manual::default();
    election.lead();
    let runner = WhileLeader::new(
        "authz-outbox-consumer",
        election.clone(),
        pass_fn(|_token| async { Err::<(), BoxError>("spicedb unavailable".into()) }),
    );
    let error = runner.run(CancellationToken::new()).await.unwrap_err();
    assert_eq!(error.to_string(), "spicedb unavailable");
}

#[tokio::test(start_paused = true)]
async fn a_while_leader_loop_that_ignores_its_token_is_dropped_after_the_grace() {
    let election = Manual::default();
    election.lead();
    let runner = WhileLeader::new(
        "stubborn",
        election.clone(),
        pass_fn(|_token| async {
            std::future::pending::<()>().await;
            Ok::<(), BoxError>(())
        }),
    )
    .stop_grace(Duration::from_millis(300));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(runner.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let stopped_at = tokio::time::Instant::now();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(stopped_at.elapsed(), Duration::from_millis(300));
}

#[test]
fn a_boot_without_an_elector_wires_no_loop_at_all() {
    let readiness = Readiness::new();
    let mut background = Background::new(&readiness).unwrap();
    let mut called = false;
    let wired = wire_background(None, &mut background, |_elector, _background| {
        called = true;
        Ok(())
    })
    .unwrap();
    assert_eq!(wired, Wired::Nothing);
    assert!(!called);
    assert!(background.worker_names().is_empty());
    assert_eq!(background.boot_passes(), 0);
    assert_eq!(readiness.names(), ["workers"], "no loop probe");
    assert!(readiness.report().is_ready());
}

#[tokio::test(start_paused = true)]
async fn the_background_plane_boots_every_pass_ungated_then_starts_the_workers() {
    let (election, script, readiness) = (Manual::default(), Script::default(), Readiness::new());
    let mut background = Background::new(&readiness).unwrap();
    background
        .ticker(
            LeaderTicker::new(
                "invitations-expire",
                election.clone(),
                PERIOD,
                script.pass(),
            )
            .probe("invitations-expire"),
        )
        .unwrap();
    background
        .ticker(
            LeaderTicker::new(
                "access-session-sweep",
                election.clone(),
                PERIOD,
                script.pass(),
            )
            .probe("access-session-sweeper"),
        )
        .unwrap();
    background
        .ticker(LeaderTicker::new(
            "rate-budget-sweep",
            election.clone(),
            PERIOD,
            script.pass(),
        ))
        .unwrap();
    let duplicate = background.ticker(LeaderTicker::new(
        "rate-budget-sweep",
        election.clone(),
        PERIOD,
        script.pass(),
    ));
    assert!(matches!(duplicate, Err(WiringError::Worker(_))));
    assert_eq!(
        readiness.names(),
        ["workers", "invitations-expire", "access-session-sweeper"]
    );
    assert!(!readiness.report().is_ready(), "boot passes not run yet");

    let shutdown = CancellationToken::new();
    let report = background.boot(&shutdown).await;
    assert_eq!(report.passes.len(), 2, "the probed loops run at boot");
    assert_eq!(script.calls(), 2);
    assert!(readiness.report().is_ready());
    let running = background.start(&shutdown);
    election.lead();
    tokio::time::sleep(PERIOD + Duration::from_millis(1)).await;
    assert_eq!(script.calls(), 5, "three tickers ticked once on the leader");
    assert!(
        running
            .shutdown(Duration::from_secs(1))
            .await
            .aborted
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn the_workers_probe_fails_when_a_ticker_worker_exhausts_its_budget() {
    let readiness = Readiness::new();
    let policy = crate::RestartPolicy {
        max_restarts: 2,
        ..crate::RestartPolicy::default()
    };
    let mut background = Background::with_policy(&readiness, policy).unwrap();
    background
        .worker("capacity-collector", |_token| async {
            Err::<(), BoxError>("sampler broken".into())
        })
        .unwrap();
    let mut running = background.start(&CancellationToken::new());
    running.stopped().await;
    let probe = running.probe();
    assert_eq!(
        probe.check(),
        Err(
            "background workers stopped after exhausting their restart budget: capacity-collector"
                .into()
        )
    );
    assert!(!readiness.report().is_ready());
}

#[tokio::test(start_paused = true)]
async fn an_every_replica_loop_keeps_its_cadence_and_logs_a_repeated_failure_once_a_minute() {
    let logs = Logs::default();
    let _guard = logs.install();
    let script = Script::default();
    script.set(Outcome::Err(
        "error connecting to server: Connection refused",
    ));
    let ticker = EveryReplica::new("sse-relay", PERIOD, script.pass());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(ticker.run(shutdown.clone()));
    let failed = "background loop tick failed: error connecting to server: Connection refused";
    let still =
        "background loop tick still failing: error connecting to server: Connection refused";

    // The first tick comes at once; 30 periods of the same error: one line, not 30.
    tokio::time::sleep(PERIOD * 29 + Duration::from_millis(1)).await;
    assert_eq!(
        script.calls(),
        30,
        "the cadence is kept: one pass per period"
    );
    assert_eq!(
        logs.all(failed).len(),
        1,
        "the first failure is logged at once"
    );
    let first = logs.find(failed).unwrap();
    assert_eq!(first.level, tracing::Level::WARN);
    assert_eq!(first.fields["loop"], "sse-relay");
    assert!(logs.all(still).is_empty(), "repeats are held back");

    // A minute after the first line, one line says how many failed ticks it held back.
    tokio::time::sleep(PERIOD * 31).await;
    let repeats = logs.all(still);
    assert_eq!(repeats.len(), 1, "one line per minute of repeats");
    assert_eq!(repeats[0].level, tracing::Level::WARN);
    assert_eq!(repeats[0].fields["failed_ticks"], "61");
    assert_eq!(repeats[0].fields["not_logged"], "59");

    // Another cause is logged at once.
    script.set(Outcome::Err("relation \"cursors\" does not exist"));
    tokio::time::sleep(PERIOD).await;
    assert_eq!(
        logs.all("background loop tick failed: relation \"cursors\" does not exist")
            .len(),
        1
    );

    // The first tick that passes again says so, once.
    script.set(Outcome::Ok);
    tokio::time::sleep(PERIOD * 3).await;
    let recovered = logs.all("background loop tick passed again");
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(recovered[0].level, tracing::Level::INFO);
    assert_eq!(recovered[0].fields["failed_ticks"], "62");

    // A failure after a recovery is a first failure again.
    script.set(Outcome::Err(
        "error connecting to server: Connection refused",
    ));
    tokio::time::sleep(PERIOD).await;
    assert_eq!(logs.all(failed).len(), 2);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_every_replica_loop_stops_with_the_shutdown_and_logs_no_failure_of_it() {
    let logs = Logs::default();
    let _guard = logs.install();
    let script = Script::default();
    script.set(Outcome::WaitThenErr("stopping"));
    let ticker = EveryReplica::new("capacity-collector", PERIOD, script.pass());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(ticker.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(script.calls(), 1, "the first tick comes at once");
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert!(logs.find("background loop tick").is_none());
}

/// Captured log lines.
#[derive(Clone, Default)]
struct Logs {
    lines: Arc<Mutex<Vec<Line>>>,
}

#[derive(Clone, Debug)]
struct Line {
    level: tracing::Level,
    message: String,
    fields: BTreeMap<String, String>,
}

impl Logs {
    /// Installs the capture for the current thread, after making sure a silent global default
    /// exists: `tracing` caches callsite interest process-wide, and a parallel test thread with
    /// no subscriber that reaches a callsite first would otherwise cache it as `never`.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            // Fails only if a default is already set, which serves the same purpose.
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        });
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    fn find(&self, prefix: &str) -> Option<Line> {
        self.all(prefix).into_iter().next()
    }

    fn all(&self, prefix: &str) -> Vec<Line> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter(|line| line.message.starts_with(prefix))
            .cloned()
            .collect()
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Logs {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        self.lines.lock().unwrap().push(Line {
            level: *event.metadata().level(),
            message,
            fields,
        });
    }
}

/// A pass that fails with "permission denied", marked permanent or not.
fn denied(permanent: bool) -> PassFn {
    crate::loops::pass_fn(move |_token| async move {
        let error = std::io::Error::other("permission denied for table invitations");
        if permanent {
            Err(crate::Permanent::boxed(error))
        } else {
            Err(BoxError::from(error))
        }
    })
}

/// Ticks `ticker` once a period until the election's leader steps down; the ticks it took.
async fn ticks_until_stepped_down(ticker: &LeaderTicker<Manual>, election: &Manual) -> u32 {
    let shutdown = CancellationToken::new();
    for n in 1..=200 {
        assert!(matches!(ticker.tick(&shutdown).await, Tick::Failed(_)));
        if !election.is_leader() {
            return n;
        }
        tokio::time::advance(PERIOD).await;
    }
    panic!("never stepped down");
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_pass_fails_for_good_steps_down_after_its_patience_and_a_passing_error_never()
 {
    let election = Manual::default();
    let shutdown = CancellationToken::new();
    election.lead();
    let transient = LeaderTicker::new(
        "invitations-expire",
        election.clone(),
        PERIOD,
        denied(false),
    );
    for _ in 0..30 {
        assert!(matches!(transient.tick(&shutdown).await, Tick::Failed(_)));
        tokio::time::advance(PERIOD).await;
    }
    assert!(election.is_leader(), "a transient failure keeps the term");
    let permanent = LeaderTicker::new("invitations-expire", election.clone(), PERIOD, denied(true));
    // The failing tick ten periods after the first one steps down: leadership moves at most
    // once per ten periods.
    assert_eq!(ticks_until_stepped_down(&permanent, &election).await, 11);
    let why = election.stepped_down.lock().unwrap().clone();
    assert_eq!(
        why,
        [
            "background loop \"invitations-expire\": permission denied for table invitations \
          (on every tick for 10s; step-down 1 of this replica for this loop)"
        ]
    );
    // Back in the lead with the same failure: it waits twice as long (a clone, as a restarted
    // worker, shares the state).
    election.lead();
    let restarted = permanent.clone();
    assert_eq!(ticks_until_stepped_down(&restarted, &election).await, 21);
    election.lead();
    assert_eq!(ticks_until_stepped_down(&permanent, &election).await, 41);
}

#[tokio::test(start_paused = true)]
async fn a_pass_resets_the_patience_and_a_ticker_told_to_stay_never_steps_down() {
    let election = Manual::default();
    let shutdown = CancellationToken::new();
    let script = Script::default();
    let ticker = LeaderTicker::new(
        "invitations-expire",
        election.clone(),
        PERIOD,
        script.pass(),
    );
    election.lead();
    script.set(Outcome::Permanent("permission denied"));
    assert_eq!(ticks_until_stepped_down(&ticker, &election).await, 11);
    election.lead();
    // One pass on this replica: it can do the work again, so the next patience is 10 periods.
    script.set(Outcome::Ok);
    assert_eq!(ticker.tick(&shutdown).await, Tick::Passed);
    tokio::time::advance(PERIOD).await;
    script.set(Outcome::Permanent("permission denied"));
    assert_eq!(ticks_until_stepped_down(&ticker, &election).await, 11);
    // The spec's behaviour on request: the leader stays, the loop reports its failure.
    election.lead();
    let staying = LeaderTicker::new("invitations-expire", election.clone(), PERIOD, denied(true))
        .stay_when_unfit();
    for _ in 0..100 {
        assert!(matches!(staying.tick(&shutdown).await, Tick::Failed(_)));
        tokio::time::advance(PERIOD).await;
    }
    assert!(election.is_leader());
    assert_eq!(election.stepped_down.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_while_leader_loop_stopped_for_good_makes_the_leader_step_down_once() {
    let election = Manual::default();
    let readiness = Readiness::new();
    let policy = crate::RestartPolicy {
        max_restarts: 2,
        ..crate::RestartPolicy::default()
    };
    let mut background = Background::with_policy(&readiness, policy).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&runs);
    background
        .while_leader(WhileLeader::new(
            "audit-archiver",
            election.clone(),
            pass_fn(move |_term: CancellationToken| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), BoxError>("archive: corrupt segment".into()) }
            }),
        ))
        .unwrap();
    election.lead();
    let mut running = background.start(&CancellationToken::new());
    running.stopped().await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "one run and two restarts");
    assert!(!election.is_leader(), "the leader stepped down");
    assert_eq!(
        *election.stepped_down.lock().unwrap(),
        ["background worker \"audit-archiver\" stopped for good: archive: corrupt segment"]
    );
    assert!(!readiness.report().is_ready());
}

#[tokio::test(start_paused = true)]
async fn a_worker_without_its_database_logs_the_outage_once_then_once_a_minute() {
    let logs = Logs::default();
    let _guard = logs.install();
    let readiness = Readiness::new();
    let mut background = Background::new(&readiness).unwrap();
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = Arc::clone(&up);
    background
        .worker("sse-relay", move |_token: CancellationToken| {
            let up = server.load(Ordering::SeqCst);
            async move {
                if !up {
                    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                    return Err(BoxError::from(refused));
                }
                // Works until the next outage, then loses its connection.
                tokio::time::sleep(Duration::from_secs(600)).await;
                Err(BoxError::from(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                )))
            }
        })
        .unwrap();
    let running = background.start(&CancellationToken::new());
    let lost = "background worker lost its database connection, restarting";
    let still = "background worker still cannot reach its database, restarting";
    // 150 s of outage: one line at its start, one a minute after.
    tokio::time::sleep(Duration::from_secs(150)).await;
    assert_eq!(logs.all(lost).len(), 1);
    let repeated = logs.all(still);
    assert_eq!(repeated.len(), 2);
    assert_eq!(repeated[0].level, tracing::Level::WARN);
    assert_eq!(repeated[0].fields["worker"], "sse-relay");
    assert!(logs.all("background worker failed, restarting").is_empty());
    assert!(readiness.report().is_ready(), "no budget spent");
    // Back for ten minutes, then lost again: a new outage, logged at once.
    up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(601)).await;
    up.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(logs.all(lost).len(), 2);
    assert_eq!(logs.all(still).len(), 2);
    drop(running);
}
