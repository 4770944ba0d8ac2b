//! Planted bugs: the model's own seam to prove that its properties can fail. Each one alters
//! what the environment does or what the driver feeds the core and reads back; the core's
//! production code has no switch for any of them.

/// A deliberately broken behaviour of the environment or of the driver; the command line's
/// `--sabotage` names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum Sabotage {
    /// Nothing broken: the model as CI checks it.
    #[default]
    #[value(skip)]
    None,
    /// The driver never fires a lease leader's [`LeaseExpiry`](plexsphere_leader_core::Timer)
    /// deadline (in the sharded lease model, a member's
    /// [`TrustDeadline`](plexsphere_leader_core::shards::ShardTimer)): its trust in the lease
    /// has no end.
    UnboundedTrust,
    /// The driver does not check the renewal's result: one that is lost, fails or finds the row
    /// another's (or not this term's) is reported "renewed" (the simulation's
    /// `keep-lease-on-failed-renewal`).
    RenewIgnoresTerm,
    /// The renewal takes the row back: it writes its own holder and epoch over the new holder's.
    RenewTakesBack,
    /// Lease (and fence) writes are acknowledged before they are durable
    /// (`synchronous_commit = off`): a server restart rolls back to the last flushed row (in
    /// the sharded models, the member, owner and fence rows).
    NonDurableLeaseWrite,
    /// A queued standby does not wait its turn: its `WaitForLock` on a held lock is answered
    /// "granted" at once.
    SkipQueue,
    /// The grant does not keep `idle_session_timeout` (the simulation's
    /// `skip-idle-session-timeout`): a silently orphaned lock session lives on and nobody leads
    /// again. It breaks the bounded liveness, not safety.
    SkipIdleSessionTimeout,
    /// Sharded model: the driver does not report the lock session's end, and answers a survey
    /// that failed with the session's last good one (the simulation's
    /// `keep-shards-on-failed-survey`): a replica whose session ended keeps believing it owns
    /// its shards.
    StaleSurvey,
    /// Ranked models: a standby's survey answers no candidate (the simulation's
    /// `never-defer`): a worse-ranked standby never defers, queues ahead of the better one,
    /// and wins the release of the leader's yield.
    NeverDefer,
    /// Sharded lease model: the take ignores the live members' owner rows (the simulation's
    /// `take-live-shards`): it owns every shard asked for that is not its own already.
    TakeIgnoresLiveMembers,
}
