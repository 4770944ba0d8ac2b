//! The rules every machine's trace is held to, written once for both checkers: the steps are
//! counted, time never goes backwards, a start is accepted exactly when not running, an ignored
//! input queues nothing, nothing is queued while not running, and the next deadline is never in
//! the past (nor still due after a timeout was handled).

use std::time::Instant;

use super::{Input, Violation};
use crate::handled::Handled;

/// The part of a checker's state the shared rules keep.
#[derive(Debug, Default)]
pub(super) struct Steps {
    pub(super) step: u64,
    pub(super) running: bool,
    now: Option<Instant>,
}

impl Steps {
    /// `what` broke at the step being checked.
    pub(super) fn violation(&self, what: String) -> Violation {
        Violation {
            step: self.step,
            what,
        }
    }

    /// A step's input at `now`, which queued `queued` actions.
    pub(super) fn input<E>(
        &mut self,
        now: Instant,
        input: &Input<'_, E>,
        queued: usize,
    ) -> Result<(), String> {
        self.step += 1;
        if self.now.is_some_and(|before| now < before) {
            return Err("time went backwards (driver contract)".into());
        }
        self.now = Some(now);
        let ignored = match input {
            Input::Start { accepted } => {
                if *accepted == self.running {
                    return Err(format!(
                        "start accepted={accepted} while running={}",
                        self.running
                    ));
                }
                self.running |= *accepted;
                !accepted
            }
            Input::Event { handled, .. } => matches!(handled, Handled::Ignored(_)),
            Input::Timeout => false,
        };
        if ignored && queued > 0 {
            return Err(format!("an ignored input queued {queued} actions"));
        }
        Ok(())
    }

    /// An action of the step: only while running.
    pub(super) fn action(&self) -> Result<(), String> {
        if self.running {
            Ok(())
        } else {
            Err("an action after Finish or while not running".into())
        }
    }

    /// The step's `poll_timeout`: none while not running, never in the past, and later than
    /// `now` after a timeout; `always`: a running machine has one in every state.
    pub(super) fn deadline<E>(
        &self,
        now: Instant,
        input: &Input<'_, E>,
        poll_timeout: Option<Instant>,
        always: bool,
    ) -> Result<(), String> {
        match (self.running, poll_timeout) {
            (false, None) => Ok(()),
            (false, Some(_)) => Err("a deadline is pending while not running".into()),
            (true, None) if always => Err("running with no deadline pending".into()),
            (true, None) => Ok(()),
            (true, Some(at)) if at < now => Err("the next deadline lies in the past".into()),
            (true, Some(at)) if at == now && matches!(input, Input::Timeout) => {
                Err("a deadline is still due after handle_timeout".into())
            }
            (true, Some(_)) => Ok(()),
        }
    }
}
