//! The supervisor's decisions, pure: the restart budget and backoff of one worker, what the
//! `workers` probe reports, and whether a gate allows. Time enters as an argument; nothing here
//! sleeps or spawns.
//!
//! ## Restart budget (defaults of [`RestartPolicy::default`])
//!
//! - A worker that returns an error or panics is restarted after a backoff: 100 ms before the
//!   first restart, doubling for each further restart still inside the window, capped at 10 s
//!   (100 ms, 200 ms, 400 ms, 800 ms, 1.6 s, …).
//! - At most **5 restarts within any 60 s**: the failure that would need a sixth restart inside
//!   the window exhausts the budget. The worker then stays stopped, and the `workers` probe fails
//!   naming it, until the process restarts.
//! - Restarts older than the window are forgotten, so a worker that fails rarely is restarted
//!   forever, and its backoff starts again from 100 ms.
//! - A worker that returns `Ok` has finished: it is not restarted and does not fail the probe.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The numbers of the restart budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// How many restarts a worker may have within [`window`](Self::window).
    pub max_restarts: u32,
    /// The sliding window the restarts are counted in.
    pub window: Duration,
    /// The backoff before the first restart in a window.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
}

/// 5 restarts within 60 s.
pub const DEFAULT_MAX_RESTARTS: u32 = 5;
/// The restart window: 60 s.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);
/// The first backoff: 100 ms.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// The backoff cap: 10 s.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: DEFAULT_MAX_RESTARTS,
            window: DEFAULT_RESTART_WINDOW,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
        }
    }
}

impl RestartPolicy {
    /// The backoff before a restart when `earlier` restarts are already inside the window:
    /// `initial_backoff × 2^earlier`, capped at `max_backoff`.
    pub fn backoff(&self, earlier: u32) -> Duration {
        let factor = 1_u32.checked_shl(earlier.min(31)).unwrap_or(u32::MAX);
        self.initial_backoff
            .checked_mul(factor)
            .map_or(self.max_backoff, |b| b.min(self.max_backoff))
    }
}

/// How one run of a worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit<E> {
    /// It returned `Ok`: it has finished.
    Finished,
    /// It returned this error.
    Failed(E),
    /// It returned this error, which retrying cannot fix (the worker marked it permanent: a
    /// missing privilege, an election that cannot run through this pool).
    FailedForGood(E),
    /// It panicked with this payload (rendered as text).
    Panicked(String),
    /// The supervisor's shutdown cancelled it.
    Cancelled,
}

/// What the supervisor does after a worker's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start it again after this backoff; this is restart number `restart` within the window.
    Restart {
        /// How long to wait first.
        after: Duration,
        /// 1 for the first restart inside the current window.
        restart: u32,
    },
    /// Leave it stopped: it finished, or the service is shutting down.
    Stop,
    /// Leave it stopped for good: the budget is exhausted, and the `workers` probe fails.
    Exhausted,
    /// Leave it stopped for good at once: its error is permanent, and the `workers` probe
    /// fails.
    GiveUp,
}

/// The restart budget of one worker: remembers the restarts inside the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartBudget {
    policy: RestartPolicy,
    restarts: VecDeque<Instant>,
    exhausted: bool,
}

impl RestartBudget {
    /// A fresh budget.
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            restarts: VecDeque::new(),
            exhausted: false,
        }
    }

    /// Decides what follows a run that ended at `now` with `exit`. Calls must come with a
    /// non-decreasing `now`. Once exhausted, every later call answers [`Decision::Exhausted`].
    pub fn on_exit<E>(&mut self, now: Instant, exit: &Exit<E>) -> Decision {
        if self.exhausted {
            return Decision::Exhausted;
        }
        match exit {
            Exit::Finished | Exit::Cancelled => return Decision::Stop,
            Exit::FailedForGood(_) => return Decision::GiveUp,
            Exit::Failed(_) | Exit::Panicked(_) => {}
        }
        self.forget_before(now);
        let earlier = u32::try_from(self.restarts.len()).unwrap_or(u32::MAX);
        if earlier >= self.policy.max_restarts {
            self.exhausted = true;
            return Decision::Exhausted;
        }
        self.restarts.push_back(now);
        Decision::Restart {
            after: self.policy.backoff(earlier),
            restart: earlier + 1,
        }
    }

    /// Whether the budget is exhausted.
    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// How many restarts lie inside the window ending at `now`.
    pub fn restarts_in_window(&self, now: Instant) -> usize {
        self.restarts
            .iter()
            .filter(|at| now.saturating_duration_since(**at) < self.policy.window)
            .count()
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some(oldest) = self.restarts.front() {
            if now.saturating_duration_since(*oldest) >= self.policy.window {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
    }
}

/// Where one worker stands, as the `workers` probe sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState<E> {
    /// Registered, not started yet.
    Registered,
    /// Running (its `restarts` so far, over its whole life).
    Running {
        /// How many times it was restarted.
        restarts: u32,
    },
    /// Waiting out a backoff after this failure.
    BackingOff {
        /// The failure that stopped the last run.
        last: Exit<E>,
    },
    /// Finished (returned `Ok`) or stopped by the shutdown.
    Stopped,
    /// Out of its restart budget after this failure: stopped for good.
    Exhausted {
        /// The failure that exhausted the budget.
        last: Exit<E>,
    },
    /// Stopped for good at its first permanent failure ([`Exit::FailedForGood`]).
    GaveUp {
        /// The permanent failure.
        last: Exit<E>,
    },
}

impl<E> WorkerState<E> {
    /// Whether this worker fails the `workers` probe: one stopped for good (exhausted, or
    /// given up after a permanent failure) does.
    pub fn fails_probe(&self) -> bool {
        matches!(self, Self::Exhausted { .. } | Self::GaveUp { .. })
    }
}

/// The verdict of the `workers` probe over `(name, state)` pairs: `Ok(())` when no worker
/// exhausted its budget, else the names of those that did, in the order given.
pub fn workers_probe<'a, E: 'a>(
    workers: impl IntoIterator<Item = (&'a str, &'a WorkerState<E>)>,
) -> Result<(), Vec<&'a str>> {
    let failed: Vec<&str> = workers
        .into_iter()
        .filter(|(_, state)| state.fails_probe())
        .map(|(name, _)| name)
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed)
    }
}

/// The gate decision: a gate given a predicate allows only when it holds; a gate given none (a
/// wiring without an Elector: tests, a single replica) stays open.
pub fn gate_allows(predicate: Option<bool>) -> bool {
    predicate.unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn failed() -> Exit<&'static str> {
        Exit::Failed("boom")
    }

    #[test]
    fn the_default_numbers_are_five_restarts_in_sixty_seconds_backing_off_from_100ms_to_10s() {
        let policy = RestartPolicy::default();
        assert_eq!(policy.max_restarts, 5);
        assert_eq!(policy.window, Duration::from_secs(60));
        let backoffs: Vec<_> = (0..9).map(|n| policy.backoff(n)).collect();
        assert_eq!(
            backoffs,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000].map(|ms| ms * MS)
        );
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn a_failing_worker_is_restarted_with_growing_backoff_then_exhausts_the_budget() {
        let start = Instant::now();
        let mut budget = RestartBudget::new(RestartPolicy::default());
        let mut at = start;
        for (n, backoff) in [100, 200, 400, 800, 1600].into_iter().enumerate() {
            assert!(!budget.is_exhausted());
            let decision = budget.on_exit(at, &failed());
            assert_eq!(
                decision,
                Decision::Restart {
                    after: backoff * MS,
                    restart: u32::try_from(n).unwrap() + 1
                }
            );
            at += backoff * MS;
        }
        assert_eq!(
            budget.on_exit(at, &Exit::<()>::Panicked("p".into())),
            Decision::Exhausted
        );
        assert!(budget.is_exhausted());
        // Exhausted is final, even for a later clean exit or a much later failure.
        assert_eq!(
            budget.on_exit(at, &Exit::<()>::Finished),
            Decision::Exhausted
        );
        let later = at + Duration::from_secs(3600);
        assert_eq!(budget.on_exit(later, &failed()), Decision::Exhausted);
    }

    #[test]
    fn a_panic_counts_like_an_error() {
        let mut budget = RestartBudget::new(RestartPolicy::default());
        let decision = budget.on_exit(Instant::now(), &Exit::<()>::Panicked("x".into()));
        assert!(matches!(decision, Decision::Restart { restart: 1, .. }));
    }

    #[test]
    fn restarts_older_than_the_window_are_forgotten_and_backoff_starts_over() {
        let start = Instant::now();
        let mut budget = RestartBudget::new(RestartPolicy::default());
        for n in 0..5 {
            let decision = budget.on_exit(start + n * MS, &failed());
            assert!(matches!(decision, Decision::Restart { .. }));
        }
        assert_eq!(budget.restarts_in_window(start + 10 * MS), 5);
        let later = start + Duration::from_secs(61);
        assert_eq!(budget.restarts_in_window(later), 0);
        assert_eq!(
            budget.on_exit(later, &failed()),
            Decision::Restart {
                after: 100 * MS,
                restart: 1
            }
        );
    }

    #[test]
    fn a_restart_exactly_one_window_old_is_out_of_the_window() {
        let start = Instant::now();
        let window = RestartPolicy::default().window;
        let mut budget = RestartBudget::new(RestartPolicy::default());
        budget.on_exit(start, &failed());
        assert_eq!(budget.restarts_in_window(start + window - MS), 1);
        assert_eq!(budget.restarts_in_window(start + window), 0);
        assert_eq!(
            budget.on_exit(start + window, &failed()),
            Decision::Restart {
                after: 100 * MS,
                restart: 1
            }
        );
    }

    #[test]
    fn a_finished_or_cancelled_worker_is_not_restarted_and_uses_no_budget() {
        let now = Instant::now();
        let mut budget = RestartBudget::new(RestartPolicy::default());
        assert_eq!(budget.on_exit(now, &Exit::<()>::Finished), Decision::Stop);
        assert_eq!(budget.on_exit(now, &Exit::<()>::Cancelled), Decision::Stop);
        assert_eq!(budget.restarts_in_window(now), 0);
    }

    #[test]
    fn a_permanent_failure_is_given_up_at_once_and_fails_the_probe() {
        let now = Instant::now();
        let mut budget = RestartBudget::new(RestartPolicy::default());
        assert_eq!(
            budget.on_exit(now, &Exit::FailedForGood("no privilege")),
            Decision::GiveUp
        );
        assert_eq!(budget.restarts_in_window(now), 0, "no budget spent");
        let state = WorkerState::GaveUp {
            last: Exit::FailedForGood("no privilege"),
        };
        assert!(state.fails_probe());
        assert_eq!(
            workers_probe([("background-leader", &state)]),
            Err(vec!["background-leader"])
        );
    }

    #[test]
    fn a_zero_budget_stops_at_the_first_failure() {
        let policy = RestartPolicy {
            max_restarts: 0,
            ..RestartPolicy::default()
        };
        let mut budget = RestartBudget::new(policy);
        assert_eq!(
            budget.on_exit(Instant::now(), &failed()),
            Decision::Exhausted
        );
    }

    #[test]
    fn the_workers_probe_fails_only_for_exhausted_workers() {
        let running = WorkerState::<&str>::Running { restarts: 2 };
        let backing_off = WorkerState::BackingOff { last: failed() };
        let exhausted = WorkerState::Exhausted { last: failed() };
        let stopped = WorkerState::Stopped;
        assert_eq!(
            workers_probe([("a", &running), ("b", &backing_off), ("c", &stopped)]),
            Ok(())
        );
        assert_eq!(
            workers_probe([("a", &running), ("sweeper", &exhausted)]),
            Err(vec!["sweeper"])
        );
        assert_eq!(workers_probe::<&str>([]), Ok(()));
    }

    #[test]
    fn a_gate_without_predicate_stays_open() {
        assert!(gate_allows(None));
    }

    #[test]
    fn a_gate_with_a_predicate_allows_only_when_it_holds() {
        assert!(gate_allows(Some(true)));
        assert!(!gate_allows(Some(false)));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Never more than `max_restarts` restarts inside any window, backoff always within
            /// its bounds, and exhaustion is final.
            #[test]
            fn the_budget_holds_in_every_window(
                gaps in proptest::collection::vec(0_u64..30_000, 1..60),
                max_restarts in 0_u32..8,
            ) {
                let policy = RestartPolicy { max_restarts, ..RestartPolicy::default() };
                let mut budget = RestartBudget::new(policy);
                let start = Instant::now();
                let mut now = start;
                let mut restarts: Vec<Instant> = Vec::new();
                let mut exhausted = false;
                for gap in gaps {
                    now += Duration::from_millis(gap);
                    match budget.on_exit(now, &Exit::Failed(())) {
                        Decision::Restart { after, restart } => {
                            prop_assert!(!exhausted);
                            prop_assert!(after >= policy.initial_backoff && after <= policy.max_backoff);
                            restarts.push(now);
                            let in_window = restarts
                                .iter()
                                .filter(|at| now.duration_since(**at) < policy.window)
                                .count();
                            prop_assert!(in_window <= max_restarts as usize);
                            prop_assert_eq!(restart as usize, in_window);
                        }
                        Decision::Exhausted => exhausted = true,
                        Decision::Stop | Decision::GiveUp => {
                            prop_assert!(false, "a failure never stops quietly");
                        }
                    }
                }
            }
        }
    }
}
