//! The driver against an in-memory lock server ([`fake`]), under paused time: the paths that
//! only turmoil or a real server reached before, each in milliseconds of real time, for the
//! single election here and for sharded leadership in [`sharded`].
#![allow(clippy::unwrap_used)] // reason: tests fail loudly on the unexpected

mod fake;
mod sharded;

use std::time::Duration;

use plexsphere_leader_core::{AcquireMode, LossReason, TermEndCause, UNLOCK_BUDGET};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use self::fake::{Fake, Fault, Kind};
use crate::{Config, Elector, RunError};

const I: Duration = Duration::from_millis(100);

/// An elector whose sessions come from `fake`.
fn elector(fake: &Fake, configure: impl FnOnce(Config) -> Config) -> Elector {
    let config = configure(Config::with_sessions(fake.clone()).check_interval(I));
    Elector::new(config).unwrap()
}

struct Running {
    elector: Elector,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), RunError>>,
}

fn run(elector: Elector) -> Running {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    Running {
        elector,
        shutdown,
        task,
    }
}

impl Running {
    async fn first_term(&self) -> crate::Term {
        timeout(I, self.elector.next_term(&CancellationToken::new()))
            .await
            .unwrap()
            .unwrap()
    }

    /// Stops the run and returns how long (virtual time) it took to return.
    async fn stop(self) -> Duration {
        let asked = Instant::now();
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        asked.elapsed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_that_fails_ends_the_wait_for_a_term_with_its_error_at_once() {
    use crate::leadership::TermWaitError;
    let fake = Fake::default();
    let elector = elector(&fake, |config| config);
    let running = run(elector.clone());
    let term = running.first_term().await;
    // A transaction-mode pooler hands the lock's server session to another client: the next
    // check proves it and the run fails.
    fake.lock().multiplexed = true;
    let error = timeout(3 * I, running.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(error, RunError::SessionsMultiplexed(_)),
        "{error:?}"
    );
    assert!(term.token().is_cancelled());
    assert_eq!(elector.leadership().run_failed(), Some(error));
    // A service waiting for its next term learns it at once, not at its shutdown.
    let waited = timeout(I, elector.next_term(&CancellationToken::new())).await;
    assert_eq!(
        waited.unwrap().map(|term| term.id()),
        Err(TermWaitError::RunFailed(error))
    );
    // A new run clears it.
    fake.lock().multiplexed = false;
    let again = run(elector.clone());
    tokio::task::yield_now().await; // the run's task starts
    assert_eq!(elector.leadership().run_failed(), None);
    let _term = again.first_term().await;
    again.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pool_that_answers_two_held_connections_from_one_backend_fails_before_any_term() {
    use crate::leadership::TermWaitError;
    let fake = Fake::default();
    fake.lock().multiplexed = true; // a transaction-mode pooler with one server session
    let elector = elector(&fake, |config| config);
    let running = run(elector.clone());
    let error = timeout(I, running.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            error,
            RunError::SessionsMultiplexed(
                plexsphere_leader_core::LockFinding::PoolSharesBackend { .. }
            )
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("Config::lease"), "{error}");
    assert_eq!(elector.leadership().last_end(), None, "no term at all");
    {
        let server = fake.lock();
        assert_eq!(server.count(Kind::Grant), 0, "the lock was never tried");
        assert_eq!(server.holder, None);
    }
    assert_eq!(
        elector
            .next_term(&CancellationToken::new())
            .await
            .map(|t| t.id()),
        Err(TermWaitError::RunFailed(error))
    );
}

#[tokio::test(start_paused = true)]
async fn a_pool_of_one_connection_is_proven_by_a_session_outside_it_and_leads() {
    let fake = Fake::default();
    // A second pooled connection never comes (a pool of one): the proof's second session is
    // one of its own, outside the pool.
    fake.lock().pool_size = Some(1);
    let running = run(elector(&fake, |config| config));
    let _term = timeout(2 * I, running.elector.next_term(&CancellationToken::new()))
        .await
        .unwrap()
        .unwrap();
    {
        let server = fake.lock();
        assert_eq!(server.count(Kind::BackendPid), 2, "two sessions answered");
        assert_eq!(server.opened_outside, 1, "one short-lived session per run");
        assert_eq!(server.count(Kind::ProofTry), 2, "the key tried on both");
        assert_eq!(
            server.count(Kind::ProofRelease),
            1,
            "and released on the first"
        );
    }
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_whose_lock_grants_every_session_fails_before_any_term() {
    use crate::leadership::TermWaitError;
    let fake = Fake::default();
    fake.lock().vacuous = true; // stubs that answer true, as some compatible servers ship
    let elector = elector(&fake, |config| config);
    let running = run(elector.clone());
    let error = timeout(I, running.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            error,
            RunError::LockNotExclusive(plexsphere_leader_core::LockFinding::LockNotExclusive {
                first: 1001,
                second: 1002
            })
        ),
        "{error:?}"
    );
    assert!(error.is_permanent());
    assert!(error.to_string().contains("Config::lease"), "{error}");
    assert!(!elector.is_leader());
    assert_eq!(elector.leadership().last_end(), None, "no term at all");
    {
        let server = fake.lock();
        assert_eq!(
            server.count(Kind::Grant),
            0,
            "the election's lock was never tried"
        );
        assert_eq!(server.holder, None);
        // The first session released the proof's key and went back; the second, granted, was
        // closed with what it held.
        assert_eq!((server.returned, server.closed), (1, 0));
    }
    assert_eq!(
        elector
            .next_term(&CancellationToken::new())
            .await
            .map(|t| t.id()),
        Err(TermWaitError::RunFailed(error))
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_session_that_fails_proves_nothing_and_gives_the_first_back_to_the_pool() {
    let fake = Fake::default();
    fake.lock().outside_refused = true; // a role's CONNECTION LIMIT, a full server
    let running = run(elector(&fake, |config| config));
    tokio::time::sleep(5 * I + I / 2).await;
    {
        let server = fake.lock();
        // Every check proved again and tried no lock; each borrow went back to the pool.
        assert_eq!(server.count(Kind::Grant), 0, "no attempt without a proof");
        assert_eq!(server.count(Kind::BackendPid), 6, "one proof per check");
        assert_eq!((server.returned, server.closed), (6, 0), "nothing closed");
    }
    assert!(!running.elector.is_leader());
    // The limit lifted: the next proof passes and the replica leads.
    fake.lock().outside_refused = false;
    let _term = timeout(2 * I, running.elector.next_term(&CancellationToken::new()))
        .await
        .unwrap()
        .unwrap();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_check_answer_that_lands_at_its_deadline_does_not_extend_the_term() {
    let fake = Fake::default();
    let running = run(elector(&fake, |c| c));
    let term = running.first_term().await;
    // The answer and the deadline fall due at the same instant: the deadline fires first.
    fake.fault(Kind::Verify, Fault::Delay(I));
    let why = timeout(3 * I, term.ended()).await.unwrap();
    assert_eq!(why, TermEndCause::Lost(LossReason::CheckTimedOut));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_check_answer_just_before_its_deadline_keeps_the_term() {
    let fake = Fake::default();
    let running = run(elector(&fake, |c| c));
    let term = running.first_term().await;
    fake.fault(Kind::Verify, Fault::Delay(I - Duration::from_millis(1)));
    tokio::time::sleep(10 * I).await;
    assert!(term.is_live(), "{:?}", term.cause());
    let checks = fake
        .lock()
        .log
        .iter()
        .filter(|k| **k == Kind::Verify)
        .count();
    assert!(checks >= 9, "{checks} checks in ten intervals");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_wait_granted_as_it_timed_out_is_released_on_the_same_session() {
    let fake = Fake::default();
    fake.lock().holder = Some(999); // another replica leads
    fake.fault(Kind::Grant, Fault::GrantThenLockTimeout);
    let running = run(elector(&fake, |c| c.acquire_mode(AcquireMode::Queue)));
    tokio::time::sleep(I / 2).await;
    {
        let server = fake.lock();
        assert_eq!(
            server.log,
            vec![
                Kind::BackendPid,
                Kind::BackendPid,
                Kind::ProofTry,
                Kind::ProofTry,
                Kind::ProofRelease,
                Kind::BoundIdle,
                Kind::Grant,
                Kind::ReleaseIfHeld
            ]
        );
        assert_eq!(
            server.holder, None,
            "the lock granted at the timeout was released"
        );
        // The proof's pooled connection, then the check's: both back to the pool (the proof's
        // second session was its own, outside the pool).
        assert_eq!((server.returned, server.closed), (2, 0), "back to the pool");
    }
    assert!(!running.elector.is_leader());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_wait_whose_release_fails_closes_the_session_of_unknown_state() {
    let fake = Fake::default();
    fake.lock().holder = Some(999);
    fake.fault(Kind::Grant, Fault::GrantThenLockTimeout);
    fake.fault(Kind::ReleaseIfHeld, Fault::Hang);
    let running = run(elector(&fake, |c| c.acquire_mode(AcquireMode::Queue)));
    // The release is bounded by the grant statement's budget: the lock timeout plus one interval.
    tokio::time::sleep(2 * I + I / 2).await;
    {
        let server = fake.lock();
        // The proof's pooled connection went back; the check's session was closed.
        assert_eq!(
            (server.returned, server.closed),
            (1, 1),
            "closed, never returned"
        );
        // Closing session 3 released its lock (the next check's session 4 meets the same race).
        assert_ne!(server.holder, Some(3));
    }
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stop_whose_unlock_never_answers_closes_after_the_unlock_budget() {
    let fake = Fake::default();
    let running = run(elector(&fake, |c| c));
    drop(running.first_term().await);
    fake.fault(Kind::Unlock, Fault::Hang);
    let took = running.stop().await;
    assert_eq!(
        took, UNLOCK_BUDGET,
        "no work to wait for, then the whole unlock budget"
    );
    let server = fake.lock();
    assert_eq!(server.closed, 1);
    assert_eq!(server.holder, None, "closing the session released the lock");
}

#[tokio::test(start_paused = true)]
async fn a_stop_during_a_standby_check_closes_the_session_at_once() {
    let fake = Fake::default();
    fake.lock().holder = Some(999);
    fake.fault(Kind::Grant, Fault::Hang);
    let running = run(elector(&fake, |c| c));
    tokio::time::sleep(I / 2).await;
    let took = running.stop().await;
    assert_eq!(took, Duration::ZERO);
    let server = fake.lock();
    assert_eq!(
        (server.returned, server.closed),
        (1, 1),
        "its state is unknown (the proof's pooled connection went back)"
    );
    assert_eq!(server.holder, Some(999));
}

#[tokio::test(start_paused = true)]
async fn the_end_of_the_lock_session_ends_the_term_at_once() {
    let fake = Fake::default();
    let running = run(elector(&fake, |c| c));
    let term = running.first_term().await;
    let lock_session = fake.lock().holder.unwrap();
    let ended_at = Instant::now();
    fake.terminate(lock_session);
    let why = term.ended().await;
    assert_eq!(why, TermEndCause::Lost(LossReason::SessionEnded));
    assert_eq!(
        ended_at.elapsed(),
        Duration::ZERO,
        "no timer stands between"
    );
    assert_eq!(fake.lock().closed, 1, "the ended session is closed");
    running.stop().await;
}

/// Work that ignores its term's cancellation, run through `run_if_leader`.
fn stubborn_work(elector: &Elector) -> tokio::task::JoinHandle<(Result<bool, RunError>, Instant)> {
    let elector = elector.clone();
    tokio::spawn(async move {
        let ran = elector
            .run_if_leader(&CancellationToken::new(), |_ignored| {
                std::future::pending::<Result<(), RunError>>()
            })
            .await;
        (ran, Instant::now())
    })
}

#[tokio::test(start_paused = true)]
async fn work_past_its_deadline_after_a_loss_is_aborted_at_the_deadline() {
    let fake = Fake::default();
    let deadline = 3 * I;
    let running = run(elector(&fake, |c| {
        c.work_deadline(deadline, crate::config::OnOverdue::Abort)
    }));
    let term = running.first_term().await;
    let work = stubborn_work(&running.elector);
    tokio::task::yield_now().await;
    let lock_session = fake.lock().holder.unwrap();
    let lost = Instant::now();
    fake.terminate(lock_session);
    drop(term);
    let (ran, returned) = work.await.unwrap();
    assert!(!ran.unwrap(), "aborted work is no failure");
    assert_eq!(returned - lost, deadline, "dropped exactly at the deadline");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn work_that_outlives_a_stop_is_aborted_as_the_run_finishes() {
    let fake = Fake::default();
    let running = run(elector(&fake, |c| {
        c.work_deadline(10 * I, crate::config::OnOverdue::Abort)
    }));
    drop(running.first_term().await);
    let work = stubborn_work(&running.elector);
    tokio::task::yield_now().await;
    let stopped = Instant::now();
    let took = running.stop().await;
    assert_eq!(
        took, I,
        "the stop grace (one interval), then an immediate unlock"
    );
    let (ran, returned) = work.await.unwrap();
    assert!(!ran.unwrap());
    assert_eq!(
        returned - stopped,
        I,
        "aborted as the run finished, not at the deadline"
    );
}

/// A clock that runs twice as fast as tokio's from its creation: readings scaled up, wake
/// instants scaled down (rounded up to the nanosecond).
#[derive(Debug)]
struct DoubleSpeed {
    origin: Instant,
}

impl crate::config::Clock for DoubleSpeed {
    fn now(&self) -> std::time::Instant {
        self.origin.into_std() + 2 * self.origin.elapsed()
    }

    fn tokio_instant(&self, reading: std::time::Instant) -> Instant {
        let local = reading.saturating_duration_since(self.origin.into_std());
        self.origin + Duration::from_nanos(u64::try_from(local.as_nanos().div_ceil(2)).unwrap())
    }
}

/// The election runs on the configured clock: at twice tokio's rate the leader checks twice
/// per interval of tokio's time, and its liveness reads the same clock.
#[tokio::test(start_paused = true)]
async fn the_election_runs_on_the_configured_clock() {
    let count_checks = |fake: &Fake| fake.lock().count(Kind::Verify);
    let tokio_clock = Fake::default();
    let fast_clock = Fake::default();
    let normal = run(elector(&tokio_clock, |c| c));
    let fast = run(elector(&fast_clock, |c| {
        c.clock(DoubleSpeed {
            origin: Instant::now(),
        })
    }));
    let _terms = (normal.first_term().await, fast.first_term().await);
    tokio::time::sleep(10 * I).await;
    let (normal_checks, fast_checks) = (count_checks(&tokio_clock), count_checks(&fast_clock));
    assert!((9..=11).contains(&normal_checks), "{normal_checks} checks");
    assert!((19..=21).contains(&fast_checks), "{fast_checks} checks");
    assert!(fast.elector.liveness().is_ok());
    normal.stop().await;
    fast.stop().await;
}
