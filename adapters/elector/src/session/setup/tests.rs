//! The parked setup, under tokio's paused clock: resumed by the next acquire, bounded, counted.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::{KeptSetups, LateSetups, RESUME_FLOOR, Setup, UNPROVEN_SETUP};

const MS: Duration = Duration::from_millis(1);

/// Far beyond any bound here.
const NEVER: Duration = Duration::from_secs(3600);

/// The bound of a setup of a source that has never connected, whose check waited less than
/// [`UNPROVEN_SETUP`].
const FIRST_BOUND: Duration = Duration::from_secs(2);

/// Setups begun and setups dropped before they finished (cancelled).
#[derive(Default, Clone)]
struct Probe {
    begun: Arc<AtomicU64>,
    cancelled: Arc<AtomicU64>,
}

/// Counts a cancellation when dropped armed.
struct Cancelled(Arc<AtomicU64>, bool);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if self.1 {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Probe {
    /// A setup that ends at `at` with `output`.
    fn setup(&self, at: Instant, output: Result<u32, &'static str>) -> Setup<u32, &'static str> {
        self.begun.fetch_add(1, Ordering::Relaxed);
        let cancelled = Cancelled(Arc::clone(&self.cancelled), true);
        Box::pin(async move {
            let mut cancelled = cancelled;
            tokio::time::sleep_until(at).await;
            cancelled.1 = false;
            output
        })
    }

    fn begun(&self) -> u64 {
        self.begun.load(Ordering::Relaxed)
    }

    fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }
}

impl KeptSetups<u32, &'static str> {
    /// Runs a setup whose connection is always a new one.
    async fn run_new(
        &self,
        begin: impl FnOnce() -> Setup<u32, &'static str>,
    ) -> Result<u32, &'static str> {
        self.run(begin, |_| true).await
    }
}

fn counts(finished: u64, given_up: u64) -> LateSetups {
    LateSetups { finished, given_up }
}

/// A check that waits `wait` for a setup ending at `at`, then gives up on it.
async fn abandon_after(
    setups: &KeptSetups<u32, &'static str>,
    probe: &Probe,
    wait: Duration,
    at: Instant,
) {
    let check = setups.run_new(|| probe.setup(at, Ok(7)));
    assert!(timeout(wait, check).await.is_err(), "the check gives up");
}

#[tokio::test(start_paused = true)]
async fn a_setup_its_check_gave_up_on_is_resumed_by_the_next_check_and_counted() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    abandon_after(&setups, &probe, 50 * MS, start + 300 * MS).await;

    let next = setups.run_new(|| probe.setup(start + NEVER, Ok(8)));
    assert_eq!(next.await, Ok(7), "the first setup's connection");
    assert_eq!(
        start.elapsed(),
        300 * MS,
        "as soon as the first setup ended"
    );
    assert_eq!(
        (probe.begun(), probe.cancelled()),
        (1, 0),
        "no second setup"
    );
    assert_eq!(setups.counts(), counts(1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_setup_that_ends_within_its_check_is_not_counted() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    let check = setups.run_new(|| probe.setup(start + 30 * MS, Ok(7)));
    assert_eq!(timeout(50 * MS, check).await, Ok(Ok(7)));
    assert_eq!(setups.counts(), counts(0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_resumed_setup_that_fails_hands_its_error_to_the_next_check_uncounted() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    let check = setups.run_new(|| probe.setup(start + 300 * MS, Err("refused")));
    assert!(timeout(50 * MS, check).await.is_err());

    let next = setups.run_new(|| probe.setup(start, Ok(8)));
    assert_eq!(next.await, Err("refused"));
    assert_eq!(setups.counts(), counts(0, 0));
    assert_eq!(probe.begun(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_setup_driven_past_its_bound_is_cancelled_when_its_check_gives_up() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;
    // The next check resumes it and waits beyond its bound (the timer finds nothing parked).
    abandon_after(&setups, &probe, FIRST_BOUND, start).await;
    assert_eq!((probe.begun(), probe.cancelled()), (1, 1));
    assert_eq!(setups.counts(), counts(0, 1));

    let next = setups.run_new(|| probe.setup(Instant::now() + 20 * MS, Ok(8)));
    assert_eq!(next.await, Ok(8), "a new setup's connection");
    assert_eq!(probe.begun(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_first_setup_nobody_resumes_is_cancelled_at_twice_the_unproven_allowance() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    assert_eq!(FIRST_BOUND, 2 * UNPROVEN_SETUP);
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;

    sleep(FIRST_BOUND - 51 * MS).await;
    assert_eq!(probe.cancelled(), 0, "kept until its bound");
    sleep(2 * MS).await;
    assert_eq!(
        probe.cancelled(),
        1,
        "cancelled at its bound, {FIRST_BOUND:?} after it began"
    );
    assert_eq!(setups.counts(), counts(0, 1));
}

#[tokio::test(start_paused = true)]
async fn the_bound_is_twice_the_wait_of_the_check_that_gave_up_when_that_is_longer() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    let interval = 2 * UNPROVEN_SETUP;
    abandon_after(&setups, &probe, interval, start + NEVER).await;

    // One more check of a whole interval resumes it…
    let next = setups.run_new(|| probe.setup(start + NEVER, Ok(8)));
    assert!(timeout(interval - MS, next).await.is_err());
    assert_eq!(
        (probe.begun(), probe.cancelled()),
        (1, 0),
        "still the first setup"
    );
    // …and the one after begins anew.
    sleep(2 * MS).await;
    assert_eq!(probe.cancelled(), 1);
    let after = setups.run_new(|| probe.setup(Instant::now(), Ok(8)));
    assert_eq!(after.await, Ok(8));
    assert_eq!(probe.begun(), 2);
}

#[tokio::test(start_paused = true)]
async fn once_connected_quickly_a_parked_setup_is_kept_for_twice_its_checks_wait() {
    let (setups, probe) = (KeptSetups::new(), Probe::default());
    let quick = setups.run_new(|| probe.setup(Instant::now() + 10 * MS, Ok(1)));
    assert_eq!(quick.await, Ok(1));

    let start = Instant::now();
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;
    sleep(49 * MS).await;
    assert_eq!(probe.cancelled(), 0);
    sleep(2 * MS).await;
    assert_eq!(probe.cancelled(), 1, "cancelled 100 ms after it began");
    assert_eq!(setups.counts(), counts(0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_setup_that_connected_late_raises_the_bound_of_the_next_to_twice_its_time() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    abandon_after(&setups, &probe, 50 * MS, start + 300 * MS).await;
    let resumed = setups.run_new(|| probe.setup(start + NEVER, Ok(8)));
    assert_eq!(resumed.await, Ok(7), "connected after 300 ms");

    let start = Instant::now();
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;
    sleep(549 * MS).await;
    assert_eq!(probe.cancelled(), 0, "kept for twice 300 ms");
    sleep(2 * MS).await;
    assert_eq!(probe.cancelled(), 1);
    assert_eq!(setups.counts(), counts(1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_connection_the_pool_had_ready_leaves_the_bound_alone() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    abandon_after(&setups, &probe, 50 * MS, start + 300 * MS).await;
    assert_eq!(setups.run_new(|| probe.setup(start, Ok(8))).await, Ok(7));
    let pooled = setups.run(|| probe.setup(Instant::now(), Ok(9)), |_| false);
    assert_eq!(pooled.await, Ok(9), "handed out at once");

    let start = Instant::now();
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;
    sleep(549 * MS).await;
    assert_eq!(
        probe.cancelled(),
        0,
        "still kept for twice the last new connection's 300 ms"
    );
    sleep(2 * MS).await;
    assert_eq!(probe.cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_source_whose_pool_had_connections_ready_keeps_a_first_new_one_for_two_waits() {
    let (setups, probe) = (KeptSetups::new(), Probe::default());
    let pooled = setups.run(|| probe.setup(Instant::now(), Ok(9)), |_| false);
    assert_eq!(pooled.await, Ok(9));

    let start = Instant::now();
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;
    sleep(49 * MS).await;
    assert_eq!(probe.cancelled(), 0);
    sleep(2 * MS).await;
    assert_eq!(
        probe.cancelled(),
        1,
        "no cold start: cancelled 100 ms after it began"
    );
}

#[tokio::test(start_paused = true)]
async fn a_kept_setup_is_cancelled_when_the_connection_it_was_for_is_closed() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    abandon_after(&setups, &probe, 50 * MS, start + NEVER).await;
    setups.cancel();
    assert_eq!(probe.cancelled(), 1, "cancelled at once, not at its bound");
    assert_eq!(setups.counts(), counts(0, 1));

    setups.cancel();
    assert_eq!(setups.counts(), counts(0, 1), "nothing left to cancel");
    let next = setups.run_new(|| probe.setup(Instant::now() + 10 * MS, Ok(8)));
    assert_eq!(next.await, Ok(8), "the next check begins anew");
}

#[tokio::test(start_paused = true)]
async fn at_a_few_milliseconds_a_parked_setup_is_kept_for_the_floor() {
    let (setups, probe) = (KeptSetups::new(), Probe::default());
    let quick = setups.run_new(|| probe.setup(Instant::now() + 3 * MS, Ok(1)));
    assert_eq!(quick.await, Ok(1));

    let start = Instant::now();
    abandon_after(&setups, &probe, 2 * MS, start + NEVER).await;
    sleep(RESUME_FLOOR - 3 * MS).await;
    assert_eq!(probe.cancelled(), 0, "not at twice 3 ms");
    sleep(2 * MS).await;
    assert_eq!(probe.cancelled(), 1, "at {RESUME_FLOOR:?}");
}

#[tokio::test(start_paused = true)]
async fn only_one_setup_is_parked_per_source_and_its_clones() {
    let (setups, probe, start) = (KeptSetups::new(), Probe::default(), Instant::now());
    let clone = setups.clone();
    let first = setups.run_new(|| probe.setup(start + 300 * MS, Ok(1)));
    let second = clone.run_new(|| probe.setup(start + 300 * MS, Ok(2)));
    let both = async { tokio::join!(first, second) };
    assert!(timeout(50 * MS, both).await.is_err(), "both checks give up");
    assert_eq!(probe.cancelled(), 1, "the second one parked is cancelled");
    assert_eq!(setups.counts(), counts(0, 1));

    let next = clone.run_new(|| probe.setup(start, Ok(3)));
    assert_eq!(next.await, Ok(1), "the first one is resumed");
    assert_eq!((probe.begun(), setups.counts()), (2, counts(1, 1)));
}

#[test]
fn outside_a_runtime_a_setup_is_cancelled_not_parked() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (setups, probe) = (KeptSetups::<u32, &str>::new(), Probe::default());
    let mut check = Box::pin(setups.run_new(|| {
        probe.begun.fetch_add(1, Ordering::Relaxed);
        let cancelled = Cancelled(Arc::clone(&probe.cancelled), true);
        Box::pin(async move {
            let _cancelled = cancelled;
            std::future::pending().await
        })
    }));
    runtime.block_on(std::future::poll_fn(|cx| {
        assert!(check.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    }));
    drop(runtime);
    drop(check);
    assert_eq!((probe.begun(), probe.cancelled()), (1, 1));
    assert_eq!(setups.counts(), counts(0, 1));
}
