//! Connection setups that outlive the check that began them.
//!
//! A standby's acquire is bounded by one check interval, connection setup included. When
//! setting up a connection takes longer than that (many electors starting at once at a short
//! interval, a slow network), cancelling the setup with the abandoned acquire means that every
//! check begins a new setup which its own deadline cancels again: nothing ever connects, and the
//! server forks a backend for each attempt thrown away. So a setup that is still in progress
//! when its check gives up is kept instead: it is *parked* in its source, and the next acquire
//! of the same source resumes it rather than beginning another.
//!
//! - **Kept only for the next check.** The election says when: a check whose acquire timed out
//!   gives its connection back (`ReturnToPool`), and the next check begins at once, in the same
//!   turn of the driver, and resumes the setup, so a setup is driven without pause. When the
//!   election instead closes the connection it was acquiring (`CloseConnection`: the run is
//!   cancelled, dropped or panics, or the replica steps down), the driver calls
//!   [`SessionSource::cancel_kept`](super::SessionSource::cancel_kept) and the setup is
//!   cancelled before the run returns, as it always was: nothing of a run outlives it.
//! - **Resumed in the caller's task.** Nothing else polls a parked setup, so it runs in whatever
//!   task and context the elector runs in (a connector may rely on it, for example on a
//!   `LocalSet`).
//! - **Bounded.** At most one setup is parked per source (clones of a source share it). A parked
//!   setup is given up (dropped, which cancels it) once it has run for [`RESUME_FACTOR`] times
//!   the longer of two durations, and at least [`RESUME_FLOOR`]: how long the check that began
//!   it waited for it (one interval), and how long this source's last new connection took to
//!   set up (nothing if it only ever had connections the pool had ready; [`UNPROVEN_SETUP`]
//!   before its first connection of any kind). It is given up when the next acquire finds it
//!   past that bound, when its check gives up on it past it, or, if neither comes, by a timer
//!   task that holds only a weak reference; and when the last clone of the source is dropped.
//!   Outside a tokio runtime (no timer to bound it) a setup is never parked.
//! - **Why that bound.** A setup that hangs for good (its startup bytes lost on a one-way
//!   partition) delays a fresh attempt until its bound. Where connections are set up within an
//!   interval, the bound is two intervals, within what the bounds of a fault's aftermath allow
//!   (design section 6; the simulation checks them). Where they take longer, as in a cold start
//!   of many electors or at an interval of a few milliseconds, the last new connection's time
//!   says how long a setup that is not hung may take. A source that never had a connection has
//!   no such evidence: it allows [`UNPROVEN_SETUP`], so its first setup is kept for at least
//!   twice that.
//! - **Counted.** [`LateSetups`]: setups that connected for a later acquire, and setups given
//!   up; each is also a `DEBUG` event.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// A parked setup is given up once it has run this many times as long as the longer of its
/// check's wait and the source's last setup that connected: with a fast server, one more check
/// resumes it.
pub(crate) const RESUME_FACTOR: u32 = 2;

/// What a setup is expected to take while its source has never had a connection: long enough
/// for a hundred electors starting at once on one server, at any check interval (so a first
/// setup is kept for at least twice this).
pub(crate) const UNPROVEN_SETUP: Duration = Duration::from_secs(1);

/// A parked setup is never given up before it has run this long: a new connection to a local
/// server takes a few milliseconds, to a busy one a few tens. Only intervals under 50 ms reach
/// this floor.
pub(crate) const RESUME_FLOOR: Duration = Duration::from_millis(100);

/// A connection setup in progress ([`KeptSetups::run`]): boxed, so that it can be parked.
pub type Setup<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// What became of the connection setups that a check gave up on ([`KeptSetups::counts`]; the
/// backends' `late_setups`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LateSetups {
    /// Setups that a later acquire resumed and that handed it its connection.
    pub finished: u64,
    /// Setups given up, and so cancelled: the elector closed the connection they were for (its
    /// run stopped, or it stepped down), they outlived their bound, another setup was already
    /// parked, or no runtime could bound them.
    pub given_up: u64,
}

/// The connection setup a [`SessionSource`](super::SessionSource) keeps for its next acquire
/// when the check that began it gave up (see the module docs): at most one, bounded, shared by
/// the clones. A backend's `acquire` runs its pool's checkout through [`run`](Self::run), and
/// its [`cancel_kept`](super::SessionSource::cancel_kept) calls [`cancel`](Self::cancel); the
/// deadpool backend and the sqlx crate do, and so can any other source.
///
/// `T` is what a setup yields (the pooled connection), `E` its error.
pub struct KeptSetups<T, E> {
    inner: Arc<Inner<T, E>>,
}

impl<T, E> Clone for KeptSetups<T, E> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T, E> std::fmt::Debug for KeptSetups<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parked = self
            .inner
            .parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("KeptSetups")
            .field("parked", &parked)
            .field("finished", &self.inner.finished.load(Ordering::Relaxed))
            .field("given_up", &self.inner.given_up.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T, E> Default for KeptSetups<T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

struct Inner<T, E> {
    parked: Mutex<Option<Running<T, E>>>,
    next_id: AtomicU64,
    finished: AtomicU64,
    given_up: AtomicU64,
    /// How long the last new connection took to set up, in nanoseconds: 0 after connections
    /// the pool had ready, until a new one; [`NEVER`] before the first connection of any kind.
    last_new: AtomicU64,
}

/// [`Inner::last_new`] before the first connection.
const NEVER: u64 = u64::MAX;

/// A setup and what bounds it.
struct Running<T, E> {
    setup: Setup<T, E>,
    id: u64,
    began: Instant,
    /// When it is given up; set when a check first gives up on it.
    expires: Option<Instant>,
}

impl<T, E> KeptSetups<T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    /// No setup parked.
    #[must_use]
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                parked: Mutex::new(None),
                next_id: AtomicU64::new(0),
                finished: AtomicU64::new(0),
                given_up: AtomicU64::new(0),
                last_new: AtomicU64::new(NEVER),
            }),
        }
    }

    /// Runs a setup to its end: the parked one if there is one within its bound, else the one
    /// `begin` makes. Dropping the returned future before the end parks the setup (outside a
    /// tokio runtime it is cancelled instead: no timer could bound it). `new` tells a
    /// connection the setup made from one its pool had ready: only the time of the former
    /// bounds later setups.
    ///
    /// # Errors
    /// The setup's own error, as it returned it.
    pub async fn run(
        &self,
        begin: impl FnOnce() -> Setup<T, E>,
        new: impl FnOnce(&T) -> bool,
    ) -> Result<T, E> {
        let now = Instant::now();
        let running = match self.inner.resume(now) {
            Some(parked) => parked,
            None => Running {
                setup: begin(),
                id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
                began: now,
                expires: None,
            },
        };
        let (output, began, late) = InFlight {
            inner: &self.inner,
            running: Some(running),
        }
        .await;
        if let Ok(connection) = &output {
            self.inner.connected(began.elapsed(), new(connection), late);
        }
        output
    }

    /// Cancels the parked setup, if any: nothing will resume it.
    pub fn cancel(&self) {
        let parked = self.inner.parked().take();
        if let Some(running) = parked {
            self.inner
                .give_up(running, "the connection it was for was closed");
        }
    }

    /// The counts so far, over every clone.
    #[must_use]
    pub fn counts(&self) -> LateSetups {
        LateSetups {
            finished: self.inner.finished.load(Ordering::Relaxed),
            given_up: self.inner.given_up.load(Ordering::Relaxed),
        }
    }
}

impl<T, E> Inner<T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    fn parked(&self) -> MutexGuard<'_, Option<Running<T, E>>> {
        // Nothing panics while holding the lock; a poisoned slot is still consistent.
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A setup handed out a connection after `took`: a `new` one, and `late` when a check had
    /// given up on it.
    fn connected(&self, took: Duration, new: bool, late: bool) {
        if new {
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(NEVER - 1);
            self.last_new.store(nanos, Ordering::Relaxed);
        } else {
            // A pool that had a connection ready is no cold start.
            let _ = self
                .last_new
                .compare_exchange(NEVER, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        if late {
            self.finished.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                ?took,
                "a connection setup that a check gave up on connected"
            );
        }
    }

    /// What a new connection is expected to take: as long as the last one (nothing when the
    /// pool had connections ready before), or [`UNPROVEN_SETUP`] before any connection.
    fn expected(&self) -> Duration {
        match self.last_new.load(Ordering::Relaxed) {
            NEVER => UNPROVEN_SETUP,
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// Takes the parked setup, unless it is past its bound (then it is given up).
    fn resume(&self, now: Instant) -> Option<Running<T, E>> {
        let parked = self.parked().take()?;
        if parked.expires.is_some_and(|expires| now >= expires) {
            self.give_up(parked, "it outlived its bound");
            return None;
        }
        Some(parked)
    }

    /// Keeps `running`, whose check gave up on it, for the next acquire.
    fn park(self: &Arc<Self>, mut running: Running<T, E>, now: Instant) {
        let first = running.expires.is_none();
        let expires = *running.expires.get_or_insert_with(|| {
            let waited = now.saturating_duration_since(running.began);
            running.began + (waited.max(self.expected()) * RESUME_FACTOR).max(RESUME_FLOOR)
        });
        if now >= expires {
            return self.give_up(running, "it outlived its bound");
        }
        let runtime = tokio::runtime::Handle::try_current();
        if first && runtime.is_err() {
            return self.give_up(running, "no runtime to bound it");
        }
        let id = running.id;
        let refused = {
            let mut slot = self.parked();
            match *slot {
                Some(_) => Some(running),
                None => {
                    *slot = Some(running);
                    None
                }
            }
        };
        if let Some(running) = refused {
            return self.give_up(running, "another setup is parked");
        }
        tracing::debug!("a check gave up on its connection setup: parked for the next check");
        if let (true, Ok(runtime)) = (first, runtime) {
            runtime.spawn(expire_at(Arc::downgrade(self), id, expires));
        }
    }

    /// Gives up the parked setup `id`, if it is still parked.
    fn expire(&self, id: u64) {
        let expired = {
            let mut slot = self.parked();
            match &*slot {
                Some(parked) if parked.id == id => slot.take(),
                _ => None,
            }
        };
        if let Some(running) = expired {
            self.give_up(running, "no check resumed it within its bound");
        }
    }

    /// Drops (cancels) `running`, outside the lock.
    fn give_up(&self, running: Running<T, E>, why: &'static str) {
        drop(running);
        self.given_up.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            why,
            "a connection setup that a check gave up on was cancelled"
        );
    }
}

/// The bound's timer: gives up setup `id` at `expires` if nobody resumed it by then.
async fn expire_at<T, E>(inner: Weak<Inner<T, E>>, id: u64, expires: Instant)
where
    T: Send + 'static,
    E: Send + 'static,
{
    tokio::time::sleep_until(expires).await;
    if let Some(inner) = inner.upgrade() {
        inner.expire(id);
    }
}

/// A setup being driven by one acquire: resolves with its output, when it began and whether a
/// check gave up on it before; parks it when dropped before that.
struct InFlight<'a, T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    inner: &'a Arc<Inner<T, E>>,
    running: Option<Running<T, E>>,
}

impl<T, E> Future for InFlight<'_, T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    type Output = (Result<T, E>, Instant, bool);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(running) = self.running.as_mut() else {
            // Already resolved: a future is not polled again.
            return Poll::Pending;
        };
        let output = std::task::ready!(running.setup.as_mut().poll(cx));
        let (began, late) = (running.began, running.expires.is_some());
        self.running = None;
        Poll::Ready((output, began, late))
    }
}

impl<T, E> Drop for InFlight<'_, T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            self.inner.park(running, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests;
