//! What the election's checker reads of an input and an action: which inputs are stop and
//! control requests, and the names a violation's text gives them.

use crate::action::Action;
use crate::control::Control;
use crate::event::Event;

/// An input after which a stopped term's lock may be released.
pub(super) fn is_stop_input<C>(event: &Event<C>) -> bool {
    matches!(
        event,
        Event::Control(
            Control::Cancelled | Control::Resign { .. } | Control::SetEligible { eligible: false }
        ) | Event::WorkDrained { .. }
            | Event::Unfit { .. }
            | Event::CandidatesSurveyed { .. }
    )
}

/// A control input: a stop, resign, eligibility, panic or drop.
pub(super) fn is_control_input<C>(event: &Event<C>) -> bool {
    matches!(event, Event::Control(_))
}

/// The name of `action` in a violation's text.
pub(super) fn name<C>(action: &Action<C>) -> &'static str {
    match action {
        Action::AcquireConnection { .. } => "AcquireConnection",
        Action::ProbePool { .. } => "ProbePool",
        Action::ProbeFitness { .. } => "ProbeFitness",
        Action::SurveyCandidates { .. } => "SurveyCandidates",
        Action::TryLock { .. } => "TryLock",
        Action::WaitForLock { .. } => "WaitForLock",
        Action::AdvanceEpoch { .. } => "AdvanceEpoch",
        Action::AwaitWork { .. } => "AwaitWork",
        Action::ReturnToPool { .. } => "ReturnToPool",
        Action::Hijack { .. } => "Hijack",
        Action::Ping { .. } => "Ping",
        Action::ReportOverdueWork { .. } => "ReportOverdueWork",
        Action::ReleaseIfHeld { .. } => "ReleaseIfHeld",
        Action::Unlock { .. } => "Unlock",
        Action::ClaimLease { .. } => "ClaimLease",
        Action::RenewLease { .. } => "RenewLease",
        Action::ReleaseLease { .. } => "ReleaseLease",
        Action::CloseConnection { .. } => "CloseConnection",
        Action::BeginTerm { .. } => "BeginTerm",
        Action::EndTerm { .. } => "EndTerm",
        Action::Log(_) => "Log",
        Action::Fail(_) => "Fail",
        Action::Finish => "Finish",
    }
}

/// The name of the input `event` (`None`: a timeout or `start`) in a violation's text.
pub(super) fn input_name<C>(event: Option<&Event<C>>) -> &'static str {
    match event {
        None => "a timeout or start",
        Some(Event::ConnectionAcquired { .. }) => "ConnectionAcquired",
        Some(Event::AcquireFailed { .. }) => "AcquireFailed",
        Some(Event::PoolProbed { .. }) => "PoolProbed",
        Some(Event::Fit { .. }) => "Fit",
        Some(Event::Unfit { .. }) => "Unfit",
        Some(Event::ProbeFailed { .. }) => "ProbeFailed",
        Some(Event::CandidatesSurveyed { .. }) => "CandidatesSurveyed",
        Some(Event::SurveyFailed { .. }) => "SurveyFailed",
        Some(Event::LockGranted { .. }) => "LockGranted",
        Some(Event::LockRefused { .. }) => "LockRefused",
        Some(Event::LockWaitTimedOut { .. }) => "LockWaitTimedOut",
        Some(Event::LockHeldBySession { .. }) => "LockHeldBySession",
        Some(Event::ReleasedIfHeld { .. }) => "ReleasedIfHeld",
        Some(Event::LockQueryFailed { .. }) => "LockQueryFailed",
        Some(Event::LockNotTried { .. }) => "LockNotTried",
        Some(Event::EpochAdvanced { .. }) => "EpochAdvanced",
        Some(Event::EpochFailed { .. }) => "EpochFailed",
        Some(Event::SessionEnded { .. }) => "SessionEnded",
        Some(Event::WorkDrained { .. }) => "WorkDrained",
        Some(Event::PingAnswered { .. }) => "PingAnswered",
        Some(Event::PingFailed { .. }) => "PingFailed",
        Some(Event::LeaseClaimed { .. }) => "LeaseClaimed",
        Some(Event::LeaseRenewed { .. }) => "LeaseRenewed",
        Some(Event::LeaseLost { .. }) => "LeaseLost",
        Some(Event::UnlockDone { .. }) => "UnlockDone",
        Some(Event::UnlockFailed { .. }) => "UnlockFailed",
        Some(Event::Control(control)) => control.name(),
    }
}
