//! A server restart under lease replicas behind a transaction-mode PgBouncer (issue 49, item 9):
//! whether the leader keeps its term depends on PgBouncer's `server_login_retry`.
//!
//! A throwaway cluster (`Cluster`), a PgBouncer in `pool_mode = transaction` in front of it, and
//! three lease replicas (`plx-replica --mechanism lease`, the default interval I = 5 s, TTL 3·I =
//! 15 s) through it. The server is stopped (`pg_ctl stop -m fast`) and started again
//! `DOWN` (2.5 s, the restart) later. While it is down, one client of the same pool
//! queries it (as any client of the pool may: a standby's claim, a monitoring probe): PgBouncer
//! tries a server login for it, which fails, and then tries the next login only
//! `server_login_retry` seconds later; meanwhile it queues the pool's queries (PgBouncer 1.18,
//! up to `query_wait_timeout`), so the leader's renewals go unanswered until that login.
//!
//! The lease rides out an outage of its renewals shorter than one interval in every phase of
//! its renewals (up to two in the best): the leader trusts its lease for 0.9·TTL = 2.7·I after
//! its last successful renewal was sent and renews every I. Here the renewals' outage is the
//! restart plus at most `server_login_retry` after it:
//!
//! | `server_login_retry` | outage | outcome (asserted) |
//! |---|---|---|
//! | 1 s | ≤ 2.5 s + 1 s < I = 5 s | the leader keeps its term: no demotion, one term, no other leader |
//! | 15 s (PgBouncer's default) | about 15 s > 2·I | the leader demotes once its trust runs out; a leader again once PgBouncer logs in again (≤ 15 s + TTL + I after the stop, plus `MARGIN`) |
//!
//! `cargo test -p plexsphere-leader-tests --test restart_pgbouncer -- --nocapture` prints the
//! figures (docs/operations.md, "A server restart behind PgBouncer").
#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

mod fault_support;
mod support;

use std::time::Duration;

use fault_support::{Fleet, MARGIN, STARTUP, sleep_until};
use plexsphere_leader_tests::replica_process::{FOLLOW, LEAD, REPLICA_APP_PREFIX, dsn};
use plexsphere_leader_tests::timeline::{self, Span};
use plexsphere_leader_tests::{ChildArgs, Cluster, Mechanism, PgBouncer, PoolMode, StopMode};
use tokio::time::Instant;

/// The replicas' check interval: the default.
const I: Duration = Duration::from_secs(5);

/// The lease's TTL: the default, three intervals.
const TTL: Duration = Duration::from_secs(15);

/// How long the server is down: the restart.
const DOWN: Duration = Duration::from_millis(2_500);

/// What one restart did to the leadership.
struct Outcome {
    /// From the stop to the server accepting connections again.
    down: Duration,
    /// When the leader's term ended after the stop, and why; `None` when it kept it.
    demoted: Option<(Duration, String)>,
    /// When another term began after the stop, if one did.
    next_term: Option<Duration>,
    /// The longest span after the stop with no leader, until the watch ended.
    no_leader: Duration,
    /// Terms begun over the whole run.
    terms: usize,
    /// The longest span two replicas believed they led at once.
    overlap: Duration,
}

/// Runs the scenario with PgBouncer's `server_login_retry` = `retry` seconds, watching for
/// `watch` after the stop (or, with `until_next_term`, until a term begins after the stop).
async fn restart_behind_pgbouncer(retry: u32, watch: Duration, until_next_term: bool) -> Outcome {
    let cluster = Cluster::start().await.unwrap();
    let direct = cluster.config("postgres");
    let admin = plexsphere_leader_tests::connect(&direct).await.unwrap();
    plexsphere_leader::lease::setup(&admin).await.unwrap();
    drop(admin);
    let retry_setting = retry.to_string();
    let bouncer = PgBouncer::start_with(
        &direct,
        PoolMode::Transaction,
        2,
        &[("server_login_retry", &retry_setting)],
    )
    .await
    .expect("PgBouncer");
    let pooled = bouncer.pg_config(&direct);
    let mut fleet = Fleet::new();
    for name in ["a", "b", "c"] {
        fleet
            .spawn_args(ChildArgs {
                mechanism: Mechanism::Lease,
                ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn(&pooled), I)
            })
            .await;
    }
    let leader = fleet.sole_leader(STARTUP + I).await;
    // At least one renewal through the pooler before the restart.
    tokio::time::sleep(I + I / 2).await;

    let stopped = Instant::now();
    cluster.stop(StopMode::Fast).await.unwrap();
    // A client of the same pool while the server is down: PgBouncer tries a server login for
    // it, which fails, and queues the query (until `query_wait_timeout`, 120 s by default) and
    // every other one of the pool until a later login succeeds, at most `server_login_retry`
    // after the failed one. The probe gives up when the server is back.
    let mut probe = pooled.clone();
    probe
        .application_name("plx-harness-probe")
        .connect_timeout(Duration::from_secs(2));
    let probe = tokio::spawn(tokio::time::timeout(DOWN, async move {
        let client = plexsphere_leader_tests::connect(&probe).await?;
        client.simple_query("SELECT 1").await?;
        Ok::<_, plexsphere_leader_tests::HarnessError>(())
    }));
    sleep_until(stopped + DOWN).await;
    cluster.start_again().await.unwrap();
    let probed = match probe.await.unwrap() {
        Ok(Ok(())) => "answered".to_owned(),
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "waited for the server".to_owned(),
    };
    let down = stopped.elapsed();

    let watch_end = stopped + watch;
    loop {
        let next_term = fleet
            .replicas
            .iter()
            .flat_map(|r| r.events(LEAD))
            .any(|r| r.at >= stopped);
        if Instant::now() >= watch_end || (until_next_term && next_term) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A term that began is reported a little later by the replica that leads it: let its
    // records arrive (the harness's own interval, 200 ms).
    tokio::time::sleep(fault_support::I).await;

    let demoted = fleet
        .get(leader)
        .events(FOLLOW)
        .into_iter()
        .find(|r| r.at >= stopped)
        .map(|r| {
            (
                r.at - stopped,
                r.str("cause").unwrap_or_default().to_owned(),
            )
        });
    let next_term = fleet
        .replicas
        .iter()
        .flat_map(|r| r.events(LEAD))
        .map(|r| r.at)
        .filter(|at| *at >= stopped)
        .min()
        .map(|at| at - stopped);
    let end = Instant::now();
    let intervals = fleet.timeline.intervals(LEAD, FOLLOW, end);
    let outcome = Outcome {
        down,
        demoted,
        next_term,
        no_leader: timeline::max_gap(
            &intervals,
            Span {
                start: stopped,
                end,
            },
        ),
        terms: fleet.lead_count(),
        overlap: fleet.max_overlap(),
    };
    println!(
        "server_login_retry = {retry}: server down {:?} (the probe: {}); leader {} demoted: {:?}; \
         next term after the stop: {:?}; longest span without a leader: {:?}; terms: {}; \
         overlap: {:?}",
        outcome.down,
        probed,
        fleet.get(leader).name(),
        outcome.demoted,
        outcome.next_term,
        outcome.no_leader,
        outcome.terms,
        outcome.overlap,
    );
    for replica in &mut fleet.replicas {
        let report = replica.stop().await.unwrap();
        assert_eq!(report.run_error, None, "{}", replica.name());
    }
    drop(bouncer);
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_server_login_retry_1_a_server_restart_keeps_the_lease_term() {
    // Long enough for a lost term to show: the leader's trust ends at most 0.9·TTL after the
    // stop, and a standby claims an expired lease at its next check.
    let outcome = restart_behind_pgbouncer(1, TTL + 2 * I, false).await;
    assert_eq!(outcome.demoted, None, "the leader keeps its term");
    assert_eq!(outcome.next_term, None, "no other term begins");
    assert_eq!(outcome.terms, 1, "one term over the whole run");
    assert_eq!(outcome.no_leader, Duration::ZERO, "never without a leader");
    assert_eq!(outcome.overlap, Duration::ZERO, "never two leaders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pgbouncers_default_server_login_retry_a_server_restart_loses_the_lease_term() {
    // PgBouncer refuses the pool's logins for 15 s after the probe's failed one; the leader
    // trusts its lease at most 0.9·TTL = 13.5 s after its last renewal, sent before the stop.
    let bound = Duration::from_secs(15) + TTL + I + MARGIN;
    let outcome = restart_behind_pgbouncer(15, bound, true).await;
    let (demoted_after, cause) = outcome.demoted.expect("the leader loses its term");
    assert!(
        demoted_after <= TTL * 9 / 10 + MARGIN,
        "demoted once its trust ran out: {demoted_after:?}"
    );
    assert!(cause.contains("Lease"), "{cause}");
    let next_term = outcome.next_term.expect("a leader again");
    assert!(next_term <= bound, "{next_term:?}");
    assert!(
        outcome.no_leader > Duration::ZERO,
        "a span without a leader"
    );
    assert_eq!(outcome.overlap, Duration::ZERO, "never two leaders");
}
