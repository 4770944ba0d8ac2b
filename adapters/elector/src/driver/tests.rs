//! The driver against an in-memory lock server, under paused time: the paths that only turmoil
//! or a real server reached before, each in milliseconds of real time. The double implements the
//! [`SessionSource`]/[`LockSession`] seam: one advisory lock, sessions with backend pids, and a
//! fault per statement kind (delay, hang, fail, or PostgreSQL's grant-at-timeout race).
#![allow(clippy::unwrap_used)] // reason: tests fail loudly on the unexpected

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use plexsphere_leader_core::{AcquireMode, LossReason, TermEndCause, UNLOCK_BUDGET};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use crate::error::CheckError;
use crate::session::{BoxFuture, LockSession, QueryError, Row, SessionSource};
use crate::{Config, Elector, RunError};

const I: Duration = Duration::from_millis(100);

/// What a statement is, told from the statement text the driver sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// The queued wait's idle bound, armed before the wait.
    BoundIdle,
    Grant,
    Verify,
    Unlock,
    ReleaseIfHeld,
}

fn kind_of(statement: &str) -> Kind {
    let key = crate::LockKey::DEFAULT;
    if statement == crate::sql::verify(key) {
        Kind::Verify
    } else if statement == crate::sql::unlock(key) {
        Kind::Unlock
    } else if statement == crate::sql::release_if_held(key) {
        Kind::ReleaseIfHeld
    } else if statement.starts_with("SELECT set_config('idle_session_timeout'") {
        Kind::BoundIdle
    } else {
        assert!(statement.contains("advisory_lock"), "{statement}");
        Kind::Grant
    }
}

/// How the server treats a statement kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Answers after this long, from the lock table as it then is.
    Delay(Duration),
    /// Never answers.
    Hang,
    /// Grants the lock to the session at once, then answers 55P03 (a queued wait granted as its
    /// `lock_timeout` fired).
    GrantThenLockTimeout,
}

#[derive(Default)]
struct Server {
    /// The session holding the lock.
    holder: Option<u64>,
    next_session: u64,
    faults: BTreeMap<Kind, Fault>,
    /// Sessions whose end was signalled (closed, or ended by the server).
    ended: BTreeMap<u64, CancellationToken>,
    returned: u32,
    closed: u32,
    /// Every statement kind run, in order.
    log: Vec<Kind>,
}

/// The in-memory lock server, and the session source over it.
#[derive(Clone, Default)]
struct Fake {
    server: Arc<Mutex<Server>>,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fake")
    }
}

impl Fake {
    fn lock(&self) -> MutexGuard<'_, Server> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fault(&self, kind: Kind, fault: Fault) {
        self.lock().faults.insert(kind, fault);
    }

    /// The server ends session `id` (`pg_terminate_backend`): its lock is released and its
    /// client learns of it.
    fn terminate(&self, id: u64) {
        let mut server = self.lock();
        if server.holder == Some(id) {
            server.holder = None;
        }
        if let Some(ended) = server.ended.get(&id) {
            ended.cancel();
        }
    }

    fn answer(&self, id: u64, kind: Kind) -> Row {
        let mut server = self.lock();
        let pid = Some(pid_of(id).to_string());
        let held = server.holder == Some(id);
        let yes_no = |b: bool| Some(if b { "t" } else { "f" }.to_owned());
        match kind {
            Kind::BoundIdle => vec![Some("400".into()), Some("400".into())],
            Kind::Grant if server.holder.is_none() || held => {
                server.holder = Some(id);
                vec![Some("granted".into()), pid]
            }
            Kind::Grant => vec![Some("refused".into()), pid],
            Kind::Verify => vec![pid, yes_no(false), yes_no(held), Some("granted".into())],
            Kind::Unlock | Kind::ReleaseIfHeld => {
                if held {
                    server.holder = None;
                }
                vec![yes_no(held)]
            }
        }
    }
}

fn pid_of(id: u64) -> i32 {
    1000 + i32::try_from(id).unwrap()
}

impl SessionSource for Fake {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        let mut server = self.lock();
        server.next_session += 1;
        let id = server.next_session;
        server.ended.insert(id, CancellationToken::new());
        let session = FakeSession {
            id,
            fake: self.clone(),
            detached: false,
            closed: false,
        };
        Box::pin(std::future::ready(Ok(
            Box::new(session) as Box<dyn LockSession>
        )))
    }
}

struct FakeSession {
    id: u64,
    fake: Fake,
    detached: bool,
    closed: bool,
}

impl FakeSession {
    fn end_token(&self) -> CancellationToken {
        self.fake.lock().ended[&self.id].clone()
    }
}

impl LockSession for FakeSession {
    fn query<'a>(&'a self, statement: &'a str) -> BoxFuture<'a, Result<Vec<Row>, QueryError>> {
        let kind = kind_of(statement);
        Box::pin(async move {
            let (fault, ended) = {
                let mut server = self.fake.lock();
                server.log.push(kind);
                (
                    server.faults.get(&kind).copied(),
                    server.ended[&self.id].clone(),
                )
            };
            let gone = || QueryError::SessionEnded(CheckError::SessionEnded);
            if ended.is_cancelled() {
                return Err(gone());
            }
            match fault {
                Some(Fault::Hang) => std::future::pending::<()>().await,
                Some(Fault::Delay(delay)) => tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = ended.cancelled() => return Err(gone()),
                },
                Some(Fault::GrantThenLockTimeout) => {
                    self.fake.lock().holder = Some(self.id);
                    return Err(QueryError::LockTimeout(CheckError::UnexpectedReply {
                        statement: "fake",
                        detail: "55P03 lock_timeout".into(),
                    }));
                }
                None => {}
            }
            Ok(vec![self.fake.answer(self.id, kind)])
        })
    }

    fn detach(mut self: Box<Self>, backend_pid: i32) -> Box<dyn LockSession> {
        assert_eq!(backend_pid, pid_of(self.id), "the grant's own backend");
        self.detached = true;
        self
    }

    fn close(mut self: Box<Self>) {
        self.closed = true;
        self.fake.lock().closed += 1;
        self.fake.terminate(self.id);
    }

    fn ended(&self) -> BoxFuture<'_, ()> {
        let (detached, ended) = (self.detached, self.end_token());
        Box::pin(async move {
            if detached {
                ended.cancelled().await;
            } else {
                std::future::pending::<()>().await;
            }
        })
    }
}

impl Drop for FakeSession {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if self.detached {
            // A detached session is closed when dropped.
            self.fake.lock().closed += 1;
            self.fake.terminate(self.id);
        } else {
            // Back to the pool, lock and all.
            self.fake.lock().returned += 1;
        }
    }
}

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
            vec![Kind::BoundIdle, Kind::Grant, Kind::ReleaseIfHeld]
        );
        assert_eq!(
            server.holder, None,
            "the lock granted at the timeout was released"
        );
        assert_eq!((server.returned, server.closed), (1, 0), "back to the pool");
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
        assert_eq!(
            (server.returned, server.closed),
            (0, 1),
            "closed, never returned"
        );
        // Closing session 1 released its lock (the next check's session 2 meets the same race).
        assert_ne!(server.holder, Some(1));
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
        (0, 1),
        "its state is unknown"
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
