//! The in-memory lock server both modes' driver tests run against, behind the
//! [`SessionSource`]/[`LockSession`] seam: the single election's advisory lock, the member lock
//! and shard locks of one shard space, sessions with backend pids, and a fault per statement
//! kind (delay, hang, or PostgreSQL's grant-at-timeout race).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::CheckError;
use crate::session::{BoxFuture, LockSession, QueryError, Row, SessionSource};

/// What a statement is, told from the statement text the driver sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    /// The queued wait's idle bound, armed before the wait.
    BoundIdle,
    /// The exclusion proof's `SELECT pg_backend_pid()`.
    BackendPid,
    /// The exclusion proof's lock test ([`crate::sql::prove_exclusion`]).
    ProofTry,
    /// The exclusion proof's release ([`crate::sql::release_proof`]).
    ProofRelease,
    Grant,
    Verify,
    Unlock,
    ReleaseIfHeld,
    /// A shard space's registration: the member lock, shared.
    Register,
    Survey,
    Take,
    UnlockShards,
    UnlockAll,
}

fn kind_of(statement: &str) -> Kind {
    let key = crate::LockKey::DEFAULT;
    if statement == crate::sql::BACKEND_PID {
        Kind::BackendPid
    } else if statement == crate::sql::verify(key) {
        Kind::Verify
    } else if statement == crate::sql::unlock(key) {
        Kind::Unlock
    } else if statement == crate::sql::release_if_held(key) {
        Kind::ReleaseIfHeld
    } else if statement.starts_with("SELECT pg_backend_pid(), pg_try_advisory_lock(") {
        Kind::ProofTry
    } else if statement.starts_with("SELECT pg_advisory_unlock(") && !statement.contains("_all") {
        Kind::ProofRelease
    } else if statement == crate::shard_sql::unlock_all() {
        Kind::UnlockAll
    } else if statement.starts_with("SELECT set_config('idle_session_timeout'") {
        Kind::BoundIdle
    } else if statement.starts_with("SELECT pg_backend_pid(), CASE") {
        Kind::Register
    } else if statement.starts_with("SELECT h.pid, h.member, h.shards") {
        Kind::Survey
    } else if statement.contains("WHERE pg_try_advisory_lock(") {
        Kind::Take
    } else if statement.contains("WHERE NOT pg_advisory_unlock(") {
        Kind::UnlockShards
    } else {
        assert!(statement.contains("advisory_lock"), "{statement}");
        Kind::Grant
    }
}

/// The shards of a take or an unlock: its `'{0,1}'::int4[]`.
fn shards_of(statement: &str) -> Vec<u32> {
    let list = statement
        .split_once("'{")
        .and_then(|(_, rest)| rest.split_once("}'"))
        .map_or("", |(list, _)| list);
    list.split(',').filter_map(|n| n.parse().ok()).collect()
}

/// The text between a statement's first parentheses after its lock function: a key's
/// arguments.
fn arguments(statement: &str) -> String {
    let after = statement
        .split_once("advisory_lock(")
        .or_else(|| statement.split_once("advisory_unlock("))
        .map_or("", |(_, rest)| rest);
    after
        .split_once(')')
        .map_or(after, |(args, _)| args)
        .to_owned()
}

/// How the server treats a statement kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// Answers after this long, from the lock table as it then is.
    Delay(Duration),
    /// Never answers.
    Hang,
    /// Grants the lock to the session at once, then answers 55P03 (a queued wait granted as its
    /// `lock_timeout` fired).
    GrantThenLockTimeout,
}

#[derive(Default)]
pub(super) struct Server {
    /// The session holding the single election's lock.
    pub(super) holder: Option<u64>,
    /// The sessions holding the shard space's member lock (shared).
    pub(super) members: BTreeSet<u64>,
    /// Each held shard's lock and the session holding it.
    pub(super) shards: BTreeMap<u32, u64>,
    next_session: u64,
    faults: BTreeMap<Kind, Fault>,
    /// Sessions whose end was signalled (closed, or ended by the server).
    ended: BTreeMap<u64, CancellationToken>,
    pub(super) returned: u32,
    pub(super) closed: u32,
    /// The leader's check finds its session marked `shared` (another client's grant ran on
    /// it: a transaction-mode pooler multiplexes server sessions).
    pub(super) multiplexed: bool,
    /// A pool of this many connections: an acquire while that many are borrowed never
    /// completes (the tests that use it need no wake-up).
    pub(super) pool_size: Option<usize>,
    /// Borrowed pooled connections (not yet given back, closed or detached).
    borrowed: usize,
    /// The advisory lock grants every session (a server whose lock functions are stubs).
    pub(super) vacuous: bool,
    /// The exclusion proof's keys (their arguments' text) and the sessions holding them.
    proof_keys: BTreeMap<String, u64>,
    /// Sessions opened outside the pool (the exclusion proof's second session).
    pub(super) opened_outside: u32,
    /// Opening a session outside the pool fails (a connection limit, a full server).
    pub(super) outside_refused: bool,
    /// Every statement kind run, in order.
    pub(super) log: Vec<Kind>,
}

impl Server {
    /// How many statements of `kind` ran.
    pub(super) fn count(&self, kind: Kind) -> usize {
        self.log.iter().filter(|k| **k == kind).count()
    }

    /// Every lock session `id` holds is released.
    fn release_all(&mut self, id: u64) {
        if self.holder == Some(id) {
            self.holder = None;
        }
        self.members.remove(&id);
        self.shards.retain(|_, holder| *holder != id);
        self.proof_keys.retain(|_, holder| *holder != id);
    }
}

/// The in-memory lock server, and the session source over it.
#[derive(Clone, Default)]
pub(super) struct Fake {
    server: Arc<Mutex<Server>>,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fake")
    }
}

impl Fake {
    pub(super) fn lock(&self) -> MutexGuard<'_, Server> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn fault(&self, kind: Kind, fault: Fault) {
        self.lock().faults.insert(kind, fault);
    }

    pub(super) fn heal(&self, kind: Kind) {
        self.lock().faults.remove(&kind);
    }

    /// The server ends session `id` (`pg_terminate_backend`): its locks are released and its
    /// client learns of it.
    pub(super) fn terminate(&self, id: u64) {
        let mut server = self.lock();
        server.release_all(id);
        if let Some(ended) = server.ended.get(&id) {
            ended.cancel();
        }
    }

    fn answer(&self, id: u64, kind: Kind, statement: &str) -> Vec<Row> {
        let mut server = self.lock();
        let pid = Some(pid_of(id).to_string());
        let held = server.holder == Some(id);
        let yes_no = |b: bool| Some(if b { "t" } else { "f" }.to_owned());
        let number = |n: u64| Some(n.to_string());
        match kind {
            Kind::BoundIdle => vec![vec![Some("400".into()), Some("400".into())]],
            // A multiplexing pooler answers every client from one server backend.
            Kind::BackendPid if server.multiplexed => vec![vec![Some(pid_of(0).to_string())]],
            Kind::BackendPid => vec![vec![pid]],
            Kind::ProofTry => {
                let key = arguments(statement);
                let holder = *server.proof_keys.entry(key).or_insert(id);
                let answered = pid_of(if server.multiplexed { 0 } else { id }).to_string();
                vec![vec![Some(answered), yes_no(server.vacuous || holder == id)]]
            }
            Kind::ProofRelease => {
                let key = arguments(statement);
                let mine = server.proof_keys.get(&key) == Some(&id);
                if mine {
                    server.proof_keys.remove(&key);
                }
                vec![vec![yes_no(mine)]]
            }
            Kind::Grant if server.holder.is_none() || held || server.vacuous => {
                server.holder = Some(id);
                vec![vec![Some("granted".into()), pid]]
            }
            Kind::Grant => vec![vec![Some("refused".into()), pid]],
            Kind::Verify => vec![vec![
                pid,
                yes_no(false),
                yes_no(held),
                Some(
                    if server.multiplexed {
                        "shared"
                    } else {
                        "granted"
                    }
                    .into(),
                ),
            ]],
            Kind::Unlock | Kind::ReleaseIfHeld => {
                if held {
                    server.holder = None;
                }
                vec![vec![yes_no(held)]]
            }
            Kind::Register => {
                let others = server.members.iter().filter(|m| **m != id).count();
                server.members.insert(id);
                vec![vec![
                    pid,
                    yes_no(true),
                    number(6400),
                    number(others as u64),
                    yes_no(false),
                ]]
            }
            Kind::Survey => {
                let holders: BTreeSet<u64> = server
                    .members
                    .iter()
                    .chain(server.shards.values())
                    .copied()
                    .collect();
                if holders.is_empty() {
                    return vec![vec![None, None, None, None, pid]];
                }
                holders
                    .into_iter()
                    .map(|holder| {
                        let shards: Vec<String> = server
                            .shards
                            .iter()
                            .filter(|(_, h)| **h == holder)
                            .map(|(s, _)| s.to_string())
                            .collect();
                        vec![
                            Some(pid_of(holder).to_string()),
                            yes_no(server.members.contains(&holder)),
                            (!shards.is_empty()).then(|| format!("{{{}}}", shards.join(","))),
                            None,
                            pid.clone(),
                        ]
                    })
                    .collect()
            }
            Kind::Take => shards_of(statement)
                .into_iter()
                .filter(|s| *server.shards.entry(*s).or_insert(id) == id)
                .map(|s| vec![number(u64::from(s))])
                .collect(),
            Kind::UnlockShards => shards_of(statement)
                .into_iter()
                .filter(|s| {
                    let mine = server.shards.get(s) == Some(&id);
                    if mine {
                        server.shards.remove(s);
                    }
                    !mine
                })
                .map(|s| vec![number(u64::from(s))])
                .collect(),
            Kind::UnlockAll => {
                server.release_all(id);
                vec![vec![Some(String::new())]]
            }
        }
    }
}

pub(super) fn pid_of(id: u64) -> i32 {
    1000 + i32::try_from(id).unwrap()
}

impl SessionSource for Fake {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        let mut server = self.lock();
        if server.pool_size.is_some_and(|size| server.borrowed >= size) {
            return Box::pin(std::future::pending());
        }
        server.borrowed += 1;
        server.next_session += 1;
        let id = server.next_session;
        server.ended.insert(id, CancellationToken::new());
        let session = FakeSession {
            id,
            fake: self.clone(),
            detached: false,
            closed: false,
            outside: false,
        };
        Box::pin(std::future::ready(Ok(
            Box::new(session) as Box<dyn LockSession>
        )))
    }

    /// A session of its own, never counted in the pool: closed when dropped.
    fn open_outside_pool(&self) -> BoxFuture<'_, Result<Box<dyn LockSession>, CheckError>> {
        let mut server = self.lock();
        if server.outside_refused {
            return Box::pin(std::future::ready(Err(CheckError::UnexpectedReply {
                statement: "fake",
                detail: "53300 too many connections for role".into(),
            })));
        }
        server.next_session += 1;
        server.opened_outside += 1;
        let id = server.next_session;
        server.ended.insert(id, CancellationToken::new());
        let session = FakeSession {
            id,
            fake: self.clone(),
            detached: true,
            closed: false,
            outside: true,
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
    /// Opened outside the pool: its end is not counted among the pool's closes.
    outside: bool,
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
            Ok(self.fake.answer(self.id, kind, statement))
        })
    }

    fn detach(mut self: Box<Self>, backend_pid: i32) -> Box<dyn LockSession> {
        assert_eq!(backend_pid, pid_of(self.id), "the grant's own backend");
        self.detached = true;
        self.fake.lock().borrowed -= 1; // out of the pool
        self
    }

    fn close(mut self: Box<Self>) {
        self.closed = true;
        if !self.outside {
            let mut server = self.fake.lock();
            server.closed += 1;
            if !self.detached {
                server.borrowed -= 1;
            }
        }
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
        if self.outside {
            self.fake.terminate(self.id);
        } else if self.detached {
            // A detached session is closed when dropped.
            self.fake.lock().closed += 1;
            self.fake.terminate(self.id);
        } else {
            // Back to the pool, lock and all.
            let mut server = self.fake.lock();
            server.returned += 1;
            server.borrowed -= 1;
        }
    }
}
