//! When a leader gives way for a loop that cannot run on it: the step-down rule of a
//! leader-ticked loop whose passes fail for good (a missing privilege, a read-only session). Pure:
//! time enters as an argument.
//!
//! A replica cannot see whether a standby could do the work: every replica of a service usually
//! shares one role, so a missing `GRANT` hits all of them, and a leader that stepped down at every
//! such failure moved leadership once per tick period and interrupted every other loop each time.
//! The rule trades a prompt hand-over for a bounded rate of moves:
//!
//! - A leader steps down only once the loop has failed for good on every tick of its term for
//!   its **patience**: [`UNFIT_PATIENCE_PERIODS`] tick periods (10) the first time. Each move
//!   therefore needs its new leader to fail for a whole patience first, so leadership moves at
//!   most once per 10 tick periods, whatever the number of replicas.
//! - Every step-down of this replica for this loop doubles its next patience (20, 40, … periods,
//!   at most [`UNFIT_PATIENCE_MAX_DOUBLINGS`] doublings: 640 periods). A replica that stepped
//!   down and got leadership back with the same failure has learnt that its successor did not
//!   keep it, so it keeps leadership longer each time: with no fit replica, the moves thin out
//!   geometrically (two replicas: after about 10, 20, 40, 60, 100, … periods) while the loop's
//!   probe reports its error and every other loop runs.
//! - A pass of the loop on this replica resets both: it can do the work again.
//! - Anything but a failure for good (a pass, a standby tick, a transient failure, a term that
//!   ended under the pass) ends the run of failures, so the patience counts within one term.
//!
//! With a fit replica among the standbys, leadership ends on it after at most one patience per
//! unfit replica that leads before it; the fit leader never steps down for this loop.

use std::time::Duration;

use tokio::time::Instant;

/// How many tick periods a loop must fail for good, on every tick of a term, before the leader
/// steps down the first time (see the module's rule).
pub const UNFIT_PATIENCE_PERIODS: u32 = 10;

/// How many times the patience doubles at most: after this many step-downs for one loop (with
/// no pass between), each further one waits `UNFIT_PATIENCE_PERIODS × 2^6` periods.
pub const UNFIT_PATIENCE_MAX_DOUBLINGS: u32 = 6;

/// What one tick says to the step-down rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The pass ran and succeeded on this replica.
    Passed,
    /// The pass failed with an error that says it cannot succeed here (`is_permanent`).
    Unfit,
    /// Anything else: standby, a transient failure, a panic, an interrupted or cancelled pass.
    Other,
}

/// The step-down state of one loop on one replica.
#[derive(Debug, Clone)]
pub(crate) struct UnfitStreak {
    period: Duration,
    /// The first failure for good of the current run of them.
    since: Option<Instant>,
    /// Step-downs for this loop since it last passed here.
    step_downs: u32,
}

impl UnfitStreak {
    /// The state of a loop ticked every `period`.
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            since: None,
            step_downs: 0,
        }
    }

    /// The patience before the next step-down.
    pub(crate) fn patience(&self) -> Duration {
        let doublings = self.step_downs.min(UNFIT_PATIENCE_MAX_DOUBLINGS);
        self.period
            .saturating_mul(UNFIT_PATIENCE_PERIODS)
            .saturating_mul(1 << doublings)
    }

    /// Takes the tick seen at `now` (non-decreasing): `Some(patience)` when the leader steps
    /// down now, having failed for good for that long; `None` when it keeps leadership.
    pub(crate) fn on_tick(&mut self, now: Instant, seen: Seen) -> Option<Duration> {
        match seen {
            Seen::Passed => {
                self.since = None;
                self.step_downs = 0;
                None
            }
            Seen::Other => {
                self.since = None;
                None
            }
            Seen::Unfit => {
                let since = *self.since.get_or_insert(now);
                let patience = self.patience();
                if now.saturating_duration_since(since) < patience {
                    return None;
                }
                self.since = None;
                self.step_downs = self.step_downs.saturating_add(1);
                Some(patience)
            }
        }
    }

    /// Step-downs for this loop since it last passed here.
    pub(crate) fn step_downs(&self) -> u32 {
        self.step_downs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_secs(1);

    /// Ticks `seen` every period from `at` until the rule says to step down; the tick count.
    fn ticks_until_step_down(streak: &mut UnfitStreak, at: &mut Instant) -> u32 {
        for n in 1..10_000 {
            let down = streak.on_tick(*at, Seen::Unfit);
            *at += P;
            if down.is_some() {
                return n;
            }
        }
        panic!("never stepped down");
    }

    #[test]
    fn a_leader_steps_down_after_ten_periods_of_failures_and_waits_twice_as_long_each_time() {
        let mut streak = UnfitStreak::new(P);
        let mut at = Instant::now();
        // The first failing tick starts the count; the one ten periods later steps down.
        let ticks: Vec<u32> = (0..8)
            .map(|_| ticks_until_step_down(&mut streak, &mut at))
            .collect();
        assert_eq!(ticks, [11, 21, 41, 81, 161, 321, 641, 641]);
        assert_eq!(streak.step_downs(), 8);
    }

    #[test]
    fn a_pass_resets_the_patience_and_anything_else_restarts_the_count() {
        let mut streak = UnfitStreak::new(P);
        let mut at = Instant::now();
        assert_eq!(ticks_until_step_down(&mut streak, &mut at), 11);
        assert_eq!(streak.patience(), 20 * P);
        // A standby tick (or a transient failure) breaks the run: the count starts over.
        for _ in 0..15 {
            assert_eq!(streak.on_tick(at, Seen::Unfit), None);
            at += P;
        }
        assert_eq!(streak.on_tick(at, Seen::Other), None);
        at += P;
        assert_eq!(ticks_until_step_down(&mut streak, &mut at), 21);
        // A pass: the loop can run here again, the next step-down is prompt again.
        assert_eq!(streak.on_tick(at, Seen::Passed), None);
        at += P;
        assert_eq!(streak.patience(), 10 * P);
        assert_eq!(ticks_until_step_down(&mut streak, &mut at), 11);
    }
}
