//! The operator's controls: resign (release, then hold off) and eligibility.

use super::*;

impl<C> Election<C> {
    /// A resign request: no check begins before `hold_off` has passed, and the replica steps
    /// down.
    pub(super) fn resign(&mut self, now: Instant, hold_off: Duration) {
        if let State::Running(running) = &mut self.state {
            running.hold_until = Some(crate::hold_off::extended(running.hold_until, now, hold_off));
        }
        self.step_down(now);
    }

    /// [`Event::SetEligible`]: records the setting; a replica made ineligible steps down.
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
