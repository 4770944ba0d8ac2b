//! Test-only, deliberately broken driver behaviours (feature `sabotage`). Each reproduces a
//! mistake seen in other advisory-lock electors; the simulation must report a violation for
//! every one of them, which proves its checker can fail.

/// One broken behaviour of the driver.
#[cfg_attr(
    not(feature = "sabotage"),
    allow(
        dead_code,
        unreachable_pub,
        reason = "constructed and exported only with the sabotage feature"
    )
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sabotage {
    /// The leader never verifies its session: every check reports success without a query.
    NeverPing,
    /// The granted connection goes back to the pool instead of being hijacked, and the leader's
    /// check runs `SELECT 1` on any pooled connection: the lock stays on an idle pooled session.
    ReturnGrantedToPool,
    /// The grant statement does not set `idle_session_timeout`, so an orphaned lock session
    /// lives until TCP gives up.
    SkipIdleSessionTimeout,
    /// A failed or unanswered check is reported as a success: the leader keeps its term.
    KeepTermOnFailedPing,
    /// A resign request loses its hold-off: the resigner may take the lock straight back.
    ResignWithoutHoldOff,
}
