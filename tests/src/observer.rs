//! [`LockObserver`]: who holds the leader lock, polled from `pg_locks`.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_postgres::{Client, Config};

use crate::timeline::{self, Interval, Span};
use crate::{HarnessError, connect};

/// The spec's query for the leader lock, joined with `pg_stat_activity`.
pub(crate) const LOCK_QUERY: &str = "SELECT l.pid, l.granted, a.application_name, a.client_addr, \
     a.client_port FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid) \
     WHERE l.locktype='advisory' AND l.classid=1886156915 AND l.objid=1 AND l.objsubid=2 \
     AND l.database=(SELECT oid FROM pg_database WHERE datname=current_database())";

/// Default time between two polls.
const DEFAULT_EVERY: Duration = Duration::from_millis(50);
/// Longest a poll (or a reconnect) may take before it counts as failed.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);

/// The session holding the leader lock (a granted row of the lock query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Backend pid of the holding session.
    pub pid: i32,
    /// Its `application_name`, for an elector's lock session its identity without the
    /// ` since <grant time>` the grant appends (`None` if the backend was gone from
    /// `pg_stat_activity`).
    pub application_name: Option<String>,
    /// Its client address.
    pub client_addr: Option<IpAddr>,
    /// Its client port.
    pub client_port: Option<i32>,
}

impl Holder {
    /// `<application_name>#<pid>`, a name unique per session for [`timeline`] functions.
    pub fn label(&self) -> String {
        format!(
            "{}#{}",
            self.application_name.as_deref().unwrap_or(""),
            self.pid
        )
    }
}

/// The holder changed (or was first seen) at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderChange {
    /// When the poll that saw the change answered (accurate to one poll interval).
    pub at: Instant,
    /// The new holder, `None` when nobody holds the lock.
    pub holder: Option<Holder>,
}

#[derive(Debug, Clone, Default)]
struct Observation {
    polls: u64,
    /// Whether the latest poll answered (`holder` is then fresh, not left from before a failure).
    ok: bool,
    holder: Option<Holder>,
}

#[derive(Debug, Default)]
struct State {
    timeline: Vec<HolderChange>,
    errors: u64,
    reconnects: u64,
    last_error: Option<String>,
    max_granted: usize,
}

struct Poller {
    config: Config,
    client: Option<Client>,
    state: Arc<Mutex<State>>,
    tx: watch::Sender<Observation>,
}

/// Polls the leader lock on its own connection (`application_name` `plx-harness-observer`)
/// every 50 ms by default and records a timeline of holders.
///
/// A failed poll (server down, restarted) is counted in [`Self::errors`] and the observer
/// reconnects at the next poll; the timeline is not changed while it cannot see the server.
/// Times are accurate to one poll interval. Dropping the observer stops polling.
#[derive(Debug)]
pub struct LockObserver {
    state: Arc<Mutex<State>>,
    latest: watch::Receiver<Observation>,
    task: JoinHandle<()>,
    started: Instant,
}

impl LockObserver {
    /// Starts observing the database of `config`, polling every 50 ms. The first poll has
    /// answered when this returns.
    pub async fn start(config: &Config) -> Result<Self, HarnessError> {
        Self::start_with_interval(config, DEFAULT_EVERY).await
    }

    /// Starts observing the database of `config`, polling every `every`.
    pub async fn start_with_interval(
        config: &Config,
        every: Duration,
    ) -> Result<Self, HarnessError> {
        let mut config = config.clone();
        config.application_name("plx-harness-observer");
        let started = Instant::now();
        let client = connect(&config).await?;
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, latest) = watch::channel(Observation::default());
        let mut poller = Poller {
            config,
            client: Some(client),
            state: Arc::clone(&state),
            tx,
        };
        poller.poll().await?;
        let task = tokio::spawn(poller.run(every));
        Ok(Self {
            state,
            latest,
            task,
            started,
        })
    }

    /// The holder seen by the latest successful poll (stale while polls fail: see
    /// [`Self::errors`]).
    pub fn current(&self) -> Option<Holder> {
        self.latest.borrow().holder.clone()
    }

    /// How many polls have answered.
    pub fn polls(&self) -> u64 {
        self.latest.borrow().polls
    }

    /// How many polls failed (connection lost, server down, timeout).
    pub fn errors(&self) -> u64 {
        self.lock().errors
    }

    /// How many times the observer's session was found closed (server restarted, session
    /// terminated) and replaced by a new one.
    pub fn reconnects(&self) -> u64 {
        self.lock().reconnects
    }

    /// The error of the latest failed poll.
    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    /// The most granted rows one poll has seen: 1 while any replica led, never more (the server
    /// grants the lock to one session).
    pub fn max_granted(&self) -> usize {
        self.lock().max_granted
    }

    /// Waits until some session holds the lock; `None` if none did within `timeout`.
    ///
    /// Like every `wait_for_*`, it looks only at the latest poll, and only if that poll
    /// answered: after a failure it waits for a fresh answer.
    pub async fn wait_for_holder(&self, timeout: Duration) -> Option<Holder> {
        self.wait_for(timeout, |h| h.is_some()).await.flatten()
    }

    /// Waits until a session other than backend `pid` holds the lock.
    pub async fn wait_for_new_holder(&self, pid: i32, timeout: Duration) -> Option<Holder> {
        self.wait_for(timeout, |h| h.as_ref().is_some_and(|h| h.pid != pid))
            .await
            .flatten()
    }

    /// Waits until the session holding the lock is named `application_name` (a grant renames a
    /// pooled session it took over, and the observer sees it at its next poll).
    pub async fn wait_for_holder_named(
        &self,
        application_name: &str,
        timeout: Duration,
    ) -> Option<Holder> {
        self.wait_for(timeout, |h| {
            h.as_ref()
                .is_some_and(|h| h.application_name.as_deref() == Some(application_name))
        })
        .await
        .flatten()
    }

    /// Waits until nobody holds the lock; `false` if someone still did after `timeout`.
    pub async fn wait_for_no_holder(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, |h| h.is_none()).await.is_some()
    }

    /// The changes of holder, oldest first. The first entry is what the first poll saw.
    pub fn timeline(&self) -> Vec<HolderChange> {
        self.lock().timeline.clone()
    }

    /// When the observer started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The holders as [`Interval`]s (replica [`Holder::label`]), the last one open until `until`.
    pub fn holder_intervals(&self, until: Instant) -> Vec<Interval> {
        holder_intervals(&self.timeline(), until)
    }

    /// Spans without a holder between the first time a holder was seen and `until` (empty if
    /// no holder was ever seen). Spans shorter than one poll interval can go unseen.
    pub fn leaderless_gaps(&self, until: Instant) -> Vec<Span> {
        let intervals = self.holder_intervals(until);
        match intervals.first() {
            Some(first) => timeline::leaderless_gaps(
                &intervals,
                Span {
                    start: first.start,
                    end: until,
                },
            ),
            None => Vec::new(),
        }
    }

    async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Option<Holder>) -> bool,
    ) -> Option<Option<Holder>> {
        let mut rx = self.latest.clone();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|o| o.ok && pred(&o.holder)));
        match waited.await {
            Ok(Ok(o)) => Some(o.holder.clone()),
            _ => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Drop for LockObserver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state stays consistent even if a holder of the lock panicked: recover it.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Poller {
    async fn run(mut self, every: Duration) {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            if let Err(e) = self.poll().await {
                {
                    let mut state = lock(&self.state);
                    state.errors += 1;
                    state.last_error = Some(e.to_string());
                }
                self.tx.send_modify(|o| o.ok = false);
            }
        }
    }

    async fn poll(&mut self) -> Result<(), HarnessError> {
        let client = match self.client.take() {
            Some(c) if !c.is_closed() => c,
            _ => {
                // The first client comes from `start`; every later one replaces a lost session.
                let client = tokio::time::timeout(POLL_TIMEOUT, connect(&self.config))
                    .await
                    .map_err(|_| timeout("observer connect"))??;
                lock(&self.state).reconnects += 1;
                client
            }
        };
        let rows = tokio::time::timeout(POLL_TIMEOUT, client.query(LOCK_QUERY, &[]))
            .await
            .map_err(|_| timeout("observer poll"))??;
        self.client = Some(client);
        let at = Instant::now();
        let mut granted = Vec::new();
        for row in &rows {
            if row.try_get::<_, bool>(1)? {
                granted.push(Holder {
                    pid: row.try_get(0)?,
                    application_name: row
                        .try_get::<_, Option<String>>(2)?
                        .map(|name| leader_name(&name)),
                    client_addr: row.try_get(3)?,
                    client_port: row.try_get(4)?,
                });
            }
        }
        let holder = granted.first().cloned();
        {
            let mut state = lock(&self.state);
            state.max_granted = state.max_granted.max(granted.len());
            let changed = state.timeline.last().is_none_or(|last| {
                last.holder.as_ref().map(|h| h.pid) != holder.as_ref().map(|h| h.pid)
            });
            if changed {
                state.timeline.push(HolderChange {
                    at,
                    holder: holder.clone(),
                });
            }
        }
        self.tx.send_modify(|o| {
            o.polls += 1;
            o.ok = true;
            o.holder = holder;
        });
        Ok(())
    }
}

fn timeout(what: &str) -> HarnessError {
    HarnessError::Timeout {
        what: what.to_owned(),
        after: POLL_TIMEOUT,
    }
}

/// Turns a change list into intervals, one per holding session.
fn holder_intervals(changes: &[HolderChange], until: Instant) -> Vec<Interval> {
    let mut out = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        if let Some(holder) = &change.holder {
            let end = changes.get(i + 1).map_or(until, |next| next.at);
            out.push(Interval {
                replica: holder.label(),
                start: change.at,
                end: end.max(change.at),
            });
        }
    }
    out
}

/// The name a lock holder goes by: the identity of an elector's `<identity> since <grant time>`
/// `application_name`, or the name itself when it has another form (a harness client).
pub(crate) fn leader_name(application_name: &str) -> String {
    plexsphere_leader::status::parse_application_name(application_name)
        .map_or(application_name, |(identity, _)| identity)
        .to_owned()
}
