//! The requests from outside a run, the same for every machine.

use std::time::Duration;

use crate::cause::{LossReason, TermEndCause};

/// A request from outside the run (the driver's owner, an operator, an unwinding panic): the
/// control inputs every machine takes, reported as [`Event::Control`](crate::Event::Control)
/// or [`ShardEvent::Control`](crate::shards::ShardEvent::Control) (both convert from it with
/// `into()`; a generic driver calls [`Machine::control`](crate::Machine::control)).
///
/// What each asks of a machine: a term it ends ends with the cause named here; "the lock" is
/// the election's lock or lease, or every shard of a sharded election with its member session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    /// The run is asked to stop (its cancellation token was cancelled): every term ends as
    /// [`Stopped`](crate::TermEndCause::Stopped), its work is given the stop grace, the lock
    /// is released, the connection closed, and the run finishes.
    Cancelled,
    /// An operator asks this replica to give up leadership: a leader ends its terms as
    /// [`Resigned`](crate::TermEndCause::Resigned), gives their work the stop grace, releases
    /// the lock and stays a standby; a standby abandons a check in progress. Either way no check
    /// begins (a sharded replica does not rejoin) before `hold_off` has passed, so another
    /// replica can take the lock.
    Resign {
        /// How long the replica does not try the lock, from now (at most
        /// [`MAX_HOLD_OFF`](crate::MAX_HOLD_OFF)).
        hold_off: Duration,
    },
    /// Whether this replica may lead (own shards). An ineligible replica never tries the lock;
    /// a leader made ineligible gives up as on [`Control::Resign`] (without a hold-off), until
    /// it is made eligible again. Applied also while no run is in progress (the setting
    /// outlives runs and applies to the next).
    SetEligible {
        /// The new setting.
        eligible: bool,
    },
    /// A panic is unwinding through the run: every term ends as lost
    /// ([`LossReason::Panicked`](crate::LossReason::Panicked)), the connection closes without
    /// unlocking, and the run finishes.
    Panicked,
    /// The run was dropped before it finished (its task was aborted or its future dropped): as
    /// [`Control::Panicked`], with [`LossReason::Dropped`](crate::LossReason::Dropped).
    Dropped,
}

impl Control {
    /// The cause a term ended in answer to this request ends with; `None` when it ends none
    /// (a replica made eligible).
    pub(crate) const fn term_end(self) -> Option<TermEndCause> {
        match self {
            Self::Cancelled => Some(TermEndCause::Stopped),
            Self::Resign { .. } | Self::SetEligible { eligible: false } => {
                Some(TermEndCause::Resigned)
            }
            Self::SetEligible { eligible: true } => None,
            Self::Panicked => Some(TermEndCause::Lost(LossReason::Panicked)),
            Self::Dropped => Some(TermEndCause::Lost(LossReason::Dropped)),
        }
    }

    /// The name of the request, in a checker's violation text.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Cancelled => "Cancelled",
            Self::Resign { .. } => "Resign",
            Self::SetEligible { .. } => "SetEligible",
            Self::Panicked => "Panicked",
            Self::Dropped => "Dropped",
        }
    }
}
