//! The requests from outside a run ([`Control`]) and the operator's: resign (release, then
//! hold off) and eligibility.

use super::*;

impl<C> Election<C> {
    /// A request from outside the run, accepted by the running role.
    pub(super) fn on_control(&mut self, now: Instant, control: Control) {
        match control {
            Control::Cancelled => self.cancel(now),
            Control::Resign { hold_off } => self.resign(now, hold_off),
            // Applied before the election's state is looked at.
            Control::SetEligible { .. } => {}
            Control::Panicked => self.abandon(Abandon::Panic),
            Control::Dropped => self.abandon(Abandon::Drop),
        }
    }

    /// A resign request: no check begins before `hold_off` has passed (the later end wins), and
    /// the replica steps down. During a release that ends in standby (a yield, an unfit or
    /// ineligible leader's, an earlier resign's) the release goes on and the hold-off applies
    /// after it; during a stop's release the request is refused in [`accepts`](role::accepts).
    fn resign(&mut self, now: Instant, hold_off: Duration) {
        if let State::Running(running) = &mut self.state {
            running.hold_until = Some(crate::hold_off::extended(running.hold_until, now, hold_off));
        }
        self.step_down(now);
    }

    /// [`Control::SetEligible`]: records the setting; a replica made ineligible steps down.
    pub(super) fn set_eligible(&mut self, now: Instant, eligible: bool) -> Handled {
        if self.eligible == eligible {
            return Handled::Ignored(Ignored::Unchanged);
        }
        self.eligible = eligible;
        if !eligible {
            self.step_down(now);
        }
        Handled::Applied
    }
}
